//! [`ExpertCache`]: whole MoE experts (one blob each: gate, up and down rows) in memory under one
//! byte budget split into per-layer shares, evicted in the order [`Eviction`] names, hot experts of a
//! calibration run pinned or not.
//!
//! The unit here is an expert, not a neuron: an expert is read, cached and evicted whole, and a
//! layer's experts compete only with each other for the layer's share (so a layer routed to many
//! experts cannot starve the others). Values are `Arc<T>` (the engine's aligned read buffers): a value
//! whose `Arc` is held outside the cache is *in use* and never evicted, so the bytes the cache
//! accounts for are all the bytes its values keep alive.
//!
//! Policy: every lookup of a layer advances that layer's clock; a hit adds one to the entry's count
//! and stamps it with the clock. Every [`AGE_EVERY`] lookups of a layer, every count of the layer is
//! halved (old popularity fades). The victim is the resident, unpinned, unused entry that
//! [`Eviction`] names: by default ([`Eviction::Recency`]) the least recently used (smallest stamp);
//! with [`Eviction::Frequency`] the smallest `(count, stamp)`, least frequently used and among those
//! the least recently used; with [`Eviction::Predicted`] the smallest score the caller last set for
//! the layer ([`ExpertCache::set_scores`]: its prediction of how soon each expert is wanted, higher
//! sooner), ties to the least recently used. Recency is the default because popularity is what the
//! pinned experts already hold, while routers pick many of the previous token's experts again, and a
//! frequency order evicts a just-read expert (count 1) before the next token can reuse it.
//!
//! Admission ([`ExpertCache::admits`]): under [`Eviction::Predicted`] an expert is worth caching
//! only when it would evict nothing scored at least as high as itself; the caller then uses it once
//! and drops it. Under the other orders every expert is admitted.

use std::fmt;
use std::sync::Arc;

use crate::{CacheError, Result};

/// Lookups of a layer between two halvings of its counts.
pub const AGE_EVERY: u64 = 256;

/// Which unpinned expert an [`ExpertCache`] evicts first (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Eviction {
    /// The least recently used.
    #[default]
    Recency,
    /// The least frequently used (counts halved every [`AGE_EVERY`] lookups), ties to the least
    /// recently used.
    Frequency,
    /// The lowest score of [`ExpertCache::set_scores`], ties to the least recently used.
    Predicted,
}

/// One routed expert of one layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ExpertId {
    /// Transformer layer.
    pub layer: u32,
    /// Expert index within the layer.
    pub expert: u32,
}

impl fmt::Display for ExpertId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "layer {} expert {}", self.layer, self.expert)
    }
}

/// Counters of an [`ExpertCache`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExpertStats {
    /// Lookups that found the expert.
    pub hits: u64,
    /// Lookups that did not.
    pub misses: u64,
    /// Experts inserted (pinned ones included).
    pub insertions: u64,
    /// Experts evicted.
    pub evictions: u64,
    /// Bytes resident now.
    pub bytes: usize,
    /// Of those, bytes of pinned (hot) experts.
    pub pinned_bytes: usize,
    /// Experts resident now.
    pub entries: usize,
}

impl ExpertStats {
    /// Hits over lookups (0 before any lookup).
    pub fn hit_rate(&self) -> f64 {
        let n = self.hits + self.misses;
        if n == 0 {
            0.0
        } else {
            self.hits as f64 / n as f64
        }
    }
}

#[derive(Debug)]
struct Entry<T> {
    value: Arc<T>,
    bytes: usize,
    count: u64,
    stamp: u64,
    pinned: bool,
}

#[derive(Debug)]
struct Layer<T> {
    share: usize,
    used: usize,
    clock: u64,
    slots: Vec<Option<Entry<T>>>,
    /// [`Eviction::Predicted`]'s scores, one per expert.
    scores: Vec<f32>,
}

impl<T> Layer<T> {
    /// Bytes that eviction cannot free: pinned or in use.
    fn held(&self) -> usize {
        self.slots
            .iter()
            .flatten()
            .filter(|e| e.pinned || Arc::strong_count(&e.value) > 1)
            .map(|e| e.bytes)
            .sum()
    }

