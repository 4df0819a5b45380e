//! Flash offload (PowerInfer-2 §4): FFN weights in a neuron store on flash, read on demand through
//! `ufs-io` into a `neuron-cache` under a byte budget, computed unit by unit as they arrive.
//!
//! * [`convert`] writes a model plus its activation profile as a *resident file* (a GGUF without the
//!   FFN tensors, naming its store) and a *neuron store* (`neuron-store`: gate row, up row and down
//!   column of each neuron together, hot neurons first, packed into 4 KiB units by activation
//!   frequency).
//! * [`Offload`] is the run-time side, used by [`crate::SparseFfn::from_store`]: at start-up the hot
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
//! * A prompt step ([`Offload::prefill`], `prefill.rs`) streams each layer's units instead: the hot
//!   prefix from memory, the rest in sequential reads of about `OffloadOptions::prefill_neurons` neurons that a reader
//!   thread issues one chunk ahead of the batched products (gate and up over the chunk's rows, then
//!   its down rows transposed, `kernels_neon::matmul_t`), so a prompt reads each unit once.
//! * A live budget ([`CacheControl`], from [`Offload::control`]): the cache shrinks or grows while
//!   decoding, between two layer steps; a shrink frees the evicted bytes.
//!
//! * Hybrid decode over the store (`blocks.rs`): an accelerator takes each layer's leading units
//!   as its block ([`Offload::accel_blocks`]) and the cache gives it that memory and its pinned hot
//!   prefix ([`CacheControl::reserve`]); [`crate::HybridFfn`] leaves those neurons out of the CPU's
//!   steps.
//!
//! * Mixture-of-Experts models (`experts.rs`, `experts_convert.rs`): the unit is a whole expert. A
//!   convert writes an expert store and a routing profile beside the resident file; [`ExpertOffload`]
//!   runs the MoE layers from that store through an `ExpertCache` (see its module docs).
//!
//! Files: `convert.rs` (offline conversion, store path, verification), `generation.rs` (the new
//! names a convert writes its parts under, its steps, removing the parts it replaced), `options.rs` (settings and
//! counters), `runtime.rs` ([`Offload`]: opening, cache), `live.rs` ([`CacheControl`]: the hot
//! prefixes behind a read-write lock, preload and live resize), `decode.rs` (one layer's
//! decode step in named stages), `prefetch.rs` (the next layer's reads queued ahead; their state in `ahead.rs`), `prefill.rs` (one layer's prompt step, streamed), `chunk.rs` (a chunk's
//! rows gathered from its units), `blocks.rs` (an accelerator's blocks from the store), `unit.rs` (what a worker does with one unit: checks, two-phase
//! reads, compute through the shared neuron selector, `neurons.rs`).

mod ahead;
mod blocks;
mod chunk;
mod convert;
mod decode;
mod experts;
mod experts_convert;
mod generation;
mod live;
mod options;
mod prefetch;
mod prefill;
mod prompt_accel;
mod runtime;
mod unit;

pub use convert::{
    auto_down_format, auto_packing, convert, store_ffn_bytes, store_path_for, verify,
    ConvertOptions, ConvertReport,
};
pub use experts::{belady_misses, ExpertCounters, ExpertOffload, ExpertOffloadOptions};
pub use experts_convert::{convert_moe, MoeConvertReport};
pub use generation::ConvertStep;
pub use live::{CacheControl, CacheReport};
pub use neuron_store::Packing;
pub use options::{OffloadOptions, OffloadStats};
pub(crate) use prefill::PrefillMask;
pub use runtime::Offload;
