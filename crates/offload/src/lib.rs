//! Sparse and offloaded FFN execution: the executors of the `transformer` crate's [`FfnExecutor`](transformer::FfnExecutor)
//! seam that skip neurons or read them from flash. [`SparseFfn`] (activation sparsity, weights in
//! memory or in a neuron store; `sparse.rs`, with the one neuron selector of sparse and offloaded
//! decode in `neurons.rs` and its cost model in `select_cost.rs`), [`AccelFfn`] (whole layers on an
//! accelerator backend; `accel_ffn.rs`, the process's backend registry and a model's layers made
//! into blocks in `accel.rs`), [`HybridFfn`] (each layer's hot neurons on the backend, the rest
//! sparse; `hybrid.rs`) and [`ExpertOffload`] (an MoE model's experts from an expert store). The
//! memory budget ([`budget`]: [`MemoryBudget`], what stays resident, the cache's share) is here
//! because the neuron cache is.
//!
//! Invariants: an executor's step computes what the in-memory sparse step computes, whatever the
//! cache holds, the read order or the thread schedule (units summed in fixed point); the cache never
//! exceeds its budget; every error of an executor reaches the forward pass boxed in
//! `transformer::ModelError::Ffn` ([`OffloadError`] inside). It does not know how a bundle is written
//! (the `model-bundle` crate converts models into a resident file and a store), nor plans, devices or
//! generation (the engine's).
//!
//! Flash offload (PowerInfer-2 §4): FFN weights in a neuron store on flash, read on demand through
//! `ufs-io` into a `neuron-cache` under a byte budget, computed unit by unit as they arrive.
//!
//! * A model is converted (by the `model-bundle` crate) into a *resident file* (a GGUF without the
//!   FFN tensors, naming its store) and a *neuron store* (`neuron-store`: gate row, up row and down
//!   column of each neuron together, hot neurons first, packed into 4 KiB units by activation
//!   frequency).
//! * [`Offload`] is the run-time side, used by [`SparseFfn::from_store`]: at start-up the hot
//!   prefix of every layer is read sequentially into the hot region of one
//!   [`neuron_cache::SharedNeuronCache`] (whole clusters of units, inserted pinned, so they are never
//!   evicted and are read without the cache's lock); the rest of the budget is the cold region
//!   (two-queue LRU of single units), looked up under one lock per layer and step. A decode step groups the
//!   predicted neurons by unit, computes units found in the cache at once and queues the others on the
//!   I/O thread; completions are computed as they arrive, interleaved with cached units, so flash reads
//!   overlap with compute at unit granularity and there is no barrier between gate, up and down (a unit
//!   holds all three).
//! * Read-ahead (`prefetch.rs`): where a step wants every neuron (no predictor), the next layer's
//!   uncached units are queued as soon as this layer's misses, so the flash reads through this
//!   layer's compute and the attention between; the next step takes them as its reads.
//! * Two-phase loading (PowerInfer-2 §4.4): where a unit spans pages (bundles over 4 KiB, e.g. d = 4096)
//!   a miss reads the unit's first page, which holds its gate rows; the rest is read only when a gate
//!   output can pass the threshold (for the output score: a non-zero activation, i.e. not a ReLU zero).
//!   Each part is checked against its own checksum (the store records the first page's CRC too).
//!   Opt-in ([`OffloadOptions::two_phase`]): the second read is in series with the first.
//!
//! * A prompt step (`Offload::prefill`, `prefill.rs`) streams each layer's units instead: the hot
//!   prefix from memory, the rest in sequential reads of about `OffloadOptions::prefill_neurons` neurons that a reader
//!   thread issues one chunk ahead of the batched products (gate and up over the chunk's rows, then
//!   its down rows transposed, `kernels_neon::matmul_t`), so a prompt reads each unit once.
//! * A live budget ([`CacheControl`], from [`Offload::control`]): the cache shrinks or grows while
//!   decoding, between two layer steps; a shrink frees the evicted bytes.
//!
//! * Hybrid decode over the store (`blocks.rs`): an accelerator takes each layer's leading units
//!   as its block ([`Offload::accel_blocks`]) and the cache gives it that memory and its pinned hot
//!   prefix ([`CacheControl::reserve`]); [`HybridFfn`] leaves those neurons out of the CPU's
//!   steps.
//!
//! * Mixture-of-Experts models (`experts.rs`): the unit is a whole expert. A
//!   convert (`model-bundle`) writes an expert store and a routing profile beside the resident file; [`ExpertOffload`]
//!   runs the MoE layers from that store through an `ExpertCache` (see its module docs).
//!
//! Files: `options.rs` (settings and
//! counters), `runtime.rs` ([`Offload`]: opening, cache), `live.rs` ([`CacheControl`]: the hot
//! prefixes behind a read-write lock, preload and live resize), `decode.rs` (one layer's
//! decode step in named stages), `prefetch.rs` (the next layer's reads queued ahead; their state in `ahead.rs`), `prefill.rs` (one layer's prompt step, streamed), `chunk.rs` (a chunk's
//! rows gathered from its units), `blocks.rs` (an accelerator's blocks from the store), `unit.rs` (what a worker does with one unit: checks, two-phase
//! reads, compute through the shared neuron selector, `neurons.rs`).

pub mod accel;
mod accel_ffn;
mod ahead;
mod belady;
mod blocks;
pub mod budget;
mod chunk;
mod decode;
mod draft;
pub mod error;
mod expert_scores;
mod expert_source;
mod experts;
mod fixed_set;
mod hybrid;
mod live;
pub mod neurons;
mod options;
mod prefetch;
mod prefill;
mod prompt_accel;
mod runtime;
pub mod sparse;
pub mod sys;
mod unit;

pub use self::accel::{AccelKind, Accelerator, FfnBlock};
pub use accel_ffn::AccelFfn;
pub use belady::belady_misses;
pub use budget::{parse_size, BudgetSplit, MemoryBudget, Resident};
pub use draft::ResidentOnly;
pub use error::{OffloadError, Result};
pub use expert_source::{expert_layer_shapes, expert_read_bytes, ExpertLayerShape};
pub use experts::{ExpertCounters, ExpertOffload, ExpertOffloadOptions, ExpertResidentOnly};
pub use fixed_set::fixed_set_misses;
pub use hybrid::{bucket, HotSplit, HybridFfn, BUCKETS};
pub use live::{CacheControl, CacheReport};
pub use neuron_cache::{Eviction, ExpertId};
pub use neuron_store::Packing;
pub use options::{OffloadOptions, OffloadStats};
pub(crate) use prefill::PrefillMask;
pub use runtime::Offload;
pub use sparse::{NeuronPredictor, SparseFfn, SparseStats};
