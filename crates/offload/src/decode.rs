//! One layer's offloaded decode step ([`Offload::decode`]), in named stages: check the request,
//! group the chosen neurons by unit, look the units up (hot clusters, cold LRU), take what was read
//! ahead for this layer and queue the other misses on the I/O thread, read the next layer ahead
//! (`prefetch.rs`), optionally wait for every read (no pipeline), compute on every pool thread, and
//! sum the workers' outputs and record the timings.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use kernels_neon::{Precision, PreparedActs};
use neuron_cache::NeuronId;
use ufs_io::{Completion, IoError};

use super::live::HotSet;
use super::runtime::Offload;
use super::unit::{from_fixed, lock_pending, tag_of, Job, Pending, Wanted, Worker, TAG_HEAD};
use crate::error::{OffloadError, Result};
use crate::neurons::{LayerRule, RowCounts};

/// A cached unit's bytes: a slice of a pinned hot cluster, or a cold unit.
enum UnitBytes<'a> {
    Hot(&'a [u8]),
    Cold(Arc<[u8]>),
}

/// A unit found in the cache: its bytes, where the unit starts in them, and its wanted entries.
struct Hit<'a> {
    bytes: UnitBytes<'a>,
    at: usize,
    range: Range<usize>,
}

impl Hit<'_> {
    fn unit(&self, unit_bytes: usize) -> &[u8] {
        let b: &[u8] = match &self.bytes {
            UnitBytes::Hot(b) => b,
            UnitBytes::Cold(b) => b,
        };
        b.get(self.at..self.at + unit_bytes).unwrap_or(&[])
    }
}

impl Offload {
    /// One token's FFN of `layer` over the `rows` (neuron ids) chosen by the caller's predictor (all
    /// rows without one), with `rule`'s score and threshold: `out = Σ down_j · v_j` over the neurons
    /// that pass. Returns the rows computed of gate, up and down.
    ///
    /// The calling thread looks the units up and queues the misses on the I/O thread; then every thread
    /// of the current rayon pool computes cached units (taking them from a shared counter) and, when
    /// none are left, completed reads (each worker first claims one of the outstanding completions, so
    /// nobody waits for a read that another worker will take). Each unit is summed alone and added to
    /// its worker's output in fixed point; the outputs are summed at the end, exactly, so the result
    /// depends neither on the order units were taken in nor on which of them were cached. An error
    /// stops the computing but not the draining of claimed reads, so no stale completion is left for
    /// the next step.
    pub(crate) fn decode(
        &self,
        rule: LayerRule<'_>,
        layer: usize,
        rows: &[u32],
        x: &[f32],
        out: &mut [f32],
        precision: Precision,
    ) -> Result<RowCounts> {
        self.decode_many(rule, layer, &[rows], x, out, precision)
    }

