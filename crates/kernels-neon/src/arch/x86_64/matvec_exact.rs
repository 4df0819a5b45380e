//! `matvec` with f32 activations ([`Precision::Exact`](crate::Precision::Exact)):
//! exact dots of quantized and float-format rows, dispatched per format.

use std::arch::x86_64::*;

use super::dequant::dequant_block;
use super::hybrid::dot_exact_hybrid;
use super::kquant::dot_exact_k;
use super::simd::{float_at, hsum, load_float8, prefetch_distance, PREFETCH};
use crate::arch::drivers::{rows_dense_or_listed, rows_with, RowDots};
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
            _mm_prefetch::<_MM_HINT_T1>(row.as_ptr().wrapping_add(b * bb + PREFETCH) as *const i8);
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

/// Exact dots of `N` float-format rows with f32 `x`, sharing the activation loads. Per row the
/// operations and their order are those of `N = 1` (four accumulators over 32 elements a step,
/// then 8-element steps on the first, then the scalar tail), so each result is independent of `N`.
///
/// # Safety
/// AVX2/FMA/F16C present.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_exact_float<const F: u8, const N: usize>(rows: [&[u8]; N], x: &[f32]) -> [f32; N] {
    let n = x.len();
    let eb = block_bytes(F);
    for row in rows {
        assert!(row.len() >= n * eb);
    }
    let mut acc = [[_mm256_setzero_ps(); 4]; N];
    let n32 = n / 32 * 32;
    let n8 = n / 8 * 8;
    let mut j = 0;
    while j < n32 {
        for row in rows {
            // Prefetch hints, one a cache line of the 32 elements' (never fault; wrapping_add
            // keeps them UB-free), a few rows ahead for a dense matrix's one row a step
            // (`prefetch_distance`: F32 decode of the SYNTHETIC d 1024 file 24.7-24.8 -> 29.6
            // tok/s, 21 -> 25 GB/s, 2 threads, AVX-512 VM, 2026-12-06; 8 KiB ahead no better).
            for line in (0..32 * eb).step_by(64) {
                let ahead = row
                    .as_ptr()
                    .wrapping_add(j * eb + line + prefetch_distance::<N>());
                _mm_prefetch::<_MM_HINT_T1>(ahead as *const i8);
            }
        }
        for i in 0..4 {
            // SAFETY: j + 32 <= n: elements j+8i..j+8i+8 are in every row and in `x`.
            unsafe {
                let xv = _mm256_loadu_ps(x.as_ptr().add(j + 8 * i));
                for (a, row) in acc.iter_mut().zip(rows) {
                    let w = load_float8::<F>(row.as_ptr().add((j + 8 * i) * eb));
                    a[i] = _mm256_fmadd_ps(w, xv, a[i]);
                }
            }
        }
        j += 32;
    }
    while j < n8 {
        // SAFETY: j + 8 <= n.
        unsafe {
            let xv = _mm256_loadu_ps(x.as_ptr().add(j));
            for (a, row) in acc.iter_mut().zip(rows) {
                let w = load_float8::<F>(row.as_ptr().add(j * eb));
                a[0] = _mm256_fmadd_ps(w, xv, a[0]);
            }
        }
        j += 8;
    }
    std::array::from_fn(|r| {
        let a = &acc[r];
        let mut s = hsum(_mm256_add_ps(
            _mm256_add_ps(a[0], a[1]),
            _mm256_add_ps(a[2], a[3]),
        ));
        for (jj, xv) in x.iter().enumerate().skip(n8) {
            s += float_at::<F>(rows[r], jj) * xv;
        }
        s
    })
}

/// [`dot_exact_float`] as a [`RowDots`] kernel.
struct FloatDots<'a, const F: u8> {
    x: &'a [f32],
}

impl<const F: u8> RowDots for FloatDots<'_, F> {
    #[inline(always)]
    unsafe fn dots<const N: usize>(&self, rows: [&[u8]; N]) -> [f32; N] {
        // SAFETY: AVX2/FMA/F16C present per this method's contract.
        unsafe { dot_exact_float::<F, N>(rows, self.x) }
    }
}

/// Float-format rows: one a step for a dense matrix, four for listed rows
/// ([`rows_dense_or_listed`]; two or three dense rows a step measured 35-45% slower on the
/// SYNTHETIC d 1024 F32 file).
///
/// # Safety
/// AVX2/FMA/F16C present.
#[inline(always)]
unsafe fn float_rows<const F: u8>(w: &QMatrix<'_>, sel: Rows<'_>, x: &[f32], y: &mut [f32]) {
    // SAFETY: features present per this function's contract.
    unsafe { rows_dense_or_listed(&FloatDots::<F> { x }, w, sel, y) }
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
            WeightFormat::F32 => float_rows::<F32>(w, sel, x, y),
            WeightFormat::F16 => float_rows::<F16>(w, sel, x, y),
            WeightFormat::BF16 => float_rows::<BF16>(w, sel, x, y),
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
