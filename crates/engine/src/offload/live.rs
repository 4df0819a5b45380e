//! A live FFN cache budget: [`CacheControl`] resizes a running [`Offload`](super::Offload)'s neuron
//! cache from any thread (the server's `POST /admin/memory-budget`).
//!
//! The hot region (each layer's hot prefix, pinned clusters read without the cache's lock) sits behind
//! a read-write lock: a decode step holds it for reading from its look-up to its last computed unit, a
//! resize holds it for writing, so a resize lands between two layer steps and never under one. A
//! shrink unpins and removes the clusters past the new hot prefix (a cluster cut in two is read again
//! at its new length), shrinks the cache's budget (the cold LRU evicts) and hands the freed heap back
//! to the system ([`crate::sys::release_free_memory`]), so resident memory follows. A grow raises the
//! budget and reads the missing hot clusters; the cold region fills again as decode misses.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockReadGuard};

use neuron_cache::{ClusterGuard, ClusterId, NeuronCache, NeuronId, SharedNeuronCache};
use neuron_store::NeuronStore;
use ufs_io::IoEngine;

use super::options::OffloadOptions;
use crate::error::{EngineError, Result};

/// Each layer's hot prefix: units `0..units[l]` of layer `l` are in the pinned clusters `clusters[l]`
/// (`cluster_units` units each, the last one possibly shorter).
pub(super) struct HotSet {
    pub(super) units: Vec<usize>,
    pub(super) clusters: Vec<Vec<ClusterGuard>>,
}

/// What a cache holds and may hold ([`CacheControl::report`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheReport {
    /// The process memory budget last set ([`CacheControl::set_memory_budget`]), or at start what
    /// stays resident plus the cache's budget.
    pub memory_budget: u64,
    /// The smallest memory budget accepted: what stays resident besides the FFN cache, plus one unit.
    pub minimum: u64,
    /// The neuron cache's budget (at most the whole FFN).
    pub cache_budget: u64,
    /// Bytes of FFN units the cache holds now (hot and cold); never above `cache_budget`.
    pub cache_bytes: u64,
    /// Bytes of the whole FFN (the neuron store's units).
    pub ffn_bytes: u64,
}

/// Resizes an [`Offload`](super::Offload)'s neuron cache while it serves; cheap to clone, usable from
/// any thread ([`super::Offload::control`]).
#[derive(Clone)]
pub struct CacheControl {
    pub(super) io: Arc<IoEngine>,
    pub(super) store: Arc<NeuronStore>,
    pub(super) cache: SharedNeuronCache,
    pub(super) hot: Arc<RwLock<HotSet>>,
    hot_share: f32,
    cluster_units: usize,
    outside: u64,
    memory_budget: Arc<AtomicU64>,
    /// The cache budget asked for and the part of it lent to prompt steps running now: the cache
    /// holds `asked - lent`. Held across a resize, so that resizes and loans apply in turn.
    budget: Arc<Mutex<Loan>>,
}

/// See [`CacheControl::budget`].
#[derive(Default)]
struct Loan {
    asked: usize,
    lent: usize,
}

impl CacheControl {
    /// A control over an empty cache (no budget yet) of `store`; [`CacheControl::set_cache_budget`]
    /// then loads it.
    pub(super) fn new(io: Arc<IoEngine>, store: Arc<NeuronStore>, opts: &OffloadOptions) -> Self {
        let layers = store.index().layers.len();
        CacheControl {
            io,
            store,
            cache: SharedNeuronCache::new(NeuronCache::new(0)),
            hot: Arc::new(RwLock::new(HotSet {
                units: vec![0; layers],
                clusters: (0..layers).map(|_| Vec::new()).collect(),
            })),
            hot_share: opts.hot_share.clamp(0.0, 1.0),
            cluster_units: opts.cluster_units.max(1),
            outside: opts.outside_ffn_bytes,
            memory_budget: Arc::new(AtomicU64::new(0)),
            budget: Arc::new(Mutex::new(Loan::default())),
        }
    }

    /// The hot prefixes, for a decode step (held until its last unit is computed).
    pub(super) fn read_hot(&self) -> RwLockReadGuard<'_, HotSet> {
        self.hot.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// The smallest process budget [`CacheControl::set_memory_budget`] accepts.
    pub fn minimum_memory_budget(&self) -> u64 {
        self.outside + self.store.index().layout.unit_bytes() as u64
    }

    /// Sets the budget of the whole process (`--memory-budget`): what stays resident besides the FFN
    /// cache (measured at load: the process, the resident file, the KV cache at the whole context, the
    /// predictors) is counted first and the cache gets the rest, at most the whole FFN. A budget
    /// below [`CacheControl::minimum_memory_budget`] is an error naming the minimum, and changes
    /// nothing.
    pub fn set_memory_budget(&self, bytes: u64) -> Result<CacheReport> {
        let min = self.minimum_memory_budget();
        if bytes < min {
            return Err(EngineError::Request(format!(
                "memory budget {bytes} bytes ({:.1} MiB) is below this model's minimum of {min} bytes ({:.1} MiB): the process, the resident file, the KV cache and the predictors take {:.1} MiB, and the neuron cache must hold one unit",
                mib(bytes),
                mib(min),
                mib(self.outside)
            )));
        }
        let cache = usize::try_from(bytes - self.outside).unwrap_or(usize::MAX);
        self.set_cache_budget(cache)?;
        self.memory_budget.store(bytes, Ordering::Relaxed);
        Ok(self.report())
    }

