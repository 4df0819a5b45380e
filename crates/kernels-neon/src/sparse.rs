//! Sparse kernels for activation sparsity (PowerInfer / PowerInfer-2).
//!
//! In a ReLU-family FFN most neurons of a token are inactive, so only the
//! rows of the gate/up projections (and the columns of the down
//! projection) of the neurons predicted to fire need to be read:
//!
//! * [`matvec_rows`]: `y[i] = dot(W[rows[i]], x)` for a list of rows
//!   (llama.cpp/PowerInfer `mul_mat_idx`). It runs the same per-row dot
//!   kernels as [`matvec`](crate::matvec), so with all rows in order the
//!   result is bit-identical to `matvec` on the same path and precision.
//! * [`axpy_rows`]: `y += Σ_i coeffs[i] · W_t[rows[i]]`, the down projection
//!   stored transposed (row `r` of `W_t` is neuron `r`'s down column):
//!   PowerInfer's `axpy`. Each listed row is dequantized and multiply-added
//!   into `y` (fused on AVX2 and NEON).
//! * [`gate_up_sparse`]: PowerInfer-2's two phases: gate rows first, then the
//!   up rows only for the neurons whose activated gate output survives a
//!   threshold.
//!
//! Measured (x86_64 AVX2, 2 shared cores, `benches/sparse.rs`, `Fast`,
//! sorted random subsets): `matvec_rows` on Q4_1 1536×576 costs 46-56 ns
//! per selected row from 5% to 100% of the rows; on Q4_0 14336×4096 (rows
//! from DRAM, 4 matrices cycled) 169 ns per row at 100% (13.6 GB/s of
//! weights, against 14-17 GB/s for a plain streaming sum in the same run),
//! 190-200 ns at 25-50% and 280-370 ns at 10-5%. `axpy_rows` on the
//! transposed Q4_0 14336×4096 down matrix: 575-630 ns per row (about 4 GB/s).
//! Both kernels prefetch the upcoming listed rows (without it: 2x slower for
//! small `matvec_rows` fractions, 3x for `axpy_rows` at 50%).
//!
//! Row lists need not be sorted; every index is checked (an out-of-range
//! row is a [`KernelError::RowOutOfRange`], never a panic). Duplicates are
//! allowed (they are simply computed, or accumulated, twice).

use rayon::prelude::*;

use crate::arch::{self, Rows};
use crate::{
    active_path, check_len, check_path, chunk_rows_setting, matvec_chunk, Activation, Acts,
    KernelError, KernelPath, Precision, QMatrix, WeightFormat, HYBRID_HEADER,
};

/// Checks that every listed row is `< w.rows()`.
fn check_rows(what: &'static str, w: &QMatrix, rows: &[u32]) -> Result<(), KernelError> {
    match rows.iter().find(|&&r| r as usize >= w.rows()) {
        None => Ok(()),
        Some(&r) => Err(KernelError::RowOutOfRange {
            what,
            row: r as usize,
            rows: w.rows(),
        }),
    }
}

/// In automatic chunk mode, row lists with fewer weight bytes than this run
/// on the calling thread: measured on x86_64 (2 threads, Q4_1 576 columns),
/// 76 listed rows (27 KB) took 12.7 µs through rayon and 4.1 µs inline.
const MIN_PARALLEL_BYTES: usize = 64 << 10;

/// `y[i] = dot(W[rows[i]], x)` with activations already prepared; parallel
/// over chunks of the row list (the [`set_chunk_rows`](crate::set_chunk_rows)
/// setting applies, counted in listed rows; in automatic mode lists under
/// `MIN_PARALLEL_BYTES` of weights run inline).
fn rows_into(path: KernelPath, w: &QMatrix, rows: &[u32], acts: &Acts, x: &[f32], y: &mut [f32]) {
    let chunk = matvec_chunk(rows.len());
    let small =
        chunk_rows_setting() == 0 && rows.len().saturating_mul(w.row_bytes()) < MIN_PARALLEL_BYTES;
    if small || rows.len() <= chunk {
        acts.run(path, w, Rows::List(rows), x, y);
    } else {
        y.par_chunks_mut(chunk)
            .zip(rows.par_chunks(chunk))
            .for_each(|(ys, rs)| acts.run(path, w, Rows::List(rs), x, ys));
    }
}

