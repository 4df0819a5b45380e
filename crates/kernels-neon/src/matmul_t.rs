//! The batched product with a matrix stored transposed: `y[t] = Σ_j x[t][j] · W[j]`.
//!
//! A neuron store keeps each neuron's down column as a row (`W` is `neurons × d_model`), so a
//! prompt's down projection over a chunk of neurons contracts over the rows of `W`, not its columns
//! as [`crate::matmul`] does. The rows are dequantized once into f32, and each work item transposes
//! a band of output columns into the same f32 tile [`crate::matmul`] uses and runs the same
//! register-blocked microkernel over the tokens.

use rayon::prelude::*;

use crate::{arch, check_len, check_path, matmul_chunk, KernelError, KernelPath, QMatrix};

/// `y[t*cols + c] = Σ_j x[t*rows + j] · W[j][c]` for `n` tokens (`x`: `n × rows`, `y`: `n × cols`,
/// token-major): the product with `w` transposed, in f32 (exact summation of the dequantized
/// weights, in any [`crate::Precision`]).
pub fn matmul_t(w: &QMatrix, x: &[f32], n: usize, y: &mut [f32]) -> Result<(), KernelError> {
    matmul_t_with(crate::active_path(), w, x, n, y)
}

/// [`matmul_t`] on an explicit path (for tests and benchmarks).
#[doc(hidden)]
pub fn matmul_t_with(
    path: KernelPath,
    w: &QMatrix,
    x: &[f32],
    n: usize,
    y: &mut [f32],
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
    let mut f = vec![0f32; overflow(rows, cols)?];
    f.par_chunks_mut(cols)
        .enumerate()
        .for_each(|(j, dst)| arch::dequant_row(path, w.format(), w.row_data(j), dst));
    let band = matmul_chunk();
    let bands: Vec<Vec<f32>> = (0..cols.div_ceil(band))
        .into_par_iter()
        .map(|b| {
            let c0 = b * band;
            let nc = band.min(cols - c0);
            // tile[i * rows + j] = W[j][c0 + i]: the band of columns as rows of `W` transposed.
            let mut tile = vec![0f32; nc * rows];
            for (j, src) in f.chunks_exact(cols).enumerate() {
                for (i, &v) in src[c0..c0 + nc].iter().enumerate() {
                    tile[i * rows + j] = v;
                }
            }
            let mut local = vec![0f32; n * nc];
            arch::tile(path, &tile, nc, rows, x, n, &mut local);
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
