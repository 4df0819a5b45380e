//! `matvec` with f32 activations ([`Precision::Exact`](crate::Precision::Exact)):
//! exact dots of quantized and float-format rows, dispatched per format.

use std::arch::aarch64::*;

use super::dequant::{dequant_block, dequant_float, float8};
use super::hybrid::dot_exact_hybrid;
use super::kquant::dot_exact_k;
use super::simd::load_f32x4;
use crate::arch::drivers::{rows_blocked, rows_with, RowDots};
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
pub(super) fn dot_exact_float<const F: u8>(row: &[u8], x: &[f32]) -> f32 {
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
    float_tail::<F>(acc, row, x)
}

/// Four float-format rows at once, each summed exactly as [`dot_exact_float`] sums it alone (its
/// own four accumulators, the same order), the activations loaded once for the four.
#[target_feature(enable = "neon")]
fn dot4_exact_float<const F: u8>(rows: [&[u8]; 4], x: &[f32]) -> [f32; 4] {
    let eb = block_bytes(F);
    let n32 = x.len() / 32 * 32;
    let (mut a0, mut a1, mut a2, mut a3) = (
        [vdupq_n_f32(0.0); 4],
        [vdupq_n_f32(0.0); 4],
        [vdupq_n_f32(0.0); 4],
        [vdupq_n_f32(0.0); 4],
    );
    let g = |r: usize| rows[r][..n32 * eb].chunks_exact(32 * eb);
    for ((((g0, g1), g2), g3), xs) in g(0)
        .zip(g(1))
        .zip(g(2))
        .zip(g(3))
        .zip(x[..n32].chunks_exact(32))
    {
        for i in 0..4 {
            let (xl, xh) = (load_f32x4(&xs[8 * i..]), load_f32x4(&xs[8 * i + 4..]));
            let (a, b) = ((2 * i) & 3, (2 * i + 1) & 3);
            let at = 8 * eb * i..8 * eb * (i + 1);
            for (acc, g) in [(&mut a0, g0), (&mut a1, g1), (&mut a2, g2), (&mut a3, g3)] {
                let [lo, hi] = float8::<F>(&g[at.clone()]);
                acc[a] = vfmaq_f32(acc[a], lo, xl);
                acc[b] = vfmaq_f32(acc[b], hi, xh);
            }
        }
    }
    [
        float_tail::<F>(a0, rows[0], x),
        float_tail::<F>(a1, rows[1], x),
        float_tail::<F>(a2, rows[2], x),
        float_tail::<F>(a3, rows[3], x),
    ]
}

/// A float row's sum from its four accumulators over the whole groups of 32, with its last
/// `x.len() % 32` elements added (through `dequant_float`).
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn float_tail<const F: u8>(mut acc: [float32x4_t; 4], row: &[u8], x: &[f32]) -> f32 {
    let eb = block_bytes(F);
    let n32 = x.len() / 32 * 32;
    let n = x.len() - n32;
    // (A row without a tail skips the buffer and the call: most rows, at ~90 instructions each.)
    let tail: f32 = if n == 0 {
        [0f32; 0].iter().sum()
    } else {
        let mut buf = [0f32; 32];
        dequant_float::<F>(&row[n32 * eb..], &mut buf[..n]);
        let (xs, n4) = (&x[n32..], n / 4 * 4);
        for i in (0..n4).step_by(4) {
            let a = &mut acc[(i / 4) & 3];
            *a = vfmaq_f32(*a, load_f32x4(&buf[i..]), load_f32x4(&xs[i..]));
        }
        (n4..n).map(|i| buf[i] * xs[i]).sum()
    };
    vaddvq_f32(vaddq_f32(
        vaddq_f32(acc[0], acc[1]),
        vaddq_f32(acc[2], acc[3]),
    )) + tail
}

/// [`dot4_exact_float`] four rows at a time, [`dot_exact_float`] the rest.
struct FloatDots<'a, const F: u8>(&'a [f32]);

impl<const F: u8> RowDots for FloatDots<'_, F> {
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn dots<const N: usize>(&self, rows: [&[u8]; N]) -> [f32; N] {
        if N == 4 {
            let s = dot4_exact_float::<F>(std::array::from_fn(|r| rows[r]), self.0);
            return std::array::from_fn(|r| s[r]);
        }
        rows.map(|r| dot_exact_float::<F>(r, self.0))
    }
}

/// The rows `sel` of `w` (float format tag `F`), four at a time.
#[target_feature(enable = "neon")]
fn float_rows<const F: u8>(w: &QMatrix<'_>, sel: Rows<'_>, x: &[f32], y: &mut [f32]) {
    // SAFETY: NEON is baseline on aarch64.
    unsafe { rows_blocked::<4, _>(&FloatDots::<F>(x), w, sel, y) }
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
        WeightFormat::F32 => float_rows::<F32>(w, sel, x, y),
        WeightFormat::F16 => float_rows::<F16>(w, sel, x, y),
        WeightFormat::BF16 => float_rows::<BF16>(w, sel, x, y),
    }
}
