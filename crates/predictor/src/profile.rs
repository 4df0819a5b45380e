//! Activation profiles: the output of `sparrow profile` and the statistics PowerInfer's offline phase needs
//! (hot/cold neurons, sparsity per batch size, co-activation of gate/up/down).
//!
//! The engine runs a corpus through the model and feeds each layer's FFN activations to a
//! [`ProfileAccumulator`]; [`ProfileAccumulator::finish`] gives a [`LayerProfile`]; the layers with the run's
//! metadata make a [`Profile`], written with [`Profile::save`] and read back with [`Profile::load`].
//!
//! # Definitions
//!
//! For token `t` and neuron `j` of a layer: `a = act(gate)[t][j]` (after SiLU or ReLU), `u = up[t][j]`,
//! `o = a * u` (the value the down projection multiplies).
//!
//! * gate active: `|a| > t_gate` (`t_gate` = [`LayerProfile::threshold`]; 0 for ReLU's exact zeros), or,
//!   with [`ProfileAccumulator::observe_scored`], the neuron's score (see [`ScoreKind`]) `> t_gate`;
//! * up active: `|u| > t_up`; down active: `|o| > t_out`;
//! * `freq[b][j]`: consecutive tokens are grouped into groups of `batch_sizes[b]` (a new group starts after
//!   every full group; groups continue across [`ProfileAccumulator::observe`] calls until
//!   [`ProfileAccumulator::end_sequence`]); a neuron is active in a group if its gate is active for any token
//!   of the group (union of active sets, as in a batched decode step); `freq[b][j]` = groups in which `j`
//!   is active / complete groups. Incomplete groups are dropped.
//! * `mean_abs[j]`, `max_abs[j]`: mean and maximum of `|o|` over all tokens;
//! * `coact_gate_up[j]` = P(up active | gate active), `coact_gate_down[j]` = P(down active | gate active)
//!   (0 when the gate was never active).
//!
//! # File layout (version 1)
//!
//! The container (magic `SPRWPROF`, version, payload length, FNV-1a 64 checksum, atomic write) is described
//! in the crate docs. The payload, all little-endian, `str` = u32 byte length + UTF-8 bytes:
//!
//! ```text
//! str      model              model file name
//! u64      model_fingerprint  caller-computed id of the model
//! str      corpus             e.g. "wikitext-2/valid.txt"
//! u64      tokens             tokens profiled
//! u8       activation         0 = ReLU, 1 = SiLU, 2 = GELU (tanh form)
//! u8       score              what thresholds apply to: 0 = |act(gate)|, 1 = |act(gate)|·‖down_j‖,
//!                             2 = |act(gate)·up|·‖down_j‖ (see ScoreKind)
//! u32      B                  number of batch sizes
//! u32 × B  batch_sizes        each >= 1
//! u32      L                  number of layers
//! L × {
//!   u32        n              neurons of the layer
//!   f32        threshold      gate threshold t_gate
//!   f32 × B×n  freq           batch-size-major: freq[0][0..n], freq[1][0..n], ...
//!   f32 × n    mean_abs
//!   f32 × n    max_abs
//!   f32 × n    coact_gate_up
//!   f32 × n    coact_gate_down
//! }
//! ```

use std::path::Path;

use crate::error::{input_err, PredictorError, Result};
use crate::file::{read_checked, write_atomic, Reader, Writer};

/// Magic of profile files.
pub const PROFILE_MAGIC: &[u8; 8] = b"SPRWPROF";
/// Version of the profile format this build reads and writes.
pub const PROFILE_VERSION: u32 = 1;

/// FFN activation function of the profiled model (the workspace's one [`tensor_types::Activation`]:
/// ReLU has exact zeros and `t_gate` is usually 0; SiLU has none and `t_gate` is calibrated, see
/// [`calibrate_threshold`]).
pub use tensor_types::Activation as ActivationKind;

