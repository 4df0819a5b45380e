//! Row-by-row re-quantization of a whole matrix from one block format into another, in parallel and
//! without materializing the matrix in f32 (one row buffer per rayon task).

use rayon::prelude::*;

use crate::{dequantize_row, quantize_row, KernelError, LayoutError, WeightFormat};

/// Re-quantizes the `rows` rows of `src` (`src_format`, `src_cols` columns each) into `dst_format`
/// rows of `dst_cols >= src_cols` columns, the columns past `src_cols` zero. Returns
/// `rows * dst_format.row_bytes(dst_cols)` bytes. Runs on the current rayon pool.
pub fn requantize_rows(
    src_format: WeightFormat,
    src: &[u8],
    src_cols: usize,
    dst_format: WeightFormat,
    dst_cols: usize,
) -> Result<Vec<u8>, KernelError> {
    let ragged = |format: WeightFormat, cols: usize| {
        KernelError::Layout(LayoutError::RaggedCols {
            format,
            cols,
            block_len: format.block_len(),
        })
    };
    let sb = src_format
        .row_bytes(src_cols)
        .ok_or(ragged(src_format, src_cols))?;
    let db = dst_format
        .row_bytes(dst_cols)
        .ok_or(ragged(dst_format, dst_cols))?;
    if dst_cols < src_cols {
        return Err(KernelError::LengthMismatch {
            what: "requantize_rows dst_cols (at least src_cols)",
            expected: src_cols,
            actual: dst_cols,
        });
    }
    if sb == 0 || db == 0 {
        return Ok(Vec::new());
    }
    if src.len() % sb != 0 {
        return Err(KernelError::Layout(LayoutError::DataLength {
            what: "requantize_rows src (whole rows)",
            expected: src.len() / sb * sb,
            actual: src.len(),
        }));
    }
    let mut out = vec![0u8; src.len() / sb * db];
    out.par_chunks_mut(db)
        .zip(src.par_chunks(sb))
        .try_for_each_init(
            || vec![0f32; dst_cols],
            |row, (dst, s)| {
                dequantize_row(src_format, s, &mut row[..src_cols])?;
                quantize_row(dst_format, row, dst)
            },
        )?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pads_with_zeros_and_matches_row_by_row() {
        let (rows, cols, wide) = (5, 64, 96);
        let x: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0)
            .collect();
        let src = crate::quantize_matrix(WeightFormat::Q8_0, &x, rows, cols).unwrap();
        let got =
            requantize_rows(WeightFormat::Q8_0, &src, cols, WeightFormat::Q4_0, wide).unwrap();
        let rb = WeightFormat::Q4_0.row_bytes(wide).unwrap();
        assert_eq!(got.len(), rows * rb);
        let mut deq = vec![0f32; cols];
        for r in 0..rows {
            dequantize_row(WeightFormat::Q8_0, &src[r * 34 * 2..][..68], &mut deq).unwrap();
            let mut padded = deq.clone();
            padded.resize(wide, 0.0);
            let mut want = vec![0u8; rb];
            quantize_row(WeightFormat::Q4_0, &padded, &mut want).unwrap();
            assert_eq!(&got[r * rb..][..rb], &want[..], "row {r}");
        }
        // The padding dequantizes to zero.
        let mut back = vec![1f32; wide];
        dequantize_row(WeightFormat::Q4_0, &got[..rb], &mut back).unwrap();
        assert!(back[cols..].iter().all(|&v| v == 0.0));
    }

    #[test]
    fn refuses_a_narrower_destination_and_partial_rows() {
        let src = vec![0u8; 34 * 2];
        assert!(requantize_rows(WeightFormat::Q8_0, &src, 64, WeightFormat::Q8_0, 32).is_err());
        assert!(
            requantize_rows(WeightFormat::Q8_0, &src[..60], 64, WeightFormat::Q8_0, 64).is_err()
        );
    }
}
