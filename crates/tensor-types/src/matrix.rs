//! [`QMatrix`]: a borrowed, validated weight matrix in one of the [`WeightFormat`]s.

use crate::{hybrid, LayoutError, WeightFormat};

/// A borrowed weight matrix in one of the [`WeightFormat`]s: `rows` rows of
/// `format.row_bytes(cols)` bytes each, back to back.
#[derive(Debug, Clone, Copy)]
pub struct QMatrix<'a> {
    format: WeightFormat,
    rows: usize,
    cols: usize,
    row_bytes: usize,
    data: &'a [u8],
}

impl<'a> QMatrix<'a> {
    /// Wraps `data` as a `rows × cols` matrix. Fails unless `cols` is a
    /// multiple of the block length and `data.len() == rows * row_bytes(cols)`;
    /// for [`WeightFormat::I4Hybrid`] also unless every outlier column is `< cols`.
    pub fn new(
        format: WeightFormat,
        rows: usize,
        cols: usize,
        data: &'a [u8],
    ) -> Result<Self, LayoutError> {
        let row_bytes = format
            .row_bytes(cols)
            .ok_or(if cols % format.block_len() != 0 {
                LayoutError::RaggedCols {
                    format,
                    cols,
                    block_len: format.block_len(),
                }
            } else {
                LayoutError::Overflow { rows, cols }
            })?;
        let expected = rows
            .checked_mul(row_bytes)
            .ok_or(LayoutError::Overflow { rows, cols })?;
        if data.len() != expected {
            return Err(LayoutError::DataLength {
                what: "matrix data",
                expected,
                actual: data.len(),
            });
        }
        if format.is_hybrid() && row_bytes > 0 {
            for (r, row) in data.chunks_exact(row_bytes).enumerate() {
                hybrid::check_row(format, cols, row).map_err(|e| match e {
                    LayoutError::OutlierOutOfRange { col, cols, .. } => {
                        LayoutError::OutlierOutOfRange { row: r, col, cols }
                    }
                    e => e,
                })?;
            }
        }
        Ok(QMatrix {
            format,
            rows,
            cols,
            row_bytes,
            data,
        })
    }

    /// Storage format.
    #[inline]
    pub fn format(&self) -> WeightFormat {
        self.format
    }

    /// Number of rows (output features).
    #[inline]
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Number of columns (input features).
    #[inline]
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes of row `r`. Panics if `r >= rows()` (like slice indexing).
    #[inline]
    pub fn row_data(&self, r: usize) -> &'a [u8] {
        &self.data[r * self.row_bytes..(r + 1) * self.row_bytes]
    }

    /// Bytes per row.
    #[inline]
    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    /// All bytes of the matrix.
    #[inline]
    pub fn data(&self) -> &'a [u8] {
        self.data
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_and_lengths_are_checked() {
        let data = vec![0u8; 2 * 18];
        let m = QMatrix::new(WeightFormat::Q4_0, 2, 32, &data).unwrap();
        assert_eq!((m.rows(), m.cols(), m.row_bytes()), (2, 32, 18));
        assert_eq!(m.row_data(1), &data[18..]);
        assert!(matches!(
            QMatrix::new(WeightFormat::Q4_0, 2, 48, &data),
            Err(LayoutError::RaggedCols { block_len: 32, .. })
        ));
        assert_eq!(
            QMatrix::new(WeightFormat::Q4_0, 3, 32, &data).unwrap_err(),
            LayoutError::DataLength {
                what: "matrix data",
                expected: 54,
                actual: 36
            }
        );
        assert!(matches!(
            QMatrix::new(WeightFormat::F32, usize::MAX, 2, &data),
            Err(LayoutError::Overflow { .. })
        ));
    }
}
