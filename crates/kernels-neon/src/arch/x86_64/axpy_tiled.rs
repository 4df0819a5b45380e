//! Column-tiled `axpy_rows` for `Q8_0`/`Q4_0`/`Q4_1`/`Q5_0`/`Q5_1`/`IQ4_NL`: the sums of a column
//! tile stay in registers across all listed rows; `axpy_rows_fixed` adds them to a fixed-point sum
//! as they leave the registers.

use std::arch::x86_64::*;

use super::dequant::dequant_block;
use super::vector::{add_fixed8, add_fixed8_dq};
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
    let group = group_rows(nb * bb);
    let sink = Sink::F32(y.as_mut_ptr());
    let mut g0 = 0;
    while g0 < rows.len() {
        let g1 = (g0 + group).min(rows.len());
        // SAFETY: features present per contract; every listed row lies in
        // `data`, b0 + nb * bb <= row_bytes (asserted above) and `y` holds
        // nb * 32 elements.
        unsafe { axpy_tiles::<F>(base, row_bytes, b0, nb, rows, g0..g1, coeffs, sink) };
        g0 = g1;
    }
}

/// Rows per group of [`axpy_rows_tiled`] over rows of `range_bytes` each.
fn group_rows(range_bytes: usize) -> usize {
    (TILED_GROUP_BYTES / range_bytes.max(1)).max(16)
}

/// [`axpy_rows_tiled`] over whole rows of `cols` elements into a zeroed `y`, then
/// `crate::add_fixed(acc, y)`, with each tile's sums converted to fixed point as they
/// leave their registers (no `y`): the same integers, since `0 + s` is `s` but for the
/// sign of a zero, which the conversion drops. Returns `false` (and does nothing) for
/// formats it does not handle, `cols` not a multiple of 32, or more rows than one group
/// (`axpy_rows` would add the groups' sums in f32 before the conversion).
///
/// # Safety
/// AVX2/FMA/F16C present.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn axpy_rows_fixed(
    format: WeightFormat,
    data: &[u8],
    row_bytes: usize,
    cols: usize,
    rows: &[u32],
    coeffs: &[f32],
    acc: &mut [i64],
) -> bool {
    // SAFETY: features present per contract.
    unsafe { rows_fixed(format, data, row_bytes, cols, rows, coeffs, acc, false) }
}

/// [`axpy_rows_fixed`] converting with AVX-512DQ's `vcvtps2qq` (as `vector::add_fixed`).
///
/// # Safety
/// AVX-512F/DQ, AVX2, FMA and F16C present.
#[target_feature(enable = "avx512f,avx512dq,avx2,fma,f16c")]
pub(crate) unsafe fn axpy_rows_fixed_dq(
    format: WeightFormat,
    data: &[u8],
    row_bytes: usize,
    cols: usize,
    rows: &[u32],
    coeffs: &[f32],
    acc: &mut [i64],
) -> bool {
    // SAFETY: features present per contract.
    unsafe { rows_fixed(format, data, row_bytes, cols, rows, coeffs, acc, true) }
}

/// The body of [`axpy_rows_fixed`] and [`axpy_rows_fixed_dq`], inlined into each (without
/// target features of its own, so that the intrinsics compile with the caller's: the DQ
/// conversion inlines only there).
///
/// # Safety
/// AVX2/FMA/F16C present, and AVX-512F/DQ where `dq`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn rows_fixed(
    format: WeightFormat,
    data: &[u8],
    row_bytes: usize,
    cols: usize,
    rows: &[u32],
    coeffs: &[f32],
    acc: &mut [i64],
    dq: bool,
) -> bool {
    use WeightFormat as W;
    if !matches!(
        format,
        W::Q8_0 | W::Q4_0 | W::Q4_1 | W::Q5_0 | W::Q5_1 | W::IQ4_NL
    ) {
        return false;
    }
    let (bb, nb) = (format.block_bytes(), cols / 32);
    if cols % 32 != 0 || rows.len() > group_rows(nb * bb) {
        return false;
    }
    assert_eq!(rows.len(), coeffs.len());
    assert!(nb * bb <= row_bytes && acc.len() >= cols);
    let max_row = rows.iter().copied().max().unwrap_or(0) as usize;
    assert!(rows.is_empty() || (max_row + 1) * row_bytes <= data.len());
    let sink = match dq {
        true => Sink::FixedDq(acc.as_mut_ptr()),
        false => Sink::Fixed(acc.as_mut_ptr()),
    };
    let (base, all) = (data.as_ptr(), 0..rows.len());
    // SAFETY: features present per contract; every listed row lies in `data`,
    // nb * bb <= row_bytes and `acc` holds nb * 32 elements (asserted above).
    unsafe {
        match format {
            WeightFormat::Q8_0 => {
                axpy_tiles::<Q8_0>(base, row_bytes, 0, nb, rows, all, coeffs, sink)
            }
            WeightFormat::Q4_0 => {
                axpy_tiles::<Q4_0>(base, row_bytes, 0, nb, rows, all, coeffs, sink)
            }
            WeightFormat::Q4_1 => {
                axpy_tiles::<Q4_1>(base, row_bytes, 0, nb, rows, all, coeffs, sink)
            }
            WeightFormat::Q5_0 => {
                axpy_tiles::<Q5_0>(base, row_bytes, 0, nb, rows, all, coeffs, sink)
            }
            WeightFormat::Q5_1 => {
                axpy_tiles::<Q5_1>(base, row_bytes, 0, nb, rows, all, coeffs, sink)
            }
            _ => axpy_tiles::<IQ4_NL>(base, row_bytes, 0, nb, rows, all, coeffs, sink),
        }
    }
    true
}

