//! Settings and counters of the run-time flash offload ([`super::Offload`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Default neurons per chunk of a prompt step's streamed layer ([`OffloadOptions::prefill_neurons`]).
pub(crate) const PREFILL_NEURONS: usize = 1280;

/// Settings of an [`Offload`](super::Offload).
#[derive(Debug, Clone)]
pub struct OffloadOptions {
    /// Bytes of FFN units kept in memory (hot and cold regions together).
    pub ffn_budget: usize,
    /// Share of `ffn_budget` preloaded as each layer's hot prefix (the rest is the cold LRU; default all,
    /// see `sparrow --help`).
    pub hot_share: f32,
    /// Units per hot cluster (read and cached as a whole).
    pub cluster_units: usize,
    /// Unit reads in flight on the I/O thread (default 256). With kernel AIO the device holds up to this
    /// many, coalesced where neighbouring; 32 left the synthetic model's reads latency-bound (0.63x vs
    /// 0.72x of in-memory sparse decode at 256, docs/BENCHMARKS.md).
    pub queue_depth: usize,
    /// Core the I/O thread is pinned to.
    pub pin_core: Option<usize>,
    /// Read with direct I/O (page cache out of play, see `ufs-io`) where the filesystem allows it.
    pub direct: bool,
    /// Keep units read from flash in the cold region (off: every miss is read again; for the ablation).
    pub cache_cold: bool,
    /// Interleave the compute of cached units with outstanding reads (off: wait for all reads of a
    /// layer first; for the ablation).
    pub pipeline: bool,
    /// Where a decode step wants every neuron of its layer (no predictor), queue the next layer's
    /// uncached units as soon as this layer's misses (`prefetch.rs`; off: each layer's reads start
    /// with its step; for the ablation).
    pub read_ahead: bool,
    /// Most bytes of units read ahead for a layer (a process budget counts twice this beside the
    /// cache, `crate::budget::read_ahead_bytes`).
    pub read_ahead_bytes: usize,
    /// Two-phase loading (PowerInfer-2 §4.4) of units that span pages: read the first page (the gate
    /// rows) alone, and the rest only if a neuron's gate output survives. Only stores whose gate rows
    /// fit in the first page. Off by default: it saves the bytes of units whose neurons turn out
    /// inactive but puts a second read in series for the others, and with predictors of precision
    /// 0.78 (the synthetic model, docs/BENCHMARKS.md) it measured slower (0.41x vs 0.58x at 50%).
    pub two_phase: bool,
    /// Hand reads to the kernel asynchronously (Linux AIO, `ufs_io::IoConfig::async_io`), so the
    /// device holds up to `queue_depth` of them at once; off: one blocking read at a time.
    pub async_io: bool,
    /// Bytes that stay resident besides the FFN cache (the process at load, the resident file, the
    /// KV cache at the whole context, the predictors: [`crate::Resident::total`]), counted first when
    /// a process budget is set live ([`super::CacheControl::set_memory_budget`]); 0 where unknown.
    pub outside_ffn_bytes: u64,
    /// Whether the embedding and the output projection stay on flash ([`transformer::stream`]) as a plan
    /// decided (`sparrow plan`: `Some(true)` on flash, `Some(false)` in memory, whatever the
    /// budget). `None`: the engine's rule, on flash only under a process budget that cannot hold the
    /// whole FFN beside them.
    pub stream_weights: Option<bool>,
    /// Most neurons per chunk of a prompt step's streamed layer (`Offload::prefill`, rounded up to
    /// whole units; the layer is split as evenly as units allow): the size of each sequential read
    /// (two chunks are held at a time) and of the chunk's f32 buffers per token.
    pub prefill_neurons: usize,
}

impl Default for OffloadOptions {
    fn default() -> Self {
        OffloadOptions {
            ffn_budget: usize::MAX,
            hot_share: 1.0,
            cluster_units: 16,
            queue_depth: 256,
            pin_core: None,
            direct: true,
            cache_cold: true,
            pipeline: true,
            read_ahead: true,
            read_ahead_bytes: usize::MAX,
            two_phase: false,
            async_io: true,
            outside_ffn_bytes: 0,
            stream_weights: None,
            prefill_neurons: PREFILL_NEURONS,
        }
    }
}

