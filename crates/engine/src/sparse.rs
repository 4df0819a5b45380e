//! Activation sparsity in the FFN (PowerInfer / PowerInfer-2; CATS-style thresholds for SiLU models).
//!
//! A neuron `j` of layer `l` is *active* for a token when its [`Score`] exceeds the layer's threshold
//! `t_l`. The default score is `|act(gate_j · x) · (up_j · x)| · ‖down_j‖`, the size of the neuron's
//! contribution to the FFN output; `Score::Gate` is CATS's `|act(gate_j · x)|` (for ReLU models with
//! `t_l = 0` that is exact: only zeros are skipped). Sparse decode computes, per layer:
//!
//! 1. the gate (and, for the default score, up) rows of the neurons the [`NeuronPredictor`] expects to
//!    fire, or of all neurons without a predictor;
//! 2. for the gate scores, the up rows only of the neurons whose activated gate survives (the paper's two
//!    phases, [`kernels_neon::gate_up_sparse`]);
//! 3. the down projection as `Σ_j a_j · down_t[j]` over the survivors ([`kernels_neon::axpy_rows`]),
//!    where `down_t` is the down matrix transposed at load time (one row per neuron, in
//!    [`DEFAULT_DOWN_FORMAT`] unless asked otherwise).
//!
//! Batched steps (prefill, perplexity) compute gate and up densely, zero the same neurons
//! (`SparseFfn::mask`), and use the same transposed down rows, so perplexity measured with a
//! [`SparseFfn`] is the quality sparse decode has.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use kernels_neon::{Precision, QMatrix, WeightFormat};
use rayon::prelude::*;

use crate::config::ModelConfig;
use crate::error::{kernel, EngineError, Result};
use crate::model::{Layer, Model};
use crate::offload::{Offload, OffloadOptions};

/// Predicts which neurons of a layer fire for an FFN input (the input after the FFN's RMSNorm).
pub trait NeuronPredictor: Send + Sync {
    /// Writes the sorted indices of the neurons of `layer` predicted active for `x` into `out`.
    fn predict(&self, layer: usize, x: &[f32], out: &mut Vec<u32>) -> Result<()>;
}

impl NeuronPredictor for predictor::PredictorSet {
    fn predict(&self, layer: usize, x: &[f32], out: &mut Vec<u32>) -> Result<()> {
        let p = self.layers.get(layer).ok_or_else(|| {
            EngineError::Request(format!(
                "the predictor set has {} layers; layer {layer} asked",
                self.layers.len()
            ))
        })?;
        Ok(p.predict(x, out)?)
    }
}

/// Counters of the work sparse decode did (neurons, summed over layers and tokens).
#[derive(Debug, Default)]
pub struct SparseCounters {
    tokens: AtomicU64,
    neurons: AtomicU64,
    gate_rows: AtomicU64,
    up_rows: AtomicU64,
    down_rows: AtomicU64,
}

/// A snapshot of [`SparseCounters`].
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct SparseStats {
    /// Decode steps (one token each) that ran sparse.
    pub tokens: u64,
    /// Neurons those steps could have computed (layers × d_ff × tokens).
    pub neurons: u64,
    /// Gate rows computed.
    pub gate_rows: u64,
    /// Up rows computed.
    pub up_rows: u64,
    /// Down columns computed: neurons that passed the threshold.
    pub down_rows: u64,
}

impl SparseStats {
    /// Share of gate rows computed.
    pub fn gate_frac(&self) -> f64 {
        self.gate_rows as f64 / (self.neurons.max(1)) as f64
    }
    /// Share of up rows computed.
    pub fn up_frac(&self) -> f64 {
        self.up_rows as f64 / (self.neurons.max(1)) as f64
    }
    /// Share of down columns computed (`1 - sparsity`).
    pub fn down_frac(&self) -> f64 {
        self.down_rows as f64 / (self.neurons.max(1)) as f64
    }
}