/// What a layer's threshold applies to: a neuron is active iff its score is above the threshold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScoreKind {
    /// `|act(gate)|` (CATS; ReLU's exact zeros with threshold 0).
    Gate,
    /// `|act(gate)| · ‖down_j‖` (the L2 norm of neuron j's down column).
    GateNorm,
    /// `|act(gate) · up| · ‖down_j‖`: the size of the neuron's contribution to the FFN output.
    OutputNorm,
}

/// A whole profiling run: metadata and one [`LayerProfile`] per layer.
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    /// Model file name.
    pub model: String,
    /// Caller-computed id of the model (e.g. a hash of the tensor table).
    pub model_fingerprint: u64,
    /// Corpus profiled, e.g. `"wikitext-2/valid.txt"`.
    pub corpus: String,
    /// Number of tokens profiled.
    pub tokens: u64,
    /// FFN activation function.
    pub activation: ActivationKind,
    /// What the thresholds apply to.
    pub score: ScoreKind,
    /// Batch sizes of [`LayerProfile::freq`], e.g. `[1, 2, 4, 8]`.
    pub batch_sizes: Vec<u32>,
    /// One entry per transformer layer.
    pub layers: Vec<LayerProfile>,
}

/// Statistics of one layer's FFN neurons (see the module docs for the definitions).
#[derive(Debug, Clone, PartialEq)]
pub struct LayerProfile {
    /// Number of FFN neurons (intermediate size).
    pub n_neurons: u32,
    /// Gate threshold: neuron active iff `|act(gate)| > threshold`.
    pub threshold: f32,
    /// `[batch size index][neuron]`: fraction of token groups in which the neuron is active.
    pub freq: Vec<Vec<f32>>,
    /// Mean `|act(gate) * up|` per neuron.
    pub mean_abs: Vec<f32>,
    /// Maximum `|act(gate) * up|` per neuron.
    pub max_abs: Vec<f32>,
    /// P(up active | gate active) per neuron.
    pub coact_gate_up: Vec<f32>,
    /// P(down active | gate active) per neuron.
    pub coact_gate_down: Vec<f32>,
}