/// Sparse matrix-vector product over selected rows: `y[i] = dot(W[rows[i]], x)`.
///
/// `x.len() == w.cols()`, `y.len() == rows.len()`; rows may come in any
/// order (an empty list is a no-op). The activations are quantized once per
/// call as in [`matvec`](crate::matvec) (see [`Precision`]); the work is
/// split over chunks of the row list with rayon. With `rows = 0..w.rows()`
/// the result equals `matvec` exactly.
pub fn matvec_rows(
    w: &QMatrix,
    rows: &[u32],
    x: &[f32],
    y: &mut [f32],
    precision: Precision,
) -> Result<(), KernelError> {
    matvec_rows_with(active_path(), w, rows, x, y, precision)
}

/// [`matvec_rows`] on an explicit path (for tests and benchmarks).
#[doc(hidden)]
pub fn matvec_rows_with(
    path: KernelPath,
    w: &QMatrix,
    rows: &[u32],
    x: &[f32],
    y: &mut [f32],
    precision: Precision,
) -> Result<(), KernelError> {
    check_path(path)?;
    check_len("matvec_rows x", w.cols(), x.len())?;
    check_len("matvec_rows y", rows.len(), y.len())?;
    check_rows("matvec_rows rows", w, rows)?;
    if rows.is_empty() {
        return Ok(());
    }
    if w.cols() == 0 {
        y.fill(0.0);
        return Ok(());
    }
    let acts = Acts::new(path, w.format(), x, precision);
    rows_into(path, w, rows, &acts, x, y);
    Ok(())
}

/// [`axpy_rows`] prefetches the column range of the listed row this many
/// entries ahead.
const AXPY_PREFETCH_ROWS: usize = 2;
/// Minimum number of `y` elements per parallel work item of [`axpy_rows`].
const MIN_AXPY_COLS: usize = 256;
/// Below this many weight elements in total, [`axpy_rows`] runs on the
/// calling thread only (the rayon overhead would dominate).
const MIN_AXPY_PARALLEL: usize = 1 << 16;

/// Sparse transposed product (the down projection of an FFN):
/// `y += Σ_i coeffs[i] · W_t[rows[i]]`.
///
/// `W_t` is the down matrix stored transposed (`w_t.rows()` = number of
/// neurons, row `r` = neuron `r`'s output column), `coeffs.len() ==
/// rows.len()`, `y.len() == w_t.cols()`. Each listed row is dequantized and
/// multiply-added into `y` in f32 (fused dequantize + FMA on AVX2 and NEON);
/// rows whose coefficient is exactly `0.0` are skipped. `y` is split into
/// column ranges, each accumulated by one rayon work item over all listed
/// rows, so no partial vectors need reducing; small problems run on the
/// calling thread.
pub fn axpy_rows(
    w_t: &QMatrix,
    rows: &[u32],
    coeffs: &[f32],
    y: &mut [f32],
) -> Result<(), KernelError> {
    axpy_rows_with(active_path(), w_t, rows, coeffs, y)
}

/// [`axpy_rows`] on an explicit path (for tests and benchmarks).
#[doc(hidden)]
pub fn axpy_rows_with(
    path: KernelPath,
    w_t: &QMatrix,
    rows: &[u32],
    coeffs: &[f32],
    y: &mut [f32],
) -> Result<(), KernelError> {
    check_path(path)?;
    check_len("axpy_rows coeffs", rows.len(), coeffs.len())?;
    check_len("axpy_rows y", w_t.cols(), y.len())?;
    check_rows("axpy_rows rows", w_t, rows)?;
    let cols = w_t.cols();
    if rows.is_empty() || cols == 0 {
        return Ok(());
    }
    let format = w_t.format();
    let (bl, bb) = (format.block_len(), format.block_bytes());
    // Column range [c0, c0 + ys.len()) of every listed row; c0 is a multiple
    // of `bl.max(32)` (hence of the block length: 32, or 256 for K-quant
    // super-blocks), so the range is whole blocks.
    let run = |c0: usize, ys: &mut [f32]| {
        if format.is_hybrid() {
            // Hybrid rows keep their outliers after the nibbles: each kernel
            // gets the whole row and picks the column range out of it. The
            // prefetch covers the scales, the range's nibbles and the outliers.
            let k = crate::scalar::hybrid_k(format);
            let (n0, n1) = (HYBRID_HEADER + c0 / 2, HYBRID_HEADER + (c0 + ys.len()) / 2);
            let tail = HYBRID_HEADER + cols / 2;
            for (i, (&r, &c)) in rows.iter().zip(coeffs).enumerate() {
                if let Some(&next) = rows.get(i + AXPY_PREFETCH_ROWS) {
                    let d = w_t.row_data(next as usize);
                    arch::prefetch(&d[..HYBRID_HEADER]);
                    arch::prefetch(&d[n0..n1]);
                    arch::prefetch(&d[tail..]);
                }
                if c != 0.0 {
                    arch::axpy_hybrid(path, k, c, w_t.row_data(r as usize), cols, c0, ys);
                }
            }
            return;
        }
        let b0 = c0 / bl * bb;
        if ys.len() % 32 == 0 && arch::axpy_rows_tiled(path, w_t, b0, rows, coeffs, ys) {
            return;
        }
        let nbytes = ys.len().div_ceil(bl) * bb;
        let seg = |r: u32| &w_t.row_data(r as usize)[b0..b0 + nbytes];
        for (k, (&r, &c)) in rows.iter().zip(coeffs).enumerate() {
            if let Some(&next) = rows.get(k + AXPY_PREFETCH_ROWS) {
                arch::prefetch(seg(next));
            }
            if c == 0.0 {
                continue;
            }
            arch::axpy_row(path, format, c, seg(r), ys);
        }
    };
    let threads = rayon::current_num_threads().max(1);
    let range = cols
        .div_ceil(threads * 2)
        .max(MIN_AXPY_COLS)
        .next_multiple_of(bl.max(32));
    if threads == 1 || cols <= range || rows.len().saturating_mul(cols) < MIN_AXPY_PARALLEL {
        run(0, y);
    } else {
        y.par_chunks_mut(range)
            .enumerate()
            .for_each(|(k, ys)| run(k * range, ys));
    }
    Ok(())
}

