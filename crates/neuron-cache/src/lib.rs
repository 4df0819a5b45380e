//! `neuron-cache`: the in-memory cache of FFN neuron weights under one hard byte budget
//! (PowerInfer-2 §4.2, "segmented neuron cache").
//!
//! The budget (`--memory-budget`) is split into three regions:
//!
//! * **fixed** — attention weights, KV cache, predictors, embeddings: reserved with
//!   [`NeuronCache::reserve_fixed`], never evicted;
//! * **hot** — whole neuron clusters, evicted cluster by cluster in LRU order;
//! * **cold** — single neurons in the classic two-queue LRU (active/inactive lists): new neurons enter the
//!   inactive list, a second hit promotes to the active list, the active list is kept at or under 90% of
//!   the cold region by demoting its tail, and eviction discards from the inactive tail.
//!
//! The hot/cold split moves at run time ([`NeuronCache::set_hot_bytes`]), and so does the budget
//! itself ([`NeuronCache::set_budget`]: a live memory budget; shrinking evicts and drops the bytes). Entries in use are pinned and
//! never evicted. [`SharedNeuronCache`] puts the cache behind a `parking_lot::Mutex` for compute threads
//! and the I/O thread, and hands out guards that unpin on drop.
//!
//! Beside it, [`ExpertCache`] holds whole Mixture-of-Experts experts (the unit of offload of an MoE
//! model) under per-layer shares of a budget, evicted by frequency then recency, hot experts pinned.
//!
//! # Example
//!
//! ```
//! use std::sync::Arc;
//! use neuron_cache::{CacheError, NeuronCache, NeuronId, SharedNeuronCache};
//!
//! let mut cache = NeuronCache::new(64 * 1024);
//! cache.reserve_fixed(16 * 1024)?; // attention, KV cache, predictors
//! cache.set_hot_bytes(16 * 1024)?; // clusters; the cold region gets the remaining 32 KiB
//! let cache = SharedNeuronCache::new(cache);
//!
//! let id = NeuronId { layer: 3, neuron: 17 };
//! if cache.get_neuron(id).is_none() {
//!     let bytes: Arc<[u8]> = vec![0u8; 8192].into(); // read by ufs-io in the engine
//!     cache.insert_neuron(id, bytes)?;
//! }
//! let pinned = cache.get_neuron(id).expect("resident"); // second hit: promoted to the active list
//! assert_eq!(pinned.len(), 8192);
//! drop(pinned); // unpinned: evictable again
//! assert!(cache.stats().resident_bytes() <= 64 * 1024);
//! # Ok::<(), CacheError>(())
//! ```
//!
//! # Invariants
//!
//! * **The budget is hard**: fixed + hot + cold resident bytes never exceed it. An insertion that does not
//!   fit even after evicting every unpinned entry of its region fails with
//!   [`CacheError::BudgetExhausted`] and changes nothing.
//! * **Pinned entries are never evicted**, not by insertions, not by resizing regions or the budget (a
//!   resize that would need to fails with [`CacheError::Pinned`] and changes nothing) and not by
//!   explicit removal ([`CacheError::InUse`]).
//! * **Active ≤ 90% of the cold region** after every operation.
//! * The cache holds bytes only; it does no I/O (only `ufs-io` and `model-format` touch weight files).
//!
//! [`NeuronCache::check_invariants`] checks all of these plus the internal list structure. Tests: unit
//! tests of the two-queue semantics, a property test against a simple reference model (random operation
//! sequences: orders, residency, errors and statistics must match), and a multi-threaded stress test of
//! [`SharedNeuronCache`] with invariant checks during and after the run (no `loom`: the cache is one
//! mutex, so its correctness under concurrency reduces to the single-threaded model plus guard hygiene).

mod cache;
mod error;
mod experts;
mod lru;
mod shared;

pub use cache::{CacheStats, ClusterId, NeuronCache, NeuronId, RegionStats};
pub use error::{CacheError, Region, Result};
pub use experts::{Eviction, ExpertCache, ExpertId, ExpertStats, AGE_EVERY};
pub use shared::{ClusterGuard, NeuronGuard, SharedNeuronCache};
