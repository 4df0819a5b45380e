//! Unpacking of the super-block formats (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS) and IQ4_NL, as
//! llama.cpp's `dequantize_row_*` read them: scales and the quant of one element.

use super::f16_at;
use tensor_types::IQ4NL_VALUES;

/// Q2_K super-block: per sub-block of 16 the f32 factors `(d * sc, dmin * m)`,
/// `sc` the low and `m` the high nibble of `scales[s]` (llama.cpp
/// `dequantize_row_q2_K`; `d` at byte 80, `dmin` at 82).
#[inline(always)]
pub(crate) fn q2k_scales(blk: &[u8]) -> ([f32; 16], [f32; 16]) {
    let (d, dmin) = (f16_at(blk, 80), f16_at(blk, 82));
    let dl = std::array::from_fn(|s| d * f32::from(blk[s] & 0xF));
    let ml = std::array::from_fn(|s| dmin * f32::from(blk[s] >> 4));
    (dl, ml)
}

/// Q2_K / Q3_K: the 2 low bits of element `i` (0..256) of a super-block
/// whose 64 `qs` bytes start at `off` (16 for Q2_K, 32 for Q3_K): half
/// `n = i / 128` uses `qs[32n..32n + 32]`, element `128n + 32k + l` bits
/// `2k..2k + 2` of `qs[32n + l]`.
#[inline(always)]
fn k2_low_bits(blk: &[u8], off: usize, i: usize) -> u8 {
    (blk[off + 32 * (i / 128) + i % 32] >> (2 * (i % 128 / 32))) & 3
}

/// Q2_K: the 2-bit quant (0..=3) of element `i` (0..256) of a super-block.
#[inline(always)]
pub(crate) fn q2k_quant(blk: &[u8], i: usize) -> u8 {
    k2_low_bits(blk, 16, i)
}

/// Q3_K super-block: per sub-block of 16 the f32 factor `d * (ls - 32)`,
/// the 6-bit `ls` unpacked from the 12 `scales` bytes (byte 96) as
/// llama.cpp's `kmask1`/`kmask2` shuffle does: low 4 bits in nibble `s / 8`
/// of byte `s % 8`, high 2 bits at bit `2 (s / 4)` of byte `8 + s % 4`.
#[inline(always)]
pub(crate) fn q3k_scales(blk: &[u8]) -> [f32; 16] {
    let d = f16_at(blk, 108);
    std::array::from_fn(|s| d * q3k_scale(blk, s) as f32)
}

/// Q3_K: the signed integer scale `ls - 32` of sub-block `s` (0..16), unpacked as
/// [`q3k_scales`] says.
#[inline(always)]
pub(crate) fn q3k_scale(blk: &[u8], s: usize) -> i32 {
    let sc = &blk[96..108];
    let lo = (sc[s % 8] >> (4 * (s / 8))) & 0xF;
    let hi = (sc[8 + s % 4] >> (2 * (s / 4))) & 3;
    i32::from(lo | hi << 4) - 32
}

/// Q3_K: the signed 3-bit quant (-4..=3) of element `i` (0..256) of a
/// super-block: the 2 low bits from `qs` (byte 32) minus 4 where bit
/// `i / 32` of `hmask[i % 32]` is clear (llama.cpp `dequantize_row_q3_K`).
#[inline(always)]
pub(crate) fn q3k_quant(blk: &[u8], i: usize) -> i8 {
    let h = (blk[i % 32] >> (i / 32)) & 1;
    k2_low_bits(blk, 32, i) as i8 - 4 * (1 - h as i8)
}

/// Q4_K: 6-bit scale and min of sub-block `j` (0..8) from the 12 packed
/// bytes `q` (llama.cpp `get_scale_min_k4`).
#[inline(always)]
pub(crate) fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Q4_K super-block: per sub-block of 32 the f32 factors `(d * sc, dmin * m)`.
#[inline(always)]
pub(crate) fn q4k_scales(blk: &[u8]) -> ([f32; 8], [f32; 8]) {
    let d = f16_at(blk, 0);
    let dmin = f16_at(blk, 2);
    let mut dl = [0f32; 8];
    let mut ml = [0f32; 8];
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, &blk[4..16]);
        dl[j] = d * f32::from(sc);
        ml[j] = dmin * f32::from(m);
    }
    (dl, ml)
}

