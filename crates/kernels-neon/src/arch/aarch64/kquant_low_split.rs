//! `Q2_K`, `Q3_K` and `IQ4_XS` super-blocks × 16-bit activations
//! ([`Precision::Fast`](crate::Precision::Fast)) with `sdot`/`udot` on `dotprod` CPUs, as
//! `kquant_split.rs` does `Q4_K`/`Q5_K`/`Q6_K` (`x = 256 * hi + lo`, [`Split16`](super::matvec_split::Split16)): the integer
//! products of `kquant::dot_k_int`'s widening path, summed in another f32 order.
//!
//! - `Q2_K` quants (0..=3) are unsigned as they are; the min term `dmin * m * d_x * sum(x)` of each
//!   16 elements is taken once per super-block by vector from [`Split16::sum16`](super::matvec_split::Split16::sum16).
//! - `Q3_K` quants (-4..=3) are taken as `q + 4` (0..=7, the high bit set where `hmask`'s bit is),
//!   the `- 4` back once per super-block by vector: `4 * sum(d * sc * d_x * sum(x))` over its 16
//!   groups ([`offset_term`]).
//! - `IQ4_XS` values (-127..=113, signed) go as they are into the `hi` dot and `+ 128` (`^ 0x80`)
//!   into the unsigned `lo` one, the `+ 128` taken back by the block's `-128 * sum(lo)`
//!   (`IQ4_NL`'s way in `matvec_split.rs`).
//!
//! Each group of 16 (32 for `IQ4_XS`) is a function of a constant group index (fixed shifts, no
//! bounds checks in the super-block); the scales are unpacked by vector (`IQ4_XS`'s by
//! [`iq4xs_scales`], the scalar reference's values).

use std::arch::aarch64::*;

use super::kquant_acts::SbDot;
use super::simd::{
    dx16, f16_at, fma_sums4, iq4nl_values, iq4xs_scales, ld, load_f32x4, offset_term, q3k_scales,
    s8_to_f32, u8_to_f32,
};

/// The quants of elements `128 n + 32 k + 16 p .. + 16` of a `Q2_K` (`Q3 = false`, 84 bytes) or
/// `Q3_K` (110 bytes) super-block, unsigned: bits `2k..2k + 2` of `qs[32 n + 16 p..]` (byte 16, or
/// 32 for `Q3_K`), `Q3_K`'s bit `4 n + k` of `hmask[16 p..]` as bit 2 (its quant plus 4).
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn k23_quants16<const Q3: bool, const N: usize>(
    blk: &[u8; N],
    (n, k, p): (usize, usize, usize),
) -> uint8x16_t {
    let qoff = if Q3 { 32 } else { 16 };
    let qs = ld(blk, qoff + 32 * n + 16 * p);
    let q = vandq_u8(vshlq_u8(qs, vdupq_n_s8(-2 * k as i8)), vdupq_n_u8(3));
    if !Q3 {
        return q;
    }
    let hm = ld(blk, 16 * p);
    // Bit 4n + k of hmask to bit 2.
    let hb = vshlq_u8(hm, vdupq_n_s8(2 - (4 * n + k) as i8));
    vorrq_u8(q, vandq_u8(hb, vdupq_n_u8(4)))
}

/// Group `G = 8 n + 2 k + p` (elements `16 G .. + 16`) of a `Q2_K` (`Q3 = false`, 84 bytes) or
/// `Q3_K` (110 bytes) super-block with its activations `a`: its quants by [`k23_quants16`], and
/// its integer dot (four lanes; its scale is lane `G % 4` of the block's `scale[G / 4]`).
///
/// # Safety
/// The CPU must support the `dotprod` extension.
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn k23_group<const Q3: bool, const N: usize, const G: usize, A: SbDot>(
    blk: &[u8; N],
    a: &A,
) -> int32x4_t {
    let q = k23_quants16::<Q3, N>(blk, (G / 8, (G / 2) % 4, G % 2));
    // SAFETY: dotprod present per this function's contract.
    unsafe { a.dot16(q, 16 * G) }
}

/// Runs [`k23_group`] for the 16 groups of `R` rows' super-blocks, four groups at a time: each
/// row's exact sums in one vector, one conversion and one FMA with its four scales
/// ([`fma_sums4`]). A group's rows take the same activations one after another with nothing
/// stored between them, so that inlined, their loads serve every row.
macro_rules! k23_groups {
    ($q3:literal, $blks:expr, $a:expr, $scale:expr, $acc:expr;
     $($i:literal: $g0:literal $g1:literal $g2:literal $g3:literal);*) => {
        // SAFETY: dotprod present per the enclosing function's contract.
        unsafe {$(
            for (r, acc) in $acc.iter_mut().enumerate() {
                let b = $blks[r];
                let s = [
                    k23_group::<$q3, _, $g0, _>(b, $a),
                    k23_group::<$q3, _, $g1, _>(b, $a),
                    k23_group::<$q3, _, $g2, _>(b, $a),
                    k23_group::<$q3, _, $g3, _>(b, $a),
                ];
                *acc = fma_sums4(*acc, s, $scale[r][$i]);
            }
        )*}
    };
}

