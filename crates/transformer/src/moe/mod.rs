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
//! * `block.rs`: [`MoeBlock`], the FFN step itself on the dense kernels, batched by expert, and
//!   [`RouteTrace`], which records the experts it selects (the routing a model realises);
//! * `copies.rs`: [`PackedExperts`], a layer's experts repacked eight rows at a time (`Q40x8`;
//!   made at load with the dense matrices' copies, `crate::packed`), which every product of a step
//!   that runs the decode kernels reads; `packed.rs`: the one-token step over them;
//! * `neurons.rs`: [`NeuronTrace`], the active neurons of each expert counted (a ReLU expert's
//!   activation profile);
//! * `ffn.rs`: [`MoeFfn`], what a layer's `layer::LayerFfn::Moe` holds, and its step (buffers kept
//!   per thread across layers and steps), which `ffn::layer_step` runs.
//!
//! The families' modules in [`crate::family`] (`qwen3moe`, `olmoe`, `qwen2moe`, and `llama` when
//! the file has `llama.expert_count`) build it. It runs in memory, or with its experts from an expert
//! store (`crate::offload::ExpertOffload`, through [`crate::FfnExecutor::moe_step`]); the modes built
//! on neuron rows (sparse, neuron stores, neuron profiles, accelerator blocks, planner) refuse an MoE
//! model by name. `profile.rs`: [`RoutingProfile`], the routers' choices counted on calibration text
//! ([`RoutingRecorder`]), which a bundle of experts carries.

mod block;
mod copies;
mod family;
mod ffn;
mod neurons;
mod packed;
mod profile;
mod routing;
mod weights;

pub use block::{MoeBlock, MoeScratch, RouteTrace, TracedStep};
pub use copies::PackedExperts;
pub use family::{unsupported, MoeConfig, MoeFamily, QkNorm, TopKNorm, MAX_EXPERTS};
pub use ffn::MoeFfn;
pub use neurons::{ExpertNeuronProfile, ExpertNeurons, NeuronTrace};
pub use profile::{RoutingProfile, RoutingRecorder, MAX_ROUTING_PROFILE_BYTES};
pub use routing::{route, ExpertGroups, Route, MIN_WEIGHT_SUM};
pub use weights::{ExpertFfn, MoeLayer, SharedExpert};
