//! `matvec` with f32 activations ([`Precision::Exact`](crate::Precision::Exact)):
//! exact dots of quantized and float-format rows, dispatched per format.

use std::arch::x86_64::*;

use super::dequant::dequant_block;
use super::hybrid::dot_exact_hybrid;
use super::kquant::dot_exact_k;
use super::simd::{float_at, hsum, load_float8, PREFETCH};
use crate::arch::drivers::rows_with;
use crate::arch::tags::{block_bytes, BF16, F16, F32, IQ4_NL, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};
use crate::arch::Rows;
use crate::QMatrix;
use crate::WeightFormat;

/// Exact dot of a quantized row with f32 `x`.
///
/// # Safety
/// AVX2/FMA/F16C present.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_exact_q<const F: u8>(row: &[u8], x: &[f32]) -> f32 {
    let nb = x.len() / 32;
    let bb = block_bytes(F);
    assert!(row.len() >= nb * bb);
    let mut acc = [_mm256_setzero_ps(); 4];
    for b in 0..nb {
        // SAFETY: b < nb: block b lies inside `row` (asserted) and
        // x[b*32..b*32+32] inside `x`.
        unsafe {
            // Prefetch hint (never faults; wrapping_add keeps it UB-free).
            _mm_prefetch::<_MM_HINT_T0>(row.as_ptr().wrapping_add(b * bb + PREFETCH) as *const i8);
            let w = dequant_block::<F>(row.as_ptr().add(b * bb));
            let xp = x.as_ptr().add(b * 32);
            for i in 0..4 {
                acc[i] = _mm256_fmadd_ps(w[i], _mm256_loadu_ps(xp.add(8 * i)), acc[i]);
            }
        }
    }
    hsum(_mm256_add_ps(
        _mm256_add_ps(acc[0], acc[1]),
        _mm256_add_ps(acc[2], acc[3]),
    ))
}

/// Exact dot of a float-format row with f32 `x`.
///
/// # Safety
/// AVX2/FMA/F16C present.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_exact_float<const F: u8>(row: &[u8], x: &[f32]) -> f32 {
    let n = x.len();
    let eb = block_bytes(F);
    assert!(row.len() >= n * eb);
    let mut acc = [_mm256_setzero_ps(); 4];
    let n32 = n / 32 * 32;
    let n8 = n / 8 * 8;
    let mut j = 0;
    while j < n32 {
        // Prefetch hint (never faults; wrapping_add keeps it UB-free).
        _mm_prefetch::<_MM_HINT_T0>(row.as_ptr().wrapping_add(j * eb + PREFETCH) as *const i8);
        for (i, a) in acc.iter_mut().enumerate() {
            // SAFETY: j + 32 <= n: elements j+8i..j+8i+8 are in `row` and `x`.
            unsafe {
                let w = load_float8::<F>(row.as_ptr().add((j + 8 * i) * eb));
                *a = _mm256_fmadd_ps(w, _mm256_loadu_ps(x.as_ptr().add(j + 8 * i)), *a);
            }
        }
        j += 32;
    }
    while j < n8 {
        // SAFETY: j + 8 <= n.
        unsafe {
            let w = load_float8::<F>(row.as_ptr().add(j * eb));
            acc[0] = _mm256_fmadd_ps(w, _mm256_loadu_ps(x.as_ptr().add(j)), acc[0]);
        }
        j += 8;
    }
    let mut s = hsum(_mm256_add_ps(
        _mm256_add_ps(acc[0], acc[1]),
        _mm256_add_ps(acc[2], acc[3]),
    ));
    for (jj, xv) in x.iter().enumerate().skip(n8) {
        s += float_at::<F>(row, jj) * xv;
    }
    s
}

/// # Safety
/// AVX2/FMA/F16C present.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn matvec_exact(w: &QMatrix<'_>, sel: Rows<'_>, x: &[f32], y: &mut [f32]) {
    // SAFETY: features present per contract; callees check lengths.
    unsafe {
        match w.format() {
            WeightFormat::Q8_0 => rows_with(w, sel, y, |r| dot_exact_q::<Q8_0>(r, x)),
            WeightFormat::Q4_0 => rows_with(w, sel, y, |r| dot_exact_q::<Q4_0>(r, x)),
            WeightFormat::Q4_1 => rows_with(w, sel, y, |r| dot_exact_q::<Q4_1>(r, x)),
            WeightFormat::Q5_0 => rows_with(w, sel, y, |r| dot_exact_q::<Q5_0>(r, x)),
            WeightFormat::Q5_1 => rows_with(w, sel, y, |r| dot_exact_q::<Q5_1>(r, x)),
            WeightFormat::IQ4_NL => rows_with(w, sel, y, |r| dot_exact_q::<IQ4_NL>(r, x)),
            WeightFormat::F32 => rows_with(w, sel, y, |r| dot_exact_float::<F32>(r, x)),
            WeightFormat::F16 => rows_with(w, sel, y, |r| dot_exact_float::<F16>(r, x)),
            WeightFormat::BF16 => rows_with(w, sel, y, |r| dot_exact_float::<BF16>(r, x)),
            WeightFormat::Q2_K
            | WeightFormat::Q3_K
            | WeightFormat::Q4_K
            | WeightFormat::Q5_K
            | WeightFormat::Q6_K
            | WeightFormat::IQ4_XS => {
                let f = w.format();
                rows_with(w, sel, y, |r| dot_exact_k(f, r, x))
            }
            WeightFormat::I4Hybrid { outliers_per_row } => {
                let k = usize::from(outliers_per_row);
                rows_with(w, sel, y, |r| dot_exact_hybrid(k, r, x))
            }
        }
    }
}
