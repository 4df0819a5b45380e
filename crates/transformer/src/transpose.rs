//! The down matrices transposed to one row per neuron, and their norms: what sparse decode reads
//! (`axpy_rows`) and what `offload::convert` writes into a neuron store, computed in one place so
//! both see the same bytes.

use kernels_neon::{QMatrix, WeightFormat};
use rayon::prelude::*;

use accel::{dequantize_matrix, transpose_f32};

use crate::error::{kernel, Result};
use crate::model::Model;

/// Format the down matrices are transposed into, at 1.7× the bytes of Q4_1 per down column read. On
/// SmolLM2 Q4_1 it costs about +0.1% perplexity and up to 1.0 in a top logit; re-quantizing across the other
/// axis to 4 bits (Q4_1) drifts top logits by about 7, and F16 by 6e-3 at 3.2× the bytes.
pub const DEFAULT_DOWN_FORMAT: WeightFormat = WeightFormat::Q8_0;

/// Per layer: the down matrix transposed into `format` (`d_ff × d_model`), and the L2 norm of each
/// neuron's row of it (the neuron's importance weight).
pub struct TransposedDown {
    /// Per layer, the transposed down matrix's bytes.
    pub rows: Vec<Vec<u8>>,
    /// Per layer and neuron, the norm of its down row.
    pub norms: Vec<Vec<f32>>,
}

impl TransposedDown {
    /// Transposes every layer's down matrix of `model` into `format` (layers in parallel on the
    /// current rayon pool) and measures the rows.
    pub fn of(model: &Model<'_>, format: WeightFormat) -> Result<Self> {
        let cfg = &model.config;
        let (d, ff) = (cfg.d_model, cfg.d_ff);
        let rows = model
            .layers
            .par_iter()
            .enumerate()
            .map(|(l, _)| {
                let f = model.gated_ffn(l, "activation sparsity (--sparse, convert)")?;
                transpose(&f.down, format)
                    .map_err(kernel(format!("transposing ffn down of layer {l}")))
            })
            .collect::<Result<Vec<_>>>()?;
        let norms = rows
            .iter()
            .map(|bytes| {
                let m =
                    QMatrix::new(format, ff, d, bytes).map_err(kernel("transposed ffn down"))?;
                let mut row = vec![0.0f32; d];
                (0..ff)
                    .map(|j| {
                        kernels_neon::dequantize_row(format, m.row_data(j), &mut row)
                            .map_err(kernel("transposed ffn down"))?;
                        Ok(row.iter().map(|v| v * v).sum::<f32>().sqrt())
                    })
                    .collect::<Result<Vec<f32>>>()
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(TransposedDown { rows, norms })
    }
}

/// `w` (`rows × cols`) transposed into `cols × rows` in `format` (one expert's down matrix of a
/// neuron-major expert store, or a layer's).
pub fn transpose(
    w: &QMatrix<'_>,
    format: WeightFormat,
) -> std::result::Result<Vec<u8>, kernels_neon::KernelError> {
    let (rows, cols) = (w.rows(), w.cols());
    let t = transpose_f32(&dequantize_matrix(w)?, rows, cols);
    kernels_neon::quantize_matrix(format, &t, cols, rows)
}
