//! Register-level helpers of the NEON kernels: bounds-checked loads and
//! stores, f16 reads, and widening of i8/u8 lanes to f32 or i16.

use std::arch::aarch64::*;

/// The f16 at bytes `i..i + 2` of `b` as f32, converted by `fcvtl` (base ARMv8 SIMD): `half`'s
/// `to_f32` converts in software unless the `fp16` target feature is on at compile time (it is
/// not on the aarch64 targets by default), about 20 instructions a value where decode reads one
/// or two per 32 weights. Exact either way (every f16 is an f32).
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn f16_at(b: &[u8], i: usize) -> f32 {
    let bits = u16::from_le_bytes([b[i], b[i + 1]]);
    vgetq_lane_f32::<0>(f16x4(vdup_n_u16(bits)))
}

/// `Q3_K`'s 16 signed 6-bit scales `ls - 32` (bytes 96..108), unpacked as
/// `scalar::q3k_scales`: low 4 bits in nibble `s / 8` of byte `s % 8`, high 2 bits at bit
/// `2 (s / 4)` of byte `8 + s % 4`.
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn q3k_scales(blk: &[u8; 110]) -> int8x16_t {
    let lo8 = u64::from_le_bytes(blk[96..104].try_into().expect("8 bytes"));
    let lo = vcreate_u8(lo8);
    let lo = vcombine_u8(vand_u8(lo, vdup_n_u8(0x0F)), vshr_n_u8::<4>(lo));
    let hi4 = u32::from_le_bytes(blk[104..108].try_into().expect("4 bytes"));
    let rep = vreinterpretq_u8_u32(vdupq_n_u32(hi4));
    // Lane s shifted right by 2 (s / 4).
    const SH: [i8; 16] = [0, 0, 0, 0, -2, -2, -2, -2, -4, -4, -4, -4, -6, -6, -6, -6];
    // SAFETY: `SH` is exactly 16 readable i8.
    let shifts = unsafe { vld1q_s8(SH.as_ptr()) };
    let hi = vandq_u8(vshlq_u8(rep, shifts), vdupq_n_u8(3));
    let ls = vorrq_u8(lo, vshlq_n_u8::<4>(hi));
    vsubq_s8(vreinterpretq_s8_u8(ls), vdupq_n_s8(32))
}

/// `Q3_K`'s 16 factors `d * (ls - 32)` of `blk`'s sub-blocks, as `scalar::q3k_scales` gives them
/// (the same f32 products) from [`q3k_scales`]' vector unpacking.
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn q3k_scales_f32(blk: &[u8]) -> [f32; 16] {
    let b: &[u8; 110] = blk[..110].try_into().expect("a Q3_K super-block");
    let d = f16_at(b, 108);
    let mut out = [0f32; 16];
    store16(
        &mut out,
        s8_to_f32(q3k_scales(b)).map(|v| vmulq_n_f32(v, d)),
    );
    out
}

/// `Q2_K`'s 16 factors `d * sc` and `dmin * m` of `blk`'s sub-blocks (`sc`, `m` the low and high
/// nibbles of bytes 0..16), as `scalar::q2k_scales` gives them (the same f32 products), by vector.
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn q2k_scales_f32(blk: &[u8]) -> ([f32; 16], [f32; 16]) {
    let (d, dmin) = (f16_at(blk, 80), f16_at(blk, 82));
    let sc = load_u8x16(&blk[..16]);
    let (mut dl, mut ml) = ([0f32; 16], [0f32; 16]);
    let lo = vandq_u8(sc, vdupq_n_u8(0x0F));
    store16(&mut dl, u8_to_f32(lo).map(|v| vmulq_n_f32(v, d)));
    store16(
        &mut ml,
        u8_to_f32(vshrq_n_u8::<4>(sc)).map(|v| vmulq_n_f32(v, dmin)),
    );
    (dl, ml)
}