/// Where [`axpy_tiles`] puts a tile's sums: added to f32 `y`, or added to `acc` in fixed
/// point (`crate::add_fixed`'s integers).
#[derive(Clone, Copy)]
enum Sink {
    F32(*mut f32),
    Fixed(*mut i64),
    /// Fixed point by `vcvtps2qq`: AVX-512F/DQ present.
    FixedDq(*mut i64),
}

impl Sink {
    /// Adds the eight sums `s` at element `at`.
    ///
    /// # Safety
    /// AVX2/FMA/F16C present; elements `at..at + 8` lie in the sink's buffer. Inlined into
    /// the caller's target features (it has none of its own).
    #[inline(always)]
    unsafe fn add(self, at: usize, s: __m256) {
        match self {
            // SAFETY: at + 8 <= the buffer's length (caller contract).
            Sink::F32(y) => unsafe {
                let yp = y.add(at);
                _mm256_storeu_ps(yp, _mm256_add_ps(_mm256_loadu_ps(yp), s));
            },
            // SAFETY: as above.
            Sink::Fixed(acc) => unsafe { add_fixed8(acc.add(at), s) },
            // SAFETY: as above, and AVX-512F/DQ present (the variant's contract).
            Sink::FixedDq(acc) => unsafe { add_fixed8_dq(acc.add(at), s) },
        }
    }
}

/// Bytes of row ranges per group in [`axpy_rows_tiled_q`] (a share of a
/// 512 KiB L2, leaving room for the prefetched next rows).
const TILED_GROUP_BYTES: usize = 192 * 1024;

/// The tile passes of [`axpy_rows_tiled_q`] over `rows[group]`, inlined into the caller's
/// target features (it has none of its own: the sink's conversion may need AVX-512).
///
/// # Safety
/// AVX2/FMA/F16C present; every listed row lies in the matrix at `base`,
/// `b0 + nb * bb <= row_bytes` and the sink holds `nb * 32` elements (checked
/// by the caller).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn axpy_tiles<const F: u8>(
    base: *const u8,
    row_bytes: usize,
    b0: usize,
    nb: usize,
    all_rows: &[u32],
    group: std::ops::Range<usize>,
    coeffs: &[f32],
    sink: Sink,
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
        // SAFETY: AVX2/FMA/F16C present per contract, in the
        // caller's features this function is inlined into.
        let mut acc = unsafe { [_mm256_setzero_ps(); 8] };
        for (k, (&r, &c)) in rows.iter().zip(coeffs).enumerate() {
            // Listed rows are scattered, so the hardware prefetcher cannot
            // follow them: the first tile pass fetches each upcoming row's
            // whole range (later passes find it in L2), later ones their tile.
            if let Some(&next) = all_rows.get(g0 + k + TILED_PREFETCH_ROWS) {
                if b == 0 {
                    let q = base.wrapping_add(next as usize * row_bytes + b0);
                    let mut o = 0;
                    while o < nb * bb {
                        // SAFETY: a prefetch never faults.
                        unsafe { _mm_prefetch::<_MM_HINT_T1>(q.wrapping_add(o) as *const i8) };
                        o += 64;
                    }
                    // SAFETY: a prefetch never faults.
                    unsafe {
                        _mm_prefetch::<_MM_HINT_T1>(q.wrapping_add(nb * bb - 1) as *const i8)
                    };
                } else {
                    let q = base.wrapping_add(next as usize * row_bytes + off);
                    // SAFETY: a prefetch never faults.
                    unsafe {
                        _mm_prefetch::<_MM_HINT_T1>(q as *const i8);
                        _mm_prefetch::<_MM_HINT_T1>(q.wrapping_add(span - 1) as *const i8);
                    }
                }
            }
            if c == 0.0 {
                continue;
            }
            // SAFETY: AVX present per contract.
            let cv = unsafe { _mm256_set1_ps(c) };
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
            // SAFETY: (b * 32 + 8 * i) + 8 <= (b + lanes / 4) * 32 <= nb * 32, which the
            // sink holds (caller contract).
            unsafe { sink.add(b * 32 + 8 * i, *a) };
        }
        b += if two { 2 } else { 1 };
    }
}
