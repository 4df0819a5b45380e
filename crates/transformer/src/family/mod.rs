//! Model families: one module per family, behind the [`Family`] trait, so that the generic forward
//! pass ([`crate::forward`]) knows none of them.
//!
//! A family says
//! * its names: the GGUF `general.architecture` value (also the prefix of its `{arch}.*` config
//!   keys) and the HF `architectures` / `model_type` values it answers to;
//! * its RoPE pairing in GGUF files (HF files keep the checkpoint's row order: half-split for all);
//! * its tensors beyond the common block (`attn_norm`, `q`, `k`, `v`, `o`, `ffn_norm`): it builds the
//!   layer's attention variant ([`AttnStep`]: q/k/v biases, per-head q/k norms, ...), reading what
//!   it needs through [`LayerTensors`];
//! * its FFN block ([`Family::ffn`]): gated dense by default. A Mixture-of-Experts family overrides
//!   it and returns [`LayerFfn::Moe`] (built by `experts.rs` from the config's
//!   [`MoeConfig`]; llama does so when the file has `llama.expert_count`, Mixtral); the forward pass
//!   does not change.
//! * optionally (defaults: none), what the generic pass applies without knowing why: norms of a
//!   block's output before the residual add ([`Family::post_norms`]), a layer's sliding window and
//!   RoPE base from the family's own config keys ([`Family::attn_span`], read through
//!   [`ConfigKeys`]), a scale of the input embeddings ([`Family::embedding_scale`]), the FFN
//!   activation ([`Family::activation`]), and keys it refuses ([`Family::check_keys`]).
//!
//! `FAMILIES` is the registry: one line per family. Adding a family is its module, its line there,
//! and its tests, plus the GGUF and HF names of any new logical tensor key in `file.rs` (qwen3 added
//! `q_norm` and `k_norm` there).

mod experts;
mod gemma3;
mod llama;
mod olmoe;
mod qwen2;
mod qwen2moe;
mod qwen3;
mod qwen3moe;
mod steps;

use std::path::Path;

use kernels_neon::{QMatrix, RopeStyle, WeightFormat};
use model_format::TensorView;

use crate::error::{kernel, Result};
use crate::layer::{AttnSpan, AttnStep, GatedFfn, Layer, LayerFfn, PostNorms};
use crate::moe::MoeConfig;
use tensor_types::Activation;

/// Every family the engine runs, in the order errors list them.
static FAMILIES: &[&dyn Family] = &[
    &llama::Llama,       // llama (also HF Mistral)
    &qwen2::Qwen2,       // qwen2
    &qwen3::Qwen3,       // qwen3 (dense)
    &qwen3moe::Qwen3Moe, // qwen3moe (Mixture of Experts; Mixtral is llama with experts)
    &olmoe::Olmoe,       // olmoe (Mixture of Experts)
    &qwen2moe::Qwen2Moe, // qwen2moe (Mixture of Experts, shared expert)
    &gemma3::Gemma3,     // gemma3
];

/// The dimensions a family loads a layer's tensors with.
#[derive(Debug, Clone, Copy)]
pub struct LayerShape {
    /// Hidden size.
    pub d_model: usize,
    /// Query width (`n_heads × head_dim`).
    pub q_dim: usize,
    /// Key/value width (`n_kv_heads × head_dim`).
    pub kv_dim: usize,
    /// Dimension of one head.
    pub head_dim: usize,
    /// FFN inner size.
    pub d_ff: usize,
    /// Whether the FFN lives in a neuron store (a resident file has no FFN tensors).
    pub offloaded: bool,
    /// The Mixture-of-Experts hyper-parameters, `None` for a dense model.
    pub moe: Option<MoeConfig>,
    /// The FFN activation (of the experts too: ReLU for TurboSparse-style files).
    pub activation: Activation,
}

/// The tensors of layer `i` of a model file, by logical key (`q`, `k_bias`, `q_norm`, ...; the
/// file's naming maps them to GGUF or HF names). Shapes are checked; errors name the file and
/// tensor.
pub trait LayerTensors<'a> {
    /// A matrix, `rows × cols`.
    fn matrix(&self, key: &str, rows: usize, cols: usize) -> Result<QMatrix<'a>>;
    /// A vector of `len` elements, dequantized to f32.
    fn vector(&self, key: &str, len: usize) -> Result<Vec<f32>>;
    /// A vector, `None` when the file does not have it.
    fn optional_vector(&self, key: &str, len: usize) -> Result<Option<Vec<f32>>>;
    /// The tensor the file names `name` (in full, e.g. `blk.3.ffn_gate_exps.weight`) as it holds it,
    /// dims in `shape` (any number: the 3-D expert tensors); `None` when absent. The caller checks
    /// the shape and names [`LayerTensors::path`] in its errors.
    fn tensor(&self, name: &str) -> Option<TensorView<'a>>;
    /// The layer's index.
    fn index(&self) -> usize;
    /// The model file or directory, for errors.
    fn path(&self) -> &Path;
}

/// A model file's `{arch}.*` config keys, as a family reads its own: `key` without the
/// architecture prefix (`attention.sliding_window`). An HF directory has none.
pub trait ConfigKeys {
    /// An unsigned integer value.
    fn uint(&self, key: &str) -> Option<u64>;
    /// A number.
    fn float(&self, key: &str) -> Option<f64>;
    /// Whether the key is there at all (of any type).
    fn present(&self, key: &str) -> bool;
}

