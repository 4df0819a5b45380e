//! What `sparrow bench` reports about a bundle of experts: hit rate, bytes read per token, the share
//! of decode time spent waiting for flash, and the bound those bytes are measured against: the
//! reads Belady's optimal policy would have done on the same routing trace with the same cache
//! (each layer's share of the cache, in whole experts, as the run splits it; starting from what the
//! cache held when decode began; an expert asked for may be used and not kept, as the run may do),
//! times the bytes of an expert. Beside it, the same minimum for one pool of the same bytes shared
//! by every layer (when every layer's expert has one size): what no split of the cache could beat.
//! And a reference that is not a bound: the reads of the best fixed set of experts of each layer's
//! share ([`offload::fixed_set_misses`]), a cache told how often each expert is asked for but not
//! when, which is what an online policy can reach when the routing has no order to follow.

use crate::generate::Engine;
use offload::{belady_misses, fixed_set_misses, ExpertCounters};

/// One decode run's expert counters and the bound they are held to.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExpertBench {
    /// The run's counters.
    pub counters: ExpertCounters,
    /// Tokens decoded.
    pub tokens: u64,
    /// Bytes read per token.
    pub bytes_per_token: f64,
    /// Bytes per token an optimal (Belady) cache of the same size would have read on the same
    /// routing: the least the routing and the cache size allow.
    pub min_bytes_per_token: f64,
    /// The same minimum with the cache's bytes one pool for every layer (`None` when the layers'
    /// experts differ in size): at most `min_bytes_per_token`.
    pub min_bytes_per_token_one_pool: Option<f64>,
    /// Bytes per token of the best fixed set of experts of each layer's share on the same routing
    /// ([`offload::fixed_set_misses`]): a reference, at least `min_bytes_per_token`.
    pub fixed_set_bytes_per_token: f64,
    /// Share of decode time spent waiting for a read.
    pub wait_share: f64,
    /// Each layer's share of the expert cache, bytes ([`offload::ExpertOffload::cache_shares`]).
    pub cache_shares: Vec<usize>,
}

impl ExpertBench {
    /// Bytes read over the bound (1.0: as few as any cache of this size could; `NaN` without reads
    /// to bound).
    pub fn over_min(&self) -> f64 {
        if self.min_bytes_per_token > 0.0 {
            self.bytes_per_token / self.min_bytes_per_token
        } else if self.bytes_per_token == 0.0 {
            1.0
        } else {
            f64::NAN
        }
    }
}

/// Restarts the counters and the routing trace of `e`'s expert offload, if it has one; returns the
/// experts each layer holds now (the optimal cache of the bound starts with them).
pub(crate) fn start(e: &Engine<'_>) -> Vec<Vec<u32>> {
    let Some(x) = e.experts() else {
        return Vec::new();
    };
    x.take_counters();
    x.set_trace(true);
    x.take_trace();
    (0..x.cache_shares().len()).map(|l| x.resident(l)).collect()
}

/// The counters of the `tokens` decoded in `secs` since [`start`], with their bound.
pub(crate) fn finish(
    e: &Engine<'_>,
    initial: &[Vec<u32>],
    tokens: usize,
    secs: f64,
) -> Option<ExpertBench> {
    let x = e.experts()?;
    let c = x.take_counters();
    let all = x.take_trace_all();
    let trace = x.take_trace();
    x.set_trace(false);
    let shares = x.cache_shares();
    // Each layer's misses by `count` (its trace, its share in whole experts, what it held) in bytes.
    let layer_bytes = |count: fn(&[u32], usize, &[u32]) -> u64| -> f64 {
        trace
            .iter()
            .enumerate()
            .map(|(l, t)| {
                let blob = x.blob_bytes(l);
                let cap = shares.get(l).copied().unwrap_or(0) / blob.max(1);
                let held = initial.get(l).map_or(&[][..], Vec::as_slice);
                count(t, cap, held) as f64 * blob as f64
            })
            .sum()
    };
    let min_bytes = layer_bytes(belady_misses::<u32>);
    let fixed_bytes = layer_bytes(fixed_set_misses::<u32>);
    let n = tokens.max(1) as f64;
    let blobs: Vec<usize> = (0..trace.len())
        .map(|l| x.blob_bytes(l))
        .filter(|&b| b > 0)
        .collect();
    let one_pool = blobs
        .first()
        .filter(|&&b| blobs.iter().all(|&x| x == b))
        .map(|&blob| {
            let held: Vec<offload::ExpertId> = initial
                .iter()
                .enumerate()
                .flat_map(|(l, v)| {
                    v.iter().map(move |&e| offload::ExpertId {
                        layer: l as u32,
                        expert: e,
                    })
                })
                .collect();
            let cap = shares.iter().sum::<usize>() / blob;
            belady_misses(&all, cap, &held) as f64 * blob as f64 / n
        });
    Some(ExpertBench {
        counters: c,
        tokens: tokens as u64,
        bytes_per_token: c.bytes_read as f64 / n,
        min_bytes_per_token: min_bytes / n,
        min_bytes_per_token_one_pool: one_pool,
        fixed_set_bytes_per_token: fixed_bytes / n,
        wait_share: c.wait_seconds / secs.max(1e-9),
        cache_shares: shares,
    })
}
