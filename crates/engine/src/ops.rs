//! Small helpers over the kernels shared by the forward pass and the FFN executors.

use kernels_neon::{Precision, QMatrix};

use crate::error::{kernel, Result};

/// `y = w · x` for `n` tokens: a matrix-vector product for one token, a matrix product for more.
pub(crate) fn mm(
    w: &QMatrix<'_>,
    x: &[f32],
    n: usize,
    y: &mut [f32],
    p: Precision,
    what: &str,
) -> Result<()> {
    if n == 1 {
        kernels_neon::matvec(w, x, y, p).map_err(kernel(what))
    } else {
        kernels_neon::matmul(w, x, n, y, p).map_err(kernel(what))
    }
}
