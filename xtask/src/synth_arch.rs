//! The model family `cargo xtask synth-model --arch` writes (`synth.rs` generates the weights):
//!
//! * `llama` (the default): `sparrow.ffn_activation = relu`, head size `d / heads`: the file of
//!   `synth.rs`'s module docs;
//! * `qwen3`: Qwen3-0.6B's shape by default (28 layers, d 1024, ff 3072, 16 heads, 8 kv heads, head
//!   size 128, a 151,936-token vocabulary), SiLU FFN (no `sparrow.ffn_activation`: the activation
//!   llama.cpp runs), `qwen3.attention.key_length` / `value_length`, and per layer the per-head
//!   RMSNorm weights `attn_q_norm` and `attn_k_norm` (F32, `head_dim` each, fixed values between 0.5
//!   and 1.5 so that a norm applied with the wrong weight shows), and a final norm weight of `2/√d`
//!   ([`SynthArch::output_norm`]). The planted power law is still
//!   planted in the gate pre-activations, but SiLU does not zero the negative ones: the FFN is dense.

use anyhow::{bail, Result};
use model_format::{DType, GgufWriter, MetaValue};

use super::synth::Options;

/// A synthetic model's family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SynthArch {
    /// GGUF `llama`, ReLU FFN.
    #[default]
    Llama,
    /// GGUF `qwen3`, SiLU FFN, per-head q/k norms.
    Qwen3,
}

impl SynthArch {
    /// `llama` or `qwen3`.
    pub fn parse(s: &str) -> Result<SynthArch> {
        match s.to_ascii_lowercase().as_str() {
            "llama" => Ok(SynthArch::Llama),
            "qwen3" => Ok(SynthArch::Qwen3),
            _ => bail!("--arch takes llama or qwen3, not `{s}`"),
        }
    }

    /// The GGUF `general.architecture` value.
    pub fn name(self) -> &'static str {
        match self {
            SynthArch::Llama => "llama",
            SynthArch::Qwen3 => "qwen3",
        }
    }

    /// The default options of this family (before the size flags override them).
    pub fn defaults(self) -> Options {
        match self {
            SynthArch::Llama => Options::default(),
            SynthArch::Qwen3 => Options {
                arch: SynthArch::Qwen3,
                layers: 28,
                d: 1024,
                ff: 3072,
                heads: 16,
                kv_heads: 8,
                head_dim: Some(128),
                vocab: 151_936,
                ..Options::default()
            },
        }
    }

    /// The metadata that differs between families: the activation and the head size keys.
    pub fn metadata(self, w: &mut GgufWriter, o: &Options) {
        match self {
            SynthArch::Llama => {
                w.metadata("sparrow.ffn_activation", MetaValue::String("relu".into()));
            }
            SynthArch::Qwen3 => {
                let hd = MetaValue::U32(o.head_dim() as u32);
                w.metadata("qwen3.attention.key_length", hd.clone());
                w.metadata("qwen3.attention.value_length", hd);
                w.metadata("tokenizer.ggml.add_bos_token", MetaValue::Bool(false));
            }
        }
    }

    /// The family's extra tensors of layer `l`, written after `attn_norm`.
    pub fn layer_tensors(self, w: &mut GgufWriter, o: &Options, l: usize) -> Result<()> {
        if self == SynthArch::Qwen3 {
            let hd = o.head_dim();
            for (k, name) in ["attn_q_norm", "attn_k_norm"].into_iter().enumerate() {
                w.tensor(
                    &format!("blk.{l}.{name}.weight"),
                    DType::F32,
                    &[hd],
                    norm_weight(hd, l, k),
                )?;
            }
        }
        Ok(())
    }

    /// The final norm's weight (every element): 1 for llama; `2/√d` for qwen3, so that its logits
    /// (the tied embedding's rows, about `√d` long, times the normed state) spread by about 2 and its
    /// perplexity is a moderate number rather than astronomically large.
    pub fn output_norm(self, d: usize) -> f32 {
        match self {
            SynthArch::Llama => 1.0,
            SynthArch::Qwen3 => 2.0 / (d as f32).sqrt(),
        }
    }

    /// Bytes of the extra tensors of one layer.
    pub fn layer_bytes(self, o: &Options) -> u64 {
        match self {
            SynthArch::Llama => 0,
            SynthArch::Qwen3 => 2 * 4 * o.head_dim() as u64,
        }
    }
}

/// A q/k norm weight: `hd` values in [0.5, 1.5), different per layer and per tensor.
fn norm_weight(hd: usize, layer: usize, which: usize) -> Vec<u8> {
    (0..hd)
        .flat_map(|i| {
            let h = (i * 37 + layer * 11 + which * 5) % 64;
            (0.5 + h as f32 / 64.0).to_le_bytes()
        })
        .collect()
}
