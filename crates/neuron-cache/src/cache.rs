//! [`NeuronCache`]: the single-threaded cache (fixed, hot and cold regions under one budget).

use std::fmt;
use std::sync::Arc;

use crate::lru::Lists;
use crate::{CacheError, Region, Result};

/// One FFN neuron (the bundled gate/up/down row of neuron `neuron` in layer `layer`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NeuronId {
    /// Transformer layer.
    pub layer: u32,
    /// Neuron index within the layer's FFN.
    pub neuron: u32,
}

/// A cluster of neurons loaded and cached as a whole (hot region).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClusterId {
    /// Transformer layer.
    pub layer: u32,
    /// Cluster index within the layer.
    pub cluster: u32,
}

impl fmt::Display for NeuronId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "layer {} neuron {}", self.layer, self.neuron)
    }
}

impl fmt::Display for ClusterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "layer {} cluster {}", self.layer, self.cluster)
    }
}

/// Counters and sizes of one region.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RegionStats {
    /// Lookups that found the entry.
    pub hits: u64,
    /// Lookups that did not.
    pub misses: u64,
    /// Entries inserted.
    pub insertions: u64,
    /// Entries evicted (by insertions or by shrinking the region).
    pub evictions: u64,
    /// Bytes resident now.
    pub bytes: usize,
    /// Entries resident now.
    pub entries: usize,
    /// Of `bytes`, bytes pinned now.
    pub pinned_bytes: usize,
    /// The region's capacity now.
    pub capacity: usize,
}

/// A snapshot of the whole cache ([`NeuronCache::stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// The hard byte budget.
    pub budget: usize,
    /// Bytes reserved in the fixed region.
    pub fixed_bytes: usize,
    /// Hot region (clusters).
    pub hot: RegionStats,
    /// Cold region (neurons).
    pub cold: RegionStats,
    /// Cold bytes on the active list.
    pub active_bytes: usize,
    /// Cold bytes on the inactive list.
    pub inactive_bytes: usize,
}

impl CacheStats {
    /// Fixed + hot + cold bytes resident; never above `budget`.
    pub fn resident_bytes(&self) -> usize {
        self.fixed_bytes + self.hot.bytes + self.cold.bytes
    }
}

#[derive(Clone, Copy, Default)]
struct Counters {
    hits: u64,
    misses: u64,
    insertions: u64,
    evictions: u64,
}

const ACTIVE: usize = 0;
const INACTIVE: usize = 1;
const HOT: usize = 0;

/// The neuron cache: one hard byte budget split into a **fixed** region (reserved, never evicted), a
/// **hot** region of whole clusters (cluster-level LRU) and a **cold** region of single neurons (the
/// two-queue active/inactive LRU). The cold region gets what the other two leave:
/// `cold capacity = budget − fixed − hot capacity`.
///
/// Cold-region policy (PowerInfer-2 §4.2): a new neuron goes to the head of the inactive list; a hit
/// while inactive promotes it to the head of the active list, a hit while active moves it to the head;
/// whenever the active list holds more than 90% of the cold capacity its tail is demoted to the head of
/// the inactive list; room is made by evicting from the inactive tail (then, if every inactive entry is
/// pinned, from the active tail). Pinned entries are skipped by eviction.
///
/// Values are `Arc<[u8]>`; the cache accounts `len()` bytes for each. A value handed out by
/// [`NeuronCache::get_neuron`] without a pin may outlive its eviction (the `Arc` keeps it alive), so code
/// that must stay within the budget holds a pin while it uses the bytes.
pub struct NeuronCache {
    budget: usize,
    fixed: usize,
    hot_cap: usize,
    hot: Lists<ClusterId, 1>,
    cold: Lists<NeuronId, 2>,
    hot_n: Counters,
    cold_n: Counters,
}

impl NeuronCache {
    /// An empty cache of `budget` bytes, all of it cold.
    pub fn new(budget: usize) -> Self {
        Self {
            budget,
            fixed: 0,
            hot_cap: 0,
            hot: Lists::new(),
            cold: Lists::new(),
            hot_n: Counters::default(),
            cold_n: Counters::default(),
        }
    }

    /// The budget in bytes.
    pub fn budget(&self) -> usize {
        self.budget
    }

    /// Bytes of the cold region (budget − fixed − hot capacity).
    pub fn cold_capacity(&self) -> usize {
        self.budget - self.fixed - self.hot_cap
    }

    /// Bytes of the hot region.
    pub fn hot_capacity(&self) -> usize {
        self.hot_cap
    }

    /// Most bytes the active list may hold: 90% of the cold capacity (rounded down).
    pub fn active_limit(&self) -> usize {
        (self.cold_capacity() as u128 * 9 / 10) as usize
    }

