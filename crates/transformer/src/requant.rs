//! Load-time re-quantization of the layer weights (PowerInfer-2 section 7.6 experiments).
//!
//! [`Overlay::build`] dequantizes every 2-D linear weight of the transformer blocks (`q`, `k`, `v`,
//! `o`, `gate`, `up`, `down`) of a [`ModelFile`] and quantizes it again into the format a [`Requant`] names, row by row
//! ([`kernels_neon::requantize_rows`]). The
//! overlay owns the new bytes; [`Model::load_with`](crate::Model::load_with) takes a matrix from
//! the overlay when it holds one and borrows the memory map otherwise. The token embedding and the
//! output projection (tied to it in SmolLM2) are left as they are in the file.
//!
//! Starting from an already-quantized file (e.g. Q4_1) the result carries both quantization
//! errors: it measures the target format on top of the file's, not on the original f32 weights.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;

use kernels_neon::{requantize_rows, QMatrix, WeightFormat};

use crate::error::{kernel, ModelError, Result};
use crate::file::{names_of, ModelFile};

/// Target format of a re-quantization.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Requant {
    /// llama.cpp `Q4_0`: groups of 32 with an f16 scale (4.5 bits per weight).
    Q4_0,
    /// Per-channel symmetric INT4, one f32 scale per row, no outliers
    /// (`I4Hybrid { outliers_per_row: 0 }`).
    Int4PerChannel,
    /// Per-channel INT4 plus the `outlier_frac` largest-magnitude weights of each row as INT8
    /// (`I4Hybrid { outliers_per_row: ceil(outlier_frac * cols) }`).
    Hybrid {
        /// Fraction of each row kept as INT8 outliers (0.01 = 1%).
        outlier_frac: f32,
    },
}

impl Requant {
    /// The kernel format of a matrix with `cols` columns.
    pub fn format(self, cols: usize) -> Option<WeightFormat> {
        match self {
            Requant::Q4_0 => Some(WeightFormat::Q4_0),
            Requant::Int4PerChannel => Some(WeightFormat::I4Hybrid {
                outliers_per_row: 0,
            }),
            Requant::Hybrid { outlier_frac } => WeightFormat::hybrid_for(outlier_frac, cols),
        }
    }
}

impl fmt::Display for Requant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Requant::Q4_0 => write!(f, "q4_0"),
            Requant::Int4PerChannel => write!(f, "int4"),
            Requant::Hybrid { outlier_frac } => write!(f, "hybrid:{}%", outlier_frac * 100.0),
        }
    }
}

impl FromStr for Requant {
    type Err = ModelError;

    /// `q4_0`, `int4` (per-channel), `hybrid:1%` or `hybrid:0.01` (outlier fraction per row).
    fn from_str(s: &str) -> Result<Self> {
        let bad = || {
            ModelError::Request(format!(
                "bad re-quantization `{s}`: expected q4_0, int4, or hybrid:<fraction> (e.g. hybrid:1% or hybrid:0.01)"
            ))
        };
        let l = s.trim().to_ascii_lowercase();
        match l.as_str() {
            "q4_0" => Ok(Requant::Q4_0),
            "int4" | "int4-per-channel" => Ok(Requant::Int4PerChannel),
            _ => {
                let v = l.strip_prefix("hybrid:").ok_or_else(bad)?;
                let frac = match v.strip_suffix('%') {
                    Some(p) => p.trim().parse::<f32>().map_err(|_| bad())? / 100.0,
                    None => v.trim().parse::<f32>().map_err(|_| bad())?,
                };
                if !(0.0..=1.0).contains(&frac) {
                    return Err(bad());
                }
                Ok(Requant::Hybrid { outlier_frac: frac })
            }
        }
    }
}

/// One re-quantized matrix.
#[derive(Debug, Clone)]
pub struct OverlayTensor {
    /// Its format.
    pub format: WeightFormat,
    /// Rows (output features).
    pub rows: usize,
    /// Columns (input features).
    pub cols: usize,
    /// `rows * format.row_bytes(cols)` bytes.
    pub data: Vec<u8>,
}

impl OverlayTensor {
    /// The matrix view of the bytes.
    pub fn matrix(&self) -> Result<QMatrix<'_>> {
        QMatrix::new(self.format, self.rows, self.cols, &self.data)
            .map_err(kernel("re-quantized matrix"))
    }
}

/// Re-quantized layer weights, by tensor name (see the module docs).
#[derive(Debug, Clone)]
pub struct Overlay {
    requant: Requant,
    tensors: HashMap<String, OverlayTensor>,
}

