//! `y += c * row` for one weight row of any format (`axpy_rows`, row by row).

use std::arch::aarch64::*;

use super::dequant::{dequant_block, dequant_row};
use super::hybrid::axpy_hybrid;
use super::kquant::axpy_k;
use super::simd::load_f32x4;
use super::vector::axpy_f32;
use crate::arch::tags::{block_bytes, IQ4_NL, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};
use crate::WeightFormat;

#[target_feature(enable = "neon")]
fn axpy_q<const F: u8>(c: f32, row: &[u8], y: &mut [f32]) {
    for (blk, ys) in row.chunks_exact(block_bytes(F)).zip(y.chunks_exact_mut(32)) {
        let w = dequant_block::<F>(blk);
        for (o, v) in ys.chunks_exact_mut(4).zip(&w) {
            let r = vfmaq_n_f32(load_f32x4(o), *v, c);
            // SAFETY: `o` is exactly 4 writable f32.
            unsafe { vst1q_f32(o.as_mut_ptr(), r) };
        }
    }
}

/// `y += c * dequant(row)` (`row` has exactly `format.row_bytes(y.len())`
/// bytes). Float formats: 32 elements at a time converted, then `axpy_f32`.
#[target_feature(enable = "neon")]
pub(crate) fn axpy_row(format: WeightFormat, c: f32, row: &[u8], y: &mut [f32]) {
    match format {
        WeightFormat::Q8_0 => axpy_q::<Q8_0>(c, row, y),
        WeightFormat::Q4_0 => axpy_q::<Q4_0>(c, row, y),
        WeightFormat::Q4_1 => axpy_q::<Q4_1>(c, row, y),
        WeightFormat::Q5_0 => axpy_q::<Q5_0>(c, row, y),
        WeightFormat::Q5_1 => axpy_q::<Q5_1>(c, row, y),
        WeightFormat::IQ4_NL => axpy_q::<IQ4_NL>(c, row, y),
        WeightFormat::Q2_K
        | WeightFormat::Q3_K
        | WeightFormat::Q4_K
        | WeightFormat::Q5_K
        | WeightFormat::Q6_K
        | WeightFormat::IQ4_XS => axpy_k(format, c, row, y),
        WeightFormat::I4Hybrid { outliers_per_row } => {
            axpy_hybrid(usize::from(outliers_per_row), c, row, y.len(), 0, y)
        }
        _ => {
            let eb = format.block_bytes();
            let mut buf = [0f32; 32];
            for (g, ys) in row.chunks(32 * eb).zip(y.chunks_mut(32)) {
                let n = ys.len();
                dequant_row(format, g, &mut buf[..n]);
                axpy_f32(c, &buf[..n], ys);
            }
        }
    }
}