/// Counters of an [`Offload`](super::Offload) since the last reset.
#[derive(Debug, Clone, Default)]
pub struct OffloadStats {
    /// Decode steps (tokens).
    pub tokens: u64,
    /// Units needed by predicted neurons.
    pub units: u64,
    /// Of those, found in the hot region.
    pub hot_hits: u64,
    /// Found in the cold region.
    pub cold_hits: u64,
    /// Read from flash.
    pub misses: u64,
    /// Of those, read ahead during the layer before (`OffloadOptions::read_ahead`).
    pub read_ahead: u64,
    /// Bytes read from flash.
    pub bytes_read: u64,
    /// Misses read in two phases whose gate outputs all failed, so the rest of the unit was not read.
    pub rest_skipped: u64,
    /// Seconds the compute thread waited for reads.
    pub io_wait_s: f64,
    /// Seconds in the offloaded FFN (compute plus waits).
    pub ffn_s: f64,
    /// Per token: seconds in the offloaded FFN over all layers.
    pub token_ffn_s: Vec<f64>,
    /// Per token: seconds of that spent waiting for reads.
    pub token_wait_s: Vec<f64>,
    /// Bytes of FFN units resident in the cache now.
    pub resident_bytes: usize,
    /// Bytes prompt steps read from flash (their layers streamed; not counted in `bytes_read`).
    pub prefill_bytes_read: u64,
    /// Prompt steps' reads of a layer's first chunk made while the layer before it computed.
    pub prefill_reads_ahead: u64,
    /// Seconds in prompt steps' offloaded FFN.
    pub prefill_s: f64,
}

impl OffloadStats {
    /// Share of needed units that had to be read.
    pub fn miss_rate(&self) -> f64 {
        self.misses as f64 / self.units.max(1) as f64
    }
}

/// The live counters behind [`OffloadStats`].
#[derive(Default)]
pub(super) struct Counters {
    pub(super) tokens: AtomicU64,
    pub(super) units: AtomicU64,
    pub(super) hot_hits: AtomicU64,
    pub(super) cold_hits: AtomicU64,
    pub(super) misses: AtomicU64,
    pub(super) read_ahead: AtomicU64,
    pub(super) bytes_read: AtomicU64,
    pub(super) rest_skipped: AtomicU64,
    pub(super) wait_ns: AtomicU64,
    pub(super) ffn_ns: AtomicU64,
    pub(super) prefill_bytes: AtomicU64,
    pub(super) prefill_reads_ahead: AtomicU64,
    pub(super) prefill_ns: AtomicU64,
    /// Per token: (FFN nanoseconds, wait nanoseconds).
    pub(super) per_token: Mutex<Vec<(u64, u64)>>,
}

impl Counters {
    /// A snapshot, with `resident_bytes` from the cache.
    pub(super) fn snapshot(&self, resident_bytes: usize) -> OffloadStats {
        let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let per = self.per_token.lock().map(|v| v.clone()).unwrap_or_default();
        OffloadStats {
            tokens: ld(&self.tokens),
            units: ld(&self.units),
            hot_hits: ld(&self.hot_hits),
            cold_hits: ld(&self.cold_hits),
            misses: ld(&self.misses),
            read_ahead: ld(&self.read_ahead),
            bytes_read: ld(&self.bytes_read),
            rest_skipped: ld(&self.rest_skipped),
            io_wait_s: ld(&self.wait_ns) as f64 * 1e-9,
            ffn_s: ld(&self.ffn_ns) as f64 * 1e-9,
            token_ffn_s: per.iter().map(|p| p.0 as f64 * 1e-9).collect(),
            token_wait_s: per.iter().map(|p| p.1 as f64 * 1e-9).collect(),
            resident_bytes,
            prefill_bytes_read: ld(&self.prefill_bytes),
            prefill_reads_ahead: ld(&self.prefill_reads_ahead),
            prefill_s: ld(&self.prefill_ns) as f64 * 1e-9,
        }
    }

    /// Zeroes every counter.
    pub(super) fn reset(&self) {
        for a in [
            &self.tokens,
            &self.units,
            &self.hot_hits,
            &self.cold_hits,
            &self.misses,
            &self.read_ahead,
            &self.bytes_read,
            &self.rest_skipped,
            &self.wait_ns,
            &self.ffn_ns,
            &self.prefill_bytes,
            &self.prefill_reads_ahead,
            &self.prefill_ns,
        ] {
            a.store(0, Ordering::Relaxed);
        }
        if let Ok(mut v) = self.per_token.lock() {
            v.clear();
        }
    }

    /// Adds one layer's FFN time and wait to the totals and to the current token (a new token starts
    /// at layer 0).
    pub(super) fn record_layer(&self, layer: usize, ns: u64, wait_ns: u64) {
        self.ffn_ns.fetch_add(ns, Ordering::Relaxed);
        self.wait_ns.fetch_add(wait_ns, Ordering::Relaxed);
        if let Ok(mut v) = self.per_token.lock() {
            if layer == 0 {
                self.tokens.fetch_add(1, Ordering::Relaxed);
                v.push((0, 0));
            }
            if let Some(last) = v.last_mut() {
                last.0 += ns;
                last.1 += wait_ns;
            }
        }
    }
}
