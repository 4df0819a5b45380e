//! The batched product with a matrix stored transposed: `y[t] = Σ_j x[t][j] · W[j]`.
//!
//! A neuron store keeps each neuron's down column as a row (`W` is `neurons × d_model`), so a
//! prompt's down projection over a chunk of neurons contracts over the rows of `W`, not its columns
//! as [`crate::matmul()`] does. Each work item takes a band of output columns (whole blocks of the
//! format), dequantizes those blocks of every row into the same f32 tile [`crate::matmul()`] uses,
//! transposed, and runs the same register-blocked microkernel over the tokens. Where the path
//! has an 8-bit tile over a transposed matrix (`arch::tile_int8_t`, AVX-512), `Fast` and `Int8`
//! products of at least `INT_TILE_MIN_TOKENS` tokens instead quantize the band's columns to 8 bits
//! per 32 rows of `W` straight from its rows, 32 at a time, and every token to 8 bits per 32 (as
//! `Int8` activations are), and take the 8-bit tile, as a prompt's other products do.

use std::mem::size_of;

use rayon::prelude::*;

use crate::out_rows::OutPtr;
use crate::quant::QActs;
use crate::{
    arch, check_len, check_path, matmul_chunk, KernelError, KernelPath, Precision, QMatrix,
    WeightFormat, INT_TILE_MIN_TOKENS,
};

/// Rows of `W` transposed into a work item's tile together.
const T_ROWS: usize = 16;

/// Output columns of one work item of [`matmul_t`] on the 8-bit tile (before rounding up to whole
/// blocks): four groups of 16 lanes, so each row's part is dequantized in calls of 64 (with 32,
/// the 0.5B Qwen's 1216 × 896 chunk of down rows took 1.18-1.22x as long as the same matrix
/// through `matmul`, with 64 1.12-1.16x, with 128 1.24-1.30x: fewer work items than threads × 4).
const INT8_BAND: usize = 64;

/// Output columns of one work item of [`matmul_t`] over a matrix of `format`: whole blocks of the
/// format (hybrid rows are dequantized whole first, so any width); [`INT8_BAND`] on the 8-bit tile,
/// else `matmul`'s chunk of rows.
fn band_cols(format: WeightFormat, int8: bool) -> usize {
    if format.is_hybrid() {
        matmul_chunk()
    } else if int8 {
        INT8_BAND.next_multiple_of(format.block_len())
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
        && arch::has_tile_int8_t(path)
}

/// Bytes [`matmul_t`] allocates on the active kernel path for a `rows × cols` matrix of `format`
/// over `n` tokens in `precision` with `threads` work items at a time (the pool's threads),
/// besides `x` and `y`: per band in flight, its output (`n` tokens of its columns, f32, until
/// copied into `y`), its tile (the band's columns of every row, transposed, f32),
/// `T_ROWS` rows of the band (the tile kernels allocate nothing); a hybrid matrix is also
/// dequantized whole (`rows × cols` f32) first. On the 8-bit tile instead, the tokens quantized
/// once (rows padded to whole blocks of 32), and per band in flight 32 of its rows in f32 and its
/// columns quantized and packed.
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
    let int8 = int8(path, format, n, precision);
    let band = band_cols(format, int8);
    let flying = threads.clamp(1, cols.div_ceil(band));
    if int8 {
        let rows_p = rows.next_multiple_of(32);
        let nb = rows_p / 32;
        // Quants, scales, their products with the sums, and the sums of 16: 48 bytes a block.
        let acts = n * (size_of::<QActs>() + 48 * nb);
        let nc = band.min(cols);
        let per_band = 4 * n * nc + arch::tile_int8_t_bytes(path, nc, rows_p, n);
        return (acts + flying * per_band) as u64;
    }
    let flying = flying as u64;
    let flying_cols = (flying * band as u64).min(cols as u64);
    let (rows, cols, n) = (rows as u64, cols as u64, n as u64);
    let whole = if format.is_hybrid() { rows * cols } else { 0 };
    4 * (n * flying_cols + flying_cols * rows + flying * (T_ROWS * band) as u64 + whole)
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
    let whole: Option<Vec<f32>> = format.is_hybrid().then(|| {
        let mut f = vec![0f32; rows * cols];
        f.par_chunks_mut(cols)
            .enumerate()
            .for_each(|(j, dst)| arch::dequant_row(path, format, w.row_data(j), dst));
        f
    });
    // On the 8-bit tile: rows padded to whole blocks, every token quantized once.
    let int8 = int8(path, format, n, precision);
    let band = band_cols(format, int8);
    let stride = if int8 {
        rows.next_multiple_of(32)
    } else {
        rows
    };
    let acts: Vec<QActs> = if int8 {
        (0..n)
            .into_par_iter()
            .map(|t| {
                let xt = &x[t * rows..(t + 1) * rows];
                if stride == rows {
                    return QActs::quantize(path, xt).with_sums16();
                }
                let mut padded = vec![0f32; stride];
                padded[..rows].copy_from_slice(xt);
                QActs::quantize(path, &padded).with_sums16()
            })
            .collect()
    } else {
        Vec::new()
    };
    // Row `j`'s band of columns `c0 .. c0 + nc` dequantized into `dst`.
    let dequant = |j: usize, c0: usize, dst: &mut [f32]| match &whole {
        Some(f) => dst.copy_from_slice(&f[j * cols + c0..j * cols + c0 + dst.len()]),
        None => {
            let span = (c0 / block * format.block_bytes())
                ..((c0 + dst.len()) / block * format.block_bytes());
            arch::dequant_row(path, format, &w.row_data(j)[span], dst)
        }
    };
    let out = OutPtr(y.as_mut_ptr());
    (0..cols.div_ceil(band)).into_par_iter().for_each(|b| {
        let c0 = b * band;
        let nc = band.min(cols - c0);
        let mut local = vec![0f32; n * nc];
        if int8 {
            // The band's rows 32 at a time, each column's 32 quantized and packed straight
            // from them: no transposed f32 tile.
            let fill = |j0: usize, panel: &mut [f32]| {
                let width = panel.len() / 32;
                for (r, row) in panel.chunks_exact_mut(width).enumerate() {
                    let dst = &mut row[..nc];
                    match j0 + r < rows {
                        true => dequant(j0 + r, c0, dst),
                        false => dst.fill(0.0),
                    }
                }
            };
            arch::tile_int8_t(path, nc, stride, fill, &acts, &mut local);
        } else {
            // tile[i * rows + j] = W[j][c0 + i]: the band of columns as rows of `W` transposed.
            let mut tile = vec![0f32; nc * rows];
            let mut part = vec![0f32; T_ROWS * nc];
            // T_ROWS rows at a time: their band dequantized side by side, then written to the tile
            // a column at a time, T_ROWS consecutive floats per write.
            for j0 in (0..rows).step_by(T_ROWS) {
                let jn = T_ROWS.min(rows - j0);
                for (r, dst) in part.chunks_exact_mut(nc).take(jn).enumerate() {
                    dequant(j0 + r, c0, dst);
                }
                for (i, col) in tile.chunks_exact_mut(rows).enumerate() {
                    for (r, v) in col[j0..j0 + jn].iter_mut().enumerate() {
                        *v = part[r * nc + i];
                    }
                }
            }
            arch::tile(path, &tile, nc, rows, x, n, &mut local);
        }
        // SAFETY: `y` has `n * cols` elements (checked above) and stays mutably borrowed until
        // the parallel loop ends; this band alone writes columns `c0 .. c0 + nc`.
        unsafe { out.write_rows(&local, n, cols, c0, nc) };
    });
    Ok(())
}
