//! `y += c * row` for one weight row of any format (`axpy_rows`, row by row).

use std::arch::x86_64::*;

use super::dequant::dequant_block;
use super::hybrid::axpy_hybrid;
use super::kquant::axpy_k;
use super::simd::{float_at, load_float8, PREFETCH};
use crate::arch::tags::{block_bytes, BF16, F16, F32, IQ4_NL, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};
use crate::WeightFormat;

/// `y += c * dequant(row)` for a quantized row (format `F`) of `y.len() / 32` blocks.
///
/// # Safety
/// AVX2/FMA/F16C present.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn axpy_q<const F: u8>(c: f32, row: &[u8], y: &mut [f32]) {
    let nb = y.len() / 32;
    let bb = block_bytes(F);
    assert!(row.len() >= nb * bb);
    let cv = _mm256_set1_ps(c);
    for b in 0..nb {
        // SAFETY: b < nb: block b lies inside `row` (asserted) and
        // y[b*32..b*32+32] inside `y`.
        unsafe {
            _mm_prefetch::<_MM_HINT_T1>(row.as_ptr().wrapping_add(b * bb + PREFETCH) as *const i8);
            let w = dequant_block::<F>(row.as_ptr().add(b * bb));
            let yp = y.as_mut_ptr().add(b * 32);
            for (i, wv) in w.iter().enumerate() {
                let p = yp.add(8 * i);
                _mm256_storeu_ps(p, _mm256_fmadd_ps(*wv, cv, _mm256_loadu_ps(p)));
            }
        }
    }
}

/// `y += c * row` for a float-format row (format `F`) of `y.len()` elements.
///
/// # Safety
/// AVX2/FMA/F16C present.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn axpy_float<const F: u8>(c: f32, row: &[u8], y: &mut [f32]) {
    let n = y.len();
    let eb = block_bytes(F);
    assert!(row.len() >= n * eb);
    let n8 = n / 8 * 8;
    let cv = _mm256_set1_ps(c);
    let mut j = 0;
    while j < n8 {
        // SAFETY: j + 8 <= n: elements j..j+8 are in `row` and `y`.
        unsafe {
            let w = load_float8::<F>(row.as_ptr().add(j * eb));
            let p = y.as_mut_ptr().add(j);
            _mm256_storeu_ps(p, _mm256_fmadd_ps(w, cv, _mm256_loadu_ps(p)));
        }
        j += 8;
    }
    for (jj, yv) in y.iter_mut().enumerate().skip(n8) {
        *yv += c * float_at::<F>(row, jj);
    }
}

/// `y += c * dequant(row)` (`row` has exactly `format.row_bytes(y.len())` bytes).
///
/// # Safety
/// AVX2/FMA/F16C present.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn axpy_row(format: WeightFormat, c: f32, row: &[u8], y: &mut [f32]) {
    // SAFETY: features present per contract; the callees assert lengths.
    unsafe {
        match format {
            WeightFormat::Q8_0 => axpy_q::<Q8_0>(c, row, y),
            WeightFormat::Q4_0 => axpy_q::<Q4_0>(c, row, y),
            WeightFormat::Q4_1 => axpy_q::<Q4_1>(c, row, y),
            WeightFormat::Q5_0 => axpy_q::<Q5_0>(c, row, y),
            WeightFormat::Q5_1 => axpy_q::<Q5_1>(c, row, y),
            WeightFormat::IQ4_NL => axpy_q::<IQ4_NL>(c, row, y),
            WeightFormat::F32 => axpy_float::<F32>(c, row, y),
            WeightFormat::F16 => axpy_float::<F16>(c, row, y),
            WeightFormat::BF16 => axpy_float::<BF16>(c, row, y),
            WeightFormat::Q2_K
            | WeightFormat::Q3_K
            | WeightFormat::Q4_K
            | WeightFormat::Q5_K
            | WeightFormat::Q6_K
            | WeightFormat::IQ4_XS => axpy_k(format, c, row, y),
            WeightFormat::I4Hybrid { outliers_per_row } => {
                axpy_hybrid(usize::from(outliers_per_row), c, row, y.len(), 0, y)
            }
        }
    }
}
