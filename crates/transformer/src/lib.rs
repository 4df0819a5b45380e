//! A decoder-only transformer and its forward pass: a model file (GGUF or an HF safetensors
//! directory, [`ModelFile`]) opened and checked into a [`Model`] whose weights are borrowed from the
//! memory map, one module per model family behind the [`family::Family`] trait (llama, also Mixtral
//! with experts; qwen2, qwen3, gemma3 and the Mixture-of-Experts qwen3moe, olmoe and qwen2moe,
//! [`moe`]), and the generic layer loop ([`forward`]) with its KV cache ([`KvCache`]).
//!
//! The FFN step of every layer goes through one trait, [`FfnExecutor`] ([`ffn`]); this crate has
//! the dense executor ([`DenseFfn`]) and the observing one ([`ObservedFfn`], profiling). The sparse,
//! offloaded, accelerated and hybrid executors live above it (the `offload` crate) and return their
//! own errors boxed in [`ModelError::Ffn`].
//!
//! # Invariants
//! - Weights are borrowed from the memory map of the [`ModelFile`]; nothing is copied except 1-D norm
//!   weights and biases (dequantized to f32) and the layer matrices of an optional [`Overlay`]
//!   (re-quantized at load time, [`requant`]), which the caller owns, and the Q4_0 matrices the
//!   AVX2 and AVX-512 paths repack for one-token decode when asked ([`Model::pack_q40x8`], [`packed`]).
//! - Names and shapes of every tensor are checked at load time: a model that loads runs.
//! - The forward pass branches on no family; a failed forward step leaves the KV cache (every cache
//!   of a batched step) as it was.
//! - GGUF llama files keep llama.cpp's permuted Q/K rows and use interleaved RoPE; HF files use
//!   half-split RoPE: both give the same numbers without rewriting weights.
//!
//! It reads no neuron store (a resident file only names its store, [`config::FfnStoreRef`]) and knows
//! nothing of budgets, plans, accelerator backends, tokenizers or generation: those are the crates
//! above it.

pub mod config;
pub mod error;
pub mod family;
pub mod ffn;
pub mod file;
pub mod fingerprint;
pub mod forward;
mod kv_cache;
pub mod layer;
pub mod model;
pub mod moe;
pub mod ops;
pub mod output_proxy;
pub mod packed;
mod prompt_attention;
pub mod proxy_step;
pub mod requant;
pub mod stream;
pub mod stream_source;
pub mod transpose;

pub use config::{Activation, Arch, ModelConfig};
pub use error::{ModelError, Result};
pub use ffn::{DenseFfn, FfnExecutor, FfnLayer, FfnScratch, MoeStep, ObservedFfn, StepKind};
pub use fingerprint::model_fingerprint;
pub use forward::{forward_seqs, FfnMode, FfnSample, KvCache, Logits, KV_CHUNK};
pub use model::{Model, ModelFile};
pub use requant::{Overlay, Requant};
