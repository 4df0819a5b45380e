//! [`MoeBlock`]: a Mixture-of-Experts FFN step over `n` tokens. The router's logits for every token
//! (one product), each token's top-k experts ([`route`]), the tokens grouped by expert
//! ([`ExpertGroups`]) so each selected expert's rows are read once for all its tokens, then every
//! selected expert and the shared expert (every token, scaled by `sigmoid(gate_inp · x)` when it
//! has a gate) in one call of [`kernels_neon::experts_ffn`]: two parallel regions a layer, work
//! split by (expert, row chunk), not one fork and join per expert and matrix; each token's outputs
//! summed in the experts' order, the shared expert last.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use kernels_neon::{Activation, ExpertCopies, ExpertJob, ExpertsScratch, Precision, Q40x8};

use super::copies::PackedExperts;
use super::family::{MoeConfig, TopKNorm};
use super::routing::{route, ExpertGroups, Route};
use super::weights::{ExpertFfn, MoeLayer, SharedExpert};
use crate::error::{kernel, ModelError, Result};
use crate::ops::{mm_step, StepKind};

/// How a family's MoE FFN computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoeBlock {
    /// Experts each token uses.
    pub n_used: usize,
    /// Normalisation of the selected weights.
    pub norm: TopKNorm,
    /// Activation of every expert (SiLU in the four families; ReLU for TurboSparse-style files).
    pub activation: Activation,
}

/// Buffers of a step, kept between layers; after [`MoeBlock::forward`], [`routes`](Self::routes)
/// holds the step's routing.
#[derive(Debug, Default)]
pub struct MoeScratch {
    logits: Vec<f32>,
    probs: Vec<f32>,
    token_routes: Vec<Route>,
    routes: Vec<Route>,
    groups: ExpertGroups,
    all_tokens: Vec<u32>,
    shared_w: Vec<f32>,
    experts: ExpertsScratch,
}

impl MoeScratch {
    /// The routes of the last step: `n_used` per token, token-major, in decreasing weight order.
    pub fn routes(&self) -> &[Route] {
        &self.routes
    }

    /// The last step's routes grouped by expert.
    pub fn groups(&self) -> &ExpertGroups {
        &self.groups
    }
}

/// Live [`RouteTrace`]s; while there is none, a block records nothing (one relaxed load a step).
static TRACERS: AtomicUsize = AtomicUsize::new(0);
/// The steps recorded while a [`RouteTrace`] is alive.
static TRACE: Mutex<Vec<TracedStep>> = Mutex::new(Vec::new());

/// One MoE block step as a [`RouteTrace`] records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TracedStep {
    /// The address of the layer's router weights: names the layer of a loaded model (see
    /// [`RouteTrace::steps_of`]).
    pub router: usize,
    /// Experts each token selected.
    pub k: usize,
    /// The selected experts, `k` per token, token-major, in decreasing weight order.
    pub experts: Vec<u32>,
}

/// Records the experts every MoE block selects while it is alive: the routing a model actually
/// realises, for diagnostics and for the tests of the synthetic models' routing statistics. Steps
/// of every model in the process are recorded (tests run side by side); [`RouteTrace::steps_of`]
/// picks one layer's by its router.
#[derive(Debug)]
pub struct RouteTrace(());

impl RouteTrace {
    /// Starts recording (the record is shared by every live trace).
    pub fn start() -> RouteTrace {
        TRACERS.fetch_add(1, Ordering::SeqCst);
        RouteTrace(())
    }

    /// The steps recorded so far whose router weights start at `router` (a layer's
    /// `MoeLayer::router` data), in the order they ran; removed from the record.
    pub fn steps_of(&self, router: *const u8) -> Vec<TracedStep> {
        let mut all = TRACE.lock().unwrap_or_else(|e| e.into_inner());
        let (mine, rest) = all.drain(..).partition(|s| s.router == router as usize);
        *all = rest;
        mine
    }
}