/// `acc += fixed(Σ_i coeffs[i] · W_t[rows[i]])`: [`axpy_rows`] into a zeroed vector, then
/// [`add_fixed`](crate::add_fixed) of it into `acc`, with the same integers on every path (an
/// offloaded store unit's down projection, added to its worker's order-free sum).
///
/// Where the path has a fused kernel (AVX2: the formats of the tiled `axpy_rows`, a few dozen
/// rows at most) each tile's sums go to `acc` as they leave their registers, and `scratch` is not
/// touched; otherwise `scratch` (`w_t.cols()` long, all zeros: a caller keeps one buffer for
/// every call) takes the sum and is left all zeros again.
pub fn axpy_rows_fixed(
    w_t: &QMatrix,
    rows: &[u32],
    coeffs: &[f32],
    scratch: &mut [f32],
    acc: &mut [i64],
) -> Result<(), KernelError> {
    axpy_rows_fixed_with(active_path(), w_t, rows, coeffs, scratch, acc)
}

/// [`axpy_rows_fixed`] on an explicit path (for tests and benchmarks).
#[doc(hidden)]
pub fn axpy_rows_fixed_with(
    path: KernelPath,
    w_t: &QMatrix,
    rows: &[u32],
    coeffs: &[f32],
    scratch: &mut [f32],
    acc: &mut [i64],
) -> Result<(), KernelError> {
    check_path(path)?;
    check_len("axpy_rows_fixed coeffs", rows.len(), coeffs.len())?;
    check_len("axpy_rows_fixed acc", w_t.cols(), acc.len())?;
    check_rows("axpy_rows_fixed rows", w_t, rows)?;
    if arch::axpy_rows_fixed(path, w_t, rows, coeffs, acc) {
        return Ok(());
    }
    check_len("axpy_rows_fixed scratch", w_t.cols(), scratch.len())?;
    debug_assert!(scratch.iter().all(|&v| v == 0.0), "scratch not zeroed");
    axpy_rows_with(path, w_t, rows, coeffs, scratch)?;
    arch::add_fixed(path, acc, scratch);
    Ok(())
}

/// PowerInfer-2's gated FFN up phase over predicted-active neurons.
///
/// For each listed neuron `r = rows[i]`: `g = dot(gate[r], x)`; if
/// `|act(g)| <= threshold` (for [`Activation::Relu`] with threshold 0: `g <=
/// 0`) `out[i] = 0` and the up row is skipped, otherwise `out[i] = act(g) ·
/// dot(up[r], x)`. Returns how many up rows were computed.
///
/// `gate` and `up` must have the same shape (their formats may differ),
/// `x.len() == cols`, `out.len() == rows.len()`. Both phases are
/// [`matvec_rows`] calls sharing one activation quantization (when the
/// formats allow), so each output equals the dense `act(matvec(gate)) *
/// matvec(up)` exactly where it was computed.
#[allow(clippy::too_many_arguments)]
pub fn gate_up_sparse(
    gate: &QMatrix,
    up: &QMatrix,
    rows: &[u32],
    x: &[f32],
    threshold: f32,
    act: Activation,
    out: &mut [f32],
    precision: Precision,
) -> Result<usize, KernelError> {
    gate_up_sparse_with(
        active_path(),
        gate,
        up,
        rows,
        x,
        threshold,
        act,
        out,
        precision,
    )
}