    /// [`Offload::decode`] of several tokens of one step at once (a speculative verification, or
    /// one token of each of several sequences): token `t` (`x`, `out`: `n × d_model`) over
    /// `rows[t]`. Each unit any token wants is looked up and read once for the step; each token
    /// then computes from it the neurons it wants, as its own one-token step would (the same
    /// entries in the same order, summed in fixed point), so every token's output is bit for bit
    /// that of [`Offload::decode`].
    pub(crate) fn decode_many(
        &self,
        rule: LayerRule<'_>,
        layer: usize,
        rows: &[&[u32]],
        x: &[f32],
        out: &mut [f32],
        precision: Precision,
    ) -> Result<RowCounts> {
        let t0 = Instant::now();
        let n = rows.len();
        let ix = self.store.index();
        let d = ix.d_model;
        self.check_many(layer, rows, x, out)?;
        let (wanted, groups) = self.group_by_unit(layer, rows);
        let wants = self.token_wants(rows);
        self.counters
            .units
            .fetch_add(groups.len() as u64, Ordering::Relaxed);
        // The hot prefixes stay as they are until this step's last unit is computed (a live resize
        // waits for it).
        let hot = self.live.read_hot();
        let (hits, misses) = self.look_up(&hot, layer, groups, true);
        self.counters
            .misses
            .fetch_add(misses.len() as u64, Ordering::Relaxed);

        let (acts_g, acts_u) = self.prepare(x, precision);
        let pending: Mutex<HashMap<usize, Pending>> =
            Mutex::new(HashMap::with_capacity(misses.len()));
        // Reads submitted whose completions nobody has taken yet.
        let outstanding = AtomicUsize::new(0);
        let job = Job {
            off: self,
            rule,
            layer,
            acts_g: &acts_g,
            acts_u: &acts_u,
            wanted: &wanted,
            wants: &wants,
            pending: &pending,
            outstanding: &outstanding,
            keep_cold: self.keeps_cold(),
        };
        let mut main = Worker::new(d, n);
        let ahead = self.claim_ahead(&job, misses);
        if let Some(e) = self.queue_misses(&job, ahead.to_read, &mut main) {
            main.err = Some(e);
        }
        // Every neuron wanted (no predictor) but the accelerator's (hybrid decode: the layer's
        // leading units, `hot.first`): so will the next layer's step want every unit past its
        // accelerator's, and after the last layer the next token's first (its reads then overlap
        // the output projection and the sampling).
        // Not under two-phase loading, whose steps read gate pages first (whole units read
        // ahead would undo it).
        let layers = ix.layers.len();
        if self.opts.read_ahead
            && !self.two_phase()
            && layers > 1
            && wanted.len() + self.accel_neurons(&hot, layer) == ix.d_ff
            && main.err.is_none()
        {
            self.read_ahead(&hot, (layer + 1) % layers);
        }
        let ready = Mutex::new(ahead.ready);
        if !self.opts.pipeline {
            self.complete_all_reads(&job, &ready, &mut main);
        }
        let others = self.compute(&job, &hits, &ready, &mut main, n);
        let (counts, wait_ns) = gather(out, main, others)?;
        self.counters
            .record_layer(layer, t0.elapsed().as_nanos() as u64, wait_ns);
        Ok(counts)
    }

    /// [`Offload::decode_many`] from the units in memory only (hot, or in the cold region): the
    /// others are skipped, nothing is read and no counter moves. Not the model's output: the draft
    /// of speculative decoding that never waits for flash (`--self-draft`).
    pub(crate) fn decode_resident(
        &self,
        rule: LayerRule<'_>,
        layer: usize,
        rows: &[&[u32]],
        x: &[f32],
        out: &mut [f32],
        precision: Precision,
    ) -> Result<RowCounts> {
        let n = rows.len();
        self.check_many(layer, rows, x, out)?;
        let (wanted, groups) = self.group_by_unit(layer, rows);
        let wants = self.token_wants(rows);
        let hot = self.live.read_hot();
        let (hits, _) = self.look_up(&hot, layer, groups, false);
        let (acts_g, acts_u) = self.prepare(x, precision);
        let pending = Mutex::new(HashMap::new());
        let outstanding = AtomicUsize::new(0);
        let job = Job {
            off: self,
            rule,
            layer,
            acts_g: &acts_g,
            acts_u: &acts_u,
            wanted: &wanted,
            wants: &wants,
            pending: &pending,
            outstanding: &outstanding,
            keep_cold: false,
        };
        let mut main = Worker::new(self.store.index().d_model, n);
        let others = self.compute(&job, &hits, &Mutex::new(Vec::new()), &mut main, n);
        Ok(gather(out, main, others)?.0)
    }

    /// Checks a step of `rows.len()` tokens (`x`, `out`: that many rows of the store's width).
    fn check_many(&self, layer: usize, rows: &[&[u32]], x: &[f32], out: &[f32]) -> Result<()> {
        let (n, d) = (rows.len(), self.store.index().d_model);
        if n == 1 {
            return self.check_step(layer, rows[0], x, out);
        }
        if n == 0 || x.len() != n * d || out.len() != n * d {
            return Err(OffloadError::Request(format!(
                "offloaded FFN: {n} tokens, {} inputs and {} outputs of width {d} (the store's)",
                x.len(),
                out.len()
            )));
        }
        for (t, r) in rows.iter().enumerate() {
            self.check_step(layer, r, &x[t * d..(t + 1) * d], &out[t * d..(t + 1) * d])?;
        }
        Ok(())
    }

