//! Neuron selection, shared by in-memory sparse decode and offloaded decode: which neurons of a layer
//! are candidates for a token (a [`NeuronPredictor`], or all of them), and which of those pass the
//! layer's threshold on their [`Score`]. The rules are written once here ([`LayerRule::select`]);
//! the two decoders differ only in where the gate and up rows come from ([`GateUpRows`]: the model's
//! matrices, or a neuron-store unit).

use rayon::prelude::*;

use crate::error::{OffloadError, Result};

/// Predicts which neurons of a layer fire for an FFN input (the input after the FFN's RMSNorm).
pub trait NeuronPredictor: Send + Sync {
    /// Writes the sorted indices of the neurons of `layer` predicted active for `x` into `out`.
    fn predict(&self, layer: usize, x: &[f32], out: &mut Vec<u32>) -> Result<()>;
}

impl NeuronPredictor for predictor::PredictorSet {
    fn predict(&self, layer: usize, x: &[f32], out: &mut Vec<u32>) -> Result<()> {
        let p = self.layers.get(layer).ok_or_else(|| {
            OffloadError::Request(format!(
                "the predictor set has {} layers; layer {layer} asked",
                self.layers.len()
            ))
        })?;
        Ok(p.predict(x, out)?)
    }
}

/// What the threshold is compared with, per neuron.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Score {
    /// `|act(gate)|` (CATS).
    Gate,
    /// `|act(gate)| · ‖down_j‖`.
    GateNorm,
    /// `|act(gate) · up| · ‖down_j‖`: the size of the neuron's contribution to the FFN output. Needs
    /// gate and up of every candidate neuron, so without a predictor only the down projection is
    /// saved; with one, gate and up run on the predicted rows. The default: on SmolLM2 it keeps
    /// perplexity far better than `Gate` at the same sparsity (see docs/BENCHMARKS.md).
    #[default]
    OutputNorm,
}

impl Score {
    /// The score of a neuron from its activated gate, up value and down-column norm.
    #[inline]
    pub fn of(self, act: f32, up: f32, norm: f32) -> f32 {
        match self {
            Score::Gate => act.abs(),
            Score::GateNorm => act.abs() * norm,
            Score::OutputNorm => (act * up).abs() * norm,
        }
    }
}

/// Rows of one layer's FFN computed for a token: (gate, up, down).
pub(crate) type RowCounts = (usize, usize, usize);

/// Checks one finite, non-negative threshold per layer.
pub(crate) fn check_thresholds(thresholds: &[f32], n_layers: usize) -> Result<()> {
    if thresholds.len() != n_layers {
        return Err(OffloadError::Request(format!(
            "sparse FFN: {} thresholds for a model of {} layers",
            thresholds.len(),
            n_layers
        )));
    }
    if let Some((l, t)) = thresholds
        .iter()
        .enumerate()
        .find(|(_, t)| !t.is_finite() || **t < 0.0)
    {
        return Err(OffloadError::Request(format!(
            "sparse FFN: threshold of layer {l} is {t}, not a finite value >= 0"
        )));
    }
    Ok(())
}

/// The per-layer thresholds, the neurons' importance weights (down-row norms) and an optional
/// predictor: everything that decides which neurons a token computes.
pub(crate) struct NeuronSelector {
    thresholds: Vec<f32>,
    activation: kernels_neon::Activation,
    /// Per layer and neuron: the L2 norm of the neuron's down column (importance weight).
    down_norms: Vec<Vec<f32>>,
    predictor: Option<Box<dyn NeuronPredictor>>,
    all_rows: Vec<u32>,
    d_model: usize,
    d_ff: usize,
}

impl NeuronSelector {
    /// A selector without a predictor (thresholds checked by the caller with [`check_thresholds`]).
    pub(crate) fn new(
        thresholds: Vec<f32>,
        activation: kernels_neon::Activation,
        down_norms: Vec<Vec<f32>>,
        d_model: usize,
        d_ff: usize,
    ) -> Self {
        NeuronSelector {
            thresholds,
            activation,
            down_norms,
            predictor: None,
            all_rows: (0..d_ff as u32).collect(),
            d_model,
            d_ff,
        }
    }

    pub(crate) fn set_predictor(&mut self, predictor: Box<dyn NeuronPredictor>) {
        self.predictor = Some(predictor);
    }