/// [`gate_up_sparse`] on an explicit path (for tests and benchmarks).
#[doc(hidden)]
#[allow(clippy::too_many_arguments)]
pub fn gate_up_sparse_with(
    path: KernelPath,
    gate: &QMatrix,
    up: &QMatrix,
    rows: &[u32],
    x: &[f32],
    threshold: f32,
    act: Activation,
    out: &mut [f32],
    precision: Precision,
) -> Result<usize, KernelError> {
    check_path(path)?;
    check_len("gate_up_sparse up rows", gate.rows(), up.rows())?;
    check_len("gate_up_sparse up cols", gate.cols(), up.cols())?;
    check_len("gate_up_sparse x", gate.cols(), x.len())?;
    check_len("gate_up_sparse out", rows.len(), out.len())?;
    check_rows("gate_up_sparse rows", gate, rows)?;
    if rows.is_empty() {
        return Ok(0);
    }
    // Phase 1: gate rows, activation, threshold.
    let acts_g = Acts::new(path, gate.format(), x, precision);
    rows_into(path, gate, rows, &acts_g, x, out);
    let mut keep = Vec::new();
    let mut pos = Vec::new();
    for (i, (o, &r)) in out.iter_mut().zip(rows).enumerate() {
        let a = crate::act_value(act, *o);
        if a.abs() <= threshold {
            *o = 0.0;
        } else {
            *o = a;
            keep.push(r);
            pos.push(i);
        }
    }
    if keep.is_empty() {
        return Ok(0);
    }
    // Phase 2: up rows of the surviving neurons only.
    let owned;
    let acts_u = if acts_g.fits(path, up.format(), precision) {
        &acts_g
    } else {
        owned = Acts::new(path, up.format(), x, precision);
        &owned
    };
    let mut ups = vec![0f32; keep.len()];
    rows_into(path, up, &keep, acts_u, x, &mut ups);
    for (&i, u) in pos.iter().zip(&ups) {
        out[i] *= u;
    }
    Ok(keep.len())
}

/// Activations prepared (quantized as the precision requires) once, for many small products with
/// matrices of one format: the few-row units of a neuron store, each its own [`QMatrix`]. See
/// [`matvec_rows_prepared`].
pub struct PreparedActs<'x> {
    path: KernelPath,
    precision: Precision,
    acts: Acts,
    x: &'x [f32],
}

impl PreparedActs<'_> {
    /// The length of the prepared vector.
    pub fn len(&self) -> usize {
        self.x.len()
    }

    /// Whether the prepared vector is empty.
    pub fn is_empty(&self) -> bool {
        self.x.is_empty()
    }
}

/// Prepares `x` for [`matvec_rows_prepared`] over matrices in `format` at `precision`.
pub fn prepare_acts(format: WeightFormat, x: &[f32], precision: Precision) -> PreparedActs<'_> {
    let path = active_path();
    PreparedActs {
        path,
        precision,
        acts: Acts::new(path, format, x, precision),
        x,
    }
}

/// [`matvec_rows`] with activations prepared by [`prepare_acts`], on the calling thread (no rayon:
/// meant for small matrices computed by many callers at once). `w` must have the format and the
/// column count the activations were prepared for; results equal [`matvec_rows`] at that precision.
pub fn matvec_rows_prepared(
    acts: &PreparedActs<'_>,
    w: &QMatrix,
    rows: &[u32],
    y: &mut [f32],
) -> Result<(), KernelError> {
    if !acts.acts.fits(acts.path, w.format(), acts.precision) {
        return Err(KernelError::Unsupported {
            what: "matvec_rows_prepared (activations prepared for another format)",
            format: w.format(),
        });
    }
    check_len("matvec_rows_prepared x", w.cols(), acts.x.len())?;
    check_len("matvec_rows_prepared y", rows.len(), y.len())?;
    check_rows("matvec_rows_prepared rows", w, rows)?;
    if rows.is_empty() {
        return Ok(());
    }
    if w.cols() == 0 {
        y.fill(0.0);
        return Ok(());
    }
    acts.acts.run(acts.path, w, Rows::List(rows), acts.x, y);
    Ok(())
}