    /// Which neurons each token wants (`n × d_ff`), where a step has several tokens (else empty).
    fn token_wants(&self, rows: &[&[u32]]) -> Vec<bool> {
        let ff = self.store.index().d_ff;
        let mut wants = Vec::new();
        if rows.len() > 1 {
            wants = vec![false; rows.len() * ff];
            for (t, r) in rows.iter().enumerate() {
                r.iter().for_each(|&j| wants[t * ff + j as usize] = true);
            }
        }
        wants
    }

    /// Each token's activations prepared for the gate and the up rows' formats.
    fn prepare<'x>(
        &self,
        x: &'x [f32],
        precision: Precision,
    ) -> (Vec<PreparedActs<'x>>, Vec<PreparedActs<'x>>) {
        let ix = self.store.index();
        let prep = |f| -> Vec<_> {
            x.chunks(ix.d_model)
                .map(|xt| kernels_neon::prepare_acts(f, xt, precision))
                .collect()
        };
        (prep(ix.formats.gate), prep(ix.formats.up))
    }

    /// Whether misses are read in two phases: asked for, and the store's units span pages with
    /// their gate rows in the first.
    fn two_phase(&self) -> bool {
        let l = &self.store.index().layout;
        self.opts.two_phase && l.pages > 1 && l.gate_in_first_page()
    }

    /// Checks the layer, the widths and the chosen neurons against the store.
    fn check_step(&self, layer: usize, rows: &[u32], x: &[f32], out: &[f32]) -> Result<()> {
        let ix = self.store.index();
        if layer >= ix.layers.len() || x.len() != ix.d_model || out.len() != ix.d_model {
            return Err(OffloadError::Request(format!(
                "offloaded FFN: layer {layer} / width {} does not match the store ({} layers of width {})",
                x.len(),
                ix.layers.len(),
                ix.d_model
            )));
        }
        if let Some(&bad) = rows.iter().find(|&&n| n as usize >= ix.d_ff) {
            return Err(OffloadError::Request(format!(
                "offloaded FFN: the predictor chose neuron {bad} of layer {layer}, which has {} neurons",
                ix.d_ff
            )));
        }
        Ok(())
    }

    /// The neurons chosen by any token as `(unit, slot, neuron)` in store order (by unit, then
    /// slot; a neuron chosen twice counts once), and each unit's range of them. A neuron's place in the store is
    /// unique, so one pass over the layer's places orders them (a sort of every row of a layer, as
    /// without a predictor, was 5% of an offloaded decode's cycles).
    fn group_by_unit(
        &self,
        layer: usize,
        rows: &[&[u32]],
    ) -> (Vec<Wanted>, Vec<(usize, Range<usize>)>) {
        let ix = self.store.index();
        let k = ix.layout.neurons;
        let mut at = vec![u32::MAX; ix.units_per_layer() * k];
        for &n in rows.iter().flat_map(|r| r.iter()) {
            let (u, s) = ix.unit_of(layer, n);
            at[u * k + s] = n;
        }
        let mut wanted: Vec<Wanted> = Vec::with_capacity(rows.first().map_or(0, |r| r.len()));
        let mut groups: Vec<(usize, Range<usize>)> = Vec::new();
        for (p, &n) in at.iter().enumerate() {
            if n == u32::MAX {
                continue;
            }
            let (u, i) = (p / k, wanted.len());
            wanted.push((u as u32, (p % k) as u32, n));
            match groups.last_mut() {
                Some((g, r)) if *g == u => r.end = i + 1,
                _ => groups.push((u, i..i + 1)),
            }
        }
        (wanted, groups)
    }

    /// Splits the units into cache hits (hot clusters first, then the cold LRU under one lock) and
    /// misses; the hits counted where `count`.
    fn look_up<'h>(
        &self,
        hot: &'h HotSet,
        layer: usize,
        groups: Vec<(usize, Range<usize>)>,
        count: bool,
    ) -> (Vec<Hit<'h>>, Vec<(usize, Range<usize>)>) {
        let c = &self.counters;
        let ub = self.store.index().layout.unit_bytes();
        let cu = self.opts.cluster_units.max(1);
        let mut hits = Vec::with_capacity(groups.len());
        let mut misses = Vec::new();
        let mut cache = self.cache.lock();
        for (u, range) in groups {
            if let Some((cluster, at)) = hot.find(layer, u, cu, ub) {
                // The hot region is preloaded and pinned: no LRU bookkeeping, no cache lock needed.
                c.hot_hits.fetch_add(u64::from(count), Ordering::Relaxed);
                hits.push(Hit {
                    bytes: UnitBytes::Hot(cluster),
                    at,
                    range,
                });
            } else if let Some(b) = cache.get_neuron(NeuronId {
                layer: layer as u32,
                neuron: u as u32,
            }) {
                c.cold_hits.fetch_add(u64::from(count), Ordering::Relaxed);
                hits.push(Hit {
                    bytes: UnitBytes::Cold(b),
                    at: 0,
                    range,
                });
            } else {
                misses.push((u, range));
            }
        }
        (hits, misses)
    }

    /// Queues every miss (its first page only under two-phase loading); when the queue is full (or
    /// `queue_depth` of the step's reads are in flight), takes one completion on this thread first
    /// (or, when every read queued so far has been taken, waits for the I/O thread to free its
    /// slot). Returns the first error met.
    fn queue_misses(
        &self,
        job: &Job<'_>,
        misses: Vec<(usize, Range<usize>)>,
        main: &mut Worker,
    ) -> Option<OffloadError> {
        let layer = job.layer;
        // Two-phase loading: a miss of a multi-page unit reads its first page (the gate rows) first.
        let two_phase = self.two_phase();
        let mut first_err: Option<OffloadError> = None;
        for (u, r) in misses {
            lock_pending(job.pending).insert(
                u,
                Pending {
                    range: r,
                    head: None,
                },
            );
            let req = if two_phase {
                self.store
                    .head_request(layer, u, tag_of(layer, u) | TAG_HEAD)
            } else {
                self.store.unit_request(layer, u, tag_of(layer, u))
            };
            loop {
                // At most `queue_depth` of the step's reads in flight (the I/O thread takes more,
                // for the reads ahead, `prefetch.rs`): each holds its buffer until it is computed.
                let outstanding = job.outstanding.load(Ordering::Acquire);
                let submitted = if outstanding >= self.opts.queue_depth.max(1) {
                    Err(IoError::QueueFull {
                        depth: self.opts.queue_depth,
                    })
                } else if outstanding > 0 {
                    self.io.try_submit(req)
                } else {
                    self.io.submit(req)
                };
                match submitted {
                    Ok(()) => {
                        job.outstanding.fetch_add(1, Ordering::AcqRel);
                        break;
                    }
                    Err(IoError::QueueFull { .. }) => {
                        job.outstanding.fetch_sub(1, Ordering::AcqRel);
                        let w0 = Instant::now();
                        let done = self.take_own(job);
                        main.wait_ns += w0.elapsed().as_nanos() as u64;
                        match done {
                            Ok(d) => job.completed(d, main),
                            Err(e) => {
                                first_err.get_or_insert(e);
                                break;
                            }
                        }
                    }
                    Err(e) => {
                        lock_pending(job.pending).remove(&u);
                        first_err.get_or_insert(e.into());
                        break;
                    }
                }
            }
        }
        first_err
    }

    /// Without the pipeline (ablation): every read queued so far completes before any compute
    /// (and joins the completions already taken, `ready`).
    fn complete_all_reads(&self, job: &Job<'_>, ready: &Mutex<Vec<Completion>>, main: &mut Worker) {
        let mut done_first = Vec::new();
        while job.outstanding.load(Ordering::Acquire) > 0 {
            job.outstanding.fetch_sub(1, Ordering::AcqRel);
            let w0 = Instant::now();
            let d = self.take_own(job);
            main.wait_ns += w0.elapsed().as_nanos() as u64;
            match d {
                Ok(d) => done_first.push(d),
                Err(e) => {
                    main.err.get_or_insert(e);
                    job.outstanding.store(0, Ordering::Release);
                }
            }
        }
        lock_ready(ready).extend(done_first);
    }

    /// Every compute worker (this thread as `main`, and the others it returns) takes cached units,
    /// then completions already taken (`ready`), then outstanding ones, until none is left.
    fn compute(
        &self,
        job: &Job<'_>,
        hits: &[Hit<'_>],
        ready: &Mutex<Vec<Completion>>,
        main: &mut Worker,
        n: usize,
    ) -> Vec<Worker> {
        let ix = self.store.index();
        let ub = ix.layout.unit_bytes();
        // While reads are outstanding a pread I/O thread needs a core of its own (PowerInfer-2 pins it
        // to one): one compute worker fewer then. An AIO thread only submits and reaps, so every
        // worker computes.
        let threads = rayon::current_num_threads().clamp(1, 8);
        let step_aside = job.outstanding.load(Ordering::Relaxed) > 0
            && self.opts.pipeline
            && !self.io.is_async();
        let workers = if step_aside {
            (threads - 1).max(1)
        } else {
            threads
        };
        // Every cached unit is summed alone, as a read unit is: which units are cached (where a
        // layer's hot region ends, what is still in the cold LRU) must not change the sum.
        let next_item = AtomicUsize::new(0);
        let run = |w: &mut Worker| {
            loop {
                let i = next_item.fetch_add(1, Ordering::Relaxed);
                if let Some(hit) = hits.get(i) {
                    if w.err.is_none() {
                        let res = job.compute(hit.unit(ub), &job.wanted[hit.range.clone()], w);
                        if let Err(e) = res {
                            w.err = Some(e);
                        }
                    }
                    continue;
                }
                let taken = lock_ready(ready).pop();
                if let Some(d) = taken {
                    job.completed(d, w);
                    continue;
                }
                // Claim one outstanding completion, or stop when none is left.
                if job
                    .outstanding
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
                    .is_err()
                {
                    break;
                }
                let w0 = Instant::now();
                let d = self.take_own(job);
                w.wait_ns += w0.elapsed().as_nanos() as u64;
                match d {
                    Ok(d) => job.completed(d, w),
                    Err(e) => {
                        w.err.get_or_insert(e);
                        job.outstanding.store(0, Ordering::Release);
                    }
                }
            }
        };
        let mut others: Vec<Worker> = (1..workers).map(|_| Worker::new(ix.d_model, n)).collect();
        if others.is_empty() {
            run(main);
        } else {
            rayon::scope(|s| {
                for w in others.iter_mut() {
                    s.spawn(|_| run(w));
                }
                run(main);
            });
        }
        others
    }
}

/// Sums the workers' fixed-point outputs (exactly, so in any order) into `out`, and their row counts;
/// the wait is the longest any worker waited. The first worker error, if any, fails the step.
fn gather(out: &mut [f32], main: Worker, others: Vec<Worker>) -> Result<(RowCounts, u64)> {
    let mut acc = main.acc;
    let mut counts = main.counts;
    let mut wait_ns = main.wait_ns;
    let mut err = main.err;
    for w in others {
        acc.iter_mut()
            .zip(&w.acc)
            .for_each(|(a, v)| *a = a.wrapping_add(*v));
        counts = (
            counts.0 + w.counts.0,
            counts.1 + w.counts.1,
            counts.2 + w.counts.2,
        );
        wait_ns = wait_ns.max(w.wait_ns);
        err = err.or(w.err);
    }
    for (o, a) in out.iter_mut().zip(acc) {
        *o = from_fixed(a);
    }
    match err {
        Some(e) => Err(e),
        None => Ok((counts, wait_ns)),
    }
}

fn lock_ready(r: &Mutex<Vec<Completion>>) -> MutexGuard<'_, Vec<Completion>> {
    r.lock().unwrap_or_else(|e| e.into_inner())
}