/// One model family ([module docs](self)).
pub trait Family: Send + Sync {
    /// The GGUF `general.architecture` value and prefix of its config keys.
    fn name(&self) -> &'static str;
    /// HF `architectures[0]` (or `model_type`) values read as this family.
    fn hf_names(&self) -> &'static [&'static str];
    /// Which pairs RoPE rotates in this family's GGUF files.
    fn gguf_rope(&self) -> RopeStyle;
    /// The layer's attention variant, with the tensors it needs.
    fn attention(&self, t: &dyn LayerTensors<'_>, s: &LayerShape) -> Result<Box<dyn AttnStep>>;
    /// The layer's FFN block: gated dense (`gate`, `up`, `down`; empty in a resident file).
    fn ffn<'a>(&self, t: &dyn LayerTensors<'a>, s: &LayerShape) -> Result<LayerFfn<'a>> {
        gated_ffn(t, s).map(LayerFfn::Gated)
    }
    /// Norms of the layer's attention and FFN outputs before the residual adds. Default: none.
    fn post_norms(&self, t: &dyn LayerTensors<'_>, s: &LayerShape) -> Result<PostNorms> {
        let _ = (t, s);
        Ok(PostNorms::default())
    }
    /// Layer `index`'s attention span (`rope_base`: the model's). Default: every position, the
    /// model's RoPE base. An error is a one-line description of the bad key.
    fn attn_span(
        &self,
        keys: &dyn ConfigKeys,
        rope_base: f32,
        index: usize,
    ) -> std::result::Result<AttnSpan, String> {
        let _ = (keys, index);
        Ok(AttnSpan {
            window: None,
            rope_base,
        })
    }
    /// The factor the input embeddings (`d_model` wide) are multiplied by. Default: none.
    fn embedding_scale(&self, d_model: usize) -> Option<f32> {
        let _ = d_model;
        None
    }
    /// The FFN activation of a file that does not name one (`sparrow.ffn_activation`). Default:
    /// SiLU.
    fn activation(&self) -> Activation {
        Activation::Silu
    }
    /// Refuses a file whose config keys ask for what this engine does not compute (a one-line
    /// description). Default: nothing refused.
    fn check_keys(&self, keys: &dyn ConfigKeys) -> std::result::Result<(), String> {
        let _ = keys;
        Ok(())
    }
}

/// The gated FFN matrices of a layer (empty when the FFN lives in a neuron store).
pub fn gated_ffn<'a>(t: &dyn LayerTensors<'a>, s: &LayerShape) -> Result<GatedFfn<'a>> {
    if s.offloaded {
        let empty = QMatrix::new(WeightFormat::F32, 0, 0, &[]).map_err(kernel("empty matrix"))?;
        return Ok(GatedFfn {
            gate: empty,
            up: empty,
            down: empty,
        });
    }
    Ok(GatedFfn {
        gate: t.matrix("gate", s.d_ff, s.d_model)?,
        up: t.matrix("up", s.d_ff, s.d_model)?,
        down: t.matrix("down", s.d_model, s.d_ff)?,
    })
}

/// Loads one layer: the common block, the family's attention variant, its FFN, its post-norms,
/// and its attention `span` (from [`Family::attn_span`]).
pub(crate) fn load_layer<'a>(
    arch: Arch,
    t: &dyn LayerTensors<'a>,
    s: &LayerShape,
    span: AttnSpan,
) -> Result<Layer<'a>> {
    let (d, q, kv) = (s.d_model, s.q_dim, s.kv_dim);
    Ok(Layer {
        attn_norm: t.vector("attn_norm", d)?,
        wq: t.matrix("q", q, d)?,
        wk: t.matrix("k", kv, d)?,
        wv: t.matrix("v", kv, d)?,
        attn_step: arch.family().attention(t, s)?,
        wo: t.matrix("o", d, q)?,
        ffn_norm: t.vector("ffn_norm", d)?,
        ffn: arch.family().ffn(t, s)?,
        post_norms: arch.family().post_norms(t, s)?,
        span,
    })
}

/// A model's family: a handle on its entry in the registry. Compares and serializes by name.
#[derive(Clone, Copy)]
pub struct Arch(&'static dyn Family);

impl Arch {
    /// The family whose GGUF name is `name`.
    pub fn from_gguf(name: &str) -> Option<Arch> {
        FAMILIES.iter().find(|f| f.name() == name).map(|f| Arch(*f))
    }

    /// The family an HF `architectures` / `model_type` value names.
    pub fn from_hf(name: &str) -> Option<Arch> {
        FAMILIES
            .iter()
            .find(|f| f.hf_names().contains(&name))
            .map(|f| Arch(*f))
    }

    /// The GGUF names of every family, for error messages.
    pub fn supported_gguf() -> String {
        FAMILIES
            .iter()
            .map(|f| f.name())
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The first HF name of every family, for error messages.
    pub fn supported_hf() -> String {
        FAMILIES
            .iter()
            .filter_map(|f| f.hf_names().first().copied())
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The family's GGUF name.
    pub fn name(&self) -> &'static str {
        self.0.name()
    }

    /// The family.
    pub fn family(&self) -> &'static dyn Family {
        self.0
    }
}

impl PartialEq for Arch {
    fn eq(&self, other: &Self) -> bool {
        self.name() == other.name()
    }
}

impl Eq for Arch {}

impl std::fmt::Debug for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl serde::Serialize for Arch {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_is_found_by_its_names_and_names_are_unique() {
        for f in FAMILIES {
            assert_eq!(Arch::from_gguf(f.name()).map(|a| a.name()), Some(f.name()));
            for hf in f.hf_names() {
                assert_eq!(Arch::from_hf(hf).map(|a| a.name()), Some(f.name()), "{hf}");
            }
        }
        let mut names: Vec<_> = FAMILIES.iter().map(|f| f.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), FAMILIES.len());
        assert!(Arch::from_gguf("gpt2").is_none());
        assert!(Arch::from_hf("GPT2LMHeadModel").is_none());
    }
}
