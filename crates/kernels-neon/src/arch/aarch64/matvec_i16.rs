//! `matvec` with 16-bit activations ([`Precision::Fast`](crate::Precision::Fast)):
//! `smull`/`smlal` integer dots of two rows at once (`sdot`/`udot` ones where the CPU has `dotprod`:
//! `matvec_split.rs`).

use std::arch::aarch64::*;

use super::dequant::weights_i8;
use super::iq4xs_split::matvec_iq4xs_split;
use super::kquant::{dot16, matvec_k_int};
use super::kquant_split::{has_k_split, matvec_k_split};
use super::matvec_split::{has_split, matvec_split, Split16};
use super::simd::{f16_at, load_i16x8};
use crate::arch::drivers::{rows_blocked, RowDots};
use crate::arch::tags::{block_bytes, has_min, IQ4_NL, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};
use crate::arch::Rows;
use crate::quant::QActs16;
use crate::WeightFormat;
use crate::{KernelPath, QMatrix};

/// Integer dot of two rows with the 16-bit activations: weights widened to
/// i16 (`vmovl_s8`), `vmull_s16`/`vmlal_high_s16` into i32 lanes (|q_w| <=
/// 128, |q_x| <= 32767: each lane sums 8 products, below 2^26), then one
/// convert and one FMA with `d_w * d_x` per block. `r1` may equal `r0`.
#[target_feature(enable = "neon")]
fn dot_i16_rows2<const F: u8>(r0: &[u8], r1: &[u8], xq: &QActs16) -> (f32, f32) {
    let bb = block_bytes(F);
    let mut sumv = [vdupq_n_f32(0.0); 2];
    let mut extra = [0f32; 2];
    for (b, (b0, b1)) in r0.chunks_exact(bb).zip(r1.chunks_exact(bb)).enumerate() {
        let qx = &xq.qs[b * 32..b * 32 + 32];
        let x = [
            load_i16x8(&qx[0..]),
            load_i16x8(&qx[8..]),
            load_i16x8(&qx[16..]),
            load_i16x8(&qx[24..]),
        ];
        let (dx, sx) = (xq.d[b], xq.s[b]);
        for (k, blk) in [b0, b1].into_iter().enumerate() {
            let (w0, w1) = weights_i8::<F>(blk);
            let w = [
                vmovl_s8(vget_low_s8(w0)),
                vmovl_high_s8(w0),
                vmovl_s8(vget_low_s8(w1)),
                vmovl_high_s8(w1),
            ];
            let mut s = vmull_s16(vget_low_s16(w[0]), vget_low_s16(x[0]));
            let mut t = vmull_s16(vget_low_s16(w[1]), vget_low_s16(x[1]));
            s = vmlal_high_s16(s, w[0], x[0]);
            t = vmlal_high_s16(t, w[1], x[1]);
            s = vmlal_s16(s, vget_low_s16(w[2]), vget_low_s16(x[2]));
            t = vmlal_s16(t, vget_low_s16(w[3]), vget_low_s16(x[3]));
            s = vmlal_high_s16(s, w[2], x[2]);
            t = vmlal_high_s16(t, w[3], x[3]);
            let isum = vaddq_s32(s, t);
            sumv[k] = vfmaq_n_f32(sumv[k], vcvtq_f32_s32(isum), f16_at(blk, 0) * dx);
            if has_min(F) {
                extra[k] += f16_at(blk, 2) * sx;
            }
        }
    }
    (
        vaddvq_f32(sumv[0]) + extra[0],
        vaddvq_f32(sumv[1]) + extra[1],
    )
}

/// [`dot_i16_rows2`] as the kernel of the shared row drivers: two rows, or
/// one row passed twice.
struct I16Dots<'a, const F: u8>(&'a QActs16);

impl<const F: u8> RowDots for I16Dots<'_, F> {
    #[inline(always)]
    unsafe fn dots<const N: usize>(&self, rows: [&[u8]; N]) -> [f32; N] {
        const { assert!(N == 1 || N == 2) };
        // SAFETY: NEON (all the kernel needs) is present per this method's
        // contract (it is baseline on aarch64).
        let (a, b) = unsafe { dot_i16_rows2::<F>(rows[0], rows[N - 1], self.0) };
        std::array::from_fn(|k| if k == 0 { a } else { b })
    }
}

/// Pairs of rows, then a last single row ([`rows_blocked`] with `R = 2`).
#[target_feature(enable = "neon")]
fn rows_i16<const F: u8>(w: &QMatrix<'_>, sel: Rows<'_>, xq: &QActs16, y: &mut [f32]) {
    // SAFETY: NEON, all `dot_i16_rows2` needs, is baseline on aarch64.
    unsafe { rows_blocked::<2, _>(&I16Dots::<F>(xq), w, sel, y) }
}

/// Whether [`matvec_i16`] with `dotprod` takes `format` by `sdot`/`udot` from split activations
/// ([`Split16`]).
pub(crate) fn takes_split(format: WeightFormat) -> bool {
    has_split(format) || has_k_split(format)
}

/// Quantized weights × 16-bit activations ([`Precision::Fast`](crate::Precision::Fast)) on
/// `path` (a NEON path: `Neon`, `NeonDotprod` or `NeonI8mm`); with `dotprod`, the formats of
/// [`takes_split`] take the `sdot`/`udot` kernels of [`matvec_split`] and [`matvec_k_split`] (the
/// same integer products), from `split` (`xq` split once per token by the
/// caller) or, where it is `None`, from a split made here.
#[target_feature(enable = "neon")]
pub(crate) fn matvec_i16(
    w: &QMatrix<'_>,
    sel: Rows<'_>,
    xq: &QActs16,
    y: &mut [f32],
    path: KernelPath,
    split: Option<&Split16>,
) {
    let dotprod = path != KernelPath::Neon;
    if dotprod && takes_split(w.format()) {
        let owned;
        let s = match split {
            Some(s) => s,
            None => {
                owned = Split16::new(xq);
                &owned
            }
        };
        // SAFETY: `dotprod` is only true on the NeonDotprod and NeonI8mm paths, both used only
        // after run-time detection of their extensions.
        return unsafe {
            if has_split(w.format()) {
                matvec_split(w, sel, xq, s, y)
            } else if w.format() == WeightFormat::IQ4_XS {
                matvec_iq4xs_split(w, sel, xq, s, y)
            } else {
                matvec_k_split(w, sel, xq, s, y)
            }
        };
    }
    match w.format() {
        WeightFormat::Q8_0 => rows_i16::<Q8_0>(w, sel, xq, y),
        WeightFormat::Q4_0 => rows_i16::<Q4_0>(w, sel, xq, y),
        WeightFormat::Q4_1 => rows_i16::<Q4_1>(w, sel, xq, y),
        WeightFormat::Q5_0 => rows_i16::<Q5_0>(w, sel, xq, y),
        WeightFormat::Q5_1 => rows_i16::<Q5_1>(w, sel, xq, y),
        WeightFormat::IQ4_NL => rows_i16::<IQ4_NL>(w, sel, xq, y),
        WeightFormat::Q2_K
        | WeightFormat::Q3_K
        | WeightFormat::Q4_K
        | WeightFormat::Q5_K
        | WeightFormat::Q6_K
        | WeightFormat::IQ4_XS => matvec_k_int(w, sel, &xq.qs, &xq.d, &xq.s, y, |q, x, e| {
            dot16(q, [load_i16x8(&x[e..]), load_i16x8(&x[e + 8..])])
        }),
        // Float and hybrid formats never take the integer path: the scalar reference.
        _ => crate::scalar::matvec_i16(w, sel, xq, y),
    }
}
