//! [`ExpertOffload`]: the Mixture-of-Experts layers of a resident file run with their experts from an
//! expert store (`neuron_store::expert`), through a budgeted [`ExpertCache`] and the I/O thread.
//!
//! A layer's step routes its tokens (the router is in the resident file), groups them by expert
//! (so each expert is read at most once per step, however many tokens of a prompt chunk share it),
//! looks every selected expert up in the cache and queues all the missing ones on the I/O thread,
//! at most [`ExpertOffloadOptions::queue_depth`] in flight (what the budget reserves for reads; the
//! rest wait their turn, so a prompt step that selects every expert holds no more); the cached experts
//! are computed while those reads are in flight, the others as they arrive.
//! Then the next layer's router is applied to this layer's input and the likeliest experts it picks
//! for each token (`prefetch_per_token`) that are neither cached nor in flight are queued too, so they are read while this layer finishes and the
//! next attention computes. Every expert's output goes to a buffer of its own and the outputs are
//! summed in expert order, exactly as the in-memory block sums them: the step's result does not
//! depend on arrival order or cache contents, and equals the in-memory path's.
//!
//! Hot experts (the most selected of the bundle's routing profile) are read at start-up, up to a
//! share of each layer's part of the cache (equal parts in whole reads, or the plan's per-layer
//! shares), pinned or (the default) as ordinary entries scored by the profile. By default the
//! cache evicts by prediction (`Eviction::Predicted`, scores from the routers' logits:
//! `expert_scores.rs`) and a read expert that would evict a higher-scored one is used once and not
//! kept.
//!
//! The experts of a ReLU model converted neuron-major come from a neuron store instead, one
//! pseudo-layer per expert, of which each read and each cache entry is the expert's hot prefix and
//! only its neurons whose gate fires are computed (`expert_source.rs`).

use std::collections::{HashSet, VecDeque};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use neuron_cache::{Eviction, ExpertCache, ExpertId};
use ufs_io::{AlignedBuf, IoConfig, IoEngine};

use crate::error::{OffloadError, Result};
use crate::expert_scores::ExpertScores;
use crate::expert_source::{Rows, Source};
use transformer::ffn::{FfnExecutor, FfnLayer, FfnScratch, MoeStep};
use transformer::moe::{route, ExpertGroups, Route, RoutingProfile};
use transformer::ops::{mm_step, StepKind};

/// `FfnExecutor` for an executor of a bundle of experts: its MoE steps run `$step(self, step, x, n,
/// out)`, it owns the weights, and a dense FFN layer is refused ([`dense_layer`]), written once for
/// [`ExpertOffload`] and [`ExpertResidentOnly`] (the names it uses must be in scope where it is
/// used).
macro_rules! experts_only_executor {
    ($ty:ty, $step:expr) => {
        impl FfnExecutor for $ty {
            fn decode(
                &self,
                layer: FfnLayer<'_, '_>,
                _: &[f32],
                _: &mut [f32],
                _: &mut FfnScratch,
            ) -> transformer::Result<()> {
                Err(dense_layer(layer.index).into())
            }

            fn batch(
                &self,
                layer: FfnLayer<'_, '_>,
                _: &[f32],
                _: usize,
                _: &mut [f32],
                _: &mut FfnScratch,
            ) -> transformer::Result<()> {
                Err(dense_layer(layer.index).into())
            }

            fn owns_weights(&self) -> bool {
                true
            }

            fn moe_step(
                &self,
                step: MoeStep<'_, '_>,
                x: &[f32],
                n: usize,
                out: &mut [f32],
            ) -> Option<transformer::Result<()>> {
                let run: fn(&Self, MoeStep<'_, '_>, &[f32], usize, &mut [f32]) -> Result<()> =
                    $step;
                Some(run(self, step, x, n, out).map_err(Into::into))
            }

            fn runs_experts(&self) -> bool {
                true
            }
        }
    };
}

mod draft;
mod shares;

