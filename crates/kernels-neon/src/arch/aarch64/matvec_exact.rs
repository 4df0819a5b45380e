//! `matvec` with f32 activations ([`Precision::Exact`](crate::Precision::Exact)):
//! exact dots of quantized and float-format rows, dispatched per format.

use std::arch::aarch64::*;

use super::dequant::{dequant_block, dequant_float, float8};
use super::hybrid::dot_exact_hybrid;
use super::kquant::dot_exact_k;
use super::simd::load_f32x4;
use crate::arch::drivers::rows_with;
use crate::arch::tags::{block_bytes, BF16, F16, F32, IQ4_NL, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};
use crate::arch::Rows;
use crate::QMatrix;
use crate::WeightFormat;

#[target_feature(enable = "neon")]
fn dot_exact_q<const F: u8>(row: &[u8], x: &[f32]) -> f32 {
    let mut acc = [vdupq_n_f32(0.0); 4];
    for (blk, xs) in row.chunks_exact(block_bytes(F)).zip(x.chunks_exact(32)) {
        let w = dequant_block::<F>(blk);
        for i in 0..8 {
            acc[i & 3] = vfmaq_f32(acc[i & 3], w[i], load_f32x4(&xs[4 * i..]));
        }
    }
    vaddvq_f32(vaddq_f32(
        vaddq_f32(acc[0], acc[1]),
        vaddq_f32(acc[2], acc[3]),
    ))
}

/// Float-format rows (tag `F`): 32 elements at a time converted to f32 in registers
/// ([`float8`]), then FMA into four accumulators (a shorter last group through `dequant_float`).
#[target_feature(enable = "neon")]
fn dot_exact_float<const F: u8>(row: &[u8], x: &[f32]) -> f32 {
    let eb = block_bytes(F);
    let n32 = x.len() / 32 * 32;
    let mut acc = [vdupq_n_f32(0.0); 4];
    for (g, xs) in row[..n32 * eb]
        .chunks_exact(32 * eb)
        .zip(x[..n32].chunks_exact(32))
    {
        for i in 0..4 {
            let [lo, hi] = float8::<F>(&g[8 * eb * i..8 * eb * (i + 1)]);
            let (a, b) = ((2 * i) & 3, (2 * i + 1) & 3);
            acc[a] = vfmaq_f32(acc[a], lo, load_f32x4(&xs[8 * i..]));
            acc[b] = vfmaq_f32(acc[b], hi, load_f32x4(&xs[8 * i + 4..]));
        }
    }
    let n = x.len() - n32;
    let mut buf = [0f32; 32];
    dequant_float::<F>(&row[n32 * eb..], &mut buf[..n]);
    let (xs, n4) = (&x[n32..], n / 4 * 4);
    for i in (0..n4).step_by(4) {
        let a = &mut acc[(i / 4) & 3];
        *a = vfmaq_f32(*a, load_f32x4(&buf[i..]), load_f32x4(&xs[i..]));
    }
    let tail: f32 = (n4..n).map(|i| buf[i] * xs[i]).sum();
    vaddvq_f32(vaddq_f32(
        vaddq_f32(acc[0], acc[1]),
        vaddq_f32(acc[2], acc[3]),
    )) + tail
}

#[target_feature(enable = "neon")]
pub(crate) fn matvec_exact(w: &QMatrix<'_>, sel: Rows<'_>, x: &[f32], y: &mut [f32]) {
    let format = w.format();
    match format {
        WeightFormat::Q8_0 => rows_with(w, sel, y, |r| dot_exact_q::<Q8_0>(r, x)),
        WeightFormat::Q4_0 => rows_with(w, sel, y, |r| dot_exact_q::<Q4_0>(r, x)),
        WeightFormat::Q4_1 => rows_with(w, sel, y, |r| dot_exact_q::<Q4_1>(r, x)),
        WeightFormat::Q5_0 => rows_with(w, sel, y, |r| dot_exact_q::<Q5_0>(r, x)),
        WeightFormat::Q5_1 => rows_with(w, sel, y, |r| dot_exact_q::<Q5_1>(r, x)),
        WeightFormat::IQ4_NL => rows_with(w, sel, y, |r| dot_exact_q::<IQ4_NL>(r, x)),
        WeightFormat::Q2_K
        | WeightFormat::Q3_K
        | WeightFormat::Q4_K
        | WeightFormat::Q5_K
        | WeightFormat::Q6_K
        | WeightFormat::IQ4_XS => rows_with(w, sel, y, |r| dot_exact_k(format, r, x)),
        WeightFormat::I4Hybrid { outliers_per_row } => {
            let k = usize::from(outliers_per_row);
            rows_with(w, sel, y, |r| dot_exact_hybrid(k, r, x))
        }
        WeightFormat::F32 => rows_with(w, sel, y, |r| dot_exact_float::<F32>(r, x)),
        WeightFormat::F16 => rows_with(w, sel, y, |r| dot_exact_float::<F16>(r, x)),
        WeightFormat::BF16 => rows_with(w, sel, y, |r| dot_exact_float::<BF16>(r, x)),
    }
}