/// The f16 at byte `at` of each of `N` blocks (two or four) as four f32 lanes (exact, one
/// `fcvtl`): the per-block factors of the rows in lane order, as the prompt tiles read them
/// (`tile_dp` four rows, `tile_mm` a row pair as `[x, y, x, y]`).
#[inline(always)]
pub(super) fn f16_lanes<const N: usize>(b: [&[u8]; N], at: usize) -> float32x4_t {
    const { assert!(N == 2 || N == 4) };
    let bits = |k: usize| {
        let v: [u8; 2] = b[k][at..at + 2].try_into().expect("2 bytes");
        u16::from_le_bytes(v)
    };
    let h = if N == 2 {
        // SAFETY: NEON is baseline on aarch64.
        unsafe { vreinterpret_u16_u32(vdup_n_u32(u32::from(bits(0)) | (u32::from(bits(1)) << 16))) }
    } else {
        let q = |k: usize| u64::from(bits(k)) << (16 * k);
        // SAFETY: NEON is baseline on aarch64.
        unsafe { vcreate_u16(q(0) | q(1) | q(2) | q(3)) }
    };
    // SAFETY: NEON is baseline on aarch64.
    unsafe { f16x4(h) }
}

/// Four f16 (their bits) as f32, by one `fcvtl` (exact).
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn f16x4(h: uint16x4_t) -> float32x4_t {
    let out: float32x4_t;
    // SAFETY: `fcvtl` only reads and writes the named vector registers (NEON is baseline).
    unsafe {
        std::arch::asm!(
            "fcvtl {o:v}.4s, {h:v}.4h",
            o = lateout(vreg) out,
            h = in(vreg) h,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    out
}

#[inline]
#[target_feature(enable = "neon")]
pub(super) fn load_u8x16(b: &[u8]) -> uint8x16_t {
    let b = &b[..16];
    // SAFETY: `b` has exactly 16 readable bytes (bounds-checked above);
    // NEON is baseline on aarch64; ld1 has no alignment requirement for u8.
    unsafe { vld1q_u8(b.as_ptr()) }
}

#[inline]
#[target_feature(enable = "neon")]
pub(super) fn load_f32x4(x: &[f32]) -> float32x4_t {
    let x = &x[..4];
    // SAFETY: `x` has exactly 4 readable f32 (bounds-checked above).
    unsafe { vld1q_f32(x.as_ptr()) }
}

/// The per-16 activation scales of a super-block's 8 per-32 ones (`dx`), each twice, as 4
/// vectors (group `G` in lane `G % 4` of vector `G / 4`).
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn dx16(dx: &[f32]) -> [float32x4_t; 4] {
    let (da, db) = (load_f32x4(&dx[0..]), load_f32x4(&dx[4..]));
    [
        vzip1q_f32(da, da),
        vzip2q_f32(da, da),
        vzip1q_f32(db, db),
        vzip2q_f32(db, db),
    ]
}

/// i8x16 as four f32x4 (lanes 0..4, .., 12..16).
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn s8_to_f32(q: int8x16_t) -> [float32x4_t; 4] {
    let lo = vmovl_s8(vget_low_s8(q));
    let hi = vmovl_high_s8(q);
    [
        vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))),
        vcvtq_f32_s32(vmovl_high_s16(lo)),
        vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))),
        vcvtq_f32_s32(vmovl_high_s16(hi)),
    ]
}

#[inline]
#[target_feature(enable = "neon")]
pub(super) fn u8_to_f32(q: uint8x16_t) -> [float32x4_t; 4] {
    let lo = vmovl_u8(vget_low_u8(q));
    let hi = vmovl_high_u8(q);
    [
        vcvtq_f32_u32(vmovl_u16(vget_low_u16(lo))),
        vcvtq_f32_u32(vmovl_high_u16(lo)),
        vcvtq_f32_u32(vmovl_u16(vget_low_u16(hi))),
        vcvtq_f32_u32(vmovl_high_u16(hi)),
    ]
}

/// Stores 16 f32 (4 × f32x4) at the start of `o`.
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn store16(o: &mut [f32], v: [float32x4_t; 4]) {
    let o = &mut o[..16];
    for (c, x) in o.chunks_exact_mut(4).zip(v) {
        // SAFETY: `c` is exactly 4 writable f32.
        unsafe { vst1q_f32(c.as_mut_ptr(), x) };
    }
}