pub use draft::ExpertResidentOnly;

/// Settings of an [`ExpertOffload`].
#[derive(Debug, Clone)]
pub struct ExpertOffloadOptions {
    /// Bytes of expert cache (split equally between the MoE layers in whole reads, unless
    /// `shares` says).
    pub cache_bytes: usize,
    /// Each layer's share of `cache_bytes` (a plan's per-layer expert caches; `None`: equal
    /// shares in whole reads, `experts/shares.rs`). They must sum to at most `cache_bytes` and hold
    /// one entry per layer of the store.
    pub shares: Option<Vec<usize>>,
    /// Share of each layer's part of the cache given to pinned hot experts (by the routing profile).
    pub hot_share: f64,
    /// Per token, the next layer's experts to queue before it runs: the first this many its
    /// router picks when applied to this layer's input, in decreasing weight (0: no prediction).
    /// A wrong guess is a read of a whole expert, so the default takes only the likeliest one.
    pub prefetch_per_token: usize,
    /// Which unpinned expert the cache evicts first. With [`Eviction::Predicted`] an expert's score
    /// is a moving average of its router logits over the layer's tokens, a fast or a slow one as a
    /// duel of shadow caches decides (`expert_scores.rs`), the next layer's logits predicted ahead
    /// standing in for its own until it runs; an expert that would evict a higher-scored one is
    /// used once and not cached.
    pub eviction: Eviction,
    /// [`Eviction::Predicted`]'s moving averages of logits, by their weight of the past (each
    /// token's logits count `1 - memory`), fast to slow.
    pub score_memory: Vec<f32>,
    /// Whether the hot experts read at start-up are pinned (never evicted); otherwise they are
    /// ordinary entries, and under [`Eviction::Predicted`] their scores start at the log of their
    /// share of the profile's selections.
    pub pin_hot: bool,
    /// Expert reads in flight at most (queued on the I/O thread or completed and not yet taken):
    /// what the budget reserves for reads beside the cache. Further reads wait their turn.
    pub queue_depth: usize,
}

impl Default for ExpertOffloadOptions {
    fn default() -> Self {
        ExpertOffloadOptions {
            cache_bytes: usize::MAX,
            shares: None,
            hot_share: 0.5,
            prefetch_per_token: 1,
            eviction: Eviction::Predicted,
            score_memory: vec![0.3, 0.8, 0.99],
            pin_hot: false,
            queue_depth: 32,
        }
    }
}

/// Counters of an [`ExpertOffload`] since it was opened (or [`ExpertOffload::take_counters`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ExpertCounters {
    /// Experts a step needed (each once per layer step).
    pub lookups: u64,
    /// Of those, found in the cache.
    pub hits: u64,
    /// Of those, already in flight (queued by the previous layer's prediction).
    pub ahead: u64,
    /// Experts read from flash (misses and predictions).
    pub reads: u64,
    /// Of those, queued by a prediction.
    pub predicted_reads: u64,
    /// Bytes read from flash (pinned hot experts at start-up not included).
    pub bytes_read: u64,
    /// Seconds a step waited for a read.
    pub wait_seconds: f64,
    /// MoE layer steps run.
    pub steps: u64,
    /// Most expert reads in flight at once (at most [`ExpertOffloadOptions::queue_depth`]).
    pub peak_in_flight: u64,
}

impl ExpertCounters {
    /// Hits over lookups.
    pub fn hit_rate(&self) -> f64 {
        self.hits as f64 / self.lookups.max(1) as f64
    }
}

/// Buffers of a step, kept between steps.
#[derive(Default)]
struct Scratch {
    logits: Vec<f32>,
    probs: Vec<f32>,
    token_routes: Vec<Route>,
    routes: Vec<Route>,
    groups: ExpertGroups,
    xs: Vec<f32>,
    g: Vec<f32>,
    u: Vec<f32>,
    outs: Vec<Vec<f32>>,
    rows: Rows,
}

