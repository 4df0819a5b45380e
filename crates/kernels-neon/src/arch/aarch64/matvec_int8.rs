//! `matvec` with 8-bit activations ([`Precision::Int8`](crate::Precision::Int8)):
//! widening-multiply integer dots, or `sdot` where `dotprod` was detected.

use std::arch::aarch64::*;

use super::dequant::weights_i8;
use super::kquant::{dot16, matvec_k_int};
use super::kquant_split::{has_k_split, matvec_k_int8_split};
use super::matvec_int8_rows::matvec_int8_rows;
use super::matvec_split::has_split;
use super::simd::{f16_at, load_i8x8_wide};
use crate::arch::drivers::rows_with;
use crate::arch::tags::{block_bytes, has_min, IQ4_NL, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};
use crate::arch::Rows;
use crate::quant::QActs;
use crate::QMatrix;
use crate::WeightFormat;

#[inline]
#[target_feature(enable = "neon")]
fn acts_i8(qs: &[i8]) -> (int8x16_t, int8x16_t) {
    let qs = &qs[..32];
    // SAFETY: `qs` has exactly 32 readable i8 (bounds-checked above).
    unsafe { (vld1q_s8(qs.as_ptr()), vld1q_s8(qs.as_ptr().add(16))) }
}

/// Integer dot of one row with widening multiplies (plain NEON).
#[target_feature(enable = "neon")]
fn dot_int8_row<const F: u8>(row: &[u8], xq: &QActs) -> f32 {
    let mut sumv = vdupq_n_f32(0.0);
    let mut extra = 0f32;
    for (b, blk) in row.chunks_exact(block_bytes(F)).enumerate() {
        let (w0, w1) = weights_i8::<F>(blk);
        let (x0, x1) = acts_i8(&xq.qs[b * 32..]);
        let mut s = vpaddlq_s16(vmull_s8(vget_low_s8(w0), vget_low_s8(x0)));
        s = vpadalq_s16(s, vmull_high_s8(w0, x0));
        s = vpadalq_s16(s, vmull_s8(vget_low_s8(w1), vget_low_s8(x1)));
        s = vpadalq_s16(s, vmull_high_s8(w1, x1));
        sumv = vfmaq_n_f32(sumv, vcvtq_f32_s32(s), f16_at(blk, 0) * xq.d[b]);
        if has_min(F) {
            extra += f16_at(blk, 2) * xq.s[b];
        }
    }
    vaddvq_f32(sumv) + extra
}

/// Whether [`matvec_int8`] with `dotprod` reads each 16 quants' sum (`sum16`): the K-quant rows'
/// offsets and `Q4_0`'s.
pub(crate) fn int8_sums16(format: WeightFormat) -> bool {
    has_k_split(format) || format == WeightFormat::Q4_0
}

/// Quantized weights × 8-bit activations; with `dotprod`, the 32-element block formats four rows
/// a step ([`matvec_int8_rows`]) and the K-quants by super-blocks ([`matvec_k_int8_split`]),
/// `sum16` given for the formats of [`int8_sums16`].
#[target_feature(enable = "neon")]
pub(crate) fn matvec_int8(
    w: &QMatrix<'_>,
    sel: Rows<'_>,
    xq: &QActs,
    y: &mut [f32],
    dotprod: bool,
    sum16: Option<&[i32]>,
) {
    match w.format() {
        f if dotprod && has_split(f) => {
            let sum16 = if int8_sums16(f) {
                sum16.expect("the per-16 sums of Q4_0 rows' 8-bit activations")
            } else {
                &[]
            };
            // SAFETY: `dotprod` is only true for the NeonDotprod and NeonI8mm paths, which are
            // only used after is_aarch64_feature_detected!("dotprod").
            unsafe { matvec_int8_rows(w, sel, xq, sum16, y) }
        }
        WeightFormat::Q8_0 => rows_with(w, sel, y, |r| dot_int8_row::<Q8_0>(r, xq)),
        WeightFormat::Q4_0 => rows_with(w, sel, y, |r| dot_int8_row::<Q4_0>(r, xq)),
        WeightFormat::Q4_1 => rows_with(w, sel, y, |r| dot_int8_row::<Q4_1>(r, xq)),
        WeightFormat::Q5_0 => rows_with(w, sel, y, |r| dot_int8_row::<Q5_0>(r, xq)),
        WeightFormat::Q5_1 => rows_with(w, sel, y, |r| dot_int8_row::<Q5_1>(r, xq)),
        WeightFormat::IQ4_NL => rows_with(w, sel, y, |r| dot_int8_row::<IQ4_NL>(r, xq)),
        f if dotprod && has_k_split(f) => {
            let sum16 = sum16.expect("the per-16 sums of the K-quant rows' 8-bit activations");
            // SAFETY: `dotprod` is only true for KernelPath::NeonDotprod, which is only used
            // after is_aarch64_feature_detected!("dotprod").
            unsafe { matvec_k_int8_split(w, sel, xq, sum16, y) }
        }
        WeightFormat::Q2_K
        | WeightFormat::Q3_K
        | WeightFormat::Q4_K
        | WeightFormat::Q5_K
        | WeightFormat::Q6_K
        | WeightFormat::IQ4_XS => matvec_k_int(w, sel, &xq.qs, &xq.d, &xq.s, y, |q, x, e| {
            dot16(q, [load_i8x8_wide(&x[e..]), load_i8x8_wide(&x[e + 8..])])
        }),
        // Float and hybrid formats never take the integer path: the scalar reference.
        _ => crate::scalar::matvec_int8(w, sel, xq, y),
    }
}
