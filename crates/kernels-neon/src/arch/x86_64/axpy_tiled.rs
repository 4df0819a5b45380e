//! Column-tiled `axpy_rows` for `Q8_0`/`Q4_0`/`Q4_1`/`Q5_0`/`Q5_1`/`IQ4_NL`: the sums of a column
//! tile stay in registers across all listed rows.

use std::arch::x86_64::*;

use super::dequant::dequant_block;
use crate::arch::tags::{block_bytes, IQ4_NL, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};
use crate::WeightFormat;

/// How far ahead in the row list [`axpy_rows_tiled`] prefetches.
const TILED_PREFETCH_ROWS: usize = 8;

/// `y += Σ_k coeffs[k] · row(rows[k])[blocks]` for a quantized format, where
/// the blocks of each row start at byte `b0` and `y.len() / 32` of them are
/// used: the sparse down projection (`axpy_rows`) in column tiles of 64, whose
/// sums stay in 8 registers across all listed rows (one load and store of `y`
/// per tile instead of one per row). Returns `false` (and does nothing) for
/// formats it does not handle.
///
/// # Safety
/// AVX2/FMA/F16C present.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn axpy_rows_tiled(
    format: WeightFormat,
    data: &[u8],
    row_bytes: usize,
    b0: usize,
    rows: &[u32],
    coeffs: &[f32],
    y: &mut [f32],
) -> bool {
    // SAFETY: features present per contract; the callee checks every bound.
    unsafe {
        match format {
            WeightFormat::Q8_0 => axpy_rows_tiled_q::<Q8_0>(data, row_bytes, b0, rows, coeffs, y),
            WeightFormat::Q4_0 => axpy_rows_tiled_q::<Q4_0>(data, row_bytes, b0, rows, coeffs, y),
            WeightFormat::Q4_1 => axpy_rows_tiled_q::<Q4_1>(data, row_bytes, b0, rows, coeffs, y),
            WeightFormat::Q5_0 => axpy_rows_tiled_q::<Q5_0>(data, row_bytes, b0, rows, coeffs, y),
            WeightFormat::Q5_1 => axpy_rows_tiled_q::<Q5_1>(data, row_bytes, b0, rows, coeffs, y),
            WeightFormat::IQ4_NL => {
                axpy_rows_tiled_q::<IQ4_NL>(data, row_bytes, b0, rows, coeffs, y)
            }
            _ => return false,
        }
    }
    true
}

/// # Safety
/// AVX2/FMA/F16C present.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn axpy_rows_tiled_q<const F: u8>(
    data: &[u8],
    row_bytes: usize,
    b0: usize,
    rows: &[u32],
    coeffs: &[f32],
    y: &mut [f32],
) {
    let bb = block_bytes(F);
    let nb = y.len() / 32;
    assert_eq!(rows.len(), coeffs.len());
    assert!(b0 + nb * bb <= row_bytes);
    let max_row = rows.iter().copied().max().unwrap_or(0) as usize;
    assert!(rows.is_empty() || (max_row + 1) * row_bytes <= data.len());
    let base = data.as_ptr();
    // Rows go in groups whose column ranges fit in L2, so the later tile
    // passes of a group find its rows there (one pass over all rows of a
    // large matrix would fetch them from DRAM once per tile).
    let group = (TILED_GROUP_BYTES / (nb * bb).max(1)).max(16);
    let mut g0 = 0;
    while g0 < rows.len() {
        let g1 = (g0 + group).min(rows.len());
        // SAFETY: features present per contract; every listed row lies in
        // `data` and b0 + nb * bb <= row_bytes (asserted above).
        unsafe { axpy_tiles::<F>(base, row_bytes, b0, nb, rows, g0..g1, coeffs, y) };
        g0 = g1;
    }
}

/// Bytes of row ranges per group in [`axpy_rows_tiled_q`] (a share of a
/// 512 KiB L2, leaving room for the prefetched next rows).
const TILED_GROUP_BYTES: usize = 192 * 1024;

/// The tile passes of [`axpy_rows_tiled_q`] over `rows[group]`.
///
/// # Safety
/// AVX2/FMA/F16C present; every listed row lies in the matrix at `base`
/// and `b0 + nb * bb <= row_bytes` (checked by the caller).
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn axpy_tiles<const F: u8>(
    base: *const u8,
    row_bytes: usize,
    b0: usize,
    nb: usize,
    all_rows: &[u32],
    group: std::ops::Range<usize>,
    coeffs: &[f32],
    y: &mut [f32],
) {
    let bb = block_bytes(F);
    let g0 = group.start;
    let rows = &all_rows[group.clone()];
    let coeffs = &coeffs[group];
    let mut b = 0;
    while b < nb {
        let two = nb - b >= 2;
        let off = b0 + b * bb;
        let span = if two { 2 * bb } else { bb };
        let mut acc = [_mm256_setzero_ps(); 8];
        for (k, (&r, &c)) in rows.iter().zip(coeffs).enumerate() {
            // Listed rows are scattered, so the hardware prefetcher cannot
            // follow them: the first tile pass fetches each upcoming row's
            // whole range (later passes find it in L2), later ones their tile.
            if let Some(&next) = all_rows.get(g0 + k + TILED_PREFETCH_ROWS) {
                if b == 0 {
                    let q = base.wrapping_add(next as usize * row_bytes + b0);
                    let mut o = 0;
                    while o < nb * bb {
                        _mm_prefetch::<_MM_HINT_T0>(q.wrapping_add(o) as *const i8);
                        o += 64;
                    }
                    _mm_prefetch::<_MM_HINT_T0>(q.wrapping_add(nb * bb - 1) as *const i8);
                } else {
                    let q = base.wrapping_add(next as usize * row_bytes + off);
                    _mm_prefetch::<_MM_HINT_T0>(q as *const i8);
                    _mm_prefetch::<_MM_HINT_T0>(q.wrapping_add(span - 1) as *const i8);
                }
            }
            if c == 0.0 {
                continue;
            }
            let cv = _mm256_set1_ps(c);
            // SAFETY: row r lies in the matrix at `base` (caller contract),
            // and its bytes off..off + span lie in the row (b + 2 <= nb when
            // `two`, b0 + nb * bb <= row_bytes).
            unsafe {
                let p = base.add(r as usize * row_bytes + off);
                let w = dequant_block::<F>(p);
                for i in 0..4 {
                    acc[i] = _mm256_fmadd_ps(w[i], cv, acc[i]);
                }
                if two {
                    let w = dequant_block::<F>(p.add(bb));
                    for i in 0..4 {
                        acc[4 + i] = _mm256_fmadd_ps(w[i], cv, acc[4 + i]);
                    }
                }
            }
        }
        let lanes = if two { 8 } else { 4 };
        for (i, a) in acc.iter().take(lanes).enumerate() {
            // SAFETY: (b * 32 + 8 * i) + 8 <= (b + lanes / 4) * 32 <= nb * 32 <= y.len().
            unsafe {
                let yp = y.as_mut_ptr().add(b * 32 + 8 * i);
                _mm256_storeu_ps(yp, _mm256_add_ps(_mm256_loadu_ps(yp), *a));
            }
        }
        b += if two { 2 } else { 1 };
    }
}