/// The sparse FFN of a model: per-layer thresholds, the transposed down matrices and an optional predictor.
pub struct SparseFfn {
    thresholds: Vec<f32>,
    activation: kernels_neon::Activation,
    down_t: Vec<Vec<u8>>,
    down_t_format: WeightFormat,
    d_model: usize,
    d_ff: usize,
    all_rows: Vec<u32>,
    predictor: Option<Box<dyn NeuronPredictor>>,
    counters: SparseCounters,
    /// Per layer and neuron: the L2 norm of the neuron's down column (importance weight).
    down_norms: Vec<Vec<f32>>,
    /// How a neuron's score is computed.
    pub score: Score,
    /// Where the FFN weights come from when they are offloaded to a neuron store (`None`: the model's
    /// matrices in memory).
    offload: Option<Offload>,
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

/// Format the down matrices are transposed into, at 1.7× the bytes of Q4_1 per down column read. On
/// SmolLM2 Q4_1 it costs about +0.1% perplexity and up to 1.0 in a top logit; re-quantizing across the other
/// axis to 4 bits (Q4_1) drifts top logits by about 7, and F16 by 6e-3 at 3.2× the bytes.
pub const DEFAULT_DOWN_FORMAT: WeightFormat = WeightFormat::Q8_0;

impl SparseFfn {
    /// Builds the sparse FFN of `model` with one threshold per layer (on [`SparseFfn::score`], the
    /// default [`Score::OutputNorm`] unless changed), transposing every down matrix into `down_format`.
    pub fn new(model: &Model<'_>, thresholds: Vec<f32>, down_format: WeightFormat) -> Result<Self> {
        let cfg = &model.config;
        check_thresholds(&thresholds, cfg.n_layers)?;
        let (d, ff) = (cfg.d_model, cfg.d_ff);
        let down_t = model
            .layers
            .par_iter()
            .enumerate()
            .map(|(l, layer)| {
                transpose(&layer.down, down_format)
                    .map_err(kernel(format!("transposing ffn down of layer {l}")))
            })
            .collect::<Result<Vec<_>>>()?;
        let down_norms = down_t
            .iter()
            .map(|bytes| {
                let m = QMatrix::new(down_format, ff, d, bytes)
                    .map_err(kernel("transposed ffn down"))?;
                let mut row = vec![0.0f32; d];
                (0..ff)
                    .map(|j| {
                        kernels_neon::dequantize_row(down_format, m.row_data(j), &mut row)
                            .map_err(kernel("transposed ffn down"))?;
                        Ok(row.iter().map(|v| v * v).sum::<f32>().sqrt())
                    })
                    .collect::<Result<Vec<f32>>>()
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(SparseFfn {
            thresholds,
            activation: cfg.activation,
            down_t,
            down_t_format: down_format,
            d_model: d,
            d_ff: ff,
            all_rows: (0..ff as u32).collect(),
            predictor: None,
            counters: SparseCounters::default(),
            down_norms,
            score: Score::OutputNorm,
            offload: None,
        })
    }

    /// The sparse FFN of a resident model whose FFN weights are in the neuron store at `store`
    /// ([`crate::offload`]): thresholds per layer as in [`SparseFfn::new`], weights read through an
    /// [`Offload`] with `opts` (budget, I/O thread). Decode and batched steps both run token by token
    /// over the store.
    pub fn from_store(
        config: &ModelConfig,
        store: &Path,
        thresholds: Vec<f32>,
        opts: OffloadOptions,
    ) -> Result<Self> {
        check_thresholds(&thresholds, config.n_layers)?;
        let off = Offload::open(store, opts)?;
        let ix = off.store().index();
        if ix.layers.len() != config.n_layers
            || ix.d_model != config.d_model
            || ix.d_ff != config.d_ff
        {
            return Err(EngineError::BadModel {
                path: store.to_path_buf(),
                detail: format!(
                    "store holds {} layers of {} neurons × {}, the model has {} × {} × {}",
                    ix.layers.len(),
                    ix.d_ff,
                    ix.d_model,
                    config.n_layers,
                    config.d_ff,
                    config.d_model
                ),
            });
        }
        Ok(SparseFfn {
            thresholds,
            activation: config.activation,
            down_t: Vec::new(),
            down_t_format: ix.formats.down,
            d_model: config.d_model,
            d_ff: config.d_ff,
            all_rows: (0..config.d_ff as u32).collect(),
            predictor: None,
            counters: SparseCounters::default(),
            down_norms: ix.layers.iter().map(|l| l.down_norms.clone()).collect(),
            score: Score::OutputNorm,
            offload: Some(off),
        })
    }

    /// The flash offload, when the weights are in a neuron store.
    pub fn offload(&self) -> Option<&Offload> {
        self.offload.as_ref()
    }

    /// The transposed down rows of layer `l` (empty when offloaded).
    pub(crate) fn down_t_data(&self, l: usize) -> &[u8] {
        self.down_t.get(l).map_or(&[], |v| v.as_slice())
    }

    /// Uses `predictor` to choose the gate rows of each decode step (without one, every gate row is
    /// computed and only the threshold makes the FFN sparse).
    pub fn with_predictor(mut self, predictor: Box<dyn NeuronPredictor>) -> Self {
        self.predictor = Some(predictor);
        self
    }

    /// Whether a predictor chooses the gate rows.
    pub fn has_predictor(&self) -> bool {
        self.predictor.is_some()
    }

    /// Per-neuron importance weights of layer `l` (down-column norms).
    pub fn down_norms(&self, l: usize) -> &[f32] {
        &self.down_norms[l]
    }

    /// The per-layer thresholds.
    pub fn thresholds(&self) -> &[f32] {
        &self.thresholds
    }

    /// The score of every neuron of an observed FFN step of layer `layer` (`act_gate`, `up`: `n × d_ff`),
    /// into `out` (cleared first).
    pub fn scores_into(&self, layer: usize, act_gate: &[f32], up: &[f32], out: &mut Vec<f32>) {
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
                        .map(|((&a, &u), &n)| self.score.of(a, u, n))
                }),
        );
    }

