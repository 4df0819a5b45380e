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
//! (`FfnExecutor::mask`), and use the same transposed down rows, so perplexity measured with a
//! [`SparseFfn`] is the quality sparse decode has.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use kernels_neon::{Precision, QMatrix, WeightFormat};
use rayon::prelude::*;

use crate::error::{kernel, OffloadError, Result};
use crate::neurons::{
    check_thresholds, GateUpRows, NeuronSelector, Precomputed, RowCounts, SelectScratch,
};
pub use crate::neurons::{thresholds_for_sparsity, NeuronPredictor, Score};
use crate::{Offload, OffloadOptions, PrefillMask};
use transformer::config::ModelConfig;
use transformer::ffn::{DenseFfn, FfnExecutor, FfnLayer, FfnScratch, StepKind};
use transformer::layer::GatedFfn;
use transformer::model::Model;
use transformer::ops::mm;
use transformer::transpose::TransposedDown;
pub use transformer::transpose::DEFAULT_DOWN_FORMAT;

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

/// The sparse FFN of a model: a neuron selector (per-layer thresholds on a [`Score`], down-row
/// norms, an optional predictor) and the weights it computes from, in memory or offloaded to a
/// neuron store. An [`FfnExecutor`].
pub struct SparseFfn {
    /// How a neuron's score is computed.
    pub score: Score,
    selector: NeuronSelector,
    counters: SparseCounters,
    weights: Weights,
    /// Layers run dense ([`SparseFfn::with_dense_layers`]; empty: none).
    dense: Vec<bool>,
    /// Batch sizes from which a decode step of several sequences runs every layer dense, and
    /// whether it does ([`SparseFfn::with_dense_batches`]; ascending, empty: none).
    batches: Vec<(usize, bool)>,
}

/// Where a [`SparseFfn`]'s weights are.
enum Weights {
    /// The model's gate and up matrices, and its down matrices transposed to one row per neuron.
    Memory {
        down_t: Vec<Vec<u8>>,
        format: WeightFormat,
    },
    /// A neuron store read through the flash offload ([`crate::Offload`]).
    Store(Box<Offload>),
}

impl SparseFfn {
    /// Builds the sparse FFN of `model` with one threshold per layer (on [`SparseFfn::score`], the
    /// default [`Score::OutputNorm`] unless changed), transposing every down matrix into `down_format`.
    pub fn new(model: &Model<'_>, thresholds: Vec<f32>, down_format: WeightFormat) -> Result<Self> {
        let cfg = &model.config;
        model.refuse_moe("activation sparsity (--sparse, profile, predictors)")?;
        check_thresholds(&thresholds, cfg.n_layers)?;
        let down = TransposedDown::of(model, down_format)?;
        Ok(SparseFfn {
            score: Score::OutputNorm,
            selector: NeuronSelector::new(
                thresholds,
                cfg.activation,
                down.norms,
                cfg.d_model,
                cfg.d_ff,
            ),
            counters: SparseCounters::default(),
            weights: Weights::Memory {
                down_t: down.rows,
                format: down_format,
            },
            dense: Vec::new(),
            batches: Vec::new(),
        })
    }