    /// Reserves `bytes` more in the fixed region, shrinking the cold region (evicting cold neurons).
    /// Fails without changing anything if it does not fit or pinned neurons are in the way.
    pub fn reserve_fixed(&mut self, bytes: usize) -> Result<()> {
        let fixed = self.fixed.checked_add(bytes).ok_or(CacheError::Layout {
            fixed: usize::MAX,
            hot: self.hot_cap,
            budget: self.budget,
        })?;
        self.relayout(self.budget, fixed, self.hot_cap)
    }

    /// Returns `bytes` of the fixed region to the cold region.
    pub fn release_fixed(&mut self, bytes: usize) -> Result<()> {
        if bytes > self.fixed {
            return Err(CacheError::FixedUnderflow {
                bytes,
                reserved: self.fixed,
            });
        }
        self.relayout(self.budget, self.fixed - bytes, self.hot_cap)
    }

    /// Moves the hot/cold split: the hot region gets `bytes`, the cold region the rest. Shrinking a region
    /// evicts its least recently used unpinned entries; fails without changing anything if the layout
    /// exceeds the budget or pinned entries would not fit.
    pub fn set_hot_bytes(&mut self, bytes: usize) -> Result<()> {
        self.relayout(self.budget, self.fixed, bytes)
    }

    /// Changes the budget at run time; the fixed and hot regions keep their sizes and the cold region
    /// gets what they leave (`budget − fixed − hot`). Shrinking evicts the cold region's least recently
    /// used unpinned neurons until it fits, and drops their bytes (the memory is freed as soon as no
    /// caller holds the `Arc` any more). Fails without changing anything if the fixed and hot regions
    /// do not fit the new budget or the cold region's pinned neurons would not.
    ///
    /// To shrink the hot region with the budget, call [`NeuronCache::set_hot_bytes`] first; to grow
    /// both, this first.
    pub fn set_budget(&mut self, budget: usize) -> Result<()> {
        self.relayout(budget, self.fixed, self.hot_cap)
    }

    fn relayout(&mut self, budget: usize, fixed: usize, hot: usize) -> Result<()> {
        let cold = fixed
            .checked_add(hot)
            .and_then(|used| budget.checked_sub(used))
            .ok_or(CacheError::Layout { fixed, hot, budget })?;
        if self.hot.pinned_bytes() > hot {
            return Err(CacheError::Pinned {
                region: Region::Hot,
                capacity: hot,
                pinned: self.hot.pinned_bytes(),
            });
        }
        if self.cold.pinned_bytes() > cold {
            return Err(CacheError::Pinned {
                region: Region::Cold,
                capacity: cold,
                pinned: self.cold.pinned_bytes(),
            });
        }
        self.budget = budget;
        self.fixed = fixed;
        self.hot_cap = hot;
        self.evict_hot_for(0);
        self.evict_cold_for(0);
        self.rebalance();
        Ok(())
    }

    // ---- cold region: neurons ----

    /// Inserts a neuron at the head of the inactive list, evicting as needed. If it is already resident,
    /// nothing changes (the resident bytes stay). Fails with [`CacheError::BudgetExhausted`] (and evicts
    /// nothing) if it does not fit even after evicting every unpinned neuron.
    pub fn insert_neuron(&mut self, id: NeuronId, data: Arc<[u8]>) -> Result<()> {
        self.insert_neuron_inner(id, data, false).map(|_| ())
    }

    /// [`NeuronCache::insert_neuron`], then pins the (new or resident) entry and returns its bytes.
    pub fn insert_neuron_pinned(&mut self, id: NeuronId, data: Arc<[u8]>) -> Result<Arc<[u8]>> {
        self.insert_neuron_inner(id, data, true)
    }

    fn insert_neuron_inner(
        &mut self,
        id: NeuronId,
        data: Arc<[u8]>,
        pin: bool,
    ) -> Result<Arc<[u8]>> {
        let idx = match self.cold.find(&id) {
            Some(idx) => idx,
            None => {
                let needed = data.len();
                let capacity = self.cold_capacity();
                if needed > capacity.saturating_sub(self.cold.pinned_bytes()) {
                    return Err(CacheError::BudgetExhausted {
                        region: Region::Cold,
                        key: id.to_string(),
                        needed,
                        capacity,
                        used: self.cold.total_bytes(),
                        pinned: self.cold.pinned_bytes(),
                    });
                }
                self.evict_cold_for(needed);
                self.cold_n.insertions += 1;
                self.cold.insert_front(INACTIVE, id, data)
            }
        };
        if pin {
            self.cold.pin(idx);
        }
        Ok(self.cold.entry(idx).data.clone())
    }

    /// Looks a neuron up (a hit promotes it, see the type's docs) without pinning it.
    pub fn get_neuron(&mut self, id: NeuronId) -> Option<Arc<[u8]>> {
        self.touch_neuron(id)
            .map(|idx| self.cold.entry(idx).data.clone())
    }

