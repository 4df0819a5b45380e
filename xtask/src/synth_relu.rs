//! The ReLU experts of `cargo xtask synth-model --arch qwen3moe|mixtral|olmoe --activation relu`
//! (TurboSparse-Mixtral's kind of model): every expert computes `down(relu(gate·x) * (up·x))` and
//! its neurons fire with planted, power-law propensities, as the dense ReLU synthetic's do
//! (`synth.rs`, whose law and Zipf propensities are reused: mean [`DENSITY`], 90% of an expert's
//! neurons inactive per token, `zipf_propensities` over a random permutation of each expert's
//! neurons, exponent [`ALPHA`]).
//!
//! How the weights realise it. The MoE generator's FFN input `x` (after the norm) carries
//! `u·x = ux_ffn` along the direction every embedding carries, the context channel `C` (the first
//! coordinates, written by attention only) and the tokens' noise off `u` and `C`, of variance
//! `v` per coordinate (`synth_routing::LayerPlan`, `x_off · d / (d - |C| - 1)`). Neuron `j`'s gate
//! row is `r_j + t_j·u` with `r_j` a random unit vector off `u` and `C`, so that
//! `gate_j·x ~ √v·(Z + z_j)`, `Z ~ N(0, 1)`: `t_j = √v·z_j / ux_ffn` with `z_j = Φ⁻¹(p_j)` makes
//! `P(gate_j·x > 0) = p_j`. The gate sees nothing of `C`, so whether a neuron fires does not depend on
//! the context (the routers read `C`; each expert's neurons follow their own law whichever tokens it
//! gets). `ffn_down` is scaled from the `z_j` so that one expert adds `EPS_FFN` per coordinate, as
//! the SiLU experts do: `E[relu(g)²·(up·x)²] = v·M(z)·(1 - ux²/d)`, `M(z) = (z²+1)Φ(z) + zφ(z)`.
//!
//! `xtask/tests/it/synth_relu.rs` checks the planted density and concentration in layer 0's gate
//! pre-activations from the file's dequantized weights, and that the engine runs the experts as ReLU.

use super::synth::math::{phi_cdf, phi_inv, phi_pdf};
use super::synth::{zipf_propensities, Rng};
use super::synth_moe::{Options, EPS_FFN};
use super::synth_routing::{ctx_dims, LayerPlan};

/// Mean firing propensity of an expert's neurons (the dense synthetic's, `synth::DENSITY`).
pub const DENSITY: f64 = super::synth::DENSITY;
/// Zipf exponent of the propensities (the dense synthetic's default).
pub const ALPHA: f64 = 1.0;

/// One expert's planted neurons.
#[derive(Debug, Clone, PartialEq)]
pub struct ExpertPlan {
    /// Firing propensity of each neuron.
    pub p: Vec<f64>,
    /// Each gate row's component along `u` (`t_j`).
    pub gate_u: Vec<f32>,
    /// Standard deviation of the expert's `ffn_down` entries off `C`.
    pub sigma_down: f32,
}

/// What the gate and down rows of a layer's ReLU experts need from the layer's plan.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Input {
    /// Model width.
    pub d: usize,
    /// Coordinates of the context channel.
    pub ctx: usize,
    /// `u · x` at the FFN input.
    pub ux: f64,
    /// Variance of the FFN input off `u` and `C`, averaged over the whole width.
    pub x_off: f64,
    /// Per-coordinate standard deviation one expert adds.
    pub eps_ffn: f64,
}

impl Input {
    /// Variance of the input per coordinate off `u` and `C` (where the gate rows' `r_j` lie).
    fn v(&self) -> f64 {
        self.x_off * self.d as f64 / (self.d - self.ctx - 1).max(1) as f64
    }
}

/// The propensities of `ff` neurons: the Zipf law over a random permutation drawn from `rng`.
pub fn propensities(ff: usize, rng: &mut Rng) -> Vec<f64> {
    let by_rank = zipf_propensities(ff, ALPHA);
    let mut perm: Vec<usize> = (0..ff).collect();
    for i in (1..ff).rev() {
        perm.swap(i, rng.below(i + 1));
    }
    let mut p = vec![0.0; ff];
    for (rank, &neuron) in perm.iter().enumerate() {
        p[neuron] = by_rank[rank];
    }
    p
}

/// The plan of one expert whose neurons fire with propensities `p`, for the layer input `x`.
pub fn expert_plan(p: Vec<f64>, x: &Input) -> ExpertPlan {
    let v = x.v();
    let z: Vec<f64> = p.iter().map(|&p| phi_inv(p)).collect();
    let gate_u = z
        .iter()
        .map(|z| (v.sqrt() * z / x.ux.max(1e-6)) as f32)
        .collect();
    let var_up = (1.0 - x.ux * x.ux / x.d as f64).max(1e-6);
    let m: f64 = z
        .iter()
        .map(|&z| ((z * z + 1.0) * phi_cdf(z) + z * phi_pdf(z)).max(0.0))
        .sum();
    let second = (v * var_up * m).max(1e-12);
    ExpertPlan {
        p,
        gate_u,
        sigma_down: (x.eps_ffn / second.sqrt()) as f32,
    }
}

/// Gate row of neuron `j` of the expert `e`: `out` holds a random row (any scale, drawn by the
/// caller); it becomes `r_j + t_j·u` (`r_j` the row off `u` and `C`, unit norm).
pub fn gate_row(e: &ExpertPlan, j: usize, ctx: usize, u: &[f32], out: &mut [f32]) {
    out[..ctx].fill(0.0);
    super::synth::project_out(out, u);
    let norm = out
        .iter()
        .map(|x| x * x)
        .sum::<f32>()
        .sqrt()
        .max(f32::MIN_POSITIVE);
    let t = e.gate_u[j];
    out.iter_mut()
        .zip(u)
        .for_each(|(x, u)| *x = *x / norm + t * u);
}

/// The planted neurons of every expert of a layer of `o` whose plan is `plan`, expert `e`'s
/// permutation drawn from `rng(e)`.
pub fn plans(o: &Options, plan: &LayerPlan, rng: impl Fn(usize) -> Rng) -> Vec<ExpertPlan> {
    let x = Input {
        d: o.d,
        ctx: ctx_dims(o.d),
        ux: plan.ux_ffn as f64,
        x_off: plan.x_off as f64,
        eps_ffn: EPS_FFN as f64,
    };
    (0..o.experts)
        .map(|e| expert_plan(propensities(o.expert_ff, &mut rng(e)), &x))
        .collect()
}
