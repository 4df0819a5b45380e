//! Row layout of [`WeightFormat::I4Hybrid`]: per-channel INT4 plus INT8 outliers (PowerInfer-2 §7.6).
//!
//! Every row (output channel) of `cols` elements (`cols` a multiple of 32, at most 65536) with `k`
//! outliers takes the same number of bytes, `row_bytes = 8 + cols/2 + 3k` rounded up to a multiple of 4,
//! so [`QMatrix`](crate::QMatrix) row access works as for the block formats:
//!
//! | bytes | field |
//! |---|---|
//! | `0..4` | `s`: f32 LE, scale of the INT4 part |
//! | `4..8` | `s_o`: f32 LE, scale of the INT8 outliers |
//! | `8..8+cols/2` | INT4 quants `q` in `-8..=7` stored as `q + 8`, in groups of 16 bytes per 32 elements: byte `j` of group `g` holds element `32g + j` (low nibble) and `32g + j + 16` (high nibble), the `Q4_0` order |
//! | next `2k` | outlier columns `c_j`: u16 LE |
//! | next `k` | outlier values `o_j`: i8 |
//! | rest (0..3 bytes) | zero padding |
//!
//! Element `i` of a row is `s * q_i` plus `s_o * o_j` for every `j` with `c_j == i`. Any distinct or
//! repeated columns `< cols` are valid; [`check_row`] rejects columns `>= cols`.

use crate::{LayoutError, WeightFormat};

/// Elements per nibble group (the format's block length).
pub const GROUP: usize = 32;
/// Bytes before the nibbles of a row (the two f32 scales).
pub const HEADER: usize = 8;
/// Widest row (column indices are u16).
pub const MAX_COLS: usize = 1 << 16;

/// Bytes of a row of `cols` elements with `k` outliers, or `None` when `cols` is not a multiple of
/// [`GROUP`], `cols > MAX_COLS` or `k > cols`.
#[inline]
pub fn row_bytes(k: usize, cols: usize) -> Option<usize> {
    if cols % GROUP != 0 || cols > MAX_COLS || k > cols {
        return None;
    }
    Some((HEADER + cols / 2 + 3 * k).next_multiple_of(4))
}

/// The outlier count `k` of `format` (0 for every other format).
#[inline]
pub fn outliers_per_row(format: WeightFormat) -> usize {
    match format {
        WeightFormat::I4Hybrid { outliers_per_row } => usize::from(outliers_per_row),
        _ => 0,
    }
}

/// For [`WeightFormat::I4Hybrid`]: checks that every outlier column of `row` (at least
/// `row_bytes(k, cols)` bytes) is `< cols`, or fails with [`LayoutError::OutlierOutOfRange`] (`row: 0`).
/// Other formats: `Ok`. Panics if `row` is shorter than its outlier columns (callers check lengths first).
pub fn check_row(format: WeightFormat, cols: usize, row: &[u8]) -> Result<(), LayoutError> {
    if !format.is_hybrid() {
        return Ok(());
    }
    let n = HEADER + cols / 2;
    let idx = &row[n..n + 2 * outliers_per_row(format)];
    match idx
        .chunks_exact(2)
        .map(|c| usize::from(u16::from_le_bytes([c[0], c[1]])))
        .find(|&c| c >= cols)
    {
        Some(col) => Err(LayoutError::OutlierOutOfRange { row: 0, col, cols }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outlier_columns_are_checked() {
        let f = WeightFormat::I4Hybrid {
            outliers_per_row: 2,
        };
        let mut row = vec![0u8; row_bytes(2, 64).unwrap()];
        let n = HEADER + 32;
        row[n..n + 2].copy_from_slice(&63u16.to_le_bytes());
        assert_eq!(check_row(f, 64, &row), Ok(()));
        row[n + 2..n + 4].copy_from_slice(&64u16.to_le_bytes());
        assert_eq!(
            check_row(f, 64, &row),
            Err(LayoutError::OutlierOutOfRange {
                row: 0,
                col: 64,
                cols: 64
            })
        );
        assert_eq!(check_row(WeightFormat::Q4_0, 64, &[]), Ok(()));
    }
}