    /// The sparse FFN of a resident model whose FFN weights are in the neuron store at `store`
    /// ([`crate::Offload`]): thresholds per layer as in [`SparseFfn::new`], weights read through an
    /// [`Offload`] with `opts` (budget, I/O thread). Decode steps (one token, or one of each of
    /// several sequences) run token by token over the store; a prompt streams each layer once.
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
            return Err(OffloadError::BadModel {
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
        let norms = ix.layers.iter().map(|l| l.down_norms.clone()).collect();
        Ok(SparseFfn {
            score: Score::OutputNorm,
            selector: NeuronSelector::new(
                thresholds,
                config.activation,
                norms,
                config.d_model,
                config.d_ff,
            ),
            counters: SparseCounters::default(),
            weights: Weights::Store(Box::new(off)),
            dense: Vec::new(),
            batches: Vec::new(),
        })
    }

    /// The flash offload, when the weights are in a neuron store.
    pub fn offload(&self) -> Option<&Offload> {
        match &self.weights {
            Weights::Store(off) => Some(off),
            Weights::Memory { .. } => None,
        }
    }

    /// The flash offload, mutably (to set its prompt accelerator), when the weights are in a
    /// neuron store.
    pub fn offload_mut(&mut self) -> Option<&mut Offload> {
        match &mut self.weights {
            Weights::Store(off) => Some(off),
            Weights::Memory { .. } => None,
        }
    }

    /// Uses `predictor` to choose the gate rows of each decode step (without one, every gate row is
    /// computed and only the threshold makes the FFN sparse).
    pub fn with_predictor(mut self, predictor: Box<dyn NeuronPredictor>) -> Self {
        self.selector.set_predictor(predictor);
        self
    }

    /// Runs the layers `dense` marks dense (`dense[l]`: every neuron from the model's own
    /// matrices, no predictor, no selection), the others sparse: a plan's choice where a layer's
    /// sparsity does not pay for its predictor. In memory only (over a neuron store every layer is
    /// sparse); frees the dense layers' transposed down rows.
    pub fn with_dense_layers(mut self, dense: Vec<bool>) -> Result<Self> {
        let layers = self.selector.thresholds().len();
        if dense.len() != layers {
            return Err(OffloadError::Request(format!(
                "dense layers given for {} layers, the model has {layers}",
                dense.len()
            )));
        }
        match &mut self.weights {
            Weights::Store(_) if dense.iter().any(|&d| d) => {
                return Err(OffloadError::Request(
                    "a neuron store's layers run sparse: none can be dense".into(),
                ))
            }
            Weights::Store(_) => {}
            Weights::Memory { down_t, .. } => {
                for (rows, _) in down_t.iter_mut().zip(&dense).filter(|(_, &d)| d) {
                    *rows = Vec::new();
                }
            }
        }
        self.dense = dense;
        Ok(self)
    }

    /// Whether layer `l` runs dense ([`SparseFfn::with_dense_layers`]).
    pub fn is_dense(&self, l: usize) -> bool {
        self.dense.get(l).copied().unwrap_or(false)
    }

    /// Runs decode steps of several sequences with every layer dense where `batches` says so:
    /// `(size, dense)` pairs (a plan's batch sizes 2, 4, 8), a step of `n` sequences taking the
    /// pair of the largest size up to `n` (none: sparse). Where a batch shares its weight reads,
    /// the dense step can beat the sparse one, which runs token by token. In memory only.
    pub fn with_dense_batches(mut self, mut batches: Vec<(usize, bool)>) -> Result<Self> {
        if self.offload().is_some() && batches.iter().any(|b| b.1) {
            return Err(OffloadError::Request(
                "a neuron store's layers run sparse: no batch can be dense".into(),
            ));
        }
        batches.sort_unstable();
        self.batches = batches;
        Ok(self)
    }

    /// Whether a decode step of `n` sequences runs every layer dense
    /// ([`SparseFfn::with_dense_batches`]).
    pub fn dense_batch(&self, n: usize) -> bool {
        n > 1
            && self
                .batches
                .iter()
                .rev()
                .find(|b| b.0 <= n)
                .is_some_and(|b| b.1)
    }

    /// The FFN of a layer that runs dense.
    fn dense_ffn(&self, l: usize) -> DenseFfn {
        DenseFfn::new(self.selector.rule(l, self.score).activation)
    }

    /// Whether a predictor chooses the gate rows.
    pub fn has_predictor(&self) -> bool {
        self.selector.has_predictor()
    }

    /// Per-neuron importance weights of layer `l` (down-column norms).
    pub fn down_norms(&self, l: usize) -> &[f32] {
        self.selector.down_norms(l)
    }

    /// The per-layer thresholds.
    pub fn thresholds(&self) -> &[f32] {
        self.selector.thresholds()
    }

    /// The score of every neuron of an observed FFN step of layer `layer` (`act_gate`, `up`: `n × d_ff`),
    /// into `out` (cleared first).
    pub fn scores_into(&self, layer: usize, act_gate: &[f32], up: &[f32], out: &mut Vec<f32>) {
        self.selector
            .scores_into(self.score, layer, act_gate, up, out)
    }

    /// Bytes of the transposed down matrices (0 when offloaded).
    pub fn down_t_bytes(&self) -> usize {
        match &self.weights {
            Weights::Memory { down_t, .. } => down_t.iter().map(Vec::len).sum(),
            Weights::Store(_) => 0,
        }
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

    fn count(&self, li: usize, (gate, up, down): RowCounts) {
        let c = &self.counters;
        if li == 0 {
            c.tokens.fetch_add(1, Ordering::Relaxed);
        }
        c.neurons
            .fetch_add(self.selector.d_ff() as u64, Ordering::Relaxed);
        c.gate_rows.fetch_add(gate as u64, Ordering::Relaxed);
        c.up_rows.fetch_add(up as u64, Ordering::Relaxed);
        c.down_rows.fetch_add(down as u64, Ordering::Relaxed);
    }

    /// One token's FFN over in-memory weights: `out = Σ_j a_j · down_t[j]` over the neurons of
    /// `rows` that pass, gate and up from `src` (`all`: of every row, whole-matrix products or
    /// computed beforehand), less those `skip` marks where `all`. Returns the rows computed.
    fn decode_in_memory(
        &self,
        l: FfnLayer<'_, '_>,
        src: &mut impl GateUpRows,
        (rows, all): (&[u32], bool),
        out: &mut [f32],
        down_t: QMatrix<'_>,
        skip: Option<&[bool]>,
    ) -> Result<RowCounts> {
        let rule = self.selector.rule(l.index, self.score);
        let mut keep = Vec::with_capacity(rows.len());
        let mut coeffs = Vec::with_capacity(rows.len());
        let up_rows = rule.select(
            src,
            rows,
            |i| rows[i] as usize,
            &mut SelectScratch::default(),
            &mut keep,
            &mut coeffs,
        )?;
        if let Some(skip) = skip.filter(|_| all) {
            // Computed in the whole-matrix products, left to the accelerator.
            (keep, coeffs) = keep
                .iter()
                .zip(&coeffs)
                .filter(|(&j, _)| !skip[j as usize])
                .map(|(&j, &c)| (j, c))
                .unzip();
        }
        out.fill(0.0);
        kernels_neon::axpy_rows(&down_t, &keep, &coeffs, out).map_err(kernel("sparse ffn down"))?;
        Ok((rows.len(), up_rows, keep.len()))
    }

    /// Layer `li`'s transposed down matrix, when the weights are in memory.
    fn down_t(&self, li: usize) -> Result<Option<QMatrix<'_>>> {
        match &self.weights {
            Weights::Memory { down_t, format } => self.transposed(down_t, *format, li).map(Some),
            Weights::Store(_) => Ok(None),
        }
    }

    fn transposed<'a>(
        &self,
        down_t: &'a [Vec<u8>],
        format: WeightFormat,
        li: usize,
    ) -> Result<QMatrix<'a>> {
        let (ff, d) = (self.selector.d_ff(), self.selector.d_model());
        QMatrix::new(format, ff, d, &down_t[li]).map_err(kernel("transposed ffn down"))
    }

    /// Batched down projection with the same transposed rows as sparse decode: for each of the `n`
    /// tokens, `out_t = Σ_j h_t[j] · down_t[j]` (`h`: `n × d_ff` masked activations), by
    /// [`kernels_neon::matmul_t`] in `precision` (f32 sums of the dequantized rows, or 8-bit
    /// products of long prompts outside `Exact`), in chunks of [`DOWN_CHUNK`] rows as a streamed
    /// prompt over a neuron store takes them.
    fn down_batch(
        &self,
        down_t: &QMatrix<'_>,
        h: &[f32],
        n: usize,
        out: &mut [f32],
        precision: Precision,
    ) -> Result<()> {
        let (ff, d) = (self.selector.d_ff(), self.selector.d_model());
        let out = &mut out[..n * d];
        out.fill(0.0);
        let row = down_t.row_bytes();
        let (mut hc, mut y) = (Vec::with_capacity(n * DOWN_CHUNK), vec![0f32; n * d]);
        for j0 in (0..ff).step_by(DOWN_CHUNK) {
            let k = DOWN_CHUNK.min(ff - j0);
            hc.clear();
            for ht in h.chunks(ff).take(n) {
                hc.extend_from_slice(&ht[j0..j0 + k]);
            }
            let rows = QMatrix::new(
                down_t.format(),
                k,
                d,
                &down_t.data()[j0 * row..(j0 + k) * row],
            )
            .map_err(kernel("sparse ffn down (batched)"))?;
            kernels_neon::matmul_t(&rows, &hc, n, &mut y, precision)
                .map_err(kernel("sparse ffn down (batched)"))?;
            out.par_chunks_mut(d)
                .zip(y.par_chunks(d))
                .for_each(|(o, yt)| kernels_neon::axpy_f32(1.0, yt, o));
        }
        Ok(())
    }
}

