//! The routing of the synthetic Mixture-of-Experts models (`synth-model --arch ... --router`): the
//! law their routers follow, the statistics it is fitted to (cited in docs/benchmarks/moe.md), and
//! the weights that make a model's forward pass realise it.
//!
//! # The law
//!
//! Expert `e`'s router logit for the token at position `t` is `ln q_e + σ·z_{t,e}`: `q` is a Zipf
//! law `q ∝ rank^-α` over a random permutation of each layer's experts (mean 1), and `z_{·,e}` a
//! stationary Gaussian process of unit variance whose correlation between consecutive tokens is `ρ`
//! (independent across experts); each token takes the `k` largest logits. `α` sets how uneven the
//! load is, `ρ` how often a token reuses its predecessor's experts beyond what the skew alone gives.
//! [`law`] holds the values; [`simulate`] draws a trace from the law itself (an AR(1) process) and
//! [`measure`] reads the two statistics the values were fitted to off any trace, the law's or a
//! model's:
//!
//! * **repeat**: the share of a token's `k` selections that the previous token also selected;
//!   Qwen3-30B-A3B: 45% ("45 % of selections repeat at the very next token", three prompts of 512
//!   tokens, github.com/kekzl/imp/pull/1359), chance `k/E` = 6.25%;
//! * **top share**: the share of all selections that the busiest fraction `f` of a layer's experts
//!   take, pooled over prompts; Qwen3-30B-A3B: a resident set of 40% of the experts chosen on other
//!   prompts covers 67.6% to 72.6% of a held-out prompt's selections (github.com/kekzl/imp/pull/1358);
//!   OLMoE-1B-7B: the busiest quartile takes 0.413 to 0.668 of a training step's selections
//!   (github.com/MakazhanAlpamys/Soup/pull/992).
//!
//! `--router measured` fits `α` to those shares (Qwen3's 0.70 at `f` = 0.4 for qwen3moe, and for
//! mixtral and qwen2moe, which have no cited figure; OLMoE's midpoint 0.54 at `f` = 0.25 for olmoe)
//! and `ρ` to Qwen3's 45% given its `α` (the same `ρ` for every family: no other family's figure was
//! found). `--router uniform` is `α = 0`, `ρ = 0`: even load, chance reuse.
//!
//! # The realisation
//!
//! Routers are weights, so the law must arise from the hidden states. The first [`ctx_dims`]
//! coordinates of the residual stream are a *context channel* `C`: no embedding, expert or shared
//! expert writes there, and only attention does. Every attention head is planted with the same
//! token-independent query and key ([`Kernel`]): the query and key rows read only the shared
//! direction `u`, which every token carries with the same weight, so the scores depend only on the
//! distance between positions, through RoPE, and every head averages its values over the last few
//! tokens with weights that fall with distance. The value rows read the tokens' own noise (not `u`,
//! not `C`) and the output rows write the averages into `C` only. `C` is then a moving average of the
//! tokens' noise whose correlation between consecutive positions is the kernel's (`ρ`, by
//! construction of the kernel), and the measured router reads `C` (scaled so a logit's spread is
//! `σ`) plus `ln q_e` along `u`. The uniform router reads the token's noise outside `C` instead.
//! [`LayerPlan`] holds the scales, from the expected energy of the residual stream per layer.

use super::synth::Rng;
use super::synth_moe::{Arch, Options, Router};

/// The law's parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Law {
    /// Zipf exponent of the load.
    pub alpha: f64,
    /// Correlation of a logit between consecutive tokens.
    pub rho: f64,
    /// Standard deviation of the time-varying part of a logit.
    pub sigma: f64,
}

/// `σ` of every law.
pub const SIGMA: f64 = 1.0;
/// `ρ` of `--router measured`: fitted to Qwen3-30B-A3B's 45% repeat with [`ALPHA_QWEN3`].
pub const RHO: f64 = 0.68;
/// `α` fitted to Qwen3-30B-A3B's top-40% share (0.70).
pub const ALPHA_QWEN3: f64 = 0.39;
/// `α` fitted to OLMoE-1B-7B's busiest-quartile share (0.54, the midpoint of 0.413..0.668).
pub const ALPHA_OLMOE: f64 = 0.45;