struct State {
    cache: ExpertCache<AlignedBuf>,
    in_flight: HashSet<u64>,
    /// Reads wanted while [`ExpertOffloadOptions::queue_depth`] were in flight, in order: (layer,
    /// expert, predicted).
    pending: VecDeque<(usize, usize, bool)>,
    counters: ExpertCounters,
    tracing: bool,
    trace: Vec<Vec<u32>>,
    /// Every layer's lookups in one sequence, in the order asked.
    trace_all: Vec<ExpertId>,
    /// [`Eviction::Predicted`]'s scores.
    scores: ExpertScores,
    s: Scratch,
}

/// The MoE layers' experts from an expert store (see the module docs).
pub struct ExpertOffload {
    store: Source,
    io: IoEngine,
    opts: ExpertOffloadOptions,
    state: Mutex<State>,
}

fn tag(layer: usize, expert: usize) -> u64 {
    ((layer as u64) << 32) | expert as u64
}

fn untag(t: u64) -> (usize, usize) {
    ((t >> 32) as usize, (t & 0xffff_ffff) as usize)
}

fn id(layer: usize, expert: usize) -> ExpertId {
    ExpertId {
        layer: layer as u32,
        expert: expert as u32,
    }
}

fn grow(v: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if v.len() < len {
        v.resize(len, 0.0);
    }
    &mut v[..len]
}

impl ExpertOffload {
    /// Opens the expert store at `path`, checks it against the model's MoE shape (`n_experts` per
    /// layer, 0 for a layer without experts) and pins each layer's hot experts by `profile`.
    pub fn open(
        path: &Path,
        experts_per_layer: &[usize],
        profile: Option<&RoutingProfile>,
        opts: ExpertOffloadOptions,
    ) -> Result<Self> {
        let io = IoEngine::new(IoConfig {
            queue_depth: opts.queue_depth.max(1),
            ..IoConfig::default()
        })?;
        let store = Source::open(&io, path, experts_per_layer)?;
        let shape = store.shape();
        if shape != experts_per_layer {
            return Err(OffloadError::BadModel {
                path: path.to_path_buf(),
                detail: format!(
                    "the expert store holds {shape:?} experts per layer, the model has {experts_per_layer:?}"
                ),
            });
        }
        let mut cache = ExpertCache::new(&shape, opts.cache_bytes).with_eviction(opts.eviction);
        match &opts.shares {
            Some(shares) => cache.set_shares(shares)?,
            None => {
                let unit: Vec<usize> = shape
                    .iter()
                    .enumerate()
                    .map(|(l, &n)| if n > 0 { store.mean_bytes(l).max(1) } else { 0 })
                    .collect();
                cache.set_shares(&shares::whole_read_shares(&unit, opts.cache_bytes))?;
            }
        }
        let mut state = State {
            cache,
            in_flight: HashSet::new(),
            pending: VecDeque::new(),
            counters: ExpertCounters::default(),
            tracing: false,
            trace: vec![Vec::new(); shape.len()],
            trace_all: Vec::new(),
            scores: ExpertScores::new(shape.len(), &opts.score_memory),
            s: Scratch::default(),
        };
        if let Some(p) = profile {
            Self::pin_hot(&store, &io, &mut state, p, &opts)?;
        }
        Ok(ExpertOffload {
            store,
            io,
            opts,
            state: Mutex::new(state),
        })
    }