/// Rows of the transposed down matrix per batched product of an in-memory prompt step.
const DOWN_CHUNK: usize = 512;

impl FfnExecutor for SparseFfn {
    /// One token's FFN of the layer: `out = down(act(gate x) * up x)` over the active neurons only.
    fn decode(
        &self,
        l: FfnLayer<'_, '_>,
        x: &[f32],
        out: &mut [f32],
        scratch: &mut FfnScratch,
    ) -> transformer::Result<()> {
        if self.is_dense(l.index) {
            return self.dense_ffn(l.index).decode(l, x, out, scratch);
        }
        Ok(self.decode_except(l, x, out, None)?)
    }

    /// In memory: gate and up computed densely, the neurons sparse decode would skip masked out
    /// ([`FfnExecutor::mask`]), then the transposed down rows. Offloaded, a prompt streams the
    /// store's units once for all its tokens (`Offload::prefill`, masked the same way). Decode
    /// tokens of one step (several sequences, or a speculative verification) are each computed
    /// as their own decode step would: over the store with each unit read once for the step
    /// (`Offload::decode_many`), in memory token by token (without a predictor, gate and up of
    /// every token from one batched product first), or dense where
    /// [`SparseFfn::with_dense_batches`] says so.
    fn batch(
        &self,
        l: FfnLayer<'_, '_>,
        x: &[f32],
        n: usize,
        out: &mut [f32],
        scratch: &mut FfnScratch,
    ) -> transformer::Result<()> {
        if self.is_dense(l.index) || (l.kind == StepKind::Decode && self.dense_batch(n)) {
            return self.dense_ffn(l.index).batch(l, x, n, out, scratch);
        }
        Ok(self.batch_except(l, x, n, out, scratch, None)?)
    }