    /// Resident entries that eviction may take, by slot.
    fn evictable(&self) -> impl Iterator<Item = (usize, &Entry<T>)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.as_ref().map(|e| (i, e)))
            .filter(|(_, e)| !e.pinned && Arc::strong_count(&e.value) == 1)
    }

    /// Whether slot `a` (`ea`) goes before slot `b` (`eb`) in `eviction`'s order.
    fn before(
        &self,
        eviction: Eviction,
        (a, ea): (usize, &Entry<T>),
        (b, eb): (usize, &Entry<T>),
    ) -> bool {
        let ord = match eviction {
            Eviction::Recency => ea.stamp.cmp(&eb.stamp),
            Eviction::Frequency => (ea.count, ea.stamp).cmp(&(eb.count, eb.stamp)),
            Eviction::Predicted => self.scores[a]
                .total_cmp(&self.scores[b])
                .then(ea.stamp.cmp(&eb.stamp)),
        };
        ord.then(a.cmp(&b)).is_lt()
    }

    fn victim(&self, eviction: Eviction) -> Option<usize> {
        self.evictable()
            .reduce(|x, y| if self.before(eviction, y, x) { y } else { x })
            .map(|(i, _)| i)
    }
}

/// Experts in memory under a budget of per-layer shares (see the module docs for the policy).
#[derive(Debug)]
pub struct ExpertCache<T> {
    budget: usize,
    eviction: Eviction,
    layers: Vec<Layer<T>>,
    stats: ExpertStats,
}

impl<T> ExpertCache<T> {
    /// A cache for layers of `experts_per_layer` experts under `budget` bytes, shared equally by the
    /// layers that have experts.
    pub fn new(experts_per_layer: &[usize], budget: usize) -> Self {
        let with = experts_per_layer.iter().filter(|&&n| n > 0).count().max(1);
        let layers = experts_per_layer
            .iter()
            .map(|&n| Layer {
                share: if n > 0 { budget / with } else { 0 },
                used: 0,
                clock: 0,
                slots: (0..n).map(|_| None).collect(),
                scores: vec![0.0; n],
            })
            .collect();
        ExpertCache {
            budget,
            eviction: Eviction::default(),
            layers,
            stats: ExpertStats::default(),
        }
    }

    /// The same cache evicting by `eviction` (set before it holds anything, or it applies from the
    /// next eviction on).
    pub fn with_eviction(mut self, eviction: Eviction) -> Self {
        self.eviction = eviction;
        self
    }

    /// The budget in bytes.
    pub fn budget(&self) -> usize {
        self.budget
    }

    /// Each layer's share of the budget.
    pub fn shares(&self) -> Vec<usize> {
        self.layers.iter().map(|l| l.share).collect()
    }

    /// Sets each layer's share (they must sum to at most the budget), evicting what no longer fits.
    /// When a share cannot hold its layer's pinned and in-use experts, nothing changes.
    pub fn set_shares(&mut self, shares: &[usize]) -> Result<()> {
        let total = shares.iter().try_fold(0usize, |a, &s| a.checked_add(s));
        if shares.len() != self.layers.len() || total.is_none_or(|t| t > self.budget) {
            return Err(CacheError::Shares {
                layers: shares.len(),
                total: total.unwrap_or(usize::MAX),
                budget: self.budget,
                expected: self.layers.len(),
            });
        }
        for (li, (l, &s)) in self.layers.iter().zip(shares).enumerate() {
            if l.held() > s {
                return Err(CacheError::ExpertBudget {
                    key: format!("layer {li}"),
                    needed: 0,
                    share: s,
                    used: l.used,
                    held: l.held(),
                });
            }
        }
        for (li, &s) in shares.iter().enumerate() {
            self.layers[li].share = s;
            self.evict_to(li, s);
        }
        Ok(())
    }