impl Profile {
    /// A profile of `n_layers` layers of `d_ff` neurons whose batch-1 frequencies are pseudo-random
    /// (fixed by a seed) and whose thresholds are zero: it orders the neurons of a neuron store and
    /// nothing else, for tests and for trying a store's layout without calibrating.
    pub fn synthetic(model: &str, model_fingerprint: u64, n_layers: usize, d_ff: usize) -> Profile {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 40) as f32 / (1u64 << 24) as f32
        };
        Profile {
            model: model.into(),
            model_fingerprint,
            corpus: "synthetic".into(),
            tokens: 0,
            activation: ActivationKind::Silu,
            score: ScoreKind::OutputNorm,
            batch_sizes: vec![1],
            layers: (0..n_layers)
                .map(|_| LayerProfile {
                    n_neurons: d_ff as u32,
                    threshold: 0.0,
                    freq: vec![(0..d_ff).map(|_| next()).collect()],
                    mean_abs: vec![0.0; d_ff],
                    max_abs: vec![0.0; d_ff],
                    coact_gate_up: vec![1.0; d_ff],
                    coact_gate_down: vec![1.0; d_ff],
                })
                .collect(),
        }
    }

    /// Writes the profile atomically (a temporary in the same folder, fsync, rename). Fails if the per-layer vectors do not
    /// match `n_neurons` and `batch_sizes`.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        self.check().map_err(|what| {
            PredictorError::Input(format!("{}: cannot save profile: {what}", path.display()))
        })?;
        let mut w = Writer::default();
        w.str(&self.model);
        w.u64(self.model_fingerprint);
        w.str(&self.corpus);
        w.u64(self.tokens);
        w.u8(match self.activation {
            ActivationKind::Relu => 0,
            ActivationKind::Silu => 1,
            ActivationKind::GeluTanh => 2,
        });
        w.u8(match self.score {
            ScoreKind::Gate => 0,
            ScoreKind::GateNorm => 1,
            ScoreKind::OutputNorm => 2,
        });
        w.u32(self.batch_sizes.len() as u32);
        for &b in &self.batch_sizes {
            w.u32(b);
        }
        w.u32(self.layers.len() as u32);
        for l in &self.layers {
            w.u32(l.n_neurons);
            w.f32(l.threshold);
            for f in &l.freq {
                w.f32s(f);
            }
            w.f32s(&l.mean_abs);
            w.f32s(&l.max_abs);
            w.f32s(&l.coact_gate_up);
            w.f32s(&l.coact_gate_down);
        }
        write_atomic(path, PROFILE_MAGIC, PROFILE_VERSION, &w.0)
    }

    /// Reads a profile; corrupt, truncated, foreign or wrong-version files are errors naming `path`.
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let payload = read_checked(path, PROFILE_MAGIC, "profile", PROFILE_VERSION)?;
        let mut r = Reader::new(path, &payload);
        let model = r.str("model name")?;
        let model_fingerprint = r.u64("model fingerprint")?;
        let corpus = r.str("corpus")?;
        let tokens = r.u64("token count")?;
        let activation = match r.u8("activation")? {
            0 => ActivationKind::Relu,
            1 => ActivationKind::Silu,
            2 => ActivationKind::GeluTanh,
            v => {
                return Err(r.err(format!(
                    "unknown activation code {v} (0 = ReLU, 1 = SiLU, 2 = GELU)"
                )))
            }
        };
        let score = match r.u8("score")? {
            0 => ScoreKind::Gate,
            1 => ScoreKind::GateNorm,
            2 => ScoreKind::OutputNorm,
            v => {
                return Err(r.err(format!(
                    "unknown score code {v} (0 = gate, 1 = gate·norm, 2 = output·norm)"
                )))
            }
        };
        let nb = r.u32("batch size count")? as usize;
        let mut batch_sizes = Vec::new();
        for i in 0..nb {
            let b = r.u32("batch sizes")?;
            if b == 0 {
                return Err(r.err(format!("batch size {i} is 0")));
            }
            batch_sizes.push(b);
        }
        let nl = r.u32("layer count")? as usize;
        let mut layers = Vec::new();
        for li in 0..nl {
            let n_neurons = r.u32("neuron count")?;
            let n = n_neurons as usize;
            let threshold = r.f32("threshold")?;
            let field = |name: &str| format!("layer {li} {name}");
            let mut freq = Vec::with_capacity(nb.min(64));
            for _ in 0..nb {
                freq.push(r.f32s(n, &field("freq"))?);
            }
            let mean_abs = r.f32s(n, &field("mean_abs"))?;
            let max_abs = r.f32s(n, &field("max_abs"))?;
            let coact_gate_up = r.f32s(n, &field("coact_gate_up"))?;
            let coact_gate_down = r.f32s(n, &field("coact_gate_down"))?;
            layers.push(LayerProfile {
                n_neurons,
                threshold,
                freq,
                mean_abs,
                max_abs,
                coact_gate_up,
                coact_gate_down,
            });
        }
        r.finish()?;
        Ok(Profile {
            model,
            model_fingerprint,
            corpus,
            tokens,
            activation,
            score,
            batch_sizes,
            layers,
        })
    }

    fn check(&self) -> std::result::Result<(), String> {
        if let Some(i) = self.batch_sizes.iter().position(|&b| b == 0) {
            return Err(format!("batch size {i} is 0"));
        }
        for (li, l) in self.layers.iter().enumerate() {
            let n = l.n_neurons as usize;
            if l.freq.len() != self.batch_sizes.len() {
                return Err(format!(
                    "layer {li}: {} freq rows for {} batch sizes",
                    l.freq.len(),
                    self.batch_sizes.len()
                ));
            }
            let vecs = [
                &l.mean_abs,
                &l.max_abs,
                &l.coact_gate_up,
                &l.coact_gate_down,
            ];
            if l.freq.iter().chain(vecs).any(|v| v.len() != n) {
                return Err(format!(
                    "layer {li}: a per-neuron vector does not have n_neurons = {n} entries"
                ));
            }
        }
        Ok(())
    }
}