/// Q4_K: the 4-bit quant of element `i` (0..256) of a super-block. Each
/// group of 64 elements uses 32 bytes of `qs`: low nibbles for its first
/// 32 elements, high nibbles for the next 32.
#[inline(always)]
pub(crate) fn q4k_quant(blk: &[u8], i: usize) -> u8 {
    let b = blk[16 + 32 * (i / 64) + i % 32];
    if i % 64 < 32 {
        b & 0xF
    } else {
        b >> 4
    }
}

/// Q5_K: the 5-bit quant of element `i` (0..256) of a super-block: the
/// nibble as in Q4_K (`qs` at byte 48), plus 16 where bit `i / 32` of
/// `qh[i % 32]` (byte 16) is set (llama.cpp `dequantize_row_q5_K`).
#[inline(always)]
pub(crate) fn q5k_quant(blk: &[u8], i: usize) -> u8 {
    let b = blk[48 + 32 * (i / 64) + i % 32];
    let lo = if i % 64 < 32 { b & 0xF } else { b >> 4 };
    lo | ((blk[16 + i % 32] >> (i / 32)) & 1) << 4
}

/// IQ4_NL / IQ4_XS: the 32 signed values (`IQ4NL_VALUES`) of 16 nibble
/// bytes, in element order (low nibbles, then high nibbles).
#[inline(always)]
pub(crate) fn iq4_quants(qs: &[u8]) -> [i8; 32] {
    let mut q = [0i8; 32];
    for j in 0..16 {
        q[j] = IQ4NL_VALUES[usize::from(qs[j] & 0xF)];
        q[j + 16] = IQ4NL_VALUES[usize::from(qs[j] >> 4)];
    }
    q
}

/// IQ4_XS super-block: per sub-block of 32 the f32 factor `d * (ls - 32)`
/// (llama.cpp `dequantize_row_iq4_xs`).
#[inline(always)]
pub(crate) fn iq4xs_scales(blk: &[u8]) -> [f32; 8] {
    let d = f16_at(blk, 0);
    let sh = u16::from_le_bytes([blk[2], blk[3]]);
    std::array::from_fn(|s| {
        let ls = ((blk[4 + s / 2] >> (4 * (s % 2))) & 0xF) | (((sh >> (2 * s)) & 3) as u8) << 4;
        d * (i32::from(ls) - 32) as f32
    })
}

/// Q6_K super-block: per sub-block of 16 the f32 factor `d * sc`.
#[inline(always)]
pub(crate) fn q6k_scales(blk: &[u8]) -> [f32; 16] {
    let d = f16_at(blk, 208);
    std::array::from_fn(|s| d * f32::from(blk[192 + s] as i8))
}

/// Q6_K: the signed quant `q - 32` (-32..=31) of element `i` (0..256) of a
/// super-block. Half `n = i / 128` uses `ql[64n..64n+64]` and
/// `qh[32n..32n+32]`; within it, element `32k + l` (k in 0..4, l in 0..32)
/// takes the low (k < 2) or high (k >= 2) nibble of
/// `ql[64n + l + 32*(k & 1)]` and bits `2k..2k+2` of `qh[32n + l]`.
#[inline(always)]
pub(crate) fn q6k_quant(blk: &[u8], i: usize) -> i8 {
    let (n, r) = (i / 128, i % 128);
    let (k, l) = (r / 32, r % 32);
    let ql = blk[64 * n + l + 32 * (k & 1)];
    let lo = if k < 2 { ql & 0xF } else { ql >> 4 };
    let hi = (blk[128 + 32 * n + l] >> (2 * k)) & 3;
    (lo | (hi << 4)) as i8 - 32
}
