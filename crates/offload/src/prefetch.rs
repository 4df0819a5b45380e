//! Reading the next layer's misses while this layer computes ([`Prefetch`]): where a decode step
//! wants every neuron of a layer (no predictor: a SiLU model's gate and up rows are all computed),
//! the next layer will want every unit too, so the units of it that are not cached are queued on
//! the I/O thread as soon as this layer's own misses are, and the flash keeps reading through this
//! layer's compute, the attention in between and the next layer's hot units, instead of waiting
//! for the next step to ask. Without it the device idled between layers: Qwen2.5-Coder-0.5B at a
//! 211 MiB budget read its 98 MiB a token at 0.65 GB/s, against 1.5 GB/s sequential.
//!
//! Completions come back on the one channel every decode step takes its reads from. A worker that
//! takes a completion read ahead for a later layer keeps it here ([`Offload::take_own`]) and takes
//! another; the step of that layer then takes what was kept as read, and registers what is still in
//! flight as its own outstanding reads. Nothing is left in flight unaccounted for: a step whose
//! layer is not the one read ahead (an error stopped the token before it) first takes and drops
//! every read still in flight, and units read ahead that the step does not miss after all are
//! registered as its reads too, with no neuron wanted.

use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::MutexGuard;

use neuron_cache::NeuronId;
use ufs_io::Completion;

use super::ahead::{Prefetch, TAG_AHEAD};
use super::live::HotSet;
use super::runtime::Offload;
use super::unit::{lock_pending, tag_of, Job, Pending, TAG_PHASES};
use crate::error::OffloadError;

/// The misses of a step against what was read ahead for its layer.
pub(super) struct Ahead {
    /// Misses neither read nor queued ahead: the step queues them.
    pub(super) to_read: Vec<(usize, Range<usize>)>,
    /// Completions already taken, to compute (their units registered as pending).
    pub(super) ready: Vec<Completion>,
}

impl Offload {
    fn lock_prefetch(&self) -> MutexGuard<'_, Prefetch> {
        self.prefetch.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Splits a step's misses by what was read ahead for its layer: units still in flight become
    /// the step's outstanding reads and units already read its ready completions (both registered
    /// in `job.pending`); the rest are returned to be queued. Reads ahead for another layer (a
    /// step that never came) are taken and dropped first.
    pub(super) fn claim_ahead(&self, job: &Job<'_>, misses: Vec<(usize, Range<usize>)>) -> Ahead {
        let mut pf = std::mem::take(&mut *self.lock_prefetch());
        if pf.layer != Some(job.layer) {
            // No other read is outstanding between steps: what comes now is the stale reads.
            for _ in 0..pf.in_flight.len() {
                if self.io.completions().recv().is_err() {
                    break;
                }
            }
            pf = Prefetch::default();
        }
        let mut pending = lock_pending(job.pending);
        let mut ahead = Ahead {
            to_read: Vec::new(),
            ready: Vec::new(),
        };
        let mut register = |u: usize, range: Range<usize>| {
            pending.insert(u, Pending { range, head: None });
        };
        let mut taken = 0u64;
        for (u, range) in misses {
            if let Some(d) = pf.done.remove(&u) {
                register(u, range);
                ahead.ready.push(d);
            } else if pf.in_flight.remove(&u) {
                register(u, range);
                job.outstanding.fetch_add(1, Ordering::AcqRel);
            } else {
                ahead.to_read.push((u, range));
                continue;
            }
            taken += 1;
        }
        // Read ahead but cached by now: taken as reads that want nothing, so none stays in flight.
        for u in pf.in_flight {
            register(u, 0..0);
            job.outstanding.fetch_add(1, Ordering::AcqRel);
        }
        self.counters.read_ahead.fetch_add(taken, Ordering::Relaxed);
        ahead
    }

    /// Neurons of `layer` in the units an accelerator holds (hybrid decode: those before
    /// `hot.first`), which no step of the CPU's asks for.
    pub(super) fn accel_neurons(&self, hot: &HotSet, layer: usize) -> usize {
        let ix = self.store.index();
        (0..hot.first[layer].min(ix.units_per_layer()))
            .map(|u| ix.neurons_of(layer, u).len())
            .sum()
    }

    /// Queues, without waiting for a free slot, the units of `layer` past the accelerator's that
    /// are neither hot nor in the cold region, at most [`super::OffloadOptions::read_ahead_bytes`]
    /// of them (what a process budget counts for them beside the cache, `budget::read_ahead_bytes`).
    /// Stops at the first read the I/O thread does not take.
    pub(super) fn read_ahead(&self, hot: &HotSet, layer: usize) {
        let ix = self.store.index();
        let ub = ix.layout.unit_bytes();
        let cu = self.opts.cluster_units.max(1);
        let most = self.opts.read_ahead_bytes / ub.max(1);
        if most == 0 {
            return;
        }
        let units: Vec<usize> = {
            let cache = self.cache.lock();
            // Units before `hot.first` are the accelerator's (hybrid decode): never read here.
            (hot.first[layer].min(ix.units_per_layer())..ix.units_per_layer())
                .filter(|&u| {
                    hot.find(layer, u, cu, ub).is_none()
                        && !cache.contains_neuron(NeuronId {
                            layer: layer as u32,
                            neuron: u as u32,
                        })
                })
                .take(most)
                .collect()
        };
        let mut pf = self.lock_prefetch();
        pf.layer = Some(layer);
        for u in units {
            // In flight before it is queued: its completion may be taken at once.
            pf.in_flight.insert(u);
            let req = self
                .store
                .unit_request(layer, u, tag_of(layer, u) | TAG_AHEAD);
            if self.io.try_submit(req).is_err() {
                pf.in_flight.remove(&u);
                break;
            }
        }
    }

    /// The next completion of one of `job`'s reads: one read ahead for a later layer is kept for
    /// that layer's step (or dropped, if that is not the layer read ahead) and the next taken.
    pub(super) fn take_own(&self, job: &Job<'_>) -> std::result::Result<Completion, OffloadError> {
        loop {
            let d = self
                .io
                .completions()
                .recv()
                .map_err(|_| OffloadError::Flash(ufs_io::IoError::Stopped))?;
            let layer = ((d.tag & !TAG_PHASES & !TAG_AHEAD) >> 32) as usize;
            if d.tag & TAG_AHEAD == 0 || layer == job.layer {
                return Ok(d);
            }
            let mut pf = self.lock_prefetch();
            let u = (d.tag & 0xffff_ffff) as usize;
            if pf.layer == Some(layer) && pf.in_flight.remove(&u) {
                pf.done.insert(u, d);
            }
        }
    }
}