    /// Looks a neuron up and pins it: it will not be evicted until [`NeuronCache::unpin_neuron`].
    pub fn pin_neuron(&mut self, id: NeuronId) -> Option<Arc<[u8]>> {
        let idx = self.touch_neuron(id)?;
        self.cold.pin(idx);
        Some(self.cold.entry(idx).data.clone())
    }

    /// Undoes one pin.
    pub fn unpin_neuron(&mut self, id: NeuronId) -> Result<()> {
        match self.cold.find(&id) {
            Some(idx) if self.cold.unpin(idx) => Ok(()),
            _ => Err(CacheError::NotPinned {
                key: id.to_string(),
            }),
        }
    }

    /// Drops a neuron from the cache (no statistics: it is not an eviction). Returns whether it was
    /// resident; fails with [`CacheError::InUse`], changing nothing, if it is pinned.
    pub fn remove_neuron(&mut self, id: NeuronId) -> Result<bool> {
        let Some(idx) = self.cold.find(&id) else {
            return Ok(false);
        };
        if self.cold.entry(idx).pins > 0 {
            return Err(CacheError::InUse {
                key: id.to_string(),
            });
        }
        self.cold.remove(idx);
        Ok(true)
    }

    /// Whether the neuron is resident (no statistics, no reordering).
    pub fn contains_neuron(&self, id: NeuronId) -> bool {
        self.cold.find(&id).is_some()
    }

    /// Whether the neuron is resident and pinned.
    pub fn is_neuron_pinned(&self, id: NeuronId) -> bool {
        self.cold
            .find(&id)
            .is_some_and(|i| self.cold.entry(i).pins > 0)
    }

    fn touch_neuron(&mut self, id: NeuronId) -> Option<u32> {
        let Some(idx) = self.cold.find(&id) else {
            self.cold_n.misses += 1;
            return None;
        };
        self.cold_n.hits += 1;
        self.cold.move_front(idx, ACTIVE);
        self.rebalance();
        Some(idx)
    }

    /// Demotes the active tail to the inactive head while the active list is over 90% of the cold region.
    fn rebalance(&mut self) {
        let limit = self.active_limit();
        while self.cold.bytes(ACTIVE) > limit {
            let Some(t) = self.cold.tail(ACTIVE) else {
                break;
            };
            self.cold.move_front(t, INACTIVE);
        }
    }

    /// Evicts until `needed` more bytes fit in the cold region (callers check that they can).
    fn evict_cold_for(&mut self, needed: usize) {
        let cap = self.cold_capacity();
        while self.cold.total_bytes() + needed > cap {
            let victim = self
                .cold
                .lru_unpinned(INACTIVE)
                .or_else(|| self.cold.lru_unpinned(ACTIVE));
            let Some(v) = victim else { break };
            self.cold.remove(v);
            self.cold_n.evictions += 1;
        }
    }

    // ---- hot region: clusters ----

    /// Inserts a cluster at the head of the hot LRU, evicting the least recently used unpinned clusters as
    /// needed. Already resident: nothing changes. Fails with [`CacheError::BudgetExhausted`] (evicting
    /// nothing) if it cannot fit.
    pub fn insert_cluster(&mut self, id: ClusterId, data: Arc<[u8]>) -> Result<()> {
        self.insert_cluster_inner(id, data, false).map(|_| ())
    }

    /// [`NeuronCache::insert_cluster`], then pins the entry and returns its bytes.
    pub fn insert_cluster_pinned(&mut self, id: ClusterId, data: Arc<[u8]>) -> Result<Arc<[u8]>> {
        self.insert_cluster_inner(id, data, true)
    }

    fn insert_cluster_inner(
        &mut self,
        id: ClusterId,
        data: Arc<[u8]>,
        pin: bool,
    ) -> Result<Arc<[u8]>> {
        let idx = match self.hot.find(&id) {
            Some(idx) => idx,
            None => {
                let needed = data.len();
                if needed > self.hot_cap.saturating_sub(self.hot.pinned_bytes()) {
                    return Err(CacheError::BudgetExhausted {
                        region: Region::Hot,
                        key: id.to_string(),
                        needed,
                        capacity: self.hot_cap,
                        used: self.hot.total_bytes(),
                        pinned: self.hot.pinned_bytes(),
                    });
                }
                self.evict_hot_for(needed);
                self.hot_n.insertions += 1;
                self.hot.insert_front(HOT, id, data)
            }
        };
        if pin {
            self.hot.pin(idx);
        }
        Ok(self.hot.entry(idx).data.clone())
    }