impl LayerProfile {
    /// Neuron indices by descending `freq[batch_idx]` (ties by index); `None` if `batch_idx` is out of range.
    pub fn hot_order(&self, batch_idx: usize) -> Option<Vec<u32>> {
        let f = self.freq.get(batch_idx)?;
        let mut idx: Vec<u32> = (0..f.len() as u32).collect();
        idx.sort_by(|&a, &b| f[b as usize].total_cmp(&f[a as usize]).then(a.cmp(&b)));
        Some(idx)
    }

    /// Smallest share of neurons (0..=1) that together carry `frac` of all activations at batch size 1
    /// (`freq[0]`): the power-law figure ("x% of neurons account for `frac` of activations").
    /// 0 when nothing was active.
    pub fn share_for_mass(&self, frac: f32) -> f32 {
        let Some(f) = self.freq.first() else {
            return 0.0;
        };
        if f.is_empty() {
            return 0.0;
        }
        let mut v: Vec<f64> = f.iter().map(|&x| f64::from(x.max(0.0))).collect();
        v.sort_by(|a, b| b.total_cmp(a));
        let total: f64 = v.iter().sum();
        if total <= 0.0 {
            return 0.0;
        }
        let target = f64::from(frac.clamp(0.0, 1.0)) * total;
        let mut acc = 0.0;
        for (i, x) in v.iter().enumerate() {
            if acc >= target * (1.0 - 1e-12) {
                return i as f32 / v.len() as f32;
            }
            acc += x;
        }
        1.0
    }

    /// `1 - mean(freq[batch_idx])`; `None` if `batch_idx` is out of range or the layer has no neurons.
    pub fn sparsity(&self, batch_idx: usize) -> Option<f32> {
        let f = self.freq.get(batch_idx)?;
        if f.is_empty() {
            return None;
        }
        let mean = f.iter().map(|&x| f64::from(x)).sum::<f64>() / f.len() as f64;
        Some((1.0 - mean) as f32)
    }

    /// Jaccard overlap `|A ∩ B| / |A ∪ B|` of the hot sets at two batch-size indices, each the top
    /// `ceil(top_frac * n)` neurons of [`hot_order`](Self::hot_order). 1 when both sets are empty;
    /// `None` if an index is out of range.
    pub fn overlap_top(&self, a_idx: usize, b_idx: usize, top_frac: f32) -> Option<f32> {
        let a = self.hot_order(a_idx)?;
        let b = self.hot_order(b_idx)?;
        // Rows of different lengths (hand-built profiles) are compared over the shorter one.
        let n = a.len().min(b.len());
        let k = ceil_count(top_frac.clamp(0.0, 1.0), n);
        if k == 0 {
            return Some(1.0);
        }
        let mut in_a = vec![false; a.len().max(b.len())];
        for &j in &a[..k] {
            in_a[j as usize] = true;
        }
        let inter = b[..k].iter().filter(|&&j| in_a[j as usize]).count();
        Some(inter as f32 / (2 * k - inter) as f32)
    }
}

/// Collects one layer's statistics from FFN activations (see the module docs for the definitions).
#[derive(Debug, Clone)]
pub struct ProfileAccumulator {
    n: usize,
    batch_sizes: Vec<u32>,
    t_gate: f32,
    t_up: f32,
    t_out: f32,
    /// Per batch size: groups in which each neuron was active.
    active: Vec<Vec<u64>>,
    /// Per batch size: complete groups.
    groups: Vec<u64>,
    /// Per batch size: union of the current (incomplete) group.
    pending: Vec<Vec<bool>>,
    /// Per batch size: tokens in the current group.
    pending_len: Vec<u32>,
    tokens: u64,
    sum_abs: Vec<f64>,
    max_abs: Vec<f32>,
    gate_n: Vec<u64>,
    gate_up_n: Vec<u64>,
    gate_down_n: Vec<u64>,
}