    /// A dense layer's neurons are all kept.
    fn mask(
        &self,
        layer: usize,
        x: &[f32],
        n: usize,
        act: &mut [f32],
        up: &[f32],
    ) -> transformer::Result<()> {
        if self.is_dense(layer) {
            return Ok(());
        }
        Ok(self.selector.mask(self.score, layer, x, n, act, up)?)
    }

    fn owns_weights(&self) -> bool {
        self.offload().is_some()
    }
}

impl SparseFfn {
    /// [`FfnExecutor::decode`] leaving out the neurons `skip` marks (`skip[j]`: neuron `j` is computed
    /// elsewhere, e.g. on an accelerator): `out` holds the contribution of the others.
    pub(crate) fn decode_except(
        &self,
        l: FfnLayer<'_, '_>,
        x: &[f32],
        out: &mut [f32],
        skip: Option<&[bool]>,
    ) -> Result<()> {
        self.decode_with(l, x, out, skip, None)
    }

    /// [`Self::decode_except`], gate and up of every row taken from `pre` where given (in memory,
    /// without a predictor: see [`Self::batch_except`]).
    fn decode_with(
        &self,
        l: FfnLayer<'_, '_>,
        x: &[f32],
        out: &mut [f32],
        skip: Option<&[bool]>,
        pre: Option<Precomputed<'_>>,
    ) -> Result<()> {
        let mut predicted = Vec::new();
        let rows = self.selector.candidates(l.index, x, &mut predicted)?;
        // The candidates the skip mask leaves.
        let unskipped = |skip: &[bool]| -> Vec<u32> {
            rows.iter()
                .copied()
                .filter(|&j| !skip[j as usize])
                .collect()
        };
        let counts = match &self.weights {
            Weights::Store(off) => {
                let kept = skip.map(unskipped);
                off.decode(
                    self.selector.rule(l.index, self.score),
                    l.index,
                    kept.as_deref().unwrap_or(rows),
                    x,
                    out,
                    l.precision,
                )?
            }
            Weights::Memory { down_t, format } => {
                let down_t = self.transposed(down_t, *format, l.index)?;
                // Without a predictor every gate and up row is computed in whole-matrix products
                // (contiguous rows) and the skipped neurons dropped after, unless they are most
                // of the layer (`planner::whole_matrix`); only then is the row list made.
                let all = !self.selector.has_predictor()
                    && skip.is_none_or(|s| {
                        let kept = rows.iter().filter(|&&j| !s[j as usize]).count();
                        planner::whole_matrix(rows.len(), kept)
                    });
                let kept = skip.filter(|_| !all).map(unskipped);
                let rows = kept.as_deref().unwrap_or(rows);
                match pre.filter(|_| all) {
                    Some(mut pre) => {
                        self.decode_in_memory(l, &mut pre, (rows, all), out, down_t, skip)?
                    }
                    None => {
                        let mut src = MatrixRows {
                            layer: l.weights,
                            x,
                            precision: l.precision,
                            all,
                            activation: self.selector.rule(l.index, self.score).activation,
                        };
                        self.decode_in_memory(l, &mut src, (rows, all), out, down_t, skip)?
                    }
                }
            }
        };
        self.count(l.index, counts);
        Ok(())
    }