    /// Sets the budget and splits it into shares in proportion to `weights` (one per layer; equal
    /// shares when they are all zero), as [`ExpertCache::set_shares`].
    pub fn set_budget(&mut self, budget: usize, weights: &[f64]) -> Result<()> {
        let w: Vec<f64> = weights.iter().map(|w| w.max(0.0)).collect();
        let sum: f64 = w.iter().sum();
        let with = self.layers.iter().filter(|l| !l.slots.is_empty()).count();
        let shares: Vec<usize> = self
            .layers
            .iter()
            .zip(w.iter().chain(std::iter::repeat(&0.0)))
            .map(|(l, &wi)| match (l.slots.is_empty(), sum > 0.0) {
                (true, _) => 0,
                (false, true) => (budget as f64 * wi / sum).floor() as usize,
                (false, false) => budget / with.max(1),
            })
            .collect();
        let old = self.budget;
        self.budget = budget;
        let r = self.set_shares(&shares);
        if r.is_err() {
            self.budget = old;
        }
        r
    }

    /// Evicts unpinned, unused experts of layer `li` until it uses at most `cap` bytes (or none is left).
    fn evict_to(&mut self, li: usize, cap: usize) {
        while self.layers[li].used > cap {
            let Some(v) = self.layers[li].victim(self.eviction) else {
                return;
            };
            let e = self.layers[li].slots[v].take().expect("victim is resident");
            self.layers[li].used -= e.bytes;
            self.stats.evictions += 1;
        }
    }

    fn slot(&self, id: ExpertId) -> Option<&Option<Entry<T>>> {
        self.layers
            .get(id.layer as usize)?
            .slots
            .get(id.expert as usize)
    }

    /// Sets layer `layer`'s scores of [`Eviction::Predicted`] (one per expert, higher: wanted
    /// sooner; values past the layer's experts are ignored, experts past `scores` keep theirs).
    pub fn set_scores(&mut self, layer: usize, scores: &[f32]) {
        if let Some(l) = self.layers.get_mut(layer) {
            let n = l.scores.len().min(scores.len());
            l.scores[..n].copy_from_slice(&scores[..n]);
        }
    }

    /// Whether inserting `id` (`bytes` long) would be worth it: always, unless the order is
    /// [`Eviction::Predicted`] and making room would evict an expert scored at least as high as
    /// `id` (or cannot be done). Changes nothing.
    pub fn admits(&self, id: ExpertId, bytes: usize) -> bool {
        let Some(l) = self.layers.get(id.layer as usize) else {
            return false;
        };
        if self.eviction != Eviction::Predicted {
            return true;
        }
        let Some(&own) = l.scores.get(id.expert as usize) else {
            return false;
        };
        let mut victims: Vec<(usize, &Entry<T>)> = l.evictable().collect();
        victims.sort_by(|&x, &y| {
            if l.before(self.eviction, x, y) {
                std::cmp::Ordering::Less
            } else {
                std::cmp::Ordering::Greater
            }
        });
        let mut used = l.used;
        for (i, e) in victims {
            if used.saturating_add(bytes) <= l.share {
                break;
            }
            if l.scores[i] >= own {
                return false;
            }
            used -= e.bytes;
        }
        used.saturating_add(bytes) <= l.share
    }

    /// Whether `id` is resident (no statistics, no recency).
    pub fn contains(&self, id: ExpertId) -> bool {
        self.slot(id).is_some_and(Option::is_some)
    }

    /// The value of `id` if resident, with no statistics and no recency (a draft's look, which must
    /// not change what the cache keeps).
    pub fn peek(&self, id: ExpertId) -> Option<Arc<T>> {
        self.slot(id)
            .and_then(Option::as_ref)
            .map(|e| Arc::clone(&e.value))
    }

