//! Mixture-of-Experts FFN layers, as llama.cpp names and computes them for the GGUF architectures
//! `qwen3moe`, `llama` with `llama.expert_count` (Mixtral), `olmoe` and `qwen2moe`:
//!
//! * `family.rs`: [`MoeFamily`] (each family's top-k normalisation, q/k norm, shared expert, RoPE
//!   style) and [`MoeConfig`] read from the `<arch>.expert_count`, `expert_used_count`,
//!   `expert_feed_forward_length` and `expert_shared_feed_forward_length` keys;
//! * `weights.rs`: [`MoeLayer`], a layer's router (`ffn_gate_inp`), experts (row ranges of the 3-D
//!   `ffn_{gate,up,down}_exps` tensors, in every weight format of the dense path) and shared expert
//!   (`ffn_{gate,up,down}_shexp`, gate `ffn_gate_inp_shexp`);
//! * `routing.rs`: softmax, top-k and normalisation of one token's router logits ([`route`]), and
//!   the grouping of a step's tokens by expert ([`ExpertGroups`]);
//! * `block.rs`: [`MoeBlock`], the FFN step itself on the dense kernels, batched by expert.
//!
//! The forward pass does not call it yet: no MoE family is registered in [`crate::family`]
//! (the seam is a variant of `layer::LayerFfn` and its arm in `ffn::layer_step`), so MoE files are
//! refused. Each [`MoeFamily`] says what its module will need: the top-k normalisation, the q/k norm
//! ([`QkNorm`]: qwen3moe per head as dense qwen3, olmoe over the whole vector), the RoPE style and
//! whether `output.weight` is required.

mod block;
mod family;
mod routing;
mod weights;

pub use block::{MoeBlock, MoeScratch};
pub use family::{MoeConfig, MoeFamily, QkNorm, TopKNorm, MAX_EXPERTS};
pub use routing::{route, ExpertGroups, Route, MIN_WEIGHT_SUM};
pub use weights::{ExpertFfn, MoeLayer, SharedExpert};