    /// Reads each layer's most selected experts, up to `hot_share` of the layer's cache part, and
    /// pins them (`pin_hot`) or scores them by the profile.
    fn pin_hot(
        store: &Source,
        io: &IoEngine,
        st: &mut State,
        p: &RoutingProfile,
        opts: &ExpertOffloadOptions,
    ) -> Result<()> {
        let cache = &mut st.cache;
        let shares = cache.shares();
        let shape = store.shape();
        for (l, &part) in shares.iter().enumerate() {
            if shape.get(l).copied().unwrap_or(0) == 0 {
                continue;
            }
            if !opts.pin_hot {
                let c = p.counts.get(l).map_or(&[][..], Vec::as_slice);
                let total = c.iter().sum::<u64>().max(1) as f32;
                let prior: Vec<f32> = (0..shape[l])
                    .map(|e| ((c.get(e).copied().unwrap_or(0) as f32 + 0.5) / total).ln())
                    .collect();
                cache.set_scores(l, &prior);
                st.scores.prior(l, &prior);
            }
            let mut room = (part as f64 * opts.hot_share.clamp(0.0, 1.0)) as usize;
            for e in p.ranked(l) {
                let e = e as usize;
                if p.counts[l][e] == 0 || e >= shape[l] {
                    break;
                }
                let blob = store.bytes(l, e);
                if blob == 0 || blob > room {
                    break;
                }
                room -= blob;
                let buf = store.read(io, l, e)?;
                if opts.pin_hot {
                    cache.pin(id(l, e), Arc::new(buf), blob)?;
                } else {
                    cache.insert(id(l, e), Arc::new(buf), blob)?;
                }
            }
        }
        Ok(())
    }

    /// The neurons computed of expert `e` of layer `l` when its experts are ReLU experts of a neuron
    /// store (the expert's hot prefix: its most active neurons on the calibration text); `None` when
    /// experts are computed whole.
    pub fn computed_neurons(&self, l: usize, e: usize) -> Option<Vec<u32>> {
        self.store.computed(l, e).map(<[u32]>::to_vec)
    }

    /// Mean bytes of one read of layer `l`'s experts (a whole expert's blob, or a ReLU expert's hot
    /// prefix in a neuron store): what one miss costs.
    pub fn blob_bytes(&self, l: usize) -> usize {
        self.store.mean_bytes(l)
    }

    /// Counters so far.
    pub fn counters(&self) -> ExpertCounters {
        self.lock().counters
    }

    /// Counters so far, restarting them.
    pub fn take_counters(&self) -> ExpertCounters {
        std::mem::take(&mut self.lock().counters)
    }

    /// Keeps (`on`) the sequence of experts each layer asks for, for [`ExpertOffload::take_trace`].
    pub fn set_trace(&self, on: bool) {
        self.lock().tracing = on;
    }

    /// The experts each layer asked for, in order, since the last call (while
    /// [`ExpertOffload::set_trace`] is on).
    pub fn take_trace(&self) -> Vec<Vec<u32>> {
        let mut st = self.lock();
        let n = st.trace.len();
        st.trace_all.clear();
        std::mem::replace(&mut st.trace, vec![Vec::new(); n])
    }

    /// Every layer's lookups in one sequence, in the order asked, since the last call or
    /// [`ExpertOffload::take_trace`] (while [`ExpertOffload::set_trace`] is on). Take it first: the
    /// per-layer trace's call clears it.
    pub fn take_trace_all(&self) -> Vec<ExpertId> {
        std::mem::take(&mut self.lock().trace_all)
    }

    /// The experts of layer `layer` in the cache now.
    pub fn resident(&self, layer: usize) -> Vec<u32> {
        self.lock().cache.resident(layer)
    }

    /// The cache's statistics.
    pub fn cache_stats(&self) -> neuron_cache::ExpertStats {
        self.lock().cache.stats()
    }