/// The cited target a family's law is fitted to: (fraction `f` of experts, their share of the
/// selections), and the repeat rate.
pub fn targets(arch: Arch) -> ((f64, f64), f64) {
    match arch {
        Arch::Olmoe => ((0.25, 0.54), 0.45),
        _ => ((0.40, 0.70), 0.45),
    }
}

/// The law of `arch` under `router`.
pub fn law(arch: Arch, router: Router) -> Law {
    match router {
        Router::Uniform => Law {
            alpha: 0.0,
            rho: 0.0,
            sigma: SIGMA,
        },
        Router::Measured => Law {
            alpha: if arch == Arch::Olmoe {
                ALPHA_OLMOE
            } else {
                ALPHA_QWEN3
            },
            rho: RHO,
            sigma: SIGMA,
        },
    }
}

/// The Zipf load `q` (mean 1) of `experts` experts with exponent `alpha`, ranks over a random
/// permutation drawn from `r`.
pub fn zipf_load(experts: usize, alpha: f64, r: &mut Rng) -> Vec<f64> {
    let by_rank: Vec<f64> = (1..=experts).map(|k| (k as f64).powf(-alpha)).collect();
    let mean = by_rank.iter().sum::<f64>() / experts as f64;
    let mut perm: Vec<usize> = (0..experts).collect();
    for i in (1..experts).rev() {
        perm.swap(i, r.below(i + 1));
    }
    let mut q = vec![0.0; experts];
    for (rank, &e) in perm.iter().enumerate() {
        q[e] = by_rank[rank] / mean;
    }
    q
}