impl Drop for RouteTrace {
    fn drop(&mut self) {
        if TRACERS.fetch_sub(1, Ordering::SeqCst) == 1 {
            TRACE.lock().unwrap_or_else(|e| e.into_inner()).clear();
        }
    }
}

fn record(router: *const u8, k: usize, routes: &[Route]) {
    if TRACERS.load(Ordering::Relaxed) == 0 {
        return;
    }
    let step = TracedStep {
        router: router as usize,
        k,
        experts: routes.iter().map(|r| r.expert).collect(),
    };
    TRACE.lock().unwrap_or_else(|e| e.into_inner()).push(step);
}

fn grow(v: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if v.len() < len {
        v.resize(len, 0.0);
    }
    &mut v[..len]
}

impl MoeBlock {
    /// The block of a model with MoE hyper-parameters `cfg` (its family's normalisation, SiLU).
    pub fn for_config(cfg: &MoeConfig) -> MoeBlock {
        MoeBlock {
            n_used: cfg.n_used,
            norm: cfg.family.top_k_norm(),
            activation: Activation::Silu,
        }
    }

    /// `out` (`n × d`) = the layer's MoE FFN of `x` (`n × d`, token-major, already normed).
    /// `kind` says how the tokens relate, as for the dense FFN: with [`StepKind::Decode`] every
    /// token is computed as a one-token step would, bit for bit.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        w: &MoeLayer<'_>,
        x: &[f32],
        n: usize,
        out: &mut [f32],
        precision: Precision,
        kind: StepKind,
        s: &mut MoeScratch,
    ) -> Result<()> {
        self.forward_over(w, None, x, n, out, precision, kind, s)
    }

    /// [`MoeBlock::forward`], the products that run the decode kernels (one token, a decode step,
    /// a `Fast` prompt's small groups) over the experts' copies `packed` where given: the same
    /// bits ([`kernels_neon::ExpertJob::copies`]).
    #[allow(clippy::too_many_arguments)]
    pub fn forward_over(
        &self,
        w: &MoeLayer<'_>,
        packed: Option<&PackedExperts>,
        x: &[f32],
        n: usize,
        out: &mut [f32],
        precision: Precision,
        kind: StepKind,
        s: &mut MoeScratch,
    ) -> Result<()> {
        let d = w.router.cols();
        check_lens(d, x, n, out)?;
        if n == 0 {
            s.routes.clear();
            return Ok(());
        }
        self.route_step(w, x, n, precision, kind, s)?;
        let out = &mut out[..n * d];
        out.fill(0.0);
        let mut jobs: Vec<ExpertJob<'_>> = s
            .groups
            .iter()
            .map(|(e, tokens, weights)| {
                let copies = packed.map(|p| &p.experts[e]);
                job(&w.experts[e], copies, tokens, weights)
            })
            .collect();
        if let Some(sh) = &w.shared {
            // The shared expert is the last job: every token, weighted by its gate.
            s.all_tokens.clear();
            s.all_tokens.extend(0..n as u32);
            s.shared_w.clear();
            s.shared_w
                .extend((0..n).map(|t| shared_weight(sh, &x[t * d..(t + 1) * d])));
            let copies = packed.and_then(|p| p.shared.as_ref());
            jobs.push(job(&sh.ffn, copies, &s.all_tokens, &s.shared_w));
        }
        let mut note = |j: usize, g: &[f32]| {
            let f = &jobs[j];
            super::neurons::note(f.gate.data().as_ptr(), f.tokens.len(), f.gate.rows(), g);
        };
        kernels_neon::experts_ffn(
            &jobs,
            self.activation,
            &x[..n * d],
            n,
            out,
            precision,
            kind == StepKind::Decode,
            &mut s.experts,
            &mut note,
        )
        .map_err(kernel("moe experts"))
    }

    /// The routing of a step's `n` tokens: the router's logits, each token's top-k
    /// ([`MoeScratch::routes`]) and the tokens grouped by expert ([`MoeScratch::groups`]) (`x`
    /// checked by [`check_lens`]); an error when the experts are in a store.
    pub(super) fn route_step(
        &self,
        w: &MoeLayer<'_>,
        x: &[f32],
        n: usize,
        precision: Precision,
        kind: StepKind,
        s: &mut MoeScratch,
    ) -> Result<()> {
        let (e, d) = (w.n_experts(), w.router.cols());
        s.routes.clear();
        if w.experts.len() != e {
            return Err(ModelError::Request(format!(
                "moe block: the {e} experts are in an expert store: load the bundle with its store"
            )));
        }
        let k = self.n_used.min(e);
        let logits = grow(&mut s.logits, n * e);
        mm_step(
            kind,
            &w.router,
            &x[..n * d],
            n,
            logits,
            precision,
            "moe router",
        )?;
        for t in 0..n {
            let row = &s.logits[t * e..(t + 1) * e];
            route(row, k, self.norm, &mut s.probs, &mut s.token_routes);
            s.routes.extend_from_slice(&s.token_routes);
        }
        record(w.router.data().as_ptr(), k, &s.routes);
        s.groups.build(&s.routes, k, e);
        Ok(())
    }

    /// `ys` (`m × d`) = `down(act(gate · x) * (up · x))` for the `m` tokens of `xs`.
    #[allow(clippy::too_many_arguments)]
    pub fn gated(
        &self,
        f: &ExpertFfn<'_>,
        xs: &[f32],
        m: usize,
        precision: Precision,
        kind: StepKind,
        g: &mut Vec<f32>,
        u: &mut Vec<f32>,
        ys: &mut Vec<f32>,
    ) -> Result<()> {
        let (ff, d) = (f.gate.rows(), f.down.rows());
        let g = grow(g, m * ff);
        if kind == StepKind::Decode {
            kernels_neon::matvec_gated(&f.gate, &f.up, self.activation, xs, m, g, precision)
                .map_err(kernel("moe expert gate/up"))?;
        } else {
            let u = grow(u, m * ff);
            mm_step(kind, &f.gate, xs, m, g, precision, "moe expert gate")?;
            mm_step(kind, &f.up, xs, m, u, precision, "moe expert up")?;
            match self.activation {
                Activation::Silu => kernels_neon::silu_mul_inplace(g, u),
                Activation::Relu => kernels_neon::relu_mul_inplace(g, u),
                Activation::GeluTanh => kernels_neon::gelu_mul_inplace(g, u),
            }
        }
        super::neurons::note(f.gate.data().as_ptr(), m, ff, g);
        mm_step(
            kind,
            &f.down,
            g,
            m,
            grow(ys, m * d),
            precision,
            "moe expert down",
        )
    }
}

