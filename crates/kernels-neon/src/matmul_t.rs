//! The batched product with a matrix stored transposed: `y[t] = Σ_j x[t][j] · W[j]`.
//!
//! A neuron store keeps each neuron's down column as a row (`W` is `neurons × d_model`), so a
//! prompt's down projection over a chunk of neurons contracts over the rows of `W`, not its columns
//! as [`crate::matmul`] does. Each work item takes a band of output columns (whole blocks of the
//! format), dequantizes those blocks of every row into the same f32 tile [`crate::matmul`] uses,
//! transposed, and runs the same register-blocked microkernel over the tokens. Where the path
//! has an 8-bit tile over quantized rows (`arch::tile_int8_rows`, AVX-512), `Fast` and `Int8`
//! products of at least `INT_TILE_MIN_TOKENS` tokens quantize that transposed tile to 8 bits per
//! 32 rows of `W` and every token to 8 bits per 32 (as `Int8` activations are) and take the
//! 8-bit tile instead, as a prompt's other products do.

use std::mem::size_of;

use rayon::prelude::*;

use crate::quant::QActs;
use crate::{
    arch, check_len, check_path, matmul_chunk, KernelError, KernelPath, Precision, QMatrix,
    WeightFormat, INT_TILE_MIN_TOKENS,
};

/// Rows of `W` transposed into a work item's tile together.
const T_ROWS: usize = 16;

/// Output columns of one work item of [`matmul_t`] over a matrix of `format`: whole blocks of the
/// format (hybrid rows are dequantized whole first, so any width).
fn band_cols(format: WeightFormat) -> usize {
    if format.is_hybrid() {
        matmul_chunk()
    } else {
        matmul_chunk().next_multiple_of(format.block_len())
    }
}

/// Whether [`matmul_t`] of `n` tokens in `precision` over a matrix of `format` takes the 8-bit
/// tile on `path`: `Fast` and `Int8` from [`INT_TILE_MIN_TOKENS`] tokens where the path has one
/// over quantized rows, for the block-quantized formats (hybrid rows keep f32).
fn int8(path: KernelPath, format: WeightFormat, n: usize, precision: Precision) -> bool {
    precision != Precision::Exact
        && n >= INT_TILE_MIN_TOKENS
        && !format.is_hybrid()
        && arch::has_tile_int8_rows(path)
}

/// Bytes [`matmul_t`] allocates on the active kernel path for a `rows × cols` matrix of `format`
/// over `n` tokens in `precision` with `threads` work items at a time (the pool's threads),
/// besides `x` and `y`: every band's output (`n × cols` f32 in all, held until copied into `y`)
/// and, per band in flight, its tile (the band's columns of every row, transposed, f32),
/// [`T_ROWS`] rows of the band and what the tile kernel allocates; a hybrid matrix is also
/// dequantized whole (`rows × cols` f32) first. On the 8-bit tile, the tokens quantized once
/// (rows padded to whole blocks of 32), and per band its tile quantized and repacked.
pub fn matmul_t_scratch_bytes(
    format: WeightFormat,
    rows: usize,
    cols: usize,
    n: usize,
    threads: usize,
    precision: Precision,
) -> u64 {
    if n == 0 || rows == 0 || cols == 0 {
        return 0;
    }
    let path = crate::active_path();
    let band = band_cols(format);
    let flying = threads.clamp(1, cols.div_ceil(band));
    if int8(path, format, n, precision) {
        let rows_p = rows.next_multiple_of(32);
        let nb = rows_p / 32;
        // Quants, scales, their products with the sums, and the sums of 16: 48 bytes a block.
        let acts = n * (size_of::<QActs>() + 48 * nb);
        let per_band = 4 * band * rows_p
            + 4 * T_ROWS * band
            + band * 40 * nb
            + arch::tile_int8_rows_bytes(path, band, rows_p, n);
        return (4 * n * cols + acts + flying * per_band) as u64;
    }
    let kernel = arch::tile_scratch_bytes(path, band.min(cols), rows) as u64;
    let flying = flying as u64;
    let flying_cols = (flying * band as u64).min(cols as u64);
    let (rows, cols, n) = (rows as u64, cols as u64, n as u64);
    let whole = if format.is_hybrid() { rows * cols } else { 0 };
    4 * (n * cols + flying_cols * rows + flying * (T_ROWS * band) as u64 + whole) + flying * kernel
}

