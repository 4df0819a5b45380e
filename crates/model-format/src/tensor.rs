//! Tensor descriptions shared by both formats.

use std::fmt;

use crate::DType;

/// A borrowed tensor, common to both formats.
///
/// `shape` is ROW-MAJOR, OUTERMOST FIRST (so a GGUF tensor with
/// `ne = [576, 1536]` has shape `[1536, 576]`: 1536 rows of 576 columns).
/// `data` is borrowed straight from the file's memory map (zero-copy) and is
/// exactly `rows() * dtype.row_bytes(cols())` bytes long. It has no particular
/// alignment in memory: read multi-byte values with `from_le_bytes`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct TensorView<'a> {
    /// The tensor's name.
    pub name: &'a str,
    /// The storage type.
    pub dtype: DType,
    /// Dimensions, outermost first (the last one is contiguous).
    pub shape: &'a [usize],
    /// The raw little-endian bytes.
    pub data: &'a [u8],
}

impl TensorView<'_> {
    /// Product of all dimensions but the last; 1 for 1-D (and 0-D) tensors.
    pub fn rows(&self) -> usize {
        match self.shape.split_last() {
            Some((_, outer)) => outer.iter().product(),
            None => 1,
        }
    }

    /// The last (contiguous) dimension; 1 for a 0-D tensor.
    pub fn cols(&self) -> usize {
        self.shape.last().copied().unwrap_or(1)
    }

    /// Total number of elements.
    pub fn n_elements(&self) -> usize {
        self.shape.iter().product()
    }
}

impl<'a> TensorView<'a> {
    /// Slice `i` along the outermost dimension, as a tensor of one dimension fewer, borrowing the
    /// same bytes: for a 3-D Mixture-of-Experts tensor of shape `[experts, rows, cols]` (ggml's
    /// `ne = [cols, rows, experts]`, as llama.cpp writes `blk.N.ffn_{gate,up,down}_exps.weight`),
    /// `outer_slice(e)` is expert `e`'s `[rows, cols]` matrix: rows `e * rows .. (e + 1) * rows`
    /// of the tensor, one contiguous block of whole rows (quantization blocks never cross a row),
    /// so it works for every format. `None` for a tensor of fewer than 2 dimensions or `i` out of
    /// range.
    pub fn outer_slice(&self, i: usize) -> Option<TensorView<'a>> {
        let (&outer, inner) = self.shape.split_first()?;
        if inner.is_empty() || i >= outer {
            return None;
        }
        let len = self.data.len() / outer;
        Some(TensorView {
            name: self.name,
            dtype: self.dtype,
            shape: inner,
            data: self.data.get(i * len..(i + 1) * len)?,
        })
    }
}

impl fmt::Debug for TensorView<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TensorView")
            .field("name", &self.name)
            .field("dtype", &self.dtype)
            .field("shape", &self.shape)
            .field("data_len", &self.data.len())
            .finish()
    }
}

/// Where a tensor lives in a file.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TensorInfo {
    /// The tensor's name.
    pub name: String,
    /// The storage type.
    pub dtype: DType,
    /// Dimensions, row-major, outermost first.
    pub shape: Vec<usize>,
    /// Absolute byte offset of the data in its file.
    pub offset: u64,
    /// Size of the data in bytes.
    pub n_bytes: u64,
}

/// Bytes a tensor of `dtype` and `shape` (outermost first) occupies, or an
/// error text if the last dimension is not a whole number of blocks or the
/// size overflows.
pub(crate) fn tensor_bytes(dtype: DType, shape: &[usize]) -> Result<usize, String> {
    let (cols, outer) = match shape.split_last() {
        Some((c, o)) => (*c, o),
        None => (1, &[][..]),
    };
    let row = dtype.row_bytes(cols).ok_or_else(|| {
        if cols % dtype.block_len() != 0 {
            format!(
                "innermost dimension {cols} is not a multiple of the {} block length {}",
                dtype.name(),
                dtype.block_len()
            )
        } else {
            format!("row of {cols} {} elements overflows", dtype.name())
        }
    })?;
    outer
        .iter()
        .try_fold(row, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| format!("size of shape {shape:?} overflows"))
}

/// Refuses tensors whose data ranges share bytes: sorts the ranges by offset and checks each
/// against the furthest end seen so far (so a tensor nested inside an earlier, larger one is caught
/// too). Empty tensors occupy no bytes and overlap nothing.
pub(crate) fn check_no_overlap(
    path: &std::path::Path,
    tensors: &[TensorInfo],
) -> Result<(), crate::FormatError> {
    let mut order: Vec<&TensorInfo> = tensors.iter().filter(|t| t.n_bytes > 0).collect();
    order.sort_by_key(|t| (t.offset, t.n_bytes));
    let mut furthest: Option<&TensorInfo> = None;
    for t in order {
        if let Some(f) = furthest {
            let f_end = f.offset.saturating_add(f.n_bytes);
            if t.offset < f_end {
                return Err(crate::FormatError::TensorOverlap {
                    path: path.to_path_buf(),
                    first: f.name.clone(),
                    first_start: f.offset,
                    first_end: f_end,
                    second: t.name.clone(),
                    second_start: t.offset,
                    second_end: t.offset.saturating_add(t.n_bytes),
                });
            }
        }
        let end = t.offset.saturating_add(t.n_bytes);
        if furthest.is_none_or(|f| end > f.offset.saturating_add(f.n_bytes)) {
            furthest = Some(t);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn view_dims() {
        let v = TensorView {
            name: "t",
            dtype: DType::F32,
            shape: &[2, 3, 4],
            data: &[],
        };
        assert_eq!((v.rows(), v.cols(), v.n_elements()), (6, 4, 24));
        let v = TensorView { shape: &[7], ..v };
        assert_eq!((v.rows(), v.cols(), v.n_elements()), (1, 7, 7));
        let v = TensorView { shape: &[], ..v };
        assert_eq!((v.rows(), v.cols(), v.n_elements()), (1, 1, 1));
    }

    #[test]
    fn outer_slices_are_row_ranges() {
        // 3 experts of 2 rows of 32 Q8_0 columns: 34 bytes a row, 68 an expert.
        let data: Vec<u8> = (0..3 * 68).map(|b| b as u8).collect();
        let v = TensorView {
            name: "blk.0.ffn_up_exps.weight",
            dtype: DType::Q8_0,
            shape: &[3, 2, 32],
            data: &data,
        };
        for e in 0..3 {
            let s = v.outer_slice(e).unwrap();
            assert_eq!((s.shape, s.rows(), s.cols()), (&[2, 32][..], 2, 32));
            assert_eq!(s.data, &data[e * 68..(e + 1) * 68]);
            assert_eq!(s.name, v.name);
        }
        assert!(v.outer_slice(3).is_none());
        let flat = TensorView {
            shape: &[51],
            dtype: DType::F32,
            ..v
        };
        assert!(flat.outer_slice(0).is_none());
        let empty = TensorView {
            shape: &[0, 2, 32],
            data: &[],
            ..v
        };
        assert!(empty.outer_slice(0).is_none());
    }

    #[test]
    fn bytes() {
        assert_eq!(tensor_bytes(DType::Q4_1, &[1536, 576]), Ok(1536 * 18 * 20));
        assert!(tensor_bytes(DType::Q4_0, &[2, 33]).is_err());
        assert!(tensor_bytes(DType::F32, &[usize::MAX, 2]).is_err());
        assert_eq!(tensor_bytes(DType::F16, &[]), Ok(2));
    }
}