/// `R` rows' `Q2_K` super-blocks (84 bytes: 16 scale bytes, 64 quant bytes, `d`, `dmin`): each
/// row's 16 scales `d * sc * d_x` as vectors, then the groups ([`k23_groups`]); returns each row's
/// min term `sum(dmin * m * d_x * sum(x))` (to subtract). Each row's f32 operations are those of
/// one row alone.
///
/// # Safety
/// The CPU must support the `dotprod` extension.
#[inline]
#[target_feature(enable = "neon,dotprod")]
pub(super) unsafe fn q2k_block<const R: usize, A: SbDot>(
    blks: [&[u8; 84]; R],
    a: &A,
    acc: &mut [float32x4_t; R],
) -> [f32; R] {
    let dxs = dx16(a.d());
    let sums = a.sum16();
    let mut scale = [[vdupq_n_f32(0.0); 4]; R];
    let mut min = [0f32; R];
    for (r, blk) in blks.iter().enumerate() {
        let (d, dmin) = (f16_at(*blk, 80), f16_at(*blk, 82));
        let sc = ld(blk, 0);
        let scf = u8_to_f32(vandq_u8(sc, vdupq_n_u8(0x0F)));
        let mf = u8_to_f32(vshrq_n_u8::<4>(sc));
        scale[r] = std::array::from_fn(|i| vmulq_f32(vmulq_n_f32(scf[i], d), dxs[i]));
        let mut m = vdupq_n_f32(0.0);
        for i in 0..4 {
            // SAFETY: `sums[4 i..4 i + 4]` is 4 readable i32 (bounds-checked by the slice).
            let x = unsafe { vcvtq_f32_s32(vld1q_s32(sums[4 * i..4 * i + 4].as_ptr())) };
            m = vfmaq_f32(m, vmulq_f32(vmulq_n_f32(mf[i], dmin), dxs[i]), x);
        }
        min[r] = vaddvq_f32(m);
    }
    k23_groups!(false, blks, a, scale, acc; 0: 0 1 2 3; 1: 4 5 6 7; 2: 8 9 10 11; 3: 12 13 14 15);
    min
}

/// `R` rows' `Q3_K` super-blocks (110 bytes: `hmask` 32, `qs` 64, scales 12, `d`): each row's 16
/// scales `d * (ls - 32) * d_x` as vectors, then the groups ([`k23_groups`]); returns each row's
/// offset term (to subtract). Each row's f32 operations are those of one row alone.
///
/// # Safety
/// The CPU must support the `dotprod` extension.
#[inline]
#[target_feature(enable = "neon,dotprod")]
pub(super) unsafe fn q3k_block<const R: usize, A: SbDot>(
    blks: [&[u8; 110]; R],
    a: &A,
    acc: &mut [float32x4_t; R],
) -> [f32; R] {
    let dxs = dx16(a.d());
    let mut scale = [[vdupq_n_f32(0.0); 4]; R];
    for (sc, blk) in scale.iter_mut().zip(blks) {
        let d = f16_at(blk, 108);
        let ls = q3k_scales(blk);
        let scf = s8_to_f32(ls).map(|v| vmulq_n_f32(v, d));
        *sc = std::array::from_fn(|i| vmulq_f32(scf[i], dxs[i]));
    }
    k23_groups!(true, blks, a, scale, acc; 0: 0 1 2 3; 1: 4 5 6 7; 2: 8 9 10 11; 3: 12 13 14 15);
    let mut off = [0f32; R];
    for (o, sc) in off.iter_mut().zip(&scale) {
        *o = 4.0 * offset_term(sc, a.sum16());
    }
    off
}

/// The integer dot (four lanes) of sub-block `J` (elements `32 J .. + 32`, 16 nibble bytes at
/// `8 + 16 J`) of an `IQ4_XS` super-block with its activations `a`.
///
/// # Safety
/// The CPU must support the `dotprod` extension.
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn iq4xs_sub<const J: usize, A: SbDot>(blk: &[u8; 136], a: &A) -> int32x4_t {
    let (v0, v1) = iq4nl_values(&blk[8 + 16 * J..8 + 16 * J + 16]);
    // SAFETY: dotprod present per this function's contract.
    unsafe { a.dot32s(v0, v1, J) }
}

/// An `IQ4_XS` super-block (136 bytes: `d`, `scales_h`, `scales_l` 4, nibbles 128): its 8 scales
/// `d * (ls - 32) * d_x` (as the scalar reference unpacks them), then its 8 sub-blocks.
///
/// # Safety
/// The CPU must support the `dotprod` extension.
#[inline]
#[target_feature(enable = "neon,dotprod")]
pub(super) unsafe fn iq4xs_block<A: SbDot>(blk: &[u8; 136], a: &A, acc: &mut float32x4_t) {
    let dl = iq4xs_scales(blk);
    let dx = a.d();
    let scale: [float32x4_t; 2] =
        std::array::from_fn(|i| vmulq_f32(dl[i], load_f32x4(&dx[4 * i..])));
    // Four sub-blocks at a time: their exact sums in one vector, one conversion and one FMA.
    // SAFETY: dotprod present per this function's contract.
    unsafe {
        let s = [
            iq4xs_sub::<0, A>(blk, a),
            iq4xs_sub::<1, A>(blk, a),
            iq4xs_sub::<2, A>(blk, a),
            iq4xs_sub::<3, A>(blk, a),
        ];
        *acc = fma_sums4(*acc, s, scale[0]);
        let s = [
            iq4xs_sub::<4, A>(blk, a),
            iq4xs_sub::<5, A>(blk, a),
            iq4xs_sub::<6, A>(blk, a),
            iq4xs_sub::<7, A>(blk, a),
        ];
        *acc = fma_sums4(*acc, s, scale[1]);
    }
}
