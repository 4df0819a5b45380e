//! Dense f32 forms of quantized matrices: what a backend that does not take the file's format
//! builds its blocks from.

use kernels_neon::QMatrix;

/// `w`'s rows dequantized to f32, row-major (`rows × cols`).
pub fn dequantize_matrix(w: &QMatrix<'_>) -> Result<Vec<f32>, kernels_neon::KernelError> {
    let (rows, cols) = (w.rows(), w.cols());
    let mut dense = vec![0.0f32; rows * cols];
    for (r, out) in dense.chunks_exact_mut(cols.max(1)).enumerate().take(rows) {
        kernels_neon::dequantize_row(w.format(), w.row_data(r), out)?;
    }
    Ok(dense)
}

/// `dense` (`rows × cols`, row-major) transposed into `cols × rows`.
pub fn transpose_f32(dense: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0.0f32; rows * cols];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = dense[r * cols + c];
        }
    }
    t
}