    /// Looks `id` up: a hit counts, stamps and returns the value (in use while the `Arc` is held).
    pub fn get(&mut self, id: ExpertId) -> Option<Arc<T>> {
        let l = self.layers.get_mut(id.layer as usize)?;
        l.clock += 1;
        if l.clock % AGE_EVERY == 0 {
            l.slots.iter_mut().flatten().for_each(|e| e.count /= 2);
        }
        let clock = l.clock;
        match l.slots.get_mut(id.expert as usize) {
            Some(Some(e)) => {
                e.count += 1;
                e.stamp = clock;
                self.stats.hits += 1;
                Some(Arc::clone(&e.value))
            }
            _ => {
                self.stats.misses += 1;
                None
            }
        }
    }

    /// Inserts `id` (`bytes` long), evicting as the policy says; returns the value now cached (the
    /// resident one if `id` was already there). Fails, changing nothing, when the layer's share cannot
    /// hold it beside its pinned and in-use experts.
    pub fn insert(&mut self, id: ExpertId, value: Arc<T>, bytes: usize) -> Result<Arc<T>> {
        self.put(id, value, bytes, false)
    }

    /// Inserts `id` pinned: a hot expert, never evicted.
    pub fn pin(&mut self, id: ExpertId, value: Arc<T>, bytes: usize) -> Result<Arc<T>> {
        self.put(id, value, bytes, true)
    }

    fn put(&mut self, id: ExpertId, value: Arc<T>, bytes: usize, pinned: bool) -> Result<Arc<T>> {
        let li = id.layer as usize;
        let n = self.layers.get(li).map_or(0, |l| l.slots.len());
        if id.expert as usize >= n {
            return Err(CacheError::NoSuchExpert {
                key: id.to_string(),
                experts: n,
            });
        }
        let l = &mut self.layers[li];
        if let Some(e) = l.slots[id.expert as usize].as_mut() {
            e.pinned |= pinned;
            return Ok(Arc::clone(&e.value));
        }
        let held = l.held();
        if held.checked_add(bytes).is_none_or(|b| b > l.share) {
            return Err(CacheError::ExpertBudget {
                key: id.to_string(),
                needed: bytes,
                share: l.share,
                used: l.used,
                held,
            });
        }
        self.evict_to(li, self.layers[li].share - bytes);
        let l = &mut self.layers[li];
        l.used += bytes;
        l.slots[id.expert as usize] = Some(Entry {
            value: Arc::clone(&value),
            bytes,
            count: 1,
            stamp: l.clock,
            pinned,
        });
        self.stats.insertions += 1;
        Ok(value)
    }

    /// Counters and current sizes.
    pub fn stats(&self) -> ExpertStats {
        let all = || self.layers.iter().flat_map(|l| l.slots.iter().flatten());
        ExpertStats {
            bytes: self.layers.iter().map(|l| l.used).sum(),
            pinned_bytes: all().filter(|e| e.pinned).map(|e| e.bytes).sum(),
            entries: all().count(),
            ..self.stats
        }
    }

    /// Bytes resident in layer `layer`.
    pub fn layer_bytes(&self, layer: usize) -> usize {
        self.layers.get(layer).map_or(0, |l| l.used)
    }

    /// Resident experts of `layer`, by index.
    pub fn resident(&self, layer: usize) -> Vec<u32> {
        self.layers.get(layer).map_or_else(Vec::new, |l| {
            (0..l.slots.len() as u32)
                .filter(|&e| l.slots[e as usize].is_some())
                .collect()
        })
    }

    /// Panics when an invariant is broken: shares within the budget, each layer within its share
    /// (unless pinned and in-use bytes alone exceed it, which insertion refuses), `used` the sum of
    /// its entries.
    pub fn check_invariants(&self) {
        let shares: usize = self.layers.iter().map(|l| l.share).sum();
        assert!(
            shares <= self.budget,
            "shares {shares} > budget {}",
            self.budget
        );
        for (li, l) in self.layers.iter().enumerate() {
            let sum: usize = l.slots.iter().flatten().map(|e| e.bytes).sum();
            assert_eq!(sum, l.used, "layer {li}: used {} != entries {sum}", l.used);
            assert!(
                l.used <= l.share,
                "layer {li}: {} bytes over its share {}",
                l.used,
                l.share
            );
        }
    }
}
