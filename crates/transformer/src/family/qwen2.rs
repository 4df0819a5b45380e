//! Qwen2: llama's block with biases on the q, k and v projections (required); GGUF files keep the HF
//! row order and use NEOX (half-split) RoPE.

use kernels_neon::RopeStyle;

use super::steps::QkvBias;
use super::{Family, LayerShape, LayerTensors};
use crate::error::Result;
use crate::layer::AttnStep;

/// The qwen2 family.
pub struct Qwen2;

impl Family for Qwen2 {
    fn name(&self) -> &'static str {
        "qwen2"
    }

    fn hf_names(&self) -> &'static [&'static str] {
        &["Qwen2ForCausalLM", "qwen2"]
    }

    fn gguf_rope(&self) -> RopeStyle {
        RopeStyle::Half
    }

    fn attention(&self, t: &dyn LayerTensors<'_>, s: &LayerShape) -> Result<Box<dyn AttnStep>> {
        Ok(Box::new(QkvBias {
            q: Some(t.vector("q_bias", s.q_dim)?),
            k: Some(t.vector("k_bias", s.kv_dim)?),
            v: Some(t.vector("v_bias", s.kv_dim)?),
        }))
    }
}