    /// Bytes of the transposed down matrices.
    pub fn down_t_bytes(&self) -> usize {
        self.down_t.iter().map(Vec::len).sum()
    }

    /// Work counters since the last [`SparseFfn::reset_stats`].
    pub fn stats(&self) -> SparseStats {
        let c = &self.counters;
        SparseStats {
            tokens: c.tokens.load(Ordering::Relaxed),
            neurons: c.neurons.load(Ordering::Relaxed),
            gate_rows: c.gate_rows.load(Ordering::Relaxed),
            up_rows: c.up_rows.load(Ordering::Relaxed),
            down_rows: c.down_rows.load(Ordering::Relaxed),
        }
    }

    /// Zeroes the work counters.
    pub fn reset_stats(&self) {
        let c = &self.counters;
        for a in [
            &c.tokens,
            &c.neurons,
            &c.gate_rows,
            &c.up_rows,
            &c.down_rows,
        ] {
            a.store(0, Ordering::Relaxed);
        }
    }

    fn down_t(&self, layer: usize) -> Result<QMatrix<'_>> {
        QMatrix::new(
            self.down_t_format,
            self.d_ff,
            self.d_model,
            &self.down_t[layer],
        )
        .map_err(kernel("transposed ffn down"))
    }

    /// One token's FFN of layer `li`: `out = down(act(gate x) * up x)` over the active neurons only.
    pub(crate) fn decode(
        &self,
        li: usize,
        layer: &Layer<'_>,
        x: &[f32],
        out: &mut [f32],
        precision: Precision,
    ) -> Result<()> {
        let mut predicted = Vec::new();
        let all = self.predictor.is_none();
        let rows: &[u32] = match &self.predictor {
            Some(p) => {
                p.predict(li, x, &mut predicted)?;
                &predicted
            }
            None => &self.all_rows,
        };
        if let Some(off) = &self.offload {
            let (g, u, dn) = off.decode(self, li, rows, x, out, precision)?;
            self.count(li, g, u, dn);
            return Ok(());
        }
        let t = self.thresholds[li];
        let norms = &self.down_norms[li];
        let mut keep = Vec::with_capacity(rows.len());
        let mut coeffs = Vec::with_capacity(rows.len());
        let up_rows;
        match self.score {
            Score::Gate => {
                // Two phases: gate rows, then up rows of the neurons whose |act(gate)| passes.
                let mut a = vec![0.0f32; rows.len()];
                up_rows = kernels_neon::gate_up_sparse(
                    &layer.gate,
                    &layer.up,
                    rows,
                    x,
                    t,
                    self.activation,
                    &mut a,
                    precision,
                )
                .map_err(kernel("sparse ffn gate/up"))?;
                for (&r, &v) in rows.iter().zip(&a) {
                    if v != 0.0 {
                        keep.push(r);
                        coeffs.push(v);
                    }
                }
            }
            Score::GateNorm => {
                // Two phases with per-neuron thresholds t / ‖down_j‖: gate rows, then up rows of the
                // survivors. (GateNorm is kept for experiments; it is not the default.)
                let mut g = vec![0.0f32; rows.len()];
                kernels_neon::matvec_rows(&layer.gate, rows, x, &mut g, precision)
                    .map_err(kernel("sparse ffn gate"))?;
                let mut survivors = Vec::with_capacity(rows.len());
                let mut acts = Vec::with_capacity(rows.len());
                for (&r, &gv) in rows.iter().zip(&g) {
                    let a = self.act(gv);
                    if self.score.of(a, 0.0, norms[r as usize]) > t {
                        survivors.push(r);
                        acts.push(a);
                    }
                }
                let mut u = vec![0.0f32; survivors.len()];
                kernels_neon::matvec_rows(&layer.up, &survivors, x, &mut u, precision)
                    .map_err(kernel("sparse ffn up"))?;
                up_rows = survivors.len();
                for ((&r, &a), &uv) in survivors.iter().zip(&acts).zip(&u) {
                    let v = a * uv;
                    if v != 0.0 {
                        keep.push(r);
                        coeffs.push(v);
                    }
                }
            }
            Score::OutputNorm => {
                // Gate and up of the predicted rows (all rows without a predictor), then the down
                // columns of the neurons whose contribution |act(g)·u|·‖down_j‖ passes the threshold.
                let mut g = vec![0.0f32; rows.len()];
                let mut u = vec![0.0f32; rows.len()];
                if all {
                    kernels_neon::matvec_many(
                        &[&layer.gate, &layer.up],
                        x,
                        &mut [&mut g[..], &mut u[..]],
                        precision,
                    )
                    .map_err(kernel("sparse ffn gate/up"))?;
                } else {
                    kernels_neon::matvec_rows(&layer.gate, rows, x, &mut g, precision)
                        .map_err(kernel("sparse ffn gate"))?;
                    kernels_neon::matvec_rows(&layer.up, rows, x, &mut u, precision)
                        .map_err(kernel("sparse ffn up"))?;
                }
                up_rows = rows.len();
                for ((&r, &gv), &uv) in rows.iter().zip(&g).zip(&u) {
                    let v = self.act(gv) * uv;
                    if v.abs() * norms[r as usize] > t {
                        keep.push(r);
                        coeffs.push(v);
                    }
                }
            }
        }
        out.fill(0.0);
        kernels_neon::axpy_rows(&self.down_t(li)?, &keep, &coeffs, out)
            .map_err(kernel("sparse ffn down"))?;
        self.count(li, rows.len(), up_rows, keep.len());
        Ok(())
    }

    fn count(&self, li: usize, gate: usize, up: usize, down: usize) {
        let c = &self.counters;
        if li == 0 {
            c.tokens.fetch_add(1, Ordering::Relaxed);
        }
        c.neurons.fetch_add(self.d_ff as u64, Ordering::Relaxed);
        c.gate_rows.fetch_add(gate as u64, Ordering::Relaxed);
        c.up_rows.fetch_add(up as u64, Ordering::Relaxed);
        c.down_rows.fetch_add(down as u64, Ordering::Relaxed);
    }

    #[inline]
    pub(crate) fn act(&self, g: f32) -> f32 {
        self.activation.apply(g)
    }

    /// Batched form: zeroes, in `act` (`n × d_ff` activated gate values, before the multiplication by
    /// up), every neuron that sparse decode would not compute for that token.
    pub(crate) fn mask(
        &self,
        li: usize,
        x: &[f32],
        n: usize,
        act: &mut [f32],
        up: &[f32],
    ) -> Result<()> {
        let t = self.thresholds[li];
        let norms = &self.down_norms[li];
        let score = self.score;
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

    /// Batched down projection with the same transposed rows as [`SparseFfn::decode`], so that batched
    /// steps (prefill, perplexity) see the numerics of sparse decode: for each of the `n` tokens,
    /// `out_t = Σ_j h_t[j] · down_t[j]` over the nonzero `h_t[j]` (`h`: `n × d_ff` masked activations).
    pub(crate) fn down_batch(&self, li: usize, h: &[f32], n: usize, out: &mut [f32]) -> Result<()> {
        let down_t = self.down_t(li)?;
        let (ff, d) = (self.d_ff, self.d_model);
        out.par_chunks_mut(d)
            .zip(h.par_chunks(ff))
            .take(n)
            .try_for_each(|(o, ht)| {
                let (rows, coeffs): (Vec<u32>, Vec<f32>) = ht
                    .iter()
                    .enumerate()
                    .filter(|(_, v)| **v != 0.0)
                    .map(|(j, &v)| (j as u32, v))
                    .unzip();
                o.fill(0.0);
                kernels_neon::axpy_rows(&down_t, &rows, &coeffs, o)
                    .map_err(kernel("sparse ffn down (batched)"))
            })
    }
}