#[inline]
#[target_feature(enable = "neon")]
pub(super) fn load_i16x8(q: &[i16]) -> int16x8_t {
    let q = &q[..8];
    // SAFETY: `q` has exactly 8 readable i16 (bounds-checked above).
    unsafe { vld1q_s16(q.as_ptr()) }
}

/// 8 i8 activation quants widened to i16x8.
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn load_i8x8_wide(q: &[i8]) -> int16x8_t {
    let q = &q[..8];
    // SAFETY: `q` has exactly 8 readable i8 (bounds-checked above).
    vmovl_s8(unsafe { vld1_s8(q.as_ptr()) })
}

/// The 8 scales `d * (ls - 32)` of an `IQ4_XS` super-block `blk` (bytes 0..8: `d` f16, `scales_h`
/// u16, `scales_l` 4 bytes; sub-block `s`'s 6-bit `ls` is nibble `s` of `scales_l` below bits
/// `2s..2s + 2` of `scales_h`), sub-blocks 0..4 and 4..8: by vector shifts where the scalar
/// unpack shifts, masks and converts one sub-block at a time, the scalar reference's values bit
/// for bit (`scalar::iq4xs_scales`: an exact conversion, then one f32 multiply).
///
/// `inline(always)` (no `target_feature`: NEON is baseline on aarch64): called once per row and
/// super-block, it was an out-of-line call of about 49 instructions in `iq4xs_split.rs`'s kernel
/// (18% of an `IQ4_XS` decode's), its shift tables stored to the stack at each call.
#[inline(always)]
pub(super) fn iq4xs_scales(blk: &[u8]) -> [float32x4_t; 2] {
    const BY_NIBBLE: [i16; 8] = [0, -4, -8, -12, 0, -4, -8, -12];
    const BY_PAIR: [i16; 8] = [0, -2, -4, -6, -8, -10, -12, -14];
    let b: &[u8; 8] = blk[..8].try_into().expect("8 bytes");
    let sh = u16::from_le_bytes([b[2], b[3]]);
    let (sl0, sl1) = (
        u16::from_le_bytes([b[4], b[5]]),
        u16::from_le_bytes([b[6], b[7]]),
    );
    // SAFETY: NEON is baseline on aarch64; the shift tables are 8 readable i16 each.
    unsafe {
        let d = f16_at(b, 0);
        let (by_nibble, by_pair) = (vld1q_s16(BY_NIBBLE.as_ptr()), vld1q_s16(BY_PAIR.as_ptr()));
        let lo = vshlq_u16(vcombine_u16(vdup_n_u16(sl0), vdup_n_u16(sl1)), by_nibble);
        let hi = vandq_u16(vshlq_u16(vdupq_n_u16(sh), by_pair), vdupq_n_u16(3));
        // `sli` keeps `lo`'s low 4 bits (its nibble) and puts `hi << 4` above them.
        let ls = vsubq_s16(
            vreinterpretq_s16_u16(vsliq_n_u16::<4>(lo, hi)),
            vdupq_n_s16(32),
        );
        [vmovl_s16(vget_low_s16(ls)), vmovl_high_s16(ls)].map(|v| vmulq_n_f32(vcvtq_f32_s32(v), d))
    }
}

/// [`iq4xs_scales`] as 8 f32 (for the kernels that take one sub-block's scale at a time).
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn iq4xs_scales8(blk: &[u8]) -> [f32; 8] {
    let v = iq4xs_scales(blk);
    let mut out = [0f32; 8];
    // SAFETY: `out` is 8 writable f32, two stores of 4.
    unsafe {
        vst1q_f32(out.as_mut_ptr(), v[0]);
        vst1q_f32(out.as_mut_ptr().add(4), v[1]);
    }
    out
}