impl ProfileAccumulator {
    /// An empty accumulator for `n_neurons` neurons, frequencies at `batch_sizes` (each >= 1, e.g.
    /// `[1, 2, 4, 8]`) and thresholds on `|act(gate)|`, `|up|` and `|act(gate) * up|`.
    pub fn new(
        n_neurons: usize,
        batch_sizes: &[u32],
        t_gate: f32,
        t_up: f32,
        t_out: f32,
    ) -> Result<Self> {
        if batch_sizes.contains(&0) {
            return input_err(format!(
                "ProfileAccumulator: batch sizes must be >= 1, got {batch_sizes:?}"
            ));
        }
        let nb = batch_sizes.len();
        Ok(ProfileAccumulator {
            n: n_neurons,
            batch_sizes: batch_sizes.to_vec(),
            t_gate,
            t_up,
            t_out,
            active: vec![vec![0; n_neurons]; nb],
            groups: vec![0; nb],
            pending: vec![vec![false; n_neurons]; nb],
            pending_len: vec![0; nb],
            tokens: 0,
            sum_abs: vec![0.0; n_neurons],
            max_abs: vec![0.0; n_neurons],
            gate_n: vec![0; n_neurons],
            gate_up_n: vec![0; n_neurons],
            gate_down_n: vec![0; n_neurons],
        })
    }

    /// Feeds `n_tokens` consecutive tokens: `act_gate` (= `act(gate)`, after SiLU/ReLU) and `up`, both
    /// `n_tokens × n_neurons` row-major.
    pub fn observe(&mut self, act_gate: &[f32], up: &[f32], n_tokens: usize) -> Result<()> {
        self.observe_inner(None, act_gate, up, n_tokens)
    }

    /// [`observe`](Self::observe) where a neuron counts as active when `scores[t][j] > t_gate` (instead of
    /// `|act_gate[t][j]| > t_gate`); `scores` has the shape of `act_gate`.
    pub fn observe_scored(
        &mut self,
        scores: &[f32],
        act_gate: &[f32],
        up: &[f32],
        n_tokens: usize,
    ) -> Result<()> {
        if scores.len() != act_gate.len() {
            return input_err(format!(
                "ProfileAccumulator::observe_scored: {} scores for {} activations",
                scores.len(),
                act_gate.len()
            ));
        }
        self.observe_inner(Some(scores), act_gate, up, n_tokens)
    }

    fn observe_inner(
        &mut self,
        scores: Option<&[f32]>,
        act_gate: &[f32],
        up: &[f32],
        n_tokens: usize,
    ) -> Result<()> {
        let want = n_tokens.checked_mul(self.n);
        if want != Some(act_gate.len()) || want != Some(up.len()) {
            return input_err(format!(
                "ProfileAccumulator::observe: {n_tokens} tokens × {} neurons, got act_gate {} and up {} values",
                self.n,
                act_gate.len(),
                up.len()
            ));
        }
        if self.n == 0 {
            self.tokens += n_tokens as u64;
            return Ok(());
        }
        for (t, (a_row, u_row)) in act_gate
            .chunks_exact(self.n)
            .zip(up.chunks_exact(self.n))
            .enumerate()
        {
            self.tokens += 1;
            let s_row = scores.map(|s| &s[t * self.n..(t + 1) * self.n]);
            for j in 0..self.n {
                let (a, u) = (a_row[j], u_row[j]);
                let o = (a * u).abs();
                self.sum_abs[j] += f64::from(o);
                if o > self.max_abs[j] {
                    self.max_abs[j] = o;
                }
                let s = s_row.map_or(a.abs(), |r| r[j]);
                if s > self.t_gate {
                    self.gate_n[j] += 1;
                    self.gate_up_n[j] += u64::from(u.abs() > self.t_up);
                    self.gate_down_n[j] += u64::from(o > self.t_out);
                    for p in &mut self.pending {
                        p[j] = true;
                    }
                }
            }
            for b in 0..self.batch_sizes.len() {
                self.pending_len[b] += 1;
                if self.pending_len[b] == self.batch_sizes[b] {
                    for (c, p) in self.active[b].iter_mut().zip(self.pending[b].iter_mut()) {
                        *c += u64::from(*p);
                        *p = false;
                    }
                    self.groups[b] += 1;
                    self.pending_len[b] = 0;
                }
            }
        }
        Ok(())
    }