    /// Sets the neuron cache's budget in bytes (at most the whole FFN is kept): the hot prefix of each
    /// layer becomes its share of it, the cold region the rest (less what a prompt step running now
    /// borrows, until it gives it back). Waits for the decode step in flight, if any, to finish its
    /// layer. An I/O error while reading hot clusters leaves a smaller, consistent hot region and is
    /// returned.
    pub fn set_cache_budget(&self, bytes: usize) -> Result<()> {
        let mut loan = self.loan();
        loan.asked = bytes;
        self.resize(bytes.saturating_sub(loan.lent), bytes)
    }

    /// Lends `bytes` of the cache's budget to a prompt step: the cache shrinks by that much (its
    /// memory handed back) until [`CacheControl::give_back`].
    pub(super) fn lend(&self, bytes: usize) -> Result<()> {
        let mut loan = self.loan();
        loan.lent += bytes;
        let r = self.resize(loan.asked.saturating_sub(loan.lent), loan.asked);
        if r.is_err() {
            // No loan to give back: the next resize restores what is asked.
            loan.lent -= bytes;
        }
        r
    }

    /// Ends a loan of [`CacheControl::lend`]: the cache grows back to what is asked less the other
    /// loans, reading its hot clusters again.
    pub(super) fn give_back(&self, bytes: usize) -> Result<()> {
        let mut loan = self.loan();
        loan.lent = loan.lent.saturating_sub(bytes);
        self.resize(loan.asked.saturating_sub(loan.lent), loan.asked)
    }

    fn loan(&self) -> std::sync::MutexGuard<'_, Loan> {
        self.budget.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Resizes the cache to `bytes`, `asked` being the budget as set (for the process budget).
    fn resize(&self, bytes: usize, asked: usize) -> Result<()> {
        let ix = self.store.index();
        let (ub, units, layers) = (
            ix.layout.unit_bytes(),
            ix.units_per_layer(),
            ix.layers.len(),
        );
        let budget = bytes.min(ix.ffn_bytes());
        let hot_budget = (budget as f64 * f64::from(self.hot_share)) as usize;
        let target = (hot_budget / layers.max(1) / ub.max(1)).min(units);
        let cu = self.cluster_units;
        let mut hot = self.hot.write().unwrap_or_else(PoisonError::into_inner);
        // Unpin the clusters that do not stay whole in the new prefix (dropping a guard unpins it).
        let mut dropped = Vec::new();
        for l in 0..layers {
            let keep = (hot.units[l] / cu).min(target / cu);
            dropped.extend(hot.clusters[l].drain(keep..).map(|g| g.id()));
            hot.units[l] = hot.units[l].min(keep * cu);
        }
        {
            let mut c = self.cache.lock();
            for id in dropped {
                c.remove_cluster(id)?;
            }
            let hot_bytes = target * ub * layers;
            if hot_bytes <= c.hot_capacity() {
                c.set_hot_bytes(hot_bytes)?;
                c.set_budget(budget)?;
            } else {
                c.set_budget(budget)?;
                c.set_hot_bytes(hot_bytes)?;
            }
            // Units about to join a hot prefix leave the cold region (no copy kept twice).
            for (l, &from) in hot.units.iter().enumerate() {
                for u in from..target {
                    let _ = c.remove_neuron(NeuronId {
                        layer: l as u32,
                        neuron: u as u32,
                    });
                }
            }
        }
        crate::sys::release_free_memory();
        // Read the missing clusters of every prefix.
        for l in 0..layers {
            while hot.units[l] < target {
                let start = hot.units[l];
                let end = (start + cu).min(target);
                let buf = self.store.read_units(&self.io, l, start..end)?;
                let data: Arc<[u8]> = Arc::from(&buf[..]);
                drop(buf);
                let id = ClusterId {
                    layer: l as u32,
                    cluster: (start / cu) as u32,
                };
                let guard = self.cache.insert_cluster_pinned(id, data)?;
                hot.clusters[l].push(guard);
                hot.units[l] = end;
            }
        }
        drop(hot);
        self.memory_budget.store(
            self.outside + asked.min(ix.ffn_bytes()) as u64,
            Ordering::Relaxed,
        );
        Ok(())
    }

    /// The budgets and what the cache holds now.
    pub fn report(&self) -> CacheReport {
        let s = self.cache.stats();
        let ffn_bytes = self.store.index().ffn_bytes() as u64;
        CacheReport {
            memory_budget: self.memory_budget.load(Ordering::Relaxed),
            minimum: self.minimum_memory_budget(),
            cache_budget: s.budget as u64,
            cache_bytes: (s.hot.bytes + s.cold.bytes) as u64,
            ffn_bytes,
        }
    }
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}
