//! The crate's single error type.

use crate::WeightFormat;

/// Bytes or shapes that do not fit a [`WeightFormat`] (from [`QMatrix::new`](crate::QMatrix::new) and
/// [`hybrid::check_row`](crate::hybrid::check_row)). The messages are those of the kernels' errors of the
/// same names, which these convert into.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    /// `cols` is not a multiple of the format's block length.
    #[error("{format:?}: cols {cols} is not a multiple of the block length {block_len}")]
    RaggedCols {
        /// Weight format.
        format: WeightFormat,
        /// Offending column count.
        cols: usize,
        /// Required divisor.
        block_len: usize,
    },
    /// A byte buffer has the wrong size.
    #[error("{what}: expected {expected} bytes, got {actual}")]
    DataLength {
        /// Which buffer.
        what: &'static str,
        /// Expected byte length.
        expected: usize,
        /// Actual byte length.
        actual: usize,
    },
    /// A size computation overflowed `usize` (or an [`I4Hybrid`](WeightFormat::I4Hybrid) row is too wide).
    #[error("size overflow: {rows} x {cols}")]
    Overflow {
        /// First factor.
        rows: usize,
        /// Second factor.
        cols: usize,
    },
    /// An [`WeightFormat::I4Hybrid`] row lists an outlier column outside the row.
    #[error("hybrid row {row}: outlier column {col} out of range (row has {cols} columns)")]
    OutlierOutOfRange {
        /// Row of the matrix (0 for a single row).
        row: usize,
        /// Offending column index.
        col: usize,
        /// Columns of the row.
        cols: usize,
    },
}