    pub(crate) fn has_predictor(&self) -> bool {
        self.predictor.is_some()
    }

    pub(crate) fn thresholds(&self) -> &[f32] {
        &self.thresholds
    }

    pub(crate) fn down_norms(&self, l: usize) -> &[f32] {
        &self.down_norms[l]
    }

    pub(crate) fn d_ff(&self) -> usize {
        self.d_ff
    }

    pub(crate) fn d_model(&self) -> usize {
        self.d_model
    }

    /// The candidate neurons of layer `li` for one token `x`: the predicted ones (written into
    /// `buf`), or every neuron without a predictor.
    pub(crate) fn candidates<'a>(
        &'a self,
        li: usize,
        x: &[f32],
        buf: &'a mut Vec<u32>,
    ) -> Result<&'a [u32]> {
        match &self.predictor {
            Some(p) => {
                p.predict(li, x, buf)?;
                Ok(buf)
            }
            None => Ok(&self.all_rows),
        }
    }

    /// Batched candidates: for each of the `n` tokens of `x` (`n × d_model`), which neurons of layer
    /// `li` the predictor chooses (`n × d_ff`, token-major), or `None` without a predictor (all).
    pub(crate) fn candidate_mask(
        &self,
        li: usize,
        x: &[f32],
        n: usize,
    ) -> Result<Option<Vec<bool>>> {
        let Some(p) = &self.predictor else {
            return Ok(None);
        };
        let mut keep = vec![false; n * self.d_ff];
        keep.par_chunks_mut(self.d_ff)
            .zip(x.par_chunks(self.d_model))
            .try_for_each(|(k, xt)| {
                let mut predicted = Vec::new();
                p.predict(li, xt, &mut predicted)?;
                for &j in &predicted {
                    if let Some(v) = k.get_mut(j as usize) {
                        *v = true;
                    }
                }
                Ok::<(), OffloadError>(())
            })?;
        Ok(Some(keep))
    }

    /// The threshold rule of layer `li` under `score`.
    pub(crate) fn rule(&self, li: usize, score: Score) -> LayerRule<'_> {
        LayerRule {
            score,
            threshold: self.thresholds[li],
            norms: &self.down_norms[li],
            activation: self.activation,
        }
    }

    /// The score of every neuron of an observed FFN step of layer `layer` (`act_gate`, `up`:
    /// `n × d_ff`), into `out` (cleared first).
    pub(crate) fn scores_into(
        &self,
        score: Score,
        layer: usize,
        act_gate: &[f32],
        up: &[f32],
        out: &mut Vec<f32>,
    ) {
        let norms = &self.down_norms[layer];
        out.clear();
        out.extend(
            act_gate
                .chunks(self.d_ff)
                .zip(up.chunks(self.d_ff))
                .flat_map(|(a, u)| {
                    a.iter()
                        .zip(u)
                        .zip(norms)
                        .map(|((&a, &u), &n)| score.of(a, u, n))
                }),
        );
    }

    /// Batched form: zeroes, in `act` (`n × d_ff` activated gate values, before the multiplication by
    /// up), every neuron that sparse decode would not compute for that token.
    pub(crate) fn mask(
        &self,
        score: Score,
        li: usize,
        x: &[f32],
        n: usize,
        act: &mut [f32],
        up: &[f32],
    ) -> Result<()> {
        let t = self.thresholds[li];
        let norms = &self.down_norms[li];
        let ff = self.d_ff;
        let d = self.d_model;
        act.par_chunks_mut(ff)
            .zip(x.par_chunks(d))
            .zip(up.par_chunks(ff))
            .take(n)
            .try_for_each(|((a, xt), u)| {
                if let Some(p) = &self.predictor {
                    let mut predicted = Vec::new();
                    p.predict(li, xt, &mut predicted)?;
                    let mut keep = vec![false; ff];
                    predicted
                        .iter()
                        .filter(|&&j| (j as usize) < ff)
                        .for_each(|&j| keep[j as usize] = true);
                    a.iter_mut()
                        .zip(&keep)
                        .filter(|(_, k)| !**k)
                        .for_each(|(v, _)| *v = 0.0);
                }
                for ((v, &uj), &nj) in a.iter_mut().zip(u).zip(norms) {
                    if score.of(*v, uj, nj) <= t {
                        *v = 0.0;
                    }
                }
                Ok(())
            })
    }
}

