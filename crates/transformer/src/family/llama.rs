//! Llama: RMSNorm, RoPE, grouped-query attention, gated FFN; q/k/v biases only where a file has
//! them. llama.cpp's converter permutes the Q/K rows of llama models so that RoPE rotates adjacent
//! pairs. A file with `llama.expert_count` (Mixtral) has a Mixture-of-Experts FFN instead, top-k
//! weights renormalised, as llama.cpp's `src/models/llama.cpp` computes it.

use kernels_neon::RopeStyle;

use super::steps::QkvBias;
use super::{Family, LayerShape, LayerTensors};
use crate::error::Result;
use crate::layer::{AttnStep, LayerFfn};

/// The llama family.
pub struct Llama;

impl Family for Llama {
    fn name(&self) -> &'static str {
        "llama"
    }

    fn hf_names(&self) -> &'static [&'static str] {
        &["LlamaForCausalLM", "llama", "MistralForCausalLM", "mistral"]
    }

    fn gguf_rope(&self) -> RopeStyle {
        RopeStyle::Interleaved
    }

    fn attention(&self, t: &dyn LayerTensors<'_>, s: &LayerShape) -> Result<Box<dyn AttnStep>> {
        Ok(Box::new(QkvBias {
            q: t.optional_vector("q_bias", s.q_dim)?,
            k: t.optional_vector("k_bias", s.kv_dim)?,
            v: t.optional_vector("v_bias", s.kv_dim)?,
        }))
    }

    fn ffn<'a>(&self, t: &dyn LayerTensors<'a>, s: &LayerShape) -> Result<LayerFfn<'a>> {
        match s.moe {
            Some(_) => super::experts::moe_ffn(t, s),
            None => super::gated_ffn(t, s).map(LayerFfn::Gated),
        }
    }
}