/// The 32 `IQ4_NL` values (i8) of 16 nibble bytes `q`, in element order as
/// two i8x16 (low nibbles, then high nibbles): a table lookup of each nibble
/// in [`IQ4NL_VALUES`](tensor_types::IQ4NL_VALUES).
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn iq4nl_values(q: &[u8]) -> (int8x16_t, int8x16_t) {
    // SAFETY: the table is exactly 16 readable i8.
    let kv = unsafe { vld1q_s8(tensor_types::IQ4NL_VALUES.as_ptr()) };
    let raw = load_u8x16(q);
    (
        vqtbl1q_s8(kv, vandq_u8(raw, vdupq_n_u8(0x0F))),
        vqtbl1q_s8(kv, vshrq_n_u8::<4>(raw)),
    )
}

/// The 32 unsigned 5-bit quants (0..=31) of a `Q5_0`/`Q5_1` block in element
/// order, as two u8x16 (elements 0..16 and 16..32), from `q` = the block's 4
/// `qh` bytes (little-endian u32 of fifth bits) and 16 nibble bytes: element
/// `j < 16` is the low nibble of byte `j` with bit `j` of `qh` as bit 4,
/// element `j + 16` the high nibble with bit `j + 16`.
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn q5_quants(q: &[u8]) -> (uint8x16_t, uint8x16_t) {
    let q = &q[..20];
    let raw = load_u8x16(&q[4..20]);
    // Lane k of each 8 tests bit k of the broadcast `qh` byte.
    let bit = vreinterpretq_u8_u64(vdupq_n_u64(0x8040_2010_0804_0201));
    let fifth = |b0: u8, b1: u8| {
        let set = vtstq_u8(vcombine_u8(vdup_n_u8(b0), vdup_n_u8(b1)), bit);
        vandq_u8(set, vdupq_n_u8(0x10))
    };
    (
        vorrq_u8(vandq_u8(raw, vdupq_n_u8(0x0F)), fifth(q[0], q[1])),
        vorrq_u8(vshrq_n_u8::<4>(raw), fifth(q[2], q[3])),
    )
}

/// `acc + sums * scale`, `sums` lane `j` the exact sum of `isum[j]`'s four lanes (two `addp`):
/// four groups' integer dots converted once and multiplied by their four scales in one FMA.
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn fma_sums4(acc: float32x4_t, isum: [int32x4_t; 4], scale: float32x4_t) -> float32x4_t {
    let t = vpaddq_s32(vpaddq_s32(isum[0], isum[1]), vpaddq_s32(isum[2], isum[3]));
    vfmaq_f32(acc, vcvtq_f32_s32(t), scale)
}

/// The 8 f16 at `p` (a repacked group's 8 rows' scales or mins) as f32, each times `by`: rows
/// 0-3, rows 4-7 (`fcvtl`, then one multiply each, as [`super::rows_acc`] scales its rows).
///
/// # Safety
/// 16 bytes readable at `p`.
#[inline(always)]
pub(super) unsafe fn f16x8_times(p: *const u8, by: f32) -> [float32x4_t; 2] {
    // SAFETY: 16 bytes readable per contract; NEON is baseline on aarch64.
    unsafe {
        let h = vld1q_u16(p as *const u16);
        [
            vmulq_n_f32(f16x4(vget_low_u16(h)), by),
            vmulq_n_f32(f16x4(vget_high_u16(h)), by),
        ]
    }
}

/// One block's split activations (the high bytes at `hi`, the low ones at `lo`, 32 each) as two
/// registers each.
///
/// # Safety
/// 32 bytes readable at each of `hi` and `lo`.
#[inline(always)]
pub(super) unsafe fn split_block(
    hi: *const i8,
    lo: *const u8,
) -> ([int8x16_t; 2], [uint8x16_t; 2]) {
    // SAFETY: 32 bytes readable at each per contract; NEON is baseline on aarch64.
    unsafe {
        (
            [vld1q_s8(hi), vld1q_s8(hi.add(16))],
            [vld1q_u8(lo), vld1q_u8(lo.add(16))],
        )
    }
}

