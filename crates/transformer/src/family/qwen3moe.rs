//! Qwen3-MoE (GGUF `qwen3moe`, Qwen3-30B-A3B): qwen3's attention (RMSNorm of every query and key
//! head, [`super::qwen3::QkNorm`]) and a Mixture-of-Experts FFN whose top-k weights are
//! renormalised, as llama.cpp's `src/models/qwen3moe.cpp` computes it. NEOX (half-split) RoPE.

use kernels_neon::RopeStyle;

use super::qwen3::QkNorm;
use super::{Family, LayerShape, LayerTensors};
use crate::error::Result;
use crate::layer::{AttnStep, LayerFfn};

/// The qwen3moe family.
pub struct Qwen3Moe;

impl Family for Qwen3Moe {
    fn name(&self) -> &'static str {
        "qwen3moe"
    }

    /// GGUF only: HF MoE checkpoints are not read.
    fn hf_names(&self) -> &'static [&'static str] {
        &[]
    }

    fn gguf_rope(&self) -> RopeStyle {
        RopeStyle::Half
    }

    fn attention(&self, t: &dyn LayerTensors<'_>, s: &LayerShape) -> Result<Box<dyn AttnStep>> {
        QkNorm::per_head(t, s)
    }

    fn ffn<'a>(&self, t: &dyn LayerTensors<'a>, s: &LayerShape) -> Result<LayerFfn<'a>> {
        super::experts::moe_ffn(t, s)
    }
}