    /// Drops the current incomplete groups, so that no group spans two sequences.
    pub fn end_sequence(&mut self) {
        for (p, l) in self.pending.iter_mut().zip(self.pending_len.iter_mut()) {
            p.fill(false);
            *l = 0;
        }
    }

    /// Tokens observed so far.
    pub fn tokens(&self) -> u64 {
        self.tokens
    }

    /// The layer's statistics (incomplete groups are dropped; all zeros if nothing was observed).
    pub fn finish(&self) -> LayerProfile {
        let ratio = |num: u64, den: u64| {
            if den == 0 {
                0.0
            } else {
                (num as f64 / den as f64) as f32
            }
        };
        LayerProfile {
            n_neurons: self.n as u32,
            threshold: self.t_gate,
            freq: self
                .active
                .iter()
                .zip(&self.groups)
                .map(|(a, &g)| a.iter().map(|&c| ratio(c, g)).collect())
                .collect(),
            mean_abs: self
                .sum_abs
                .iter()
                .map(|&s| {
                    if self.tokens == 0 {
                        0.0
                    } else {
                        (s / self.tokens as f64) as f32
                    }
                })
                .collect(),
            max_abs: self.max_abs.clone(),
            coact_gate_up: self
                .gate_up_n
                .iter()
                .zip(&self.gate_n)
                .map(|(&u, &g)| ratio(u, g))
                .collect(),
            coact_gate_down: self
                .gate_down_n
                .iter()
                .zip(&self.gate_n)
                .map(|(&d, &g)| ratio(d, g))
                .collect(),
        }
    }
}

/// The threshold `t` such that a fraction `target_sparsity` (clamped to 0..=1) of `values` are `<= t`:
/// the `ceil(target * n)`-th smallest value (so at least that fraction is `<= t`; more with ties).
/// `values` (e.g. `|act(gate)|` samples) is reordered. For `target * n < 1`, a value just below the
/// smallest sample; 0 for no samples. NaNs sort above every number.
pub fn calibrate_threshold(values: &mut [f32], target_sparsity: f32) -> f32 {
    let n = values.len();
    if n == 0 {
        return 0.0;
    }
    let t = if target_sparsity.is_nan() {
        0.0
    } else {
        target_sparsity.clamp(0.0, 1.0)
    };
    let k = ceil_count(t, n);
    if k == 0 {
        let (_, min, _) = values.select_nth_unstable_by(0, |a, b| a.total_cmp(b));
        return next_down(*min);
    }
    let (_, v, _) = values.select_nth_unstable_by(k - 1, |a, b| a.total_cmp(b));
    *v
}

/// `ceil(frac * n)` for `frac` in 0..=1, forgiving the f32 rounding of `frac` (0.2 × 10 is 2, not 3).
fn ceil_count(frac: f32, n: usize) -> usize {
    ((f64::from(frac) * n as f64 - 1e-6).ceil().max(0.0) as usize).min(n)
}

/// Largest f32 below `x` (for finite `x`).
pub(crate) fn next_down(x: f32) -> f32 {
    if x.is_nan() || x == f32::NEG_INFINITY {
        return x;
    }
    if x == 0.0 {
        return -f32::from_bits(1);
    }
    let b = x.to_bits();
    f32::from_bits(if x > 0.0 { b - 1 } else { b + 1 })
}
