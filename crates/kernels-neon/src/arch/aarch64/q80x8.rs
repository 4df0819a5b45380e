//! The kernel of Q8_0 rows repacked eight at a time ([`crate::Q40x8`]) on `dotprod` CPUs, 16-bit
//! activations ([`Precision::Fast`](crate::Precision::Fast)) split as [`Split16`] splits them
//! (`x = 256 * hr + ls`, both signed), one token.
//!
//! A group block holds the 8 rows' f16 scales (16 bytes), then two quads of rows, each as 8
//! registers of 16 bytes: in register `k` of quad `q`, bytes `4r..4r + 4` are weights `4k..4k + 4`
//! of row `4q + r`. The by-element form of `sdot` (`sdot v.4s, w.16b, x.4b[i]`) multiplies each
//! row's four bytes by the same four activation bytes, so each i32 lane gathers one row's dot: per
//! 32 weights of four rows, 8 `sdot` on `hr` and 8 on `ls` (as [`super::matvec_split`]'s rows
//! take signed weights) with no horizontal sum, one conversion and one FMA for four rows. The lanes' integers
//! are the block's exact dots, and per row the f32 operations are [`super::rows_acc`]'s (`d * d_x`
//! from the f16 scale, one FMA a block from zero, in block order): bit for bit the split rows'
//! result.

use std::arch::aarch64::*;
use std::arch::asm;

use super::matvec_split::Split16;
use super::simd::{f16x8_times, split_block};
use crate::arch::tags::Q8_0;
use crate::q40x8::group_block;
use crate::quant::QActs16;

/// Bytes of a Q8_0 group block: 8 f16 scales and 8 rows of 32 quants.
const Q80_GROUP_BLOCK: usize = group_block(Q8_0);

