//! Column-tiled `axpy_rows` (the sparse down projection with the sums of a
//! column tile kept in registers across all listed rows): NEON has no such
//! kernel yet, so `axpy_rows` goes row by row with [`axpy_row`](super::axpy_row).

use crate::WeightFormat;

/// Always `false` (does nothing): no tiled kernel on NEON; the arguments are
/// those of the x86_64 kernel.
pub(crate) fn axpy_rows_tiled(
    format: WeightFormat,
    data: &[u8],
    row_bytes: usize,
    b0: usize,
    rows: &[u32],
    coeffs: &[f32],
    y: &mut [f32],
) -> bool {
    let _ = (format, data, row_bytes, b0, rows, coeffs, y);
    false
}
