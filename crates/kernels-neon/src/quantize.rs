//! Weight quantizers: f32 rows into the block formats (the inverse of
//! [`dequantize_row`](crate::dequantize_row)).
//!
//! These run at load or conversion time (re-quantizing, transposing the
//! down projection for [`axpy_rows`](crate::axpy_rows)), not per token, so
//! they are plain scalar code. They follow ggml's reference quantizers:
//!
//! * `Q8_0`: `d = max|x| / 127`, `q = round(x / d)`;
//! * `Q4_0`: `d = x_m / -8` where `x_m` is the element of largest magnitude
//!   (sign kept), `q = clamp(trunc(x / d + 8.5), 0, 15)`;
//! * `Q4_1`: `d = (max - min) / 15`, `m = min`, `q = clamp(trunc((x - m) / d + 0.5), 0, 15)`;
//! * `F32`, `F16`, `BF16`: plain conversion.
//!
//! K-quants are not produced here (their encoders search scales; files
//! carry them already quantized).

use half::{bf16, f16};

use crate::{KernelError, WeightFormat};

/// Quantizes one row of `src.len()` elements into `dst`, which must hold
/// exactly `format.row_bytes(src.len())` bytes.
///
/// Supported formats: `F32`, `F16`, `BF16`, `Q8_0`, `Q4_0`, `Q4_1`; K-quants
/// give [`KernelError::Unsupported`]. Non-finite inputs give
/// [`KernelError::NonFinite`] (a quantized block cannot represent them).
pub fn quantize_row(format: WeightFormat, src: &[f32], dst: &mut [u8]) -> Result<(), KernelError> {
    let expected = format.row_bytes(src.len()).ok_or(KernelError::RaggedCols {
        format,
        cols: src.len(),
        block_len: format.block_len(),
    })?;
    if dst.len() != expected {
        return Err(KernelError::DataLength {
            what: "quantize_row dst",
            expected,
            actual: dst.len(),
        });
    }
    if let Some(i) = src.iter().position(|v| !v.is_finite()) {
        return Err(KernelError::NonFinite { what: "quantize_row src", index: i });
    }
    match format {
        WeightFormat::F32 => {
            for (d, v) in dst.chunks_exact_mut(4).zip(src) {
                d.copy_from_slice(&v.to_le_bytes());
            }
        }
        WeightFormat::F16 => {
            for (d, v) in dst.chunks_exact_mut(2).zip(src) {
                d.copy_from_slice(&f16::from_f32(*v).to_le_bytes());
            }
        }
        WeightFormat::BF16 => {
            for (d, v) in dst.chunks_exact_mut(2).zip(src) {
                d.copy_from_slice(&bf16::from_f32(*v).to_le_bytes());
            }
        }
        WeightFormat::Q8_0 => {
            for (blk, x) in dst.chunks_exact_mut(34).zip(src.chunks_exact(32)) {
                let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
                let d = amax / 127.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                blk[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
                for (q, v) in blk[2..].iter_mut().zip(x) {
                    *q = ((v * id).round() as i8) as u8;
                }
            }
        }
        WeightFormat::Q4_0 => {
            for (blk, x) in dst.chunks_exact_mut(18).zip(src.chunks_exact(32)) {
                let xm = x.iter().fold(0.0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
                let d = xm / -8.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                blk[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
                for j in 0..16 {
                    let lo = ((x[j] * id + 8.5) as i32).clamp(0, 15) as u8;
                    let hi = ((x[j + 16] * id + 8.5) as i32).clamp(0, 15) as u8;
                    blk[2 + j] = lo | (hi << 4);
                }
            }
        }
        WeightFormat::Q4_1 => {
            for (blk, x) in dst.chunks_exact_mut(20).zip(src.chunks_exact(32)) {
                let min = x.iter().copied().fold(f32::INFINITY, f32::min);
                let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let d = (max - min) / 15.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                blk[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
                blk[2..4].copy_from_slice(&f16::from_f32(min).to_le_bytes());
                for j in 0..16 {
                    let lo = (((x[j] - min) * id + 0.5) as i32).clamp(0, 15) as u8;
                    let hi = (((x[j + 16] - min) * id + 0.5) as i32).clamp(0, 15) as u8;
                    blk[4 + j] = lo | (hi << 4);
                }
            }
        }
        WeightFormat::Q4_K | WeightFormat::Q6_K => {
            return Err(KernelError::Unsupported { what: "quantize_row", format });
        }
    }
    Ok(())
}

/// Quantizes a row-major `rows × cols` f32 matrix into `format`, row by row
/// (`rows * format.row_bytes(cols)` bytes).
pub fn quantize_matrix(format: WeightFormat, src: &[f32], rows: usize, cols: usize) -> Result<Vec<u8>, KernelError> {
    if src.len() != rows * cols {
        return Err(KernelError::LengthMismatch { what: "quantize_matrix src", expected: rows * cols, actual: src.len() });
    }
    let rb = format.row_bytes(cols).ok_or(KernelError::RaggedCols { format, cols, block_len: format.block_len() })?;
    let mut out = vec![0u8; rows * rb];
    if cols == 0 {
        return Ok(out);
    }
    for (d, s) in out.chunks_exact_mut(rb).zip(src.chunks_exact(cols)) {
        quantize_row(format, s, d)?;
    }
    Ok(out)
}
