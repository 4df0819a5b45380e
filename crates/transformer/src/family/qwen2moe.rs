//! Qwen2-MoE (GGUF `qwen2moe`, Qwen1.5-MoE-A2.7B): qwen2's attention (q/k/v biases; llama.cpp
//! loads them where the file has them) and a Mixture-of-Experts FFN with raw top-k weights plus a
//! shared expert scaled by `sigmoid(ffn_gate_inp_shexp · x)`, as llama.cpp's
//! `src/models/qwen2moe.cpp` computes it. NEOX (half-split) RoPE.

use kernels_neon::RopeStyle;

use super::steps::QkvBias;
use super::{Family, LayerShape, LayerTensors};
use crate::error::Result;
use crate::layer::{AttnStep, LayerFfn};

/// The qwen2moe family.
pub struct Qwen2Moe;

impl Family for Qwen2Moe {
    fn name(&self) -> &'static str {
        "qwen2moe"
    }

    /// GGUF only: HF MoE checkpoints are not read.
    fn hf_names(&self) -> &'static [&'static str] {
        &[]
    }

    fn gguf_rope(&self) -> RopeStyle {
        RopeStyle::Half
    }

    fn attention(&self, t: &dyn LayerTensors<'_>, s: &LayerShape) -> Result<Box<dyn AttnStep>> {
        Ok(Box::new(QkvBias {
            q: t.optional_vector("q_bias", s.q_dim)?,
            k: t.optional_vector("k_bias", s.kv_dim)?,
            v: t.optional_vector("v_bias", s.kv_dim)?,
        }))
    }

    fn ffn<'a>(&self, t: &dyn LayerTensors<'a>, s: &LayerShape) -> Result<LayerFfn<'a>> {
        super::experts::moe_ffn(t, s)
    }
}