/// A by-element dot: `acc += w · x.4b[I]` by lanes, lane `r` gaining bytes `4r..4r + 4` of `w`
/// times bytes `4I..4I + 4` of `x` (the sums here stay below 2^31).
macro_rules! dot_at {
    ($(#[$doc:meta])* $name:ident, $insn:literal, $features:literal, $w:ty, $x:ty) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// The CPU must support the extensions of this function's features.
        #[inline]
        #[target_feature(enable = $features)]
        pub(super) unsafe fn $name<const I: i32>(mut acc: int32x4_t, w: $w, x: $x) -> int32x4_t {
            // SAFETY: the instruction only reads and writes the named vector registers; its
            // extension is present per contract.
            unsafe {
                asm!(
                    concat!($insn, " {acc:v}.4s, {w:v}.16b, {x:v}.4b[{i}]"),
                    acc = inout(vreg) acc,
                    w = in(vreg) w,
                    x = in(vreg) x,
                    i = const I,
                    options(pure, nomem, nostack, preserves_flags)
                );
            }
            acc
        }
    };
}

dot_at!(
    /// Both signed (`sdot`; `dotprod`).
    sdot_at, "sdot", "neon,dotprod", int8x16_t, int8x16_t
);
dot_at!(
    /// Both unsigned (`udot`; `dotprod`).
    udot_at, "udot", "neon,dotprod", uint8x16_t, uint8x16_t
);

/// The four rows' exact dots of one quad's block (8 weight vectors `w`, paired with the four-byte
/// elements of `h` and `l` in order: `w[2i]`, `w[2i + 1]` with elements `2(i % 2)`, `2(i % 2) + 1`
/// of register `i / 2`) with the split activations `h` and `l`. Weights signed where `SIGNED`
/// (Q8_0, IQ4_NL: `h` and `l` are then `hr` and `lo`, taken as i8 by `sdot`; `corr` unused),
/// else unsigned (`hi` and `lo` by `udot`, `corr` added to every lane before the `lo` dots).
///
/// # Safety
/// `dotprod` present. Always inlined into callers with that feature.
#[inline(always)]
pub(super) unsafe fn quad_sums<const SIGNED: bool>(
    w: [int8x16_t; 8],
    h: [int8x16_t; 2],
    l: [uint8x16_t; 2],
    corr: int32x4_t,
) -> int32x4_t {
    // SAFETY: dotprod present per contract.
    unsafe {
        let z = vdupq_n_s32(0);
        let a = sdot_at::<1>(sdot_at::<0>(z, w[0], h[0]), w[1], h[0]);
        let a = sdot_at::<3>(sdot_at::<2>(a, w[2], h[0]), w[3], h[0]);
        let a = sdot_at::<1>(sdot_at::<0>(a, w[4], h[1]), w[5], h[1]);
        let a = sdot_at::<3>(sdot_at::<2>(a, w[6], h[1]), w[7], h[1]);
        if SIGNED {
            let l = [vreinterpretq_s8_u8(l[0]), vreinterpretq_s8_u8(l[1])];
            let s = vshlq_n_s32::<8>(a);
            let s = sdot_at::<1>(sdot_at::<0>(s, w[0], l[0]), w[1], l[0]);
            let s = sdot_at::<3>(sdot_at::<2>(s, w[2], l[0]), w[3], l[0]);
            let s = sdot_at::<1>(sdot_at::<0>(s, w[4], l[1]), w[5], l[1]);
            return sdot_at::<3>(sdot_at::<2>(s, w[6], l[1]), w[7], l[1]);
        }
        let s = vaddq_s32(vshlq_n_s32::<8>(a), corr);
        let u = w.map(|v| vreinterpretq_u8_s8(v));
        let s = udot_at::<1>(udot_at::<0>(s, u[0], l[0]), u[1], l[0]);
        let s = udot_at::<3>(udot_at::<2>(s, u[2], l[0]), u[3], l[0]);
        let s = udot_at::<1>(udot_at::<0>(s, u[4], l[1]), u[5], l[1]);
        udot_at::<3>(udot_at::<2>(s, u[6], l[1]), u[7], l[1])
    }
}

/// The dots of one Q8_0 group's 8 rows (module docs) with `xq`, split as `s`.
///
/// # Safety
/// `dotprod` present.
#[target_feature(enable = "neon,dotprod")]
unsafe fn group_body(group: &[u8], s: &Split16, xq: &QActs16) -> [f32; 8] {
    let nb = xq.d.len();
    assert!(group.len() >= nb * Q80_GROUP_BLOCK && s.hr.len() >= nb * 32 && s.lo.len() >= nb * 32);
    let mut acc = [vdupq_n_f32(0.0); 2];
    for b in 0..nb {
        // SAFETY: b < nb: group block b (272 bytes at 272 b), the split bytes 32b..32b + 32 and
        // d[b] are in bounds (asserted above); dotprod per contract.
        unsafe {
            let gp = group.as_ptr().add(b * Q80_GROUP_BLOCK);
            let (h, l) = split_block(s.hr.as_ptr().add(32 * b), s.lo.as_ptr().add(32 * b));
            let d = f16x8_times(gp, *xq.d.get_unchecked(b));
            for (q, (a, dq)) in acc.iter_mut().zip(d).enumerate() {
                let wp = gp.add(16 + 128 * q) as *const i8;
                let (w0, w1) = (vld1q_s8_x4(wp), vld1q_s8_x4(wp.add(64)));
                let w = [w0.0, w0.1, w0.2, w0.3, w1.0, w1.1, w1.2, w1.3];
                let isum = quad_sums::<true>(w, h, l, vdupq_n_s32(0));
                *a = vfmaq_f32(*a, vcvtq_f32_s32(isum), dq);
            }
        }
    }
    let mut y = [0f32; 8];
    // SAFETY: 8 writable f32 in `y`.
    unsafe {
        vst1q_f32(y.as_mut_ptr(), acc[0]);
        vst1q_f32(y.as_mut_ptr().add(4), acc[1]);
    }
    y
}

/// The dots of the 8 rows of one Q8_0 group (`xq.d.len()` group blocks at `group`) with `xq`,
/// split as `s` ([`Split16::new`] of `xq`).
///
/// # Safety
/// The CPU must support `dotprod`.
pub(crate) unsafe fn q80x8_group(group: &[u8], s: &Split16, xq: &QActs16) -> [f32; 8] {
    // SAFETY: dotprod present per this function's contract.
    unsafe { group_body(group, s, xq) }
}