    /// Looks a cluster up (moving it to the head) without pinning it.
    pub fn get_cluster(&mut self, id: ClusterId) -> Option<Arc<[u8]>> {
        self.touch_cluster(id)
            .map(|idx| self.hot.entry(idx).data.clone())
    }

    /// Looks a cluster up and pins it.
    pub fn pin_cluster(&mut self, id: ClusterId) -> Option<Arc<[u8]>> {
        let idx = self.touch_cluster(id)?;
        self.hot.pin(idx);
        Some(self.hot.entry(idx).data.clone())
    }

    /// Undoes one pin.
    pub fn unpin_cluster(&mut self, id: ClusterId) -> Result<()> {
        match self.hot.find(&id) {
            Some(idx) if self.hot.unpin(idx) => Ok(()),
            _ => Err(CacheError::NotPinned {
                key: id.to_string(),
            }),
        }
    }

    /// Drops a cluster from the cache (not counted as an eviction). Returns whether it was resident;
    /// fails with [`CacheError::InUse`], changing nothing, if it is pinned.
    pub fn remove_cluster(&mut self, id: ClusterId) -> Result<bool> {
        let Some(idx) = self.hot.find(&id) else {
            return Ok(false);
        };
        if self.hot.entry(idx).pins > 0 {
            return Err(CacheError::InUse {
                key: id.to_string(),
            });
        }
        self.hot.remove(idx);
        Ok(true)
    }

    /// Whether the cluster is resident (no statistics, no reordering).
    pub fn contains_cluster(&self, id: ClusterId) -> bool {
        self.hot.find(&id).is_some()
    }

    fn touch_cluster(&mut self, id: ClusterId) -> Option<u32> {
        let Some(idx) = self.hot.find(&id) else {
            self.hot_n.misses += 1;
            return None;
        };
        self.hot_n.hits += 1;
        self.hot.move_front(idx, HOT);
        Some(idx)
    }

    fn evict_hot_for(&mut self, needed: usize) {
        while self.hot.total_bytes() + needed > self.hot_cap {
            let Some(v) = self.hot.lru_unpinned(HOT) else {
                break;
            };
            self.hot.remove(v);
            self.hot_n.evictions += 1;
        }
    }

    // ---- inspection ----

    /// Counters and sizes.
    pub fn stats(&self) -> CacheStats {
        let region = |n: Counters, bytes, entries, pinned_bytes, capacity| RegionStats {
            hits: n.hits,
            misses: n.misses,
            insertions: n.insertions,
            evictions: n.evictions,
            bytes,
            entries,
            pinned_bytes,
            capacity,
        };
        CacheStats {
            budget: self.budget,
            fixed_bytes: self.fixed,
            hot: region(
                self.hot_n,
                self.hot.total_bytes(),
                self.hot.total_len(),
                self.hot.pinned_bytes(),
                self.hot_cap,
            ),
            cold: region(
                self.cold_n,
                self.cold.total_bytes(),
                self.cold.total_len(),
                self.cold.pinned_bytes(),
                self.cold_capacity(),
            ),
            active_bytes: self.cold.bytes(ACTIVE),
            inactive_bytes: self.cold.bytes(INACTIVE),
        }
    }

    /// Cold-region order: (active list, inactive list), most recently used first.
    pub fn cold_order(&self) -> (Vec<NeuronId>, Vec<NeuronId>) {
        (self.cold.keys(ACTIVE), self.cold.keys(INACTIVE))
    }

    /// Hot-region order, most recently used first.
    pub fn hot_order(&self) -> Vec<ClusterId> {
        self.hot.keys(HOT)
    }

    /// Checks every internal invariant (list links and counters, each region within its capacity, the
    /// active list within 90% of the cold region, the budget) and describes the first violation.
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        self.hot.check().map_err(|e| format!("hot: {e}"))?;
        self.cold.check().map_err(|e| format!("cold: {e}"))?;
        let s = self.stats();
        if s.hot.bytes > s.hot.capacity {
            return Err(format!(
                "hot region holds {} > {} bytes",
                s.hot.bytes, s.hot.capacity
            ));
        }
        if s.cold.bytes > s.cold.capacity {
            return Err(format!(
                "cold region holds {} > {} bytes",
                s.cold.bytes, s.cold.capacity
            ));
        }
        if s.active_bytes > self.active_limit() {
            return Err(format!(
                "active list holds {} > {} bytes",
                s.active_bytes,
                self.active_limit()
            ));
        }
        if s.resident_bytes() > self.budget
            || self.fixed + self.hot_cap + self.cold_capacity() != self.budget
        {
            return Err(format!(
                "budget {} exceeded or miscounted: {s:?}",
                self.budget
            ));
        }
        Ok(())
    }
}

impl fmt::Debug for NeuronCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NeuronCache")
            .field("stats", &self.stats())
            .finish()
    }
}
