//! Row drivers shared by the architecture kernels: which weight rows go to
//! which per-row (or per-`R`-rows) dot kernel, in what order, with which
//! prefetch hints. Written once here; each architecture supplies only the
//! dot kernels.
//!
//! Invariant: the drivers are `#[inline(always)]` and generic over the
//! kernel (a closure or a [`RowDots`] type), so each call site in a
//! `#[target_feature]` function monomorphizes to the same loop it had when
//! the driver was written out there: no dynamic call per row, and the kernel
//! is inlined under the caller's target features.

use crate::arch::Rows;
use crate::{QMatrix, WeightFormat};

/// `y[i] = f(row sel.get(i))`, one row at a time, prefetching the head of
/// listed row `i + 2` (see [`Rows::prefetch`]).
#[inline(always)]
pub(crate) fn rows_with(
    w: &QMatrix<'_>,
    sel: Rows<'_>,
    y: &mut [f32],
    mut f: impl FnMut(&[u8]) -> f32,
) {
    for (i, yv) in y.iter_mut().enumerate() {
        sel.prefetch(w, i + 2, 1);
        *yv = f(w.row_data(sel.get(i)));
    }
}

/// A dot kernel over several weight rows at once: the dots of `N` rows with
/// one activation vector (held by the implementor), sharing the activation
/// loads between the rows. Per row the result must not depend on `N`.
pub(crate) trait RowDots {
    /// The dots of `rows` (each a whole weight row) with the activations.
    ///
    /// # Safety
    /// The CPU features the implementor's kernel is compiled for are present.
    unsafe fn dots<const N: usize>(&self, rows: [&[u8]; N]) -> [f32; N];
}

/// `R` rows per step (prefetching the heads of the next `R` listed rows),
/// then pairs where `R > 2` (short lists, such as the few rows of a
/// neuron-store unit, and tails: pairs still share the activations), then
/// single rows.
///
/// # Safety
/// As [`RowDots::dots`]: the features of `k`'s kernel are present.
#[inline(always)]
pub(crate) unsafe fn rows_blocked<const R: usize, K: RowDots>(
    k: &K,
    w: &QMatrix<'_>,
    sel: Rows<'_>,
    y: &mut [f32],
) {
    let mut i = 0;
    while i + R <= y.len() {
        sel.prefetch(w, i + R, R);
        let rows = std::array::from_fn(|r| w.row_data(sel.get(i + r)));
        // SAFETY: features present per this function's contract.
        let s = unsafe { k.dots::<R>(rows) };
        y[i..i + R].copy_from_slice(&s);
        i += R;
    }
    while R > 2 && i + 2 <= y.len() {
        let rows = [w.row_data(sel.get(i)), w.row_data(sel.get(i + 1))];
        // SAFETY: features present per this function's contract.
        let s = unsafe { k.dots::<2>(rows) };
        y[i..i + 2].copy_from_slice(&s);
        i += 2;
    }
    while i < y.len() {
        // SAFETY: features present per this function's contract.
        y[i] = unsafe { k.dots::<1>([w.row_data(sel.get(i))]) }[0];
        i += 1;
    }
}

/// [`rows_blocked`] one row per step for a dense matrix (its rows stream from memory, where fewer
/// concurrent streams per thread measured faster) and four for listed rows (scattered: more rows
/// in flight hide their latency, and they share the activation loads).
///
/// # Safety
/// As [`RowDots::dots`]: the features of `k`'s kernel are present.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn rows_dense_or_listed<K: RowDots>(
    k: &K,
    w: &QMatrix<'_>,
    sel: Rows<'_>,
    y: &mut [f32],
) {
    // SAFETY: features present per this function's contract.
    unsafe {
        if matches!(sel, Rows::From(_)) {
            rows_blocked::<1, _>(k, w, sel, y)
        } else {
            rows_blocked::<4, _>(k, w, sel, y)
        }
    }
}

/// `y += c * dequant(row)` for a K-quant row (any super-block format), one
/// 256-element super-block at a time: `dequant` fills a buffer on the
/// stack, `axpy` adds `c` times it to the block's 256 outputs.
#[inline(always)]
pub(crate) fn axpy_superblocks(
    format: WeightFormat,
    c: f32,
    row: &[u8],
    y: &mut [f32],
    mut dequant: impl FnMut(&[u8], &mut [f32; 256]),
    mut axpy: impl FnMut(f32, &[f32], &mut [f32]),
) {
    let mut buf = [0f32; 256];
    for (blk, ys) in row
        .chunks_exact(format.block_bytes())
        .zip(y.chunks_exact_mut(256))
    {
        dequant(blk, &mut buf);
        axpy(c, &buf, ys);
    }
}
