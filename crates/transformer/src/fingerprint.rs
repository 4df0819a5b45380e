//! The model fingerprint that profiles, predictors and neuron stores are checked against. A leaf: it
//! reads a loaded [`Model`] and nothing else of the engine.

use crate::model::{LayerFfn, Model};

/// A stable id of a model's weights for profile and predictor files: FNV-1a 64 over the shapes and the
/// first 64 KiB of the first layer's gate and last layer's down matrices (for a resident file, the
/// fingerprint of the model it was converted from).
pub fn model_fingerprint(model: &Model<'_>) -> u64 {
    // A resident file carries the fingerprint of the model it was converted from.
    if let Some(r) = &model.config.ffn_store {
        return r.fingerprint;
    }
    let mut h = predictor::Fnv1a64::default();
    let c = &model.config;
    for v in [
        c.n_layers,
        c.d_model,
        c.d_ff,
        c.n_heads,
        c.n_kv_heads,
        c.vocab_size,
        model.weight_bytes,
    ] {
        h.update(&(v as u64).to_le_bytes());
    }
    if let (Some(first), Some(last)) = (model.layers.first(), model.layers.last()) {
        let first = match &first.ffn {
            LayerFfn::Gated(f) => &f.gate,
            LayerFfn::Moe(m) => &m.weights.router,
        };
        let last = match &last.ffn {
            LayerFfn::Gated(f) => Some(&f.down),
            LayerFfn::Moe(m) => m.weights.experts.last().map(|e| &e.down),
        };
        for m in std::iter::once(first).chain(last) {
            let d = m.data();
            h.update(&d[..d.len().min(64 << 10)]);
        }
    }
    h.finish()
}
