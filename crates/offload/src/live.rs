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

use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockReadGuard};

use neuron_cache::{ClusterGuard, ClusterId, NeuronCache, NeuronId, SharedNeuronCache};
use neuron_store::NeuronStore;
use ufs_io::IoEngine;

use super::options::OffloadOptions;
use crate::budget::MemoryBudget;
use crate::error::{OffloadError, Result};

/// Each layer's hot prefix: units `first[l]..first[l] + units[l]` of layer `l` are in the pinned
/// clusters `clusters[l]` (`cluster_units` units each, the last one possibly shorter). The units
/// before `first[l]` (none, unless [`CacheControl::reserve`] gave them to an accelerator) are not
/// the CPU's.
pub(super) struct HotSet {
    pub(super) first: Vec<usize>,
    pub(super) units: Vec<usize>,
    pub(super) clusters: Vec<Vec<ClusterGuard>>,
}

impl HotSet {
    /// Unit `u` of layer `l` as `(cluster, offset of the unit in it)` when it is hot.
    pub(super) fn find(
        &self,
        l: usize,
        u: usize,
        cluster_units: usize,
        unit_bytes: usize,
    ) -> Option<(&[u8], usize)> {
        let i = u
            .checked_sub(self.first[l])
            .filter(|&i| i < self.units[l])?;
        let c: &[u8] = &self.clusters[l][i / cluster_units];
        Some((c, (i % cluster_units) * unit_bytes))
    }
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
    /// The cache's budget as set, before that cap, less what [`CacheControl::reserve`] took (what
    /// is left for an accelerator's blocks beside the cache).
    pub cache_asked: u64,
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
    /// The share of the cache's budget that holds each layer's pinned hot prefix.
    hot_share: f32,
    cluster_units: usize,
    /// The cache budget asked for, the part of it lent to prompt steps running now (the cache
    /// holds `asked - lent`) and what stays resident besides the cache. Held across a resize, so
    /// that resizes, loans and reservations apply in turn.
    budget: Arc<Mutex<Loan>>,
}

/// See [`CacheControl::budget`].
#[derive(Default)]
struct Loan {
    asked: usize,
    lent: usize,
    /// Bytes resident besides the cache: the process, the resident file, the KV cache, the
    /// predictors ([`OffloadOptions::outside_ffn_bytes`]) and what [`CacheControl::reserve`] took.
    outside: u64,
    /// The process budget set by [`CacheControl::set_memory_budget`] (`None` after
    /// [`CacheControl::set_cache_budget`]: then `outside` plus the cache's budget). Kept here, not
    /// recomputed by each resize, so that a prompt's loan ending after a budget change does not
    /// report another budget.
    memory: Option<u64>,
}