/// Where the gate and up rows of the candidate neurons come from (the model's matrices, or one
/// neuron-store unit). Row indices are the source's own (neuron ids, or slots in a unit).
pub trait GateUpRows {
    /// `g[i] = gate row rows[i] · x`.
    fn gate(&mut self, rows: &[u32], g: &mut [f32]) -> Result<()>;
    /// `u[i] = up row rows[i] · x`.
    fn up(&mut self, rows: &[u32], u: &mut [f32]) -> Result<()>;
    /// Gate and up of the same rows.
    fn gate_up(&mut self, rows: &[u32], g: &mut [f32], u: &mut [f32]) -> Result<()>;
    /// For [`Score::Gate`], a fused kernel where the source has one: `out[i] = act(g_i) · u_i` for
    /// the rows whose `|act(g_i)|` passes `threshold`, 0 for the others; returns the up rows
    /// computed. `None`: no fused kernel (the two phases run through `gate` and `up`).
    fn gate_score_fused(
        &mut self,
        _rows: &[u32],
        _threshold: f32,
        _out: &mut [f32],
    ) -> Option<Result<usize>> {
        None
    }
}

/// Gate and up of every row of a layer for one token, computed beforehand (a batched decode step's
/// whole-matrix products, `kernels_neon::matvec_batch_many`, bit for bit what one token's
/// `matvec_many` gives): rows are looked up, not computed.
pub struct Precomputed<'a> {
    /// `gate · x`, one value per row of the layer.
    pub g: &'a [f32],
    /// `up · x`.
    pub u: &'a [f32],
}

impl GateUpRows for Precomputed<'_> {
    fn gate(&mut self, rows: &[u32], g: &mut [f32]) -> Result<()> {
        for (o, &r) in g.iter_mut().zip(rows) {
            *o = self.g[r as usize];
        }
        Ok(())
    }

    fn up(&mut self, rows: &[u32], u: &mut [f32]) -> Result<()> {
        for (o, &r) in u.iter_mut().zip(rows) {
            *o = self.u[r as usize];
        }
        Ok(())
    }

    fn gate_up(&mut self, rows: &[u32], g: &mut [f32], u: &mut [f32]) -> Result<()> {
        self.gate(rows, g)?;
        self.up(rows, u)
    }
}

/// Reusable buffers of [`LayerRule::select`].
#[derive(Default)]
pub struct SelectScratch {
    g: Vec<f32>,
    u: Vec<f32>,
    survivors: Vec<u32>,
    acts: Vec<f32>,
}

/// One layer's threshold rule under one score.
#[derive(Clone, Copy)]
pub struct LayerRule<'a> {
    /// The score compared with the threshold.
    pub score: Score,
    /// The layer's threshold.
    pub threshold: f32,
    /// The layer's down-row norms, by neuron id.
    pub norms: &'a [f32],
    /// The FFN activation.
    pub activation: kernels_neon::Activation,
}