    /// [`FfnExecutor::batch`] leaving out the neurons `skip` marks, as [`Self::decode_except`].
    pub(crate) fn batch_except(
        &self,
        l: FfnLayer<'_, '_>,
        x: &[f32],
        n: usize,
        out: &mut [f32],
        scratch: &mut FfnScratch,
        skip: Option<&[bool]>,
    ) -> Result<()> {
        // A prompt over the store: streamed, each unit read once for all the step's tokens.
        if let (StepKind::Prompt, Weights::Store(off)) = (l.kind, &self.weights) {
            let keep = self.selector.candidate_mask(l.index, x, n)?;
            let mask = PrefillMask {
                keep: keep.as_deref(),
                skip,
            };
            let rule = self.selector.rule(l.index, self.score);
            return off.prefill(rule, mask, l.index, x, n, out, l.precision);
        }
        // One decode token of each of several sequences (each computed as its own decode step, so
        // a batch selects what sequential runs would).
        let down_t = match l.kind {
            StepKind::Decode => None,
            StepKind::Prompt => self.down_t(l.index)?,
        };
        let Some(down_t) = down_t else {
            let (d, ff) = (self.selector.d_model(), self.selector.d_ff());
            // In memory without a predictor each token's step computes gate and up of every row
            // (whole-matrix products, under `OutputNorm`): one batched product reads the weights
            // once for every token, bit for bit the same values.
            let batched = matches!(self.weights, Weights::Memory { .. })
                && n > 1
                && !self.selector.has_predictor()
                && self.score == Score::OutputNorm
                && skip
                    .is_none_or(|s| planner::whole_matrix(ff, s.iter().filter(|&&h| !h).count()));
            if batched {
                let (g, u) = scratch.gate_up(n * ff);
                kernels_neon::matvec_batch_many(
                    &[&l.weights.gate, &l.weights.up],
                    x,
                    n,
                    &mut [&mut *g, &mut *u],
                    l.precision,
                )
                .map_err(kernel("sparse ffn batched gate/up"))?;
                let (g, u) = (&*g, &*u);
                for (t, (xt, ot)) in x.chunks(d).zip(out.chunks_mut(d)).enumerate() {
                    let pre = Precomputed {
                        g: &g[t * ff..(t + 1) * ff],
                        u: &u[t * ff..(t + 1) * ff],
                    };
                    self.decode_with(l, xt, ot, skip, Some(pre))?;
                }
                return Ok(());
            }
            if let Weights::Store(off) = &self.weights {
                return self.decode_store_many(off, l, x, n, out, skip);
            }
            for (xt, ot) in x.chunks(d).zip(out.chunks_mut(d)) {
                self.decode_except(l, xt, ot, skip)?;
            }
            return Ok(());
        };
        let (w, li) = (l.weights, l.index);
        let (g, u) = scratch.gate_up(n * self.selector.d_ff());
        mm(&w.gate, x, n, g, l.precision, "ffn gate")?;
        mm(&w.up, x, n, u, l.precision, "ffn up")?;
        let act = self.selector.rule(li, self.score).activation;
        g.par_chunks_mut(1024).for_each(|c| {
            c.iter_mut()
                .for_each(|v| *v = kernels_neon::act_value(act, *v))
        });
        self.mask(li, x, n, g, u)?;
        if let Some(skip) = skip {
            let ff = self.selector.d_ff();
            g.par_chunks_mut(ff).for_each(|row| {
                row.iter_mut()
                    .zip(skip)
                    .filter(|(_, &s)| s)
                    .for_each(|(v, _)| *v = 0.0)
            });
        }
        g.par_chunks_mut(1024)
            .zip(u.par_chunks(1024))
            .for_each(|(a, b)| a.iter_mut().zip(b).for_each(|(a, b)| *a *= b));
        self.down_batch(&down_t, g, n, out, l.precision)
    }
}