/// A standard normal number (Box-Muller).
fn gauss(r: &mut Rng) -> f64 {
    let u = |r: &mut Rng| ((r.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    let (a, b) = (u(r), u(r));
    (-2.0 * a.ln()).sqrt() * (std::f64::consts::TAU * b).cos()
}

/// The `k` largest of `logits` (ties to the lower index).
pub fn top_k(logits: &[f64], k: usize) -> Vec<u32> {
    let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
    idx.sort_by(|&a, &b| {
        logits[b as usize]
            .total_cmp(&logits[a as usize])
            .then(a.cmp(&b))
    });
    idx.truncate(k);
    idx
}

/// Traces drawn from `law` for one layer of `experts` experts, `k` per token: `windows` windows of
/// `tokens` tokens (each window a fresh prompt), each token's selected experts.
pub fn simulate(
    law: Law,
    (experts, k): (usize, usize),
    (windows, tokens): (usize, usize),
    seed: u64,
) -> Vec<Vec<Vec<u32>>> {
    let mut r = Rng::new(seed, 0x7A0);
    let bias: Vec<f64> = zipf_load(experts, law.alpha, &mut r)
        .iter()
        .map(|q| q.ln())
        .collect();
    let innovation = (1.0 - law.rho * law.rho).sqrt();
    (0..windows)
        .map(|_| {
            let mut z: Vec<f64> = (0..experts).map(|_| gauss(&mut r)).collect();
            (0..tokens)
                .map(|t| {
                    if t > 0 {
                        z.iter_mut()
                            .for_each(|z| *z = law.rho * *z + innovation * gauss(&mut r));
                    }
                    let logits: Vec<f64> = bias
                        .iter()
                        .zip(&z)
                        .map(|(b, z)| b + law.sigma * z)
                        .collect();
                    top_k(&logits, k)
                })
                .collect()
        })
        .collect()
}

/// The statistics of a trace.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RoutingStats {
    /// Share of a token's selections its predecessor (same window) also made.
    pub repeat: f64,
    /// `k / E`: what `repeat` is without skew or locality.
    pub chance: f64,
    /// Share of all selections taken by the busiest quarter of the experts.
    pub top25: f64,
    /// Share taken by the busiest 40%.
    pub top40: f64,
}

impl RoutingStats {
    /// The share of the busiest fraction `f` (0.25 or 0.4).
    pub fn top(&self, f: f64) -> f64 {
        if f < 0.3 {
            self.top25
        } else {
            self.top40
        }
    }
}

/// [`RoutingStats`] of `windows` (each a sequence of tokens' selections) over `experts` experts.
pub fn measure(windows: &[Vec<Vec<u32>>], experts: usize) -> RoutingStats {
    let mut counts = vec![0usize; experts];
    let (mut same, mut pairs, mut k) = (0usize, 0usize, 0usize);
    for w in windows {
        for (t, sel) in w.iter().enumerate() {
            k = sel.len();
            sel.iter().for_each(|&e| counts[e as usize] += 1);
            if t > 0 {
                same += sel.iter().filter(|e| w[t - 1].contains(e)).count();
                pairs += sel.len();
            }
        }
    }
    let total = counts.iter().sum::<usize>().max(1) as f64;
    counts.sort_unstable_by(|a, b| b.cmp(a));
    let top = |f: f64| {
        let n = ((f * experts as f64).round() as usize).max(1);
        counts[..n].iter().sum::<usize>() as f64 / total
    };
    RoutingStats {
        repeat: same as f64 / pairs.max(1) as f64,
        chance: k as f64 / experts as f64,
        top25: top(0.25),
        top40: top(0.4),
    }
}

/// Width of the context channel `C` of a model of width `d`.
pub fn ctx_dims(d: usize) -> usize {
    (d / 4).min(128)
}

/// Variance of a `C` coordinate (before the norm) at the last layer's FFN input; each layer's
/// attention adds `1/layers` of it.
pub const CTX_VAR: f64 = 1.0;
/// RoPE frequencies below this carry none of the planted query (they would make far positions
/// score as high as near ones).
pub const THETA_MIN: f64 = 0.03;
/// Positions over which the planted kernel is computed (its weight beyond a few dozen is nil).
const SPAN: usize = 2048;

/// The planted attention of every head: the share `pairs[i]` of the query's (and key's) squared
/// norm on RoPE pair `i` (`∝ 1/θ_i` above [`THETA_MIN`]) and the peak score `sharpness`, so that the
/// score at distance `Δ` is `sharpness · Σ pairs[i]·cos(Δ·θ_i)`.
#[derive(Debug, Clone, PartialEq)]
pub struct Kernel {
    /// Share of the squared norm per RoPE pair.
    pub pairs: Vec<f64>,
    /// Peak score.
    pub sharpness: f64,
    /// `Σ w(Δ)²` of the attention weights far from the start: an average's variance per unit of
    /// the values' variance.
    pub sum_w2: f64,
    /// Correlation of the averages at consecutive positions.
    pub lag1: f64,
}

fn thetas(head_dim: usize, base: f64) -> Vec<f64> {
    (0..head_dim / 2)
        .map(|i| base.powf(-2.0 * i as f64 / head_dim as f64))
        .collect()
}

/// The attention weights `w(Δ)` (`Δ` = 0..[`SPAN`]) of the kernel `pairs` at `sharpness`.
fn weights(pairs: &[f64], th: &[f64], sharpness: f64) -> Vec<f64> {
    let score: Vec<f64> = (0..SPAN)
        .map(|d| {
            sharpness
                * pairs
                    .iter()
                    .zip(th)
                    .map(|(p, t)| p * (d as f64 * t).cos())
                    .sum::<f64>()
        })
        .collect();
    let max = score.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let w: Vec<f64> = score.iter().map(|s| (s - max).exp()).collect();
    let z: f64 = w.iter().sum();
    w.iter().map(|x| x / z).collect()
}

/// The kernel for heads of `head_dim` at RoPE base `base` whose averages correlate `lag1` between
/// consecutive positions (bisection on the sharpness; the correlation falls as it grows).
pub fn kernel(head_dim: usize, base: f64, lag1: f64) -> Kernel {
    let th = thetas(head_dim, base);
    let raw: Vec<f64> = th
        .iter()
        .map(|&t| if t >= THETA_MIN { 1.0 / t } else { 0.0 })
        .collect();
    let z: f64 = raw.iter().sum();
    let pairs: Vec<f64> = raw.iter().map(|p| p / z).collect();
    let stats = |s: f64| {
        let w = weights(&pairs, &th, s);
        let s2: f64 = w.iter().map(|x| x * x).sum();
        let l1 = w.windows(2).map(|p| p[0] * p[1]).sum::<f64>() / s2;
        (s2, l1)
    };
    let (mut lo, mut hi) = (1.0f64, 1000.0f64);
    for _ in 0..60 {
        let mid = (lo * hi).sqrt();
        if stats(mid).1 > lag1 {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let sharpness = (lo * hi).sqrt();
    let (sum_w2, lag1) = stats(sharpness);
    Kernel {
        pairs,
        sharpness,
        sum_w2,
        lag1,
    }
}

impl Kernel {
    /// The planted query (and key) of one head after the q/k norm: `head_dim` values whose squares
    /// are `pairs` times `head_dim · sharpness / √head_dim`, on the first element of each RoPE pair
    /// (`i` with `half_split`, llama.cpp's NEOX rotation, else `2i`).
    pub fn head_vector(&self, head_dim: usize, half_split: bool) -> Vec<f32> {
        let scale = self.sharpness / (head_dim as f64).sqrt();
        let mut v = vec![0.0f32; head_dim];
        for (i, p) in self.pairs.iter().enumerate() {
            let at = if half_split { i } else { 2 * i };
            v[at] = (p * head_dim as f64 * scale).sqrt() as f32;
        }
        v
    }

    /// The constant of a q/k norm weight that turns a head vector of RMS 1 into [`head_vector`].
    ///
    /// [`head_vector`]: Kernel::head_vector
    pub fn norm_weight(&self, head_dim: usize) -> f32 {
        (self.sharpness / (head_dim as f64).sqrt()).sqrt() as f32
    }
}

/// The scales of one layer's planted weights, from the expected energy of the residual stream.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerPlan {
    /// `u · x` at the attention input (after its norm).
    pub ux_attn: f32,
    /// `u · x` at the FFN input.
    pub ux_ffn: f32,
    /// Standard deviation of an `attn_output` entry on `C`.
    pub o_scale: f32,
    /// Standard deviation of a measured router entry on `C`.
    pub router_ctx: f32,
    /// Standard deviation of a uniform router entry off `C`.
    pub router_noise: f32,
    /// Variance of the FFN input off `u` and `C`, per coordinate of the whole width (its
    /// squared norm there over `d`).
    pub x_off: f32,
}

/// The plan of `layer` of `o` with the kernel `k` (`eps_ffn`: what an FFN block adds per
/// coordinate off `C`, standard deviation).
pub fn layer_plan(o: &Options, k: &Kernel, layer: usize, eps_ffn: f64) -> LayerPlan {
    let (d, m, layers) = (o.d as f64, ctx_dims(o.d) as f64, o.layers as f64);
    let l = layer as f64;
    // Per coordinate, averaged over all d: `u` (√d along a unit vector), the tokens' noise (unit
    // variance off `u` and `C`), what the FFN blocks before this layer added off `C`, the context.
    let off = (d - m - 1.0) / d;
    let ffn = eps_ffn * eps_ffn * l * (d - m) / d;
    let ctx = |layers_in: f64| m / d * CTX_VAR * layers_in / layers;
    let rms2_attn = (1.0 + off + ffn + ctx(l)).max(1e-6);
    let rms2_ffn = (1.0 + off + ffn + ctx(l + 1.0)).max(1e-6);
    // A value entry reads the noise off `u` and `C` through a row of variance 1/d per entry.
    let var_v = (off + ffn) / rms2_attn;
    let o_var = CTX_VAR / (layers * k.sum_w2 * var_v);
    let x_ctx_var = CTX_VAR * (l + 1.0) / layers / rms2_ffn;
    let x_off_var = (off + ffn) / rms2_ffn;
    LayerPlan {
        ux_attn: (d / rms2_attn).sqrt() as f32,
        ux_ffn: (d / rms2_ffn).sqrt() as f32,
        o_scale: (o_var / o.q_dim() as f64).sqrt() as f32,
        router_ctx: (SIGMA * SIGMA / (m * x_ctx_var)).sqrt() as f32,
        router_noise: (SIGMA * SIGMA / (d * x_off_var)).sqrt() as f32,
        x_off: x_off_var as f32,
    }
}
