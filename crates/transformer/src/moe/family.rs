//! The Mixture-of-Experts families as llama.cpp names and computes them (`src/models/{qwen3moe,
//! llama,olmoe,qwen2moe}.cpp`, `src/llama-arch.cpp` of the llama.cpp that docs/BENCHMARKS.md
//! builds), and their hyper-parameters read from GGUF metadata.

use std::path::Path;

use model_format::MetaValue;

use crate::error::{ModelError, Result};

/// Most experts a layer may declare: real models have up to a few hundred (Qwen3-235B-A22B: 128,
/// DeepSeek-V3: 256); a hostile file's count must not size buffers.
pub const MAX_EXPERTS: usize = 4096;

/// A Mixture-of-Experts model family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum MoeFamily {
    /// GGUF `qwen3moe` (Qwen3-30B-A3B): top-k of the softmax renormalised (`norm_topk_prob`),
    /// per-head RMSNorm of q and k, expert width `expert_feed_forward_length`, no shared expert.
    Qwen3Moe,
    /// GGUF `llama` with `llama.expert_count` (Mixtral): top-k of the softmax renormalised (the
    /// same as a softmax over the selected logits), expert width `feed_forward_length`.
    Mixtral,
    /// GGUF `olmoe` (OLMoE-1B-7B): top-k of the softmax NOT renormalised, RMSNorm of the whole q
    /// and k vectors (not per head), expert width `feed_forward_length`.
    Olmoe,
    /// GGUF `qwen2moe` (Qwen1.5-MoE-A2.7B): top-k of the softmax NOT renormalised, plus a shared
    /// expert (`ffn_{gate,up,down}_shexp`, width `expert_shared_feed_forward_length`) scaled by
    /// `sigmoid(ffn_gate_inp_shexp · x)`; expert width `expert_feed_forward_length`.
    Qwen2Moe,
}

/// How the weights of the selected experts are normalised after the softmax over all experts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum TopKNorm {
    /// Divided by their sum (clamped below at 2^-14, as llama.cpp's `build_moe_ffn` does).
    Renormalize,
    /// Used as they are.
    Raw,
}

/// Which RMSNorm a family applies to q and k before RoPE.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum QkNorm {
    /// None.
    None,
    /// Over each head (`attn_q_norm`, `attn_k_norm` of `head_dim` elements).
    PerHead,
    /// Over the whole q (and k) vector of a token (`attn_q_norm` of `n_heads * head_dim`).
    Full,
}

impl MoeFamily {
    /// Every family.
    pub const ALL: [MoeFamily; 4] = [
        MoeFamily::Qwen3Moe,
        MoeFamily::Mixtral,
        MoeFamily::Olmoe,
        MoeFamily::Qwen2Moe,
    ];

    /// The GGUF `general.architecture`.
    pub fn gguf_arch(self) -> &'static str {
        match self {
            MoeFamily::Qwen3Moe => "qwen3moe",
            MoeFamily::Mixtral => "llama",
            MoeFamily::Olmoe => "olmoe",
            MoeFamily::Qwen2Moe => "qwen2moe",
        }
    }

    /// The family of a GGUF architecture, given whether its `<arch>.expert_count` is above 0
    /// (`llama` is Mixtral only then); `None` for a dense architecture.
    pub fn from_gguf_arch(arch: &str, has_experts: bool) -> Option<MoeFamily> {
        match arch {
            "qwen3moe" => Some(MoeFamily::Qwen3Moe),
            "llama" if has_experts => Some(MoeFamily::Mixtral),
            "olmoe" => Some(MoeFamily::Olmoe),
            "qwen2moe" => Some(MoeFamily::Qwen2Moe),
            _ => None,
        }
    }

    /// The normalisation of the top-k weights (the `norm_w` argument each family passes to
    /// llama.cpp's `build_moe_ffn`).
    pub fn top_k_norm(self) -> TopKNorm {
        match self {
            MoeFamily::Qwen3Moe | MoeFamily::Mixtral => TopKNorm::Renormalize,
            MoeFamily::Olmoe | MoeFamily::Qwen2Moe => TopKNorm::Raw,
        }
    }

    /// The q/k normalisation of the family's attention.
    pub fn qk_norm(self) -> QkNorm {
        match self {
            MoeFamily::Qwen3Moe => QkNorm::PerHead,
            MoeFamily::Olmoe => QkNorm::Full,
            MoeFamily::Mixtral | MoeFamily::Qwen2Moe => QkNorm::None,
        }
    }

    /// Whether the family has a gated shared expert.
    pub fn has_shared_expert(self) -> bool {
        self == MoeFamily::Qwen2Moe
    }

    /// Whether the file must hold `output.weight` (llama.cpp ties it to the embedding only for
    /// `qwen3moe` and `llama`).
    pub fn output_required(self) -> bool {
        matches!(self, MoeFamily::Olmoe | MoeFamily::Qwen2Moe)
    }

    /// Whether RoPE rotates the two halves of a head (llama.cpp's NEOX type) rather than
    /// interleaved pairs (`llama`, whose GGUF q/k rows are permuted for it).
    pub fn rope_half_split(self) -> bool {
        self != MoeFamily::Mixtral
    }
}