impl SparseFfn {
    /// Decode tokens of one step over the store, each unit any of them wants read once for all
    /// ([`Offload::decode_many`]): each token's candidates (less `skip`) as its own decode step
    /// would choose them, so each token's output is that step's, bit for bit.
    fn decode_store_many(
        &self,
        off: &Offload,
        l: FfnLayer<'_, '_>,
        x: &[f32],
        n: usize,
        out: &mut [f32],
        skip: Option<&[bool]>,
    ) -> Result<()> {
        let rows = self.token_rows(l.index, x, n, skip)?;
        let refs: Vec<&[u32]> = rows.iter().map(Vec::as_slice).collect();
        let rule = self.layer_rule(l.index);
        let counts = off.decode_many(rule, l.index, &refs, x, out, l.precision)?;
        self.count(l.index, counts);
        let c = &self.counters;
        if l.index == 0 {
            c.tokens.fetch_add(n as u64 - 1, Ordering::Relaxed);
        }
        let more = (self.selector.d_ff() * (n - 1)) as u64;
        c.neurons.fetch_add(more, Ordering::Relaxed);
        Ok(())
    }

    /// The candidates of each of the `n` tokens of `x` in layer `li` (less those `skip` marks), as
    /// a decode step of each would choose them.
    pub(crate) fn token_rows(
        &self,
        li: usize,
        x: &[f32],
        n: usize,
        skip: Option<&[bool]>,
    ) -> Result<Vec<Vec<u32>>> {
        let d = self.selector.d_model();
        let mut rows: Vec<Vec<u32>> = Vec::with_capacity(n);
        for xt in x.chunks(d).take(n) {
            let mut predicted = Vec::new();
            let cand = self.selector.candidates(li, xt, &mut predicted)?;
            rows.push(match skip {
                Some(s) => cand.iter().copied().filter(|&j| !s[j as usize]).collect(),
                None => cand.to_vec(),
            });
        }
        Ok(rows)
    }

    /// Layer `li`'s selection rule (score and threshold).
    pub(crate) fn layer_rule(&self, li: usize) -> crate::neurons::LayerRule<'_> {
        self.selector.rule(li, self.score)
    }
}

/// The gate and up rows of in-memory sparse decode: the model's matrices.
struct MatrixRows<'a, 'w> {
    layer: &'a GatedFfn<'w>,
    x: &'a [f32],
    precision: Precision,
    /// Every row is a candidate (no predictor): gate and up as whole matrix-vector products.
    all: bool,
    activation: kernels_neon::Activation,
}

impl GateUpRows for MatrixRows<'_, '_> {
    fn gate(&mut self, rows: &[u32], g: &mut [f32]) -> Result<()> {
        kernels_neon::matvec_rows(&self.layer.gate, rows, self.x, g, self.precision)
            .map_err(kernel("sparse ffn gate"))
    }

    fn up(&mut self, rows: &[u32], u: &mut [f32]) -> Result<()> {
        kernels_neon::matvec_rows(&self.layer.up, rows, self.x, u, self.precision)
            .map_err(kernel("sparse ffn up"))
    }

    fn gate_up(&mut self, rows: &[u32], g: &mut [f32], u: &mut [f32]) -> Result<()> {
        if self.all {
            kernels_neon::matvec_many(
                &[&self.layer.gate, &self.layer.up],
                self.x,
                &mut [g, u],
                self.precision,
            )
            .map_err(kernel("sparse ffn gate/up"))
        } else {
            self.gate(rows, g)?;
            self.up(rows, u)
        }
    }

    /// Two phases in one kernel: gate rows, then up rows of the neurons whose |act(gate)| passes.
    fn gate_score_fused(
        &mut self,
        rows: &[u32],
        threshold: f32,
        out: &mut [f32],
    ) -> Option<Result<usize>> {
        Some(
            kernels_neon::gate_up_sparse(
                &self.layer.gate,
                &self.layer.up,
                rows,
                self.x,
                threshold,
                self.activation,
                out,
                self.precision,
            )
            .map_err(kernel("sparse ffn gate/up")),
        )
    }
}