/// The job of expert `f` (with its copies, where made) over `tokens`, weighted by `weights`.
fn job<'a>(
    f: &'a ExpertFfn<'a>,
    copies: Option<&'a [Q40x8; 3]>,
    tokens: &'a [u32],
    weights: &'a [f32],
) -> ExpertJob<'a> {
    ExpertJob {
        gate: &f.gate,
        up: &f.up,
        down: &f.down,
        tokens,
        weights,
        copies: copies.map(|[gate, up, down]| ExpertCopies { gate, up, down }),
    }
}

/// Errors unless `x` and `out` hold `n` tokens of `d` floats.
pub(super) fn check_lens(d: usize, x: &[f32], n: usize, out: &[f32]) -> Result<()> {
    if x.len() < n * d || out.len() < n * d {
        return Err(ModelError::Request(format!(
            "moe block: {n} tokens of {d} need {} floats in and out, got {} and {}",
            n * d,
            x.len(),
            out.len()
        )));
    }
    Ok(())
}

/// The weight of the shared expert `sh`'s output for the token `x`: `sigmoid(gate_inp · x)`, 1
/// without a gate.
pub(super) fn shared_weight(sh: &SharedExpert<'_>, x: &[f32]) -> f32 {
    match &sh.gate_inp {
        Some(gi) => sigmoid(kernels_neon::dot_f32(gi, x)),
        None => 1.0,
    }
}

fn sigmoid(v: f32) -> f32 {
    1.0 / (1.0 + (-v).exp())
}
