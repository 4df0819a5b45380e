//! [`Offload`]: the store, its I/O thread and the neuron cache, with each layer's hot prefix
//! preloaded.

use std::path::Path;
use std::sync::Arc;

use neuron_cache::{ClusterGuard, ClusterId, NeuronCache, SharedNeuronCache};
use neuron_store::NeuronStore;
use ufs_io::{IoConfig, IoEngine, OpenOptions};

use super::options::{Counters, OffloadOptions, OffloadStats};
use crate::error::Result;

/// The run-time side of flash offload: the store, its I/O thread and the neuron cache.
///
/// The cache's hot region holds each layer's hot prefix as clusters inserted pinned (never evicted;
/// the pins live as long as the `Offload`, and their bytes are read without the cache's lock); its
/// cold region holds units read on demand (two-queue LRU). Hot and cold bytes together stay within
/// [`OffloadOptions::ffn_budget`] (the cache's budget; no fixed region: the budget is the FFN's).
pub struct Offload {
    pub(super) io: IoEngine,
    pub(super) store: NeuronStore,
    pub(super) cache: SharedNeuronCache,
    /// Per layer: units `0..hot_units[l]` are in hot clusters.
    pub(super) hot_units: Vec<usize>,
    /// Per layer, per cluster: the pinned hot clusters.
    pub(super) hot: Vec<Vec<ClusterGuard>>,
    pub(super) opts: OffloadOptions,
    pub(super) counters: Counters,
}

impl Offload {
    /// Opens the store at `path` (validated), starts the I/O thread and preloads each layer's hot prefix
    /// into the hot region (`hot_share` of `ffn_budget`, split evenly over layers, whole clusters).
    pub fn open(path: &Path, opts: OffloadOptions) -> Result<Self> {
        let io = IoEngine::new(IoConfig {
            queue_depth: opts.queue_depth.max(1),
            pin_core: opts.pin_core,
            async_io: opts.async_io,
            ..Default::default()
        })?;
        let store = NeuronStore::open(
            &io,
            path,
            OpenOptions {
                direct: opts.direct,
                drop_cache: true,
            },
        )?;
        let ix = store.index();
        let (ub, units) = (ix.layout.unit_bytes(), ix.units_per_layer());
        let budget = opts.ffn_budget.min(ix.ffn_bytes());
        let hot_budget = (budget as f64 * f64::from(opts.hot_share.clamp(0.0, 1.0))) as usize;
        let per_layer = (hot_budget / ix.layers.len() / ub).min(units);
        let mut cache = NeuronCache::new(budget);
        cache.set_hot_bytes(per_layer * ub * ix.layers.len())?;
        let cache = SharedNeuronCache::new(cache);
        let cu = opts.cluster_units.max(1);
        let mut hot = Vec::with_capacity(ix.layers.len());
        for l in 0..ix.layers.len() {
            let mut clusters = Vec::new();
            for (c, start) in (0..per_layer).step_by(cu).enumerate() {
                let buf = store.read_units(&io, l, start..(start + cu).min(per_layer))?;
                let data: Arc<[u8]> = Arc::from(&buf[..]);
                let id = ClusterId {
                    layer: l as u32,
                    cluster: c as u32,
                };
                clusters.push(cache.insert_cluster_pinned(id, data)?);
            }
            hot.push(clusters);
        }
        Ok(Offload {
            io,
            hot_units: vec![per_layer; ix.layers.len()],
            hot,
            store,
            cache,
            opts,
            counters: Counters::default(),
        })
    }

    /// The store.
    pub fn store(&self) -> &NeuronStore {
        &self.store
    }

    /// The options in use.
    pub fn options(&self) -> &OffloadOptions {
        &self.opts
    }

    /// The I/O engine (its statistics: latency histogram, requests, merges).
    pub fn io(&self) -> &IoEngine {
        &self.io
    }

    /// Counters since the last [`Offload::reset_stats`].
    pub fn stats(&self) -> OffloadStats {
        self.counters.snapshot(self.cache.stats().resident_bytes())
    }

    /// Zeroes the counters (the cache keeps its contents).
    pub fn reset_stats(&self) {
        self.counters.reset();
    }
}
