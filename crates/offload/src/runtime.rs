//! [`Offload`]: the store, its I/O thread and the neuron cache, with each layer's hot prefix
//! preloaded.

use std::path::Path;
use std::sync::{Arc, Mutex};

use neuron_cache::SharedNeuronCache;
use neuron_store::NeuronStore;
use ufs_io::{IoConfig, IoEngine, OpenOptions};

use super::ahead::Prefetch;
use super::live::CacheControl;
use super::options::{Counters, OffloadOptions, OffloadStats};
use super::prompt_accel::PromptAccel;
use crate::error::Result;

/// A prompt step's read of a layer's first chunk made ahead: `(layer, units, the read)`.
pub(super) type PrefillAhead = (usize, std::ops::Range<usize>, Result<ufs_io::AlignedBuf>);

/// The run-time side of flash offload: the store, its I/O thread and the neuron cache.
///
/// The cache's hot region holds each layer's hot prefix as clusters inserted pinned (never evicted
/// while they are part of the prefix; their bytes are read without the cache's lock, under the
/// prefixes' read lock); its cold region holds units read on demand (two-queue LRU). Hot and cold
/// bytes together stay within the cache's budget, [`OffloadOptions::ffn_budget`] at start and then
/// whatever [`CacheControl`] sets (no fixed region: the budget is the FFN's).
pub struct Offload {
    pub(super) io: Arc<IoEngine>,
    pub(super) store: Arc<NeuronStore>,
    pub(super) cache: SharedNeuronCache,
    /// The hot prefixes and the budget, shared with every [`CacheControl`] handed out.
    pub(super) live: CacheControl,
    pub(super) opts: OffloadOptions,
    pub(super) counters: Counters,
    /// The accelerator of prompt steps (NPU-centric prefill), if any.
    pub(super) prompt_accel: Option<PromptAccel>,
    /// Reads queued ahead for the next layer's decode step.
    pub(super) prefetch: Mutex<Prefetch>,
    /// A prompt step's next layer's first chunk, read after this layer's reads (`stream_layer`):
    /// `(layer, units, the read)`.
    pub(super) prefill_ahead: Mutex<Option<PrefillAhead>>,
}

impl Offload {
    /// Opens the store at `path` (validated), starts the I/O thread and preloads each layer's hot prefix
    /// into the hot region (`hot_share` of `ffn_budget`, split evenly over layers, whole clusters).
    pub fn open(path: &Path, opts: OffloadOptions) -> Result<Self> {
        // Read-ahead queues the next layer's units behind this layer's: room for them on top of
        // the reads in flight the options (a plan) chose for the device.
        let ahead = if opts.read_ahead {
            super::ahead::READ_AHEAD_SLOTS
        } else {
            0
        };
        let io = Arc::new(IoEngine::new(IoConfig {
            queue_depth: opts.queue_depth.max(1) + ahead,
            pin_core: opts.pin_core,
            async_io: opts.async_io,
            ..Default::default()
        })?);
        let store = Arc::new(NeuronStore::open(
            &io,
            path,
            OpenOptions {
                direct: opts.direct,
                drop_cache: true,
            },
        )?);
        let live = CacheControl::new(io.clone(), store.clone(), &opts);
        live.set_cache_budget(opts.ffn_budget)?;
        Ok(Offload {
            io,
            store,
            cache: live.cache.clone(),
            live,
            opts,
            counters: Counters::default(),
            prompt_accel: None,
            prefetch: Mutex::new(Prefetch::default()),
            prefill_ahead: Mutex::new(None),
        })
    }

    /// A handle that changes the neuron cache's budget while this offload runs (from any thread).
    pub fn control(&self) -> CacheControl {
        self.live.clone()
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