/// The error of a mode that does not run Mixture-of-Experts models yet: names the file, the
/// architecture and the mode.
pub fn unsupported(path: &Path, arch: &str, mode: &str) -> ModelError {
    ModelError::BadModel {
        path: path.to_path_buf(),
        detail: format!(
            "a Mixture-of-Experts model ({arch}): {mode} does not support MoE yet \
             (MoE models run in memory, dense)"
        ),
    }
}

/// The Mixture-of-Experts hyper-parameters of a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct MoeConfig {
    /// The family.
    pub family: MoeFamily,
    /// Experts per layer (`<arch>.expert_count`).
    pub n_experts: usize,
    /// Experts each token uses (`<arch>.expert_used_count`).
    pub n_used: usize,
    /// Neurons of one expert.
    pub expert_ff: usize,
    /// Neurons of the shared expert, for the families that have one.
    pub shared_ff: Option<usize>,
}

impl MoeConfig {
    /// Reads the MoE keys of a GGUF file at `path` whose metadata `get` returns: `Ok(None)` for a
    /// dense architecture (`llama` without experts, or any other), an error naming the file and
    /// the key for a missing, zero or inconsistent count.
    pub fn from_gguf<'m>(
        path: &Path,
        get: impl Fn(&str) -> Option<&'m MetaValue>,
    ) -> Result<Option<MoeConfig>> {
        let bad = |detail: String| ModelError::BadModel {
            path: path.to_path_buf(),
            detail,
        };
        let Some(arch) = get("general.architecture").and_then(MetaValue::as_str) else {
            return Ok(None);
        };
        let uint = |key: &str| -> Result<Option<usize>> {
            let key = format!("{arch}.{key}");
            match get(&key) {
                None => Ok(None),
                Some(v) => v
                    .as_u64()
                    .and_then(|v| usize::try_from(v).ok())
                    .map(Some)
                    .ok_or_else(|| bad(format!("{key} is not a non-negative integer: {v:?}"))),
            }
        };
        let n_experts = uint("expert_count")?.unwrap_or(0);
        let Some(family) = MoeFamily::from_gguf_arch(arch, n_experts > 0) else {
            return Ok(None);
        };
        if !(1..=MAX_EXPERTS).contains(&n_experts) {
            return Err(bad(format!(
                "{arch}.expert_count is {n_experts}: a {arch} model needs 1..={MAX_EXPERTS} experts"
            )));
        }
        let n_used = uint("expert_used_count")?.unwrap_or(0);
        if !(1..=n_experts).contains(&n_used) {
            return Err(bad(format!(
                "{arch}.expert_used_count is {n_used}: it must be 1..={n_experts} (expert_count)"
            )));
        }
        let ff = uint("feed_forward_length")?;
        let expert_ff = match family {
            MoeFamily::Mixtral | MoeFamily::Olmoe => ff,
            // llama.cpp: `n_ff_exp ? n_ff_exp : n_ff / n_expert_used`.
            MoeFamily::Qwen3Moe | MoeFamily::Qwen2Moe => uint("expert_feed_forward_length")?
                .filter(|&f| f > 0)
                .or(ff.map(|f| f / n_used)),
        }
        .filter(|&f| f > 0)
        .ok_or_else(|| {
            bad(format!(
                "{arch}: no expert width (feed_forward_length or expert_feed_forward_length)"
            ))
        })?;
        let shared_ff = if family.has_shared_expert() {
            let f = uint("expert_shared_feed_forward_length")?
                .filter(|&f| f > 0)
                .or(ff)
                .filter(|&f| f > 0)
                .ok_or_else(|| bad(format!("{arch}: no shared expert width (expert_shared_feed_forward_length or feed_forward_length)")))?;
            Some(f)
        } else {
            None
        };
        Ok(Some(MoeConfig {
            family,
            n_experts,
            n_used,
            expert_ff,
            shared_ff,
        }))
    }
}