/// Loads 16 bytes at `b[o..o + 16]` (`o + 16 <= N`, checked at compile time by the callers'
/// constant offsets or here).
#[inline(always)]
pub(super) fn ld<const N: usize>(b: &[u8; N], o: usize) -> uint8x16_t {
    let s = &b[o..o + 16];
    // SAFETY: `s` is exactly 16 readable bytes (bounds-checked above).
    unsafe { vld1q_u8(s.as_ptr()) }
}

/// `sum(scale_g * sum16_g)` over a super-block's 16 groups (`scale` as `kquant_split::q6k_block`
/// lays it out): what an offset of the unsigned quants (`Q6_K`'s 32, `Q3_K`'s 4) takes back, once
/// per super-block by vector rather than per group in the integer sums (as the x86 kernels do).
/// Here, beside the loads, for `kquant_split` and `kquant_low_split` both.
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn offset_term(scale: &[float32x4_t; 4], sum16: &[i32; 16]) -> f32 {
    let mut t = vdupq_n_f32(0.0);
    for (i, sc) in scale.iter().enumerate() {
        let x = &sum16[4 * i..4 * i + 4];
        // SAFETY: `x` is exactly 4 readable i32 (bounds-checked above).
        t = vfmaq_f32(t, *sc, vcvtq_f32_s32(unsafe { vld1q_s32(x.as_ptr()) }));
    }
    vaddvq_f32(t)
}

/// Defines `unsafe fn $name(acc: int32x4_t, a: $a, b: $b) -> int32x4_t`: `acc` plus the
/// accumulating dot or matrix instruction `$insn` (`$insn acc.4s, a.16b, b.16b`), enabled with
/// `$features`. The dot products (`sdot`, `udot`) and the matrix multiplies (`smmla`,
/// `usmmla`) are all this one shape.
macro_rules! acc_insn {
    ($(#[$doc:meta])* $vis:vis $name:ident, $insn:literal, $a:ty, $b:ty, $features:literal) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// The CPU must support the extensions the instruction needs (its `target_feature`).
        #[inline]
        #[target_feature(enable = $features)]
        $vis unsafe fn $name(mut acc: int32x4_t, a: $a, b: $b) -> int32x4_t {
            // SAFETY: the instruction only reads and writes the named vector registers; the
            // caller guarantees its extension is present.
            unsafe {
                std::arch::asm!(
                    concat!($insn, " {acc:v}.4s, {a:v}.16b, {b:v}.16b"),
                    acc = inout(vreg) acc,
                    a = in(vreg) a,
                    b = in(vreg) b,
                    options(pure, nomem, nostack, preserves_flags)
                );
            }
            acc
        }
    };
}
pub(super) use acc_insn;

/// `(v[0] + v[1]) + (v[2] + v[3])`: `vaddvq_f32`'s order across four registers, so that kernels
/// keeping a row's lanes as registers of rows (the eight-row copies) add them as the one-row
/// kernels add their lanes.
#[inline(always)]
pub(super) fn add_pairwise(v: [float32x4_t; 4]) -> float32x4_t {
    // SAFETY: NEON is baseline on aarch64.
    unsafe { vaddq_f32(vaddq_f32(v[0], v[1]), vaddq_f32(v[2], v[3])) }
}

/// The 8 rows' results of an eight-row copy's kernel: per half (rows 0-3, 4-7) its four lane
/// registers added as [`add_pairwise`] adds them, less `less` (the split rows' `vaddvq_f32(acc) -
/// min`).
#[inline(always)]
pub(super) fn rows_less(acc: &[[float32x4_t; 2]; 4], less: [float32x4_t; 2]) -> [f32; 8] {
    let mut y = [0f32; 8];
    for (h, l) in less.into_iter().enumerate() {
        let s = add_pairwise([acc[0][h], acc[1][h], acc[2][h], acc[3][h]]);
        // SAFETY: 4 writable f32 at `y[4 h..]` (h < 2); NEON is baseline on aarch64.
        unsafe { vst1q_f32(y.as_mut_ptr().add(4 * h), vsubq_f32(s, l)) };
    }
    y
}