/// The linear weights of a block that are re-quantized.
pub const LINEAR_WEIGHTS: [&str; 7] = ["q", "k", "v", "o", "gate", "up", "down"];

impl Overlay {
    /// Re-quantizes every layer's linear weights of `file` (parallel over rows, in the current
    /// rayon pool).
    pub fn build(file: &ModelFile, requant: Requant) -> Result<Overlay> {
        let config = file.config()?;
        if config.moe.is_some() {
            return Err(crate::moe::unsupported(
                file.path(),
                config.arch.name(),
                "re-quantizing at load (--requant)",
            ));
        }
        let names = names_of(file);
        let mut tensors = HashMap::new();
        for i in 0..config.n_layers {
            for kind in LINEAR_WEIGHTS {
                let name = (names.layer)(i, kind);
                let t = file
                    .tensor(&name)
                    .ok_or_else(|| ModelError::MissingTensor {
                        path: file.path().to_path_buf(),
                        name: name.clone(),
                    })?;
                let ctx = || {
                    format!(
                        "re-quantizing `{name}` of {} to {requant}",
                        file.path().display()
                    )
                };
                let bad = |detail: String| ModelError::BadModel {
                    path: file.path().to_path_buf(),
                    detail,
                };
                if t.shape.len() != 2 {
                    return Err(bad(format!(
                        "tensor `{name}` is not 2-D: shape {:?}",
                        t.shape
                    )));
                }
                let (rows, cols) = (t.shape[0], t.shape[1]);
                let src = t.dtype;
                let dst = requant.format(cols).ok_or_else(|| {
                    bad(format!("{}: no {requant} format for {cols} columns", ctx()))
                })?;
                let (sb, db) = match (src.row_bytes(cols), dst.row_bytes(cols)) {
                    (Some(s), Some(d)) => (s, d),
                    _ => {
                        return Err(bad(format!(
                            "{}: {cols} columns do not fit {src:?} / {dst:?}",
                            ctx()
                        )))
                    }
                };
                if t.data.len() != rows * sb {
                    return Err(bad(format!(
                        "tensor `{name}`: {} bytes, expected {}",
                        t.data.len(),
                        rows * sb
                    )));
                }
                let data = requantize_rows(src, t.data, cols, dst, cols).map_err(kernel(ctx()))?;
                debug_assert_eq!(data.len(), rows * db);
                tensors.insert(
                    name,
                    OverlayTensor {
                        format: dst,
                        rows,
                        cols,
                        data,
                    },
                );
            }
        }
        Ok(Overlay { requant, tensors })
    }

    /// The re-quantization this overlay applied.
    pub fn requant(&self) -> Requant {
        self.requant
    }

    /// The re-quantized tensor called `name` (file naming), if any.
    pub fn get(&self, name: &str) -> Option<&OverlayTensor> {
        self.tensors.get(name)
    }

    /// Number of re-quantized tensors.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// Whether no tensor was re-quantized.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// Bytes of all re-quantized tensors.
    pub fn bytes(&self) -> usize {
        self.tensors.values().map(|t| t.data.len()).sum()
    }

    /// Weights (elements) of all re-quantized tensors.
    pub fn elements(&self) -> usize {
        self.tensors.values().map(|t| t.rows * t.cols).sum()
    }

    /// Storage bits per weight over the re-quantized tensors (scales, outliers and padding
    /// included).
    pub fn bits_per_weight(&self) -> f64 {
        8.0 * self.bytes() as f64 / self.elements().max(1) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_specs() {
        assert_eq!("q4_0".parse::<Requant>().unwrap(), Requant::Q4_0);
        assert_eq!("INT4".parse::<Requant>().unwrap(), Requant::Int4PerChannel);
        assert_eq!(
            "hybrid:1%".parse::<Requant>().unwrap(),
            Requant::Hybrid { outlier_frac: 0.01 }
        );
        assert_eq!(
            "hybrid:0.005".parse::<Requant>().unwrap(),
            Requant::Hybrid {
                outlier_frac: 0.005
            }
        );
        assert_eq!(
            "hybrid:2%".parse::<Requant>().unwrap().format(576),
            Some(WeightFormat::I4Hybrid {
                outliers_per_row: 12
            })
        );
        for bad in [
            "",
            "q4_1",
            "hybrid:",
            "hybrid:x%",
            "hybrid:150%",
            "hybrid:-1",
        ] {
            assert!(bad.parse::<Requant>().is_err(), "{bad}");
        }
    }
}