    /// Each layer's share of the cache, in bytes.
    pub fn cache_shares(&self) -> Vec<usize> {
        self.lock().cache.shares()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues expert `e` of layer `l` unless it is in flight already; while
    /// [`ExpertOffloadOptions::queue_depth`] reads are in flight it waits in `pending`, so the
    /// buffers of reads never exceed what the budget reserves for them.
    fn submit(&self, st: &mut State, l: usize, e: usize, predicted: bool) -> Result<()> {
        if st.in_flight.contains(&tag(l, e)) {
            return Ok(());
        }
        if st.in_flight.len() >= self.opts.queue_depth.max(1) {
            if !st.pending.iter().any(|&(pl, pe, _)| (pl, pe) == (l, e)) {
                st.pending.push_back((l, e, predicted));
            }
            return Ok(());
        }
        self.issue(st, l, e, predicted)
    }

    /// Issues waiting reads while fewer than the queue depth are in flight.
    fn pump(&self, st: &mut State) -> Result<()> {
        while st.in_flight.len() < self.opts.queue_depth.max(1) {
            let Some((l, e, predicted)) = st.pending.pop_front() else {
                return Ok(());
            };
            if !st.in_flight.contains(&tag(l, e)) && !st.cache.contains(id(l, e)) {
                self.issue(st, l, e, predicted)?;
            }
        }
        Ok(())
    }

    /// Hands the read of expert `e` of layer `l` to the I/O thread.
    fn issue(&self, st: &mut State, l: usize, e: usize, predicted: bool) -> Result<()> {
        st.in_flight.insert(tag(l, e));
        st.counters.peak_in_flight = st.counters.peak_in_flight.max(st.in_flight.len() as u64);
        let r = self.store.request(l, e, tag(l, e))?;
        if let Err(err) = self.io.submit(r) {
            st.in_flight.remove(&tag(l, e));
            return Err(err.into());
        }
        st.counters.reads += 1;
        st.counters.predicted_reads += u64::from(predicted);
        st.counters.bytes_read += r.len as u64;
        Ok(())
    }

    /// Waits for the next completion, checks it and caches it (when the layer's share takes it);
    /// returns its layer, expert and bytes.
    fn receive(&self, st: &mut State) -> Result<(usize, usize, Arc<AlignedBuf>)> {
        let t0 = Instant::now();
        let c = self
            .io
            .completions()
            .recv()
            .map_err(|_| OffloadError::Flash(ufs_io::IoError::Stopped))?;
        st.counters.wait_seconds += t0.elapsed().as_secs_f64();
        st.in_flight.remove(&c.tag);
        self.pump(st)?;
        let (l, e) = untag(c.tag);
        let buf = c.result?;
        self.store.verify(l, e, &buf)?;
        let len = buf.len();
        let arc = Arc::new(buf);
        if !st.cache.admits(id(l, e), len) {
            return Ok((l, e, arc));
        }
        // A share full of pinned and in-use experts refuses it: it is used once and dropped.
        let arc = st
            .cache
            .insert(id(l, e), Arc::clone(&arc), len)
            .unwrap_or(arc);
        Ok((l, e, arc))
    }

    /// Routes the step's tokens into `st.s.routes` and `st.s.groups`.
    fn route_step(st: &mut State, step: &MoeStep<'_, '_>, x: &[f32], n: usize) -> Result<()> {
        let w = &step.moe.weights;
        let (e, k) = (w.n_experts(), step.moe.block.n_used.min(w.n_experts()));
        let s = &mut st.s;
        let logits = grow(&mut s.logits, n * e);
        let d = w.router.cols();
        mm_step(
            step.kind,
            &w.router,
            &x[..n * d],
            n,
            logits,
            step.precision,
            "moe router",
        )?;
        s.routes.clear();
        for t in 0..n {
            route(
                &s.logits[t * e..(t + 1) * e],
                k,
                step.moe.block.norm,
                &mut s.probs,
                &mut s.token_routes,
            );
            s.routes.extend_from_slice(&s.token_routes);
        }
        s.groups.build(&s.routes, k, e);
        Ok(())
    }

    /// Under [`Eviction::Predicted`], folds the `n` tokens' router logits of layer `l` (in
    /// `st.s.logits`, `e` a token, `k` picked) into the layer's scores; with `commit` false (the
    /// next layer's logits predicted ahead) only the cache's scores take them, not the averages.
    fn score(&self, st: &mut State, l: usize, (e, k): (usize, usize), n: usize, commit: bool) {
        if self.opts.eviction != Eviction::Predicted || e == 0 {
            return;
        }
        let logits = &st.s.logits[..n * e];
        let scores = if commit {
            let blob = self.store.mean_bytes(l).max(1);
            let capacity = st.cache.shares().get(l).map_or(0, |s| s / blob);
            st.scores.observe(l, logits, (e, k), n, capacity)
        } else {
            st.scores.ahead(l, logits, e, n)
        };
        st.cache.set_scores(l, &scores);
    }

    /// Queues the experts the next layer's router picks for this step's input.
    fn predict_next(
        &self,
        st: &mut State,
        step: &MoeStep<'_, '_>,
        x: &[f32],
        n: usize,
    ) -> Result<()> {
        let Some(next) = step.next.filter(|_| self.opts.prefetch_per_token > 0) else {
            return Ok(());
        };
        let l = step.index + 1;
        let w = &next.weights;
        let (e, k) = (w.n_experts(), next.block.n_used.min(w.n_experts()));
        let d = w.router.cols();
        let logits = grow(&mut st.s.logits, n * e);
        mm_step(
            step.kind,
            &w.router,
            &x[..n * d],
            n,
            logits,
            step.precision,
            "moe router (next layer)",
        )?;
        self.score(st, l, (e, k), n, false);
        let mut want = vec![false; e];
        for t in 0..n {
            let s = &mut st.s;
            route(
                &s.logits[t * e..(t + 1) * e],
                k,
                next.block.norm,
                &mut s.probs,
                &mut s.token_routes,
            );
            // `route` lists a token's experts in decreasing weight.
            s.token_routes
                .iter()
                .take(self.opts.prefetch_per_token)
                .for_each(|r| want[r.expert as usize] = true);
        }
        for ex in (0..e).filter(|&ex| want[ex]) {
            if !st.cache.contains(id(l, ex)) {
                self.submit(st, l, ex, true)?;
            }
        }
        Ok(())
    }

    /// One MoE layer step over `n` tokens (see the module docs).
    fn step(&self, step: MoeStep<'_, '_>, x: &[f32], n: usize, out: &mut [f32]) -> Result<()> {
        let w = &step.moe.weights;
        let (l, d) = (step.index, w.router.cols());
        let out = step_output(&step, x, n, out)?;
        if n == 0 {
            return Ok(());
        }
        let mut guard = self.lock();
        let st = &mut *guard;
        st.counters.steps += 1;
        Self::route_step(st, &step, x, n)?;
        let k = step.moe.block.n_used.min(w.n_experts());
        self.score(st, l, (w.n_experts(), k), n, true);
        // Predictions still waiting for their turn were for this layer or an older one: this
        // layer's own misses come first.
        st.pending.clear();
        let needed: Vec<usize> = st.s.groups.iter().map(|(e, _, _)| e).collect();
        let mut have: Vec<Option<Arc<AlignedBuf>>> = vec![None; needed.len()];
        for (i, &e) in needed.iter().enumerate() {
            st.counters.lookups += 1;
            if st.tracing {
                st.trace[l].push(e as u32);
                st.trace_all.push(id(l, e));
            }
            have[i] = st.cache.get(id(l, e));
            if have[i].is_some() {
                st.counters.hits += 1;
            } else if st.in_flight.contains(&tag(l, e)) {
                st.counters.ahead += 1;
            } else {
                self.submit(st, l, e, false)?;
            }
        }
        self.predict_next(st, &step, x, n)?;
        if st.s.outs.len() < needed.len() {
            st.s.outs.resize_with(needed.len(), Vec::new);
        }
        let mut done = vec![false; needed.len()];
        let mut left = needed.len();
        // Cached experts first, while the reads are in flight; then the others as they arrive.
        for i in 0..needed.len() {
            if let Some(b) = have[i].take() {
                self.expert(st, &step, i, &b, x)?;
                done[i] = true;
                left -= 1;
            }
        }
        while left > 0 {
            let (rl, re, b) = self.receive(st)?;
            let Some(i) = needed
                .iter()
                .position(|&e| e == re)
                .filter(|&i| rl == l && !done[i])
            else {
                continue;
            };
            self.expert(st, &step, i, &b, x)?;
            done[i] = true;
            left -= 1;
        }
        // The sum, in the in-memory block's order.
        for (i, (_, tokens, weights)) in st.s.groups.iter().enumerate() {
            let ys = &st.s.outs[i];
            for (j, (&t, &wt)) in tokens.iter().zip(weights).enumerate() {
                let t = t as usize;
                kernels_neon::axpy_f32(wt, &ys[j * d..(j + 1) * d], &mut out[t * d..(t + 1) * d]);
            }
        }
        self.shared(st, &step, x, n, out)
    }

    /// Computes the `i`-th selected expert of the step from its blob `b` into `st.s.outs[i]`.
    fn expert(
        &self,
        st: &mut State,
        step: &MoeStep<'_, '_>,
        i: usize,
        b: &[u8],
        x: &[f32],
    ) -> Result<()> {
        let l = step.index;
        let d = step.moe.weights.router.cols();
        let s = &mut st.s;
        let (e, tokens, _) = s.groups.iter().nth(i).expect("the step's i-th expert");
        let mm = tokens.len();
        let xs = grow(&mut s.xs, mm * d);
        for (j, &t) in tokens.iter().enumerate() {
            let t = t as usize;
            xs[j * d..(j + 1) * d].copy_from_slice(&x[t * d..(t + 1) * d]);
        }
        let kind = if mm == 1 { StepKind::Decode } else { step.kind };
        self.store.compute(
            &step.moe.block,
            (l, e),
            b,
            &s.xs[..mm * d],
            mm,
            (step.precision, kind),
            (&mut s.g, &mut s.u, &mut s.outs[i]),
            &mut s.rows,
        )
    }

    /// Adds the shared expert's output (as the in-memory block does).
    fn shared(
        &self,
        st: &mut State,
        step: &MoeStep<'_, '_>,
        x: &[f32],
        n: usize,
        out: &mut [f32],
    ) -> Result<()> {
        let Some(sh) = &step.moe.weights.shared else {
            return Ok(());
        };
        let d = step.moe.weights.router.cols();
        let s = &mut st.s;
        if s.outs.is_empty() {
            s.outs.push(Vec::new());
        }
        let ys = &mut s.outs[0];
        step.moe.block.gated(
            &sh.ffn,
            &x[..n * d],
            n,
            step.precision,
            step.kind,
            &mut s.g,
            &mut s.u,
            ys,
        )?;
        for t in 0..n {
            let xt = &x[t * d..(t + 1) * d];
            let scale = match &sh.gate_inp {
                Some(gi) => 1.0 / (1.0 + (-kernels_neon::dot_f32(gi, xt)).exp()),
                None => 1.0,
            };
            kernels_neon::axpy_f32(scale, &ys[t * d..(t + 1) * d], &mut out[t * d..(t + 1) * d]);
        }
        Ok(())
    }
}

experts_only_executor!(ExpertOffload, |s, step, x, n, out| s.step(step, x, n, out));

/// The first `n × d` floats of `out`, zeroed, once `x` and `out` are checked to hold `n` tokens
/// of the step's width `d` (a step of the run or of a draft).
fn step_output<'o>(
    step: &MoeStep<'_, '_>,
    x: &[f32],
    n: usize,
    out: &'o mut [f32],
) -> Result<&'o mut [f32]> {
    let d = step.moe.weights.router.cols();
    if x.len() < n * d || out.len() < n * d {
        return Err(OffloadError::Request(format!(
            "moe step: {n} tokens of {d} need {} floats in and out",
            n * d
        )));
    }
    let out = &mut out[..n * d];
    out.fill(0.0);
    Ok(out)
}

fn dense_layer(index: usize) -> OffloadError {
    OffloadError::Request(format!(
        "layer {index} is a dense FFN layer in a bundle of experts: not supported"
    ))
}