/// `y[t*cols + c] = Σ_j x[t*rows + j] · W[j][c]` for `n` tokens (`x`: `n × rows`, `y`: `n × cols`,
/// token-major): the product with `w` transposed. In f32 (exact summation of the dequantized
/// weights) in [`Precision::Exact`], and wherever the path has no 8-bit tile over quantized rows;
/// else `Fast` and `Int8` products of at least [`INT_TILE_MIN_TOKENS`] tokens multiply 8-bit
/// quants of both (each 32 of `W`'s rows per output column, each 32 of a token's values, one f32
/// scale each), as llama.cpp's prompts multiply a Q8_0 matrix.
pub fn matmul_t(
    w: &QMatrix,
    x: &[f32],
    n: usize,
    y: &mut [f32],
    precision: Precision,
) -> Result<(), KernelError> {
    matmul_t_with(crate::active_path(), w, x, n, y, precision)
}

/// [`matmul_t`] on an explicit path (for tests and benchmarks).
#[doc(hidden)]
pub fn matmul_t_with(
    path: KernelPath,
    w: &QMatrix,
    x: &[f32],
    n: usize,
    y: &mut [f32],
    precision: Precision,
) -> Result<(), KernelError> {
    check_path(path)?;
    let (rows, cols) = (w.rows(), w.cols());
    let overflow = |a: usize, b: usize| {
        a.checked_mul(b)
            .ok_or(KernelError::Layout(crate::LayoutError::Overflow {
                rows: a,
                cols: b,
            }))
    };
    check_len("matmul_t x", overflow(n, rows)?, x.len())?;
    check_len("matmul_t y", overflow(n, cols)?, y.len())?;
    if n == 0 || cols == 0 {
        return Ok(());
    }
    if rows == 0 {
        y.fill(0.0);
        return Ok(());
    }
    let format = w.format();
    // A band of output columns is whole blocks of every row: each work item dequantizes its own
    // blocks (the matrix stays quantized, in cache). Hybrid rows (scales and outliers per row) are
    // dequantized whole once instead.
    let block = format.block_len();
    let band = band_cols(format);
    let whole: Option<Vec<f32>> = format.is_hybrid().then(|| {
        let mut f = vec![0f32; rows * cols];
        f.par_chunks_mut(cols)
            .enumerate()
            .for_each(|(j, dst)| arch::dequant_row(path, format, w.row_data(j), dst));
        f
    });
    // On the 8-bit tile: rows padded to whole blocks, every token quantized once.
    let int8 = int8(path, format, n, precision);
    let stride = if int8 {
        rows.next_multiple_of(32)
    } else {
        rows
    };
    let acts: Vec<QActs> = if int8 {
        (0..n)
            .into_par_iter()
            .map(|t| {
                let mut xt = vec![0f32; stride];
                xt[..rows].copy_from_slice(&x[t * rows..(t + 1) * rows]);
                QActs::quantize(path, &xt).with_sums16()
            })
            .collect()
    } else {
        Vec::new()
    };
    let bands: Vec<Vec<f32>> = (0..cols.div_ceil(band))
        .into_par_iter()
        .map(|b| {
            let c0 = b * band;
            let nc = band.min(cols - c0);
            // tile[i * stride + j] = W[j][c0 + i]: the band of columns as rows of `W` transposed
            // (zero past `rows`).
            let mut tile = vec![0f32; nc * stride];
            let mut part = vec![0f32; T_ROWS * nc];
            let span =
                (c0 / block * format.block_bytes())..((c0 + nc) / block * format.block_bytes());
            // T_ROWS rows at a time: their band dequantized side by side, then written to the tile
            // a column at a time, T_ROWS consecutive floats per write.
            for j0 in (0..rows).step_by(T_ROWS) {
                let jn = T_ROWS.min(rows - j0);
                for (r, dst) in part.chunks_exact_mut(nc).take(jn).enumerate() {
                    let j = j0 + r;
                    match &whole {
                        Some(f) => dst.copy_from_slice(&f[j * cols + c0..j * cols + c0 + nc]),
                        None => arch::dequant_row(path, format, &w.row_data(j)[span.clone()], dst),
                    }
                }
                for (i, col) in tile.chunks_exact_mut(stride).enumerate() {
                    for (r, v) in col[j0..j0 + jn].iter_mut().enumerate() {
                        *v = part[r * nc + i];
                    }
                }
            }
            let mut local = vec![0f32; n * nc];
            if int8 {
                // The rows one after another, each a whole number of blocks.
                let wq = QActs::quantize(path, &tile);
                arch::tile_int8_rows(path, &wq, nc, stride, &acts, &mut local);
            } else {
                arch::tile(path, &tile, nc, rows, x, n, &mut local);
            }
            local
        })
        .collect();
    for (b, local) in bands.iter().enumerate() {
        let c0 = b * band;
        let nc = band.min(cols - c0);
        for (t, src) in local.chunks_exact(nc).enumerate() {
            y[t * cols + c0..t * cols + c0 + nc].copy_from_slice(src);
        }
    }
    Ok(())
}