impl LayerRule<'_> {
    /// The activation of a gate output.
    #[inline]
    pub(crate) fn act(&self, g: f32) -> f32 {
        kernels_neon::act_value(self.activation, g)
    }

    /// Two-phase loading: whether a neuron whose gate output is `g` can still pass once its up row
    /// is known (for the output score, a non-zero activation: ReLU zeros are the case this is for).
    pub(crate) fn may_pass(&self, g: f32, neuron: usize) -> bool {
        let a = self.act(g);
        match self.score {
            Score::OutputNorm => a != 0.0 || 0.0 > self.threshold,
            score => score.of(a, 0.0, self.norms[neuron]) > self.threshold,
        }
    }

    /// Computes the candidate `rows` from `src` and pushes `(row, act(gate)·up)` of every neuron that
    /// passes into `keep`/`coeffs` (`neuron(i)` is the neuron id of candidate `i`, for its norm).
    /// Returns the up rows computed.
    ///
    /// * [`Score::OutputNorm`]: gate and up of every candidate, then `|act(g)·u|·‖down_j‖ > t`.
    /// * [`Score::Gate`], [`Score::GateNorm`]: two phases: gate rows, then the up rows of the neurons
    ///   whose `score(act(g))` passes; a neuron is kept when `act(g)·u` is not zero.
    pub fn select(
        &self,
        src: &mut impl GateUpRows,
        rows: &[u32],
        neuron: impl Fn(usize) -> usize,
        s: &mut SelectScratch,
        keep: &mut Vec<u32>,
        coeffs: &mut Vec<f32>,
    ) -> Result<usize> {
        let (t, n) = (self.threshold, rows.len());
        if self.score == Score::OutputNorm {
            s.g.resize(n, 0.0);
            s.u.resize(n, 0.0);
            src.gate_up(rows, &mut s.g[..n], &mut s.u[..n])?;
            for (i, (&r, (&gv, &uv))) in rows.iter().zip(s.g.iter().zip(&s.u)).enumerate() {
                let v = self.act(gv) * uv;
                if v.abs() * self.norms[neuron(i)] > t {
                    keep.push(r);
                    coeffs.push(v);
                }
            }
            return Ok(n);
        }
        if self.score == Score::Gate {
            s.g.resize(n, 0.0);
            if let Some(up_rows) = src.gate_score_fused(rows, t, &mut s.g[..n]) {
                let up_rows = up_rows?;
                for (&r, &v) in rows.iter().zip(&s.g) {
                    if v != 0.0 {
                        keep.push(r);
                        coeffs.push(v);
                    }
                }
                return Ok(up_rows);
            }
        }
        s.g.resize(n, 0.0);
        src.gate(rows, &mut s.g[..n])?;
        s.survivors.clear();
        s.acts.clear();
        for (i, (&r, &gv)) in rows.iter().zip(&s.g).enumerate() {
            let a = self.act(gv);
            if self.score.of(a, 0.0, self.norms[neuron(i)]) > t {
                s.survivors.push(r);
                s.acts.push(a);
            }
        }
        let m = s.survivors.len();
        s.u.resize(m, 0.0);
        src.up(&s.survivors, &mut s.u[..m])?;
        for ((&r, &a), &uv) in s.survivors.iter().zip(&s.acts).zip(&s.u) {
            let v = a * uv;
            if v != 0.0 {
                keep.push(r);
                coeffs.push(v);
            }
        }
        Ok(m)
    }
}

/// Calibrates one threshold per layer from samples of the neuron score ([`Score`]): the `sparsity`
/// quantile of each layer's samples (so that a share `sparsity` of the sampled scores is at or below it).
/// `samples[l]` is reordered.
pub fn thresholds_for_sparsity(samples: &mut [Vec<f32>], sparsity: f32) -> Result<Vec<f32>> {
    if !(0.0..=1.0).contains(&sparsity) {
        return Err(OffloadError::Request(format!(
            "target sparsity {sparsity} is not within 0..=1"
        )));
    }
    samples
        .iter_mut()
        .enumerate()
        .map(|(l, s)| {
            if s.is_empty() {
                return Err(OffloadError::Request(format!(
                    "no activation samples for layer {l}"
                )));
            }
            if sparsity == 0.0 {
                return Ok(0.0);
            }
            // Round, not ceil: `0.3f32 as f64 * 100` is 30.000001, which must still mean 30 samples.
            let k = ((s.len() as f64 * sparsity as f64).round() as usize).clamp(1, s.len()) - 1;
            let (_, v, _) = s.select_nth_unstable_by(k, f32::total_cmp);
            Ok(*v)
        })
        .collect()
}

#[cfg(test)]
mod sparsity_tests {
    use super::*;

    #[test]
    fn threshold_is_the_quantile() {
        let mut s = vec![
            (1..=100).map(|v| v as f32).rev().collect::<Vec<_>>(),
            vec![0.5; 10],
        ];
        let t = thresholds_for_sparsity(&mut s, 0.3).unwrap();
        assert_eq!(t[0], 30.0);
        assert_eq!(t[1], 0.5);
        let mut s = vec![vec![3.0, 1.0, 2.0]];
        assert_eq!(thresholds_for_sparsity(&mut s, 0.0).unwrap(), vec![0.0]);
        assert_eq!(thresholds_for_sparsity(&mut s, 1.0).unwrap(), vec![3.0]);
        assert!(thresholds_for_sparsity(&mut s, 1.5).is_err());
        assert!(thresholds_for_sparsity(&mut [Vec::new()], 0.5).is_err());
    }
}