impl Loan {
    fn memory_budget(&self, ffn_bytes: usize) -> u64 {
        self.memory
            .unwrap_or(self.outside + self.asked.min(ffn_bytes) as u64)
    }
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
                first: vec![0; layers],
                units: vec![0; layers],
                clusters: (0..layers).map(|_| Vec::new()).collect(),
            })),
            hot_share: opts.hot_share.clamp(0.0, 1.0),
            cluster_units: opts.cluster_units.max(1),
            budget: Arc::new(Mutex::new(Loan {
                outside: opts.outside_ffn_bytes,
                ..Loan::default()
            })),
        }
    }

    /// The hot prefixes, for a decode step (held until its last unit is computed).
    pub(super) fn read_hot(&self) -> RwLockReadGuard<'_, HotSet> {
        self.hot.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// The smallest process budget [`CacheControl::set_memory_budget`] accepts.
    pub fn minimum_memory_budget(&self) -> u64 {
        self.loan().outside + self.store.index().layout.unit_bytes() as u64
    }

    /// Sets the budget of the whole process (`--memory-budget`): what stays resident besides the FFN
    /// cache (measured at load: the process, the resident file, the KV cache at the whole context, the
    /// predictors) is counted first and the cache gets the rest, at most the whole FFN. A budget
    /// below [`CacheControl::minimum_memory_budget`] is an error naming the minimum, and changes
    /// nothing.
    pub fn set_memory_budget(&self, bytes: u64) -> Result<CacheReport> {
        self.set_process_budget(bytes, MemoryBudget::Process(bytes))
    }

    /// [`CacheControl::set_memory_budget`] of `bytes`, the cache sized by `budget` (a process
    /// budget of `bytes`, planned or not).
    fn set_process_budget(&self, bytes: u64, budget: MemoryBudget) -> Result<CacheReport> {
        {
            let mut loan = self.loan();
            let min = loan.outside + self.store.index().layout.unit_bytes() as u64;
            if bytes < min {
                return Err(OffloadError::Request(format!(
                    "memory budget {bytes} bytes ({:.1} MiB) is below this model's minimum of {min} bytes ({:.1} MiB): the process, the resident file, the KV cache and the predictors take {:.1} MiB, and the neuron cache must hold one unit",
                    mib(bytes),
                    mib(min),
                    mib(loan.outside)
                )));
            }
            let ffn = self.store.index().ffn_bytes() as u64;
            let cache = budget.cache_bytes(ffn, || loan.outside).unwrap_or(0);
            loan.asked = usize::try_from(cache).unwrap_or(usize::MAX);
            loan.memory = Some(bytes);
            self.resize(&loan)?;
        }
        Ok(self.report())
    }

    /// Applies `budget` live: a process budget as [`CacheControl::set_memory_budget`] does, any
    /// other as the neuron cache's size it gives ([`MemoryBudget::cache_bytes`]) over the store's
    /// FFN, counted as at load (the store file's size, `budget::store_ffn_bytes`).
    pub fn set_budget(&self, budget: MemoryBudget) -> Result<CacheReport> {
        if let Some(bytes) = budget.process() {
            return self.set_process_budget(bytes, budget);
        }
        let ffn = crate::budget::store_ffn_bytes(self.store.path())?;
        let cache = budget.cache_bytes(ffn, || 0).unwrap_or(0);
        self.set_cache_budget(usize::try_from(cache).unwrap_or(usize::MAX))?;
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
        loan.memory = None;
        self.resize(&loan)
    }

    /// Takes `bytes` of the cache's budget for an accelerator that holds units `0..first[l]` of
    /// every layer `l` (hybrid decode over the store: each layer's hottest neurons), built by
    /// `build` while the cache holds none of its units: every pinned cluster and every cached unit
    /// of the accelerator's is let go first, so that the blocks and the units they replace never
    /// take memory at once. Then the blocks are counted as resident besides the cache (a later
    /// [`CacheControl::set_memory_budget`] leaves them out too) and each layer's pinned hot prefix
    /// is read again, starting after them, so that no unit is held twice. More than the cache's
    /// budget, or another number of layers, is an error and changes nothing; an error of `build`
    /// restores the prefixes as they were and is returned.
    pub fn reserve_with<T>(
        &self,
        bytes: u64,
        first: &[usize],
        build: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        let mut loan = self.loan();
        let b = usize::try_from(bytes).unwrap_or(usize::MAX);
        let layers = self.store.index().layers.len();
        if b > loan.asked || first.len() != layers {
            return Err(OffloadError::Request(format!(
                "the accelerator's blocks of {} layers take {:.1} MiB, more than the neuron cache's budget of {:.1} MiB or another number of layers than the store's {layers}",
                first.len(),
                mib(bytes),
                mib(loan.asked as u64)
            )));
        }
        let units = self.store.index().units_per_layer();
        let before = self.read_hot().first.clone();
        self.restart_prefixes(&first.iter().map(|&f| f.min(units)).collect::<Vec<_>>())?;
        let built = match build() {
            Ok(t) => t,
            Err(e) => {
                self.restart_prefixes(&before)?;
                self.resize(&loan)?;
                return Err(e);
            }
        };
        loan.asked -= b;
        loan.outside += bytes;
        self.resize(&loan)?;
        Ok(built)
    }

    /// [`CacheControl::reserve_with`] for blocks built already.
    pub fn reserve(&self, bytes: u64, first: &[usize]) -> Result<()> {
        self.reserve_with(bytes, first, || Ok(()))
    }

    /// Lets every pinned cluster go and every cached unit before `first[l]` of each layer `l`, and
    /// makes the prefixes start there (empty until the next resize reads them), handing the memory
    /// back.
    fn restart_prefixes(&self, first: &[usize]) -> Result<()> {
        let mut hot = self.hot.write().unwrap_or_else(PoisonError::into_inner);
        let mut dropped = Vec::new();
        for (l, &f) in first.iter().enumerate() {
            dropped.extend(hot.clusters[l].drain(..).map(|g| g.id()));
            hot.units[l] = 0;
            hot.first[l] = f;
        }
        {
            let mut c = self.cache.lock();
            for id in dropped {
                c.remove_cluster(id)?;
            }
            c.set_hot_bytes(0)?;
            for (l, &f) in first.iter().enumerate() {
                for u in 0..f {
                    let _ = c.remove_neuron(NeuronId {
                        layer: l as u32,
                        neuron: u as u32,
                    });
                }
            }
        }
        drop(hot);
        crate::sys::release_free_memory();
        Ok(())
    }

    /// Lends `bytes` of the cache's budget to a prompt step: the cache shrinks by that much (its
    /// memory handed back) until [`CacheControl::give_back`].
    pub(super) fn lend(&self, bytes: usize) -> Result<()> {
        let mut loan = self.loan();
        loan.lent += bytes;
        let r = self.resize(&loan);
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
        self.resize(&loan)
    }

    fn loan(&self) -> std::sync::MutexGuard<'_, Loan> {
        self.budget.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Resizes the cache to what `loan` asks less what it lends, `hot_share` of it pinned.
    fn resize(&self, loan: &Loan) -> Result<()> {
        let bytes = loan.asked.saturating_sub(loan.lent);
        let ix = self.store.index();
        let (ub, units, layers) = (
            ix.layout.unit_bytes(),
            ix.units_per_layer(),
            ix.layers.len(),
        );
        let budget = bytes.min(ix.ffn_bytes());
        let hot_budget = (budget as f64 * f64::from(self.hot_share)) as usize;
        let per_layer = hot_budget / layers.max(1) / ub.max(1);
        let cu = self.cluster_units;
        let mut hot = self.hot.write().unwrap_or_else(PoisonError::into_inner);
        // Each layer's hot units (after the accelerator's, if any).
        let target: Vec<usize> = hot
            .first
            .iter()
            .map(|&f| per_layer.min(units - f))
            .collect();
        // Unpin the clusters that do not stay whole in the new prefix (dropping a guard unpins it).
        let mut dropped = Vec::new();
        for (l, &t) in target.iter().enumerate() {
            let keep = (hot.units[l] / cu).min(t / cu);
            dropped.extend(hot.clusters[l].drain(keep..).map(|g| g.id()));
            hot.units[l] = hot.units[l].min(keep * cu);
        }
        {
            let mut c = self.cache.lock();
            for id in dropped {
                c.remove_cluster(id)?;
            }
            let hot_bytes = target.iter().sum::<usize>() * ub;
            if hot_bytes <= c.hot_capacity() {
                c.set_hot_bytes(hot_bytes)?;
                c.set_budget(budget)?;
            } else {
                c.set_budget(budget)?;
                c.set_hot_bytes(hot_bytes)?;
            }
            // Units about to join a hot prefix leave the cold region (no copy kept twice).
            for (l, &from) in hot.units.iter().enumerate() {
                for u in hot.first[l] + from..hot.first[l] + target[l] {
                    let _ = c.remove_neuron(NeuronId {
                        layer: l as u32,
                        neuron: u as u32,
                    });
                }
            }
        }
        crate::sys::release_free_memory();
        // Read the missing clusters of every prefix.
        for (l, &t) in target.iter().enumerate() {
            while hot.units[l] < t {
                let start = hot.units[l];
                let end = (start + cu).min(t);
                let f = hot.first[l];
                let buf = self.store.read_units(&self.io, l, f + start..f + end)?;
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
        Ok(())
    }

    /// The budgets and what the cache holds now.
    pub fn report(&self) -> CacheReport {
        let s = self.cache.stats();
        let ffn_bytes = self.store.index().ffn_bytes() as u64;
        let (cache_asked, memory_budget) = {
            let loan = self.loan();
            (loan.asked as u64, loan.memory_budget(ffn_bytes as usize))
        };
        CacheReport {
            cache_asked,
            memory_budget,
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
