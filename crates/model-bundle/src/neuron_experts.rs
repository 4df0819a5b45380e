//! The routed experts of a ReLU MoE model (TurboSparse-Mixtral's kind) written neuron-major: one
//! pseudo-layer `l·E + e` of a dense neuron store (`neuron_store::StoreWriter`) per expert `e` of
//! layer `l`, its neurons in the order of the expert's calibration profile (most often active
//! first), each neuron's gate row, up row and down column (the expert's down matrix transposed by
//! `transformer::transpose`, in the expert's own down format) one bundle. A whole expert is still
//! one contiguous read (its pseudo-layer's units); the store's hot units of an expert are the
//! prefix that carries the wanted share of its profiled activations, which the executor computes.

use std::path::Path;

use kernels_neon::{Activation, QMatrix, WeightFormat};
use neuron_store::{Formats, LayerInput, NeuronStore, Packing, StoreIndex, StoreWriter};
use transformer::model::Model;
use transformer::moe::ExpertNeuronProfile;

use crate::error::{BundleError, Result};

/// What [`crate::convert_moe_with`] needs to write a ReLU model's experts neuron-major.
#[derive(Debug, Clone, Copy)]
pub struct ReluExperts<'a> {
    /// The experts' active neurons counted on calibration text (`None`: stored in id order, all
    /// of each expert computed).
    pub profile: Option<&'a ExpertNeuronProfile>,
    /// Share of each expert's profiled activations its computed prefix carries (1: every neuron,
    /// exact).
    pub recall: f64,
}

impl Default for ReluExperts<'_> {
    fn default() -> Self {
        ReluExperts {
            profile: None,
            recall: 1.0,
        }
    }
}

/// The experts' width and formats when every layer of `model` has routed ReLU experts of one
/// width and one set of formats (what one neuron store holds); `None` otherwise (SiLU experts, a
/// dense layer, mixed shapes), which keep the expert store.
pub(crate) fn relu_shape(model: &Model<'_>) -> Option<(usize, Formats)> {
    let mut shape = None;
    for layer in &model.layers {
        let moe = layer.ffn.moe()?;
        if moe.block.activation != Activation::Relu || moe.weights.shared.is_some() {
            return None;
        }
        for e in &moe.weights.experts {
            let s = (
                e.gate.rows(),
                Formats {
                    gate: e.gate.format(),
                    up: e.up.format(),
                    down: e.down.format(),
                },
            );
            if *shape.get_or_insert(s) != s {
                return None;
            }
        }
    }
    shape
}

/// The format the down columns are stored in: the expert's own where it quantizes rows of
/// `d_model`, else Q8_0.
fn down_format(own: WeightFormat, d_model: usize) -> WeightFormat {
    let probe = vec![0.0f32; d_model];
    match kernels_neon::quantize_matrix(own, &probe, 1, d_model) {
        Ok(_) => own,
        Err(_) => WeightFormat::Q8_0,
    }
}

/// Writes the experts of `model` (a [`relu_shape`] model) neuron-major to `path`; `progress(layer,
/// layers)` after each layer. Returns the store's index.
pub(crate) fn write(
    model: &Model<'_>,
    path: &Path,
    relu: &ReluExperts<'_>,
    progress: &mut impl FnMut(usize, usize),
) -> Result<StoreIndex> {
    let (ff, formats) = relu_shape(model).ok_or_else(|| {
        BundleError::Request(format!(
            "{}: not a model of ReLU experts of one shape",
            model.path().display()
        ))
    })?;
    let d = model.config.d_model;
    let formats = Formats {
        down: down_format(formats.down, d),
        ..formats
    };
    let n_experts: usize = model
        .layers
        .iter()
        .map(|l| l.ffn.moe().map_or(0, |m| m.weights.n_experts()))
        .sum();
    let mut w = StoreWriter::create_packed(path, n_experts, d, ff, formats, Packing::Page)?;
    let layers = model.layers.len();
    for (l, layer) in model.layers.iter().enumerate() {
        let Some(moe) = layer.ffn.moe() else {
            continue;
        };
        for (e, ffn) in moe.weights.experts.iter().enumerate() {
            let down_t = transformer::transpose::transpose(&ffn.down, formats.down)
                .map_err(|err| transpose_error(model, l, e, err))?;
            let norms = norms(&down_t, formats.down, ff, d)
                .map_err(|err| transpose_error(model, l, e, err))?;
            let (order, hot) = match relu.profile {
                Some(p) => (p.order(l, e, ff), p.prefix(l, e, ff, relu.recall)),
                None => ((0..ff as u32).collect(), ff),
            };
            w.add_layer(LayerInput {
                gate: ffn.gate.data(),
                up: ffn.up.data(),
                down_t: &down_t,
                order,
                hot_neurons: hot,
                down_norms: norms,
            })?;
        }
        progress(l + 1, layers);
    }
    Ok(w.finish()?)
}

fn transpose_error(
    model: &Model<'_>,
    l: usize,
    e: usize,
    err: kernels_neon::KernelError,
) -> BundleError {
    BundleError::BadModel {
        path: model.path().to_path_buf(),
        detail: format!("transposing the down matrix of expert {e} of layer {l}: {err}"),
    }
}

/// The L2 norm of each of the `ff` rows of `down_t`.
fn norms(
    down_t: &[u8],
    format: WeightFormat,
    ff: usize,
    d: usize,
) -> std::result::Result<Vec<f32>, kernels_neon::KernelError> {
    let m = QMatrix::new(format, ff, d, down_t)?;
    let mut row = vec![0.0f32; d];
    (0..ff)
        .map(|j| {
            kernels_neon::dequantize_row(format, m.row_data(j), &mut row)?;
            Ok(row.iter().map(|v| v * v).sum::<f32>().sqrt())
        })
        .collect()
}

/// Reads back and checks every unit of the store at `path` (`--verify`).
pub(crate) fn verify(path: &Path) -> Result<()> {
    let io = ufs_io::IoEngine::new(ufs_io::IoConfig::default())?;
    NeuronStore::open(&io, path, ufs_io::OpenOptions::default())?.verify_all(&io)?;
    Ok(())
}