/// `w` (`rows × cols`) transposed into `cols × rows` in `format`.
fn check_thresholds(thresholds: &[f32], n_layers: usize) -> Result<()> {
    if thresholds.len() != n_layers {
        return Err(EngineError::Request(format!(
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
        return Err(EngineError::Request(format!(
            "sparse FFN: threshold of layer {l} is {t}, not a finite value >= 0"
        )));
    }
    Ok(())
}

fn transpose(
    w: &QMatrix<'_>,
    format: WeightFormat,
) -> std::result::Result<Vec<u8>, kernels_neon::KernelError> {
    let (rows, cols) = (w.rows(), w.cols());
    let mut dense = vec![0.0f32; rows * cols];
    for (r, out) in dense.chunks_exact_mut(cols.max(1)).enumerate().take(rows) {
        kernels_neon::dequantize_row(w.format(), w.row_data(r), out)?;
    }
    let mut t = vec![0.0f32; rows * cols];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = dense[r * cols + c];
        }
    }
    kernels_neon::quantize_matrix(format, &t, cols, rows)
}

/// Calibrates one threshold per layer from samples of the neuron score ([`Score`]): the `sparsity`
/// quantile of each layer's samples (so that a share `sparsity` of the sampled scores is at or below it).
/// `samples[l]` is reordered.
pub fn thresholds_for_sparsity(samples: &mut [Vec<f32>], sparsity: f32) -> Result<Vec<f32>> {
    if !(0.0..=1.0).contains(&sparsity) {
        return Err(EngineError::Request(format!(
            "target sparsity {sparsity} is not within 0..=1"
        )));
    }
    samples
        .iter_mut()
        .enumerate()
        .map(|(l, s)| {
            if s.is_empty() {
                return Err(EngineError::Request(format!(
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
mod tests {
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
