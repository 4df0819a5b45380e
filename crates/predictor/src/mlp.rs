//! Per-layer neuron activation predictors (PowerInfer section 5.1): a one-hidden-layer MLP
//! `sigmoid(W2 · relu(W1 · x + b1) + b2)` from the FFN input `x` (after the FFN RMSNorm, `d_in` floats) to
//! "which of the `n_out` FFN neurons fire".
//!
//! # Training ([`train`])
//!
//! 1. The [`Dataset`] is split into a training part and a held-out part ([`Dataset::split`], seeded).
//! 2. Inputs are standardized per dimension (mean/std of the training part, std floored at 5% of the
//!    median std); the affine map is folded into `W1`/`b1` after training, so the stored predictor takes
//!    raw inputs.
//! 3. For each candidate hidden size (`TrainConfig::hidden_sizes`, rounded up to a multiple of 32, in
//!    increasing order): train an f32 MLP with Adam on minibatches, loss = binary cross-entropy with a
//!    positive-class weight (`TrainConfig::pos_weight`, 0 = `sqrt(negatives/positives)` clamped to 1..=16,
//!    since a missed neuron costs accuracy and a false one only time). Batched products use
//!    `kernels_neon::matmul` on f32 matrices; everything else is sequential, so training is deterministic
//!    given `TrainConfig::seed` (on one machine and kernel path).
//! 4. Quantize `W1`, `W2` to `Q8_0` and compute the held-out logits with the quantized predictor itself.
//!    The decision threshold (one per layer, on the logit) is the largest value giving recall >=
//!    `target_recall` over all held-out (sample, neuron) pairs, i.e. the fewest predicted neurons.
//! 5. **Acceptance rule:** the first candidate with predicted fraction <= `max(1.25 * true_frac,
//!    true_frac + 0.05)` is taken. Otherwise the next (larger) candidate is tried as long as its stored size
//!    stays within `max_bytes`; when none is accepted, the candidate with the smallest predicted fraction
//!    wins. The smallest candidate is always trained, even if it exceeds `max_bytes`.
//!
//! # Cost
//!
//! One epoch costs about `6 · samples · hidden · (d_in + n_out)` flops (forward, two backward products per
//! layer) plus `samples · n_out` sigmoids. Measured on x86_64 AVX2 (2 cores shared with other jobs, so
//! rough) with `examples/train_cost.rs` (20k synthetic samples, 576 → 1536, 12% active, defaults): the
//! first candidate (hidden 32) was accepted after 8 epochs of ~0.3-0.5 s, about 4 s for the layer in all.
//! With batch 256 instead of 64 the same data needed hidden 128 and ~25 s. Fewer candidates
//! (`hidden_sizes`), epochs or samples are the knobs.
//!
//! # Inference
//!
//! [`Predictor::scores`] computes the logits with `kernels_neon::matvec` (`Precision::Fast`: 16-bit
//! activations, integer dot products) on the stored `Q8_0` weights; [`Predictor::predict`] lists the neurons whose logit is `> threshold`. Both reuse
//! per-thread scratch buffers (or an explicit [`Scratch`] with the `*_with` variants): no allocation per
//! call once warm.
//!
//! # Storage
//!
//! `W1` is `hidden × d_pad` (`d_pad` = `d_in` rounded up to 32, zero-padded), `W2` is `n_out × hidden`
//! (`hidden` a multiple of 32), both in ggml's `Q8_0` layout: per block of 32 weights an f16 scale
//! `d = max|w| / 127` (2 bytes, LE) then 32 `i8` quants `round(w / d)` (34 bytes per block).
//! [`Predictor::bytes`] = both weight matrices plus the f32 biases.
//!
//! # Predictor set file layout (version 1)
//!
//! Container (magic `SPRWPRED`, version, payload length, FNV-1a 64 checksum, atomic write): see the crate
//! docs. Payload, little-endian:
//!
//! ```text
//! u64  model_fingerprint
//! u32  L                       number of layers
//! L × {
//!   u32  d_in                  input width (> 0)
//!   u32  hidden                hidden width (> 0, multiple of 32)
//!   u32  n_out                 neurons predicted
//!   u8   weight format         8 = Q8_0 (the only one so far)
//!   f32  threshold             decision threshold on the logit
//!   u8 × hidden·(d_pad/32)·34  W1 (Q8_0 rows)
//!   f32 × hidden               b1
//!   u8 × n_out·(hidden/32)·34  W2 (Q8_0 rows)
//!   f32 × n_out                b2
//! }
//! ```

use std::cell::RefCell;
use std::path::Path;

use kernels_neon::{matmul, matvec, Precision, QMatrix, WeightFormat};
use rayon::prelude::*;

use crate::error::{input_err, PredictorError, Result};
use crate::file::{read_checked, write_atomic, Reader, Writer};
use crate::profile::next_down;

/// Magic of predictor set files.
pub const PREDICTOR_MAGIC: &[u8; 8] = b"SPRWPRED";
/// Version of the predictor set format this build reads and writes.
pub const PREDICTOR_VERSION: u32 = 1;
/// Kernel precision of inference: 16-bit activations and integer dot products on the `Q8_0` weights
/// (`kernels_neon::Precision::Fast`; the threshold is calibrated with the same kernels).
const PRECISION: Precision = Precision::Fast;
/// Weight format code of `Q8_0` in predictor files.
const FORMAT_Q8_0: u8 = 8;

// ---------------------------------------------------------------------------------------------------------
// Random numbers (deterministic, no dependency).

/// SplitMix64: small, fast, and good enough for shuffles and initialization.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x5851_f42d_4c95_7f2d)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `[0, 1)`.
    pub fn f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (((self.next_u64() >> 11) as u128 * n as u128) >> 53) as usize
    }
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i + 1);
            v.swap(i, j);
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// Dataset.

/// Training samples of one layer: inputs (`d_in` floats each) and the set of active neurons (a bitset of
/// `n_out` bits each).
#[derive(Debug, Clone, PartialEq)]
pub struct Dataset {
    d_in: usize,
    n_out: usize,
    words: usize,
    n: usize,
    inputs: Vec<f32>,
    labels: Vec<u64>,
}

impl Dataset {
    /// An empty dataset of `d_in`-wide inputs and `n_out` neurons.
    pub fn new(d_in: usize, n_out: usize) -> Self {
        Dataset {
            d_in,
            n_out,
            words: n_out.div_ceil(64),
            n: 0,
            inputs: Vec::new(),
            labels: Vec::new(),
        }
    }

    /// An empty dataset with room for `samples` samples (no reallocation while pushing that many).
    pub fn with_capacity(d_in: usize, n_out: usize, samples: usize) -> Self {
        let mut d = Self::new(d_in, n_out);
        d.inputs.reserve(samples.saturating_mul(d_in));
        d.labels.reserve(samples.saturating_mul(d.words));
        d
    }

    /// Input width.
    pub fn d_in(&self) -> usize {
        self.d_in
    }

    /// Number of neurons.
    pub fn n_out(&self) -> usize {
        self.n_out
    }

    /// Adds a sample: input `x` (`d_in` floats) and the indices of the active neurons (any order, each
    /// `< n_out`).
    pub fn push(&mut self, x: &[f32], active: &[u32]) -> Result<()> {
        self.check_x(x)?;
        if let Some(&j) = active.iter().find(|&&j| j as usize >= self.n_out) {
            return input_err(format!(
                "Dataset::push: neuron {j} out of range (n_out = {})",
                self.n_out
            ));
        }
        self.inputs.extend_from_slice(x);
        let base = self.labels.len();
        self.labels.resize(base + self.words, 0);
        self.n += 1;
        for &j in active {
            self.labels[base + j as usize / 64] |= 1 << (j % 64);
        }
        Ok(())
    }

    /// Adds a sample: input `x` (`d_in` floats) and `active(j)` for every neuron `j < n_out`.
    pub fn push_mask(&mut self, x: &[f32], active: impl Fn(usize) -> bool) -> Result<()> {
        self.check_x(x)?;
        self.inputs.extend_from_slice(x);
        let base = self.labels.len();
        self.labels.resize(base + self.words, 0);
        self.n += 1;
        for j in 0..self.n_out {
            if active(j) {
                self.labels[base + j / 64] |= 1 << (j % 64);
            }
        }
        Ok(())
    }

    fn check_x(&self, x: &[f32]) -> Result<()> {
        if x.len() != self.d_in {
            return input_err(format!(
                "Dataset: input has {} values, d_in is {}",
                x.len(),
                self.d_in
            ));
        }
        Ok(())
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.n
    }

    /// Whether there are no samples.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Input of sample `i` (`None` if out of range).
    pub fn input(&self, i: usize) -> Option<&[f32]> {
        let start = i.checked_mul(self.d_in)?;
        self.inputs.get(start..start.checked_add(self.d_in)?)
    }

    /// Whether neuron `j` is active in sample `i` (false if either is out of range).
    pub fn is_active(&self, i: usize, j: usize) -> bool {
        j < self.n_out
            && i < self.n
            && self
                .labels
                .get(i * self.words + j / 64)
                .is_some_and(|w| w >> (j % 64) & 1 == 1)
    }

    /// Fraction of (sample, neuron) pairs that are active (0 when empty).
    pub fn active_frac(&self) -> f32 {
        let total = self.len() * self.n_out;
        if total == 0 {
            return 0.0;
        }
        let ones: u64 = self.labels.iter().map(|w| u64::from(w.count_ones())).sum();
        (ones as f64 / total as f64) as f32
    }

    /// Splits into `(train, holdout)`: a seeded random `holdout` fraction (clamped to 0..=1, rounded down)
    /// goes to the second part.
    pub fn split(&self, holdout: f32, seed: u64) -> (Dataset, Dataset) {
        let n = self.len();
        let h = if holdout.is_nan() {
            0.0
        } else {
            holdout.clamp(0.0, 1.0)
        };
        let n_hold = ((f64::from(h) * n as f64).floor() as usize).min(n);
        let mut idx: Vec<usize> = (0..n).collect();
        Rng::new(seed).shuffle(&mut idx);
        let (hold, train) = idx.split_at(n_hold);
        (self.subset(train), self.subset(hold))
    }

    fn subset(&self, idx: &[usize]) -> Dataset {
        let mut d = Dataset::new(self.d_in, self.n_out);
        for &i in idx {
            d.inputs
                .extend_from_slice(&self.inputs[i * self.d_in..(i + 1) * self.d_in]);
            d.labels
                .extend_from_slice(&self.labels[i * self.words..(i + 1) * self.words]);
        }
        d.n = idx.len();
        d
    }
}

// ---------------------------------------------------------------------------------------------------------
// Configuration and reports.

/// Training settings; [`Default`] gives the values noted per field.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainConfig {
    /// Seed of the split, initialization and minibatch order (0).
    pub seed: u64,
    /// Recall the decision threshold must reach on the held-out samples (0.95).
    pub target_recall: f32,
    /// Hidden sizes tried in increasing order, each rounded up to a multiple of 32 (`[32, 64, 128, 256]`).
    pub hidden_sizes: Vec<usize>,
    /// Largest stored size of one layer's predictor in bytes ([`Predictor::bytes`]) (1 MiB).
    pub max_bytes: usize,
    /// Passes over the training samples per candidate (8).
    pub epochs: usize,
    /// Minibatch size (64: smaller batches converged much better per epoch at 576 → 1536, for about the
    /// same time per epoch).
    pub batch: usize,
    /// Adam learning rate (0.003).
    pub lr: f32,
    /// Fraction of samples held out to choose the threshold and measure recall (0.2). With no held-out
    /// samples (tiny datasets or 0) the training samples are used instead, and the report is optimistic.
    pub holdout: f32,
    /// Weight of positive labels in the loss; 0 = automatic (`sqrt(neg/pos)` clamped to 1..=16) (0).
    pub pos_weight: f32,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            seed: 0,
            target_recall: 0.95,
            hidden_sizes: vec![32, 64, 128, 256],
            max_bytes: 1 << 20,
            epochs: 8,
            batch: 64,
            lr: 0.003,
            holdout: 0.2,
            pos_weight: 0.0,
        }
    }
}

/// Held-out quality and size of a trained predictor (measured with the quantized weights).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerReport {
    /// Hidden size.
    pub hidden: usize,
    /// Fraction of truly active (sample, neuron) pairs predicted active.
    pub recall: f32,
    /// Fraction of predicted pairs truly active (1 when nothing is predicted).
    pub precision: f32,
    /// Fraction of all pairs predicted active.
    pub predicted_frac: f32,
    /// Fraction of all pairs truly active.
    pub true_frac: f32,
    /// Stored bytes ([`Predictor::bytes`]).
    pub bytes: usize,
    /// Decision threshold on the logit.
    pub threshold: f32,
}

/// Progress events of [`train`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TrainProgress {
    /// An epoch of a candidate finished.
    Epoch {
        /// Hidden size of the candidate.
        hidden: usize,
        /// Epochs done (1-based).
        epoch: usize,
        /// Epochs in all.
        epochs: usize,
        /// Mean weighted cross-entropy over the epoch (estimated on the first 8 samples of each minibatch).
        loss: f32,
    },
    /// A candidate was quantized and measured.
    Candidate {
        /// Its held-out report.
        report: LayerReport,
        /// Whether it met the acceptance rule (training stops).
        accepted: bool,
    },
}

// ---------------------------------------------------------------------------------------------------------
// Quantization.

/// Appends `row` (length a multiple of 32) as ggml `Q8_0` blocks: f16 scale `max|x|/127`, 32 × i8.
pub(crate) fn quantize_q8_0(row: &[f32], out: &mut Vec<u8>) {
    for block in row.chunks(32) {
        let amax = block
            .iter()
            .fold(0.0f32, |m, &v| if v.abs() > m { v.abs() } else { m });
        let d = amax / 127.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        out.extend_from_slice(&half::f16::from_f32(d).to_le_bytes());
        for i in 0..32 {
            let v = block.get(i).copied().unwrap_or(0.0);
            out.push(((v * id).round().clamp(-127.0, 127.0) as i8) as u8);
        }
    }
}

fn q8_bytes(rows: usize, cols: usize) -> Option<usize> {
    WeightFormat::Q8_0.row_bytes(cols)?.checked_mul(rows)
}

// ---------------------------------------------------------------------------------------------------------
// Predictor.

/// Reusable buffers of [`Predictor::scores_with`] / [`Predictor::predict_with`].
#[derive(Debug, Clone, Default)]
pub struct Scratch {
    x: Vec<f32>,
    h: Vec<f32>,
    z: Vec<f32>,
}

impl Scratch {
    /// Empty buffers (they grow on first use).
    pub fn new() -> Self {
        Self::default()
    }
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::new());
}

/// One layer's trained predictor, weights stored as `Q8_0` (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct Predictor {
    d_in: usize,
    d_pad: usize,
    hidden: usize,
    n_out: usize,
    w1: Vec<u8>,
    b1: Vec<f32>,
    w2: Vec<u8>,
    b2: Vec<f32>,
    threshold: f32,
}

impl Predictor {
    /// Builds a predictor from f32 weights: `w1` is `hidden × d_in` row-major, `b1` `hidden`, `w2`
    /// `n_out × hidden`, `b2` `n_out`; `threshold` is the decision threshold on the logit. `d_in` is padded
    /// to a multiple of 32 and `hidden` to a multiple of 32 with zeros, then the weights are quantized to
    /// `Q8_0`.
    #[allow(clippy::too_many_arguments)]
    pub fn from_f32(
        d_in: usize,
        hidden: usize,
        n_out: usize,
        w1: &[f32],
        b1: &[f32],
        w2: &[f32],
        b2: &[f32],
        threshold: f32,
    ) -> Result<Self> {
        let bad = |what: &str, want: Option<usize>, got: usize| {
            PredictorError::Input(format!(
                "Predictor::from_f32: {what} has {got} values, expected {want:?}"
            ))
        };
        if d_in == 0 || hidden == 0 {
            return input_err("Predictor::from_f32: d_in and hidden must be > 0");
        }
        if Some(w1.len()) != hidden.checked_mul(d_in) {
            return Err(bad("w1", hidden.checked_mul(d_in), w1.len()));
        }
        if Some(w2.len()) != n_out.checked_mul(hidden) {
            return Err(bad("w2", n_out.checked_mul(hidden), w2.len()));
        }
        if b1.len() != hidden {
            return Err(bad("b1", Some(hidden), b1.len()));
        }
        if b2.len() != n_out {
            return Err(bad("b2", Some(n_out), b2.len()));
        }
        let d_pad = d_in.next_multiple_of(32);
        let h_pad = hidden.next_multiple_of(32);
        let mut row = vec![0f32; d_pad];
        let mut q1 = Vec::with_capacity(q8_bytes(h_pad, d_pad).unwrap_or(0));
        for r in 0..h_pad {
            row.fill(0.0);
            if r < hidden {
                row[..d_in].copy_from_slice(&w1[r * d_in..(r + 1) * d_in]);
            }
            quantize_q8_0(&row, &mut q1);
        }
        let mut row = vec![0f32; h_pad];
        let mut q2 = Vec::with_capacity(q8_bytes(n_out, h_pad).unwrap_or(0));
        for r in 0..n_out {
            row[..hidden].copy_from_slice(&w2[r * hidden..(r + 1) * hidden]);
            quantize_q8_0(&row, &mut q2);
        }
        let mut b1p = b1.to_vec();
        b1p.resize(h_pad, 0.0);
        Ok(Predictor {
            d_in,
            d_pad,
            hidden: h_pad,
            n_out,
            w1: q1,
            b1: b1p,
            w2: q2,
            b2: b2.to_vec(),
            threshold,
        })
    }

    /// Input width.
    pub fn d_in(&self) -> usize {
        self.d_in
    }

    /// Hidden width (a multiple of 32).
    pub fn hidden(&self) -> usize {
        self.hidden
    }

    /// Number of neurons predicted.
    pub fn n_out(&self) -> usize {
        self.n_out
    }

    /// Decision threshold: neuron `j` is predicted active iff `logit[j] > threshold`.
    pub fn threshold(&self) -> f32 {
        self.threshold
    }

    /// Sets the decision threshold (e.g. to trade recall for speed at run time).
    pub fn set_threshold(&mut self, threshold: f32) {
        self.threshold = threshold;
    }

    /// Stored bytes: `Q8_0` weights of `W1` and `W2` plus the f32 biases.
    pub fn bytes(&self) -> usize {
        self.w1.len() + self.w2.len() + 4 * (self.b1.len() + self.b2.len())
    }

    /// Logits of all `n_out` neurons for input `x` (`d_in` floats) into `out` (`n_out` floats), using a
    /// per-thread scratch buffer.
    pub fn scores(&self, x: &[f32], out: &mut [f32]) -> Result<()> {
        SCRATCH.with(|s| match s.try_borrow_mut() {
            Ok(mut s) => self.scores_with(x, &mut s, out),
            Err(_) => self.scores_with(x, &mut Scratch::new(), out),
        })
    }

    /// [`scores`](Self::scores) with explicit scratch buffers.
    pub fn scores_with(&self, x: &[f32], scratch: &mut Scratch, out: &mut [f32]) -> Result<()> {
        if out.len() != self.n_out {
            return input_err(format!(
                "Predictor::scores: out has {} values, n_out is {}",
                out.len(),
                self.n_out
            ));
        }
        self.hidden_acts(x, scratch)?;
        let w2 = QMatrix::new(WeightFormat::Q8_0, self.n_out, self.hidden, &self.w2)?;
        matvec(&w2, &scratch.h, out, PRECISION)?;
        for (o, b) in out.iter_mut().zip(&self.b2) {
            *o += b;
        }
        Ok(())
    }

    fn hidden_acts(&self, x: &[f32], scratch: &mut Scratch) -> Result<()> {
        if x.len() != self.d_in {
            return input_err(format!(
                "Predictor: input has {} values, d_in is {}",
                x.len(),
                self.d_in
            ));
        }
        scratch.x.clear();
        scratch.x.extend_from_slice(x);
        scratch.x.resize(self.d_pad, 0.0);
        scratch.h.resize(self.hidden, 0.0);
        let w1 = QMatrix::new(WeightFormat::Q8_0, self.hidden, self.d_pad, &self.w1)?;
        matvec(&w1, &scratch.x, &mut scratch.h, PRECISION)?;
        for (h, b) in scratch.h.iter_mut().zip(&self.b1) {
            *h = (*h + b).max(0.0);
        }
        Ok(())
    }

    /// Neurons predicted active for input `x` (`d_in` floats): sorted indices `j` with
    /// `logit[j] > threshold`, written to `out` (cleared first). Uses a per-thread scratch buffer.
    pub fn predict(&self, x: &[f32], out: &mut Vec<u32>) -> Result<()> {
        SCRATCH.with(|s| match s.try_borrow_mut() {
            Ok(mut s) => self.predict_with(x, &mut s, out),
            Err(_) => self.predict_with(x, &mut Scratch::new(), out),
        })
    }

    /// [`predict`](Self::predict) with explicit scratch buffers.
    pub fn predict_with(&self, x: &[f32], scratch: &mut Scratch, out: &mut Vec<u32>) -> Result<()> {
        let mut z = std::mem::take(&mut scratch.z);
        z.resize(self.n_out, 0.0);
        let r = self.scores_with(x, scratch, &mut z);
        out.clear();
        if r.is_ok() {
            out.extend(
                z.iter()
                    .enumerate()
                    .filter(|(_, &v)| v > self.threshold)
                    .map(|(j, _)| j as u32),
            );
        }
        scratch.z = z;
        r
    }

    fn write(&self, w: &mut Writer) {
        w.u32(self.d_in as u32);
        w.u32(self.hidden as u32);
        w.u32(self.n_out as u32);
        w.u8(FORMAT_Q8_0);
        w.f32(self.threshold);
        w.bytes(&self.w1);
        w.f32s(&self.b1);
        w.bytes(&self.w2);
        w.f32s(&self.b2);
    }

    fn read(r: &mut Reader, li: usize) -> Result<Self> {
        let d_in = r.u32(&format!("layer {li} d_in"))? as usize;
        let hidden = r.u32(&format!("layer {li} hidden"))? as usize;
        let n_out = r.u32(&format!("layer {li} n_out"))? as usize;
        let fmt = r.u8(&format!("layer {li} weight format"))?;
        if fmt != FORMAT_Q8_0 {
            return Err(r.err(format!(
                "layer {li}: unknown weight format code {fmt} (8 = Q8_0)"
            )));
        }
        if d_in == 0 || hidden == 0 || hidden % 32 != 0 {
            return Err(r.err(format!(
                "layer {li}: bad shape d_in {d_in}, hidden {hidden} (both > 0, hidden a multiple of 32)"
            )));
        }
        let threshold = r.f32(&format!("layer {li} threshold"))?;
        let Some(d_pad) = d_in.checked_next_multiple_of(32) else {
            return Err(r.err(format!("layer {li}: d_in {d_in} too large")));
        };
        let overflow = r.err(format!(
            "layer {li}: shape {d_in} × {hidden} × {n_out} overflows"
        ));
        let (Some(n1), Some(n2)) = (q8_bytes(hidden, d_pad), q8_bytes(n_out, hidden)) else {
            return Err(overflow);
        };
        let w1 = r.take(n1, &format!("layer {li} W1"))?.to_vec();
        let b1 = r.f32s(hidden, &format!("layer {li} b1"))?;
        let w2 = r.take(n2, &format!("layer {li} W2"))?.to_vec();
        let b2 = r.f32s(n_out, &format!("layer {li} b2"))?;
        Ok(Predictor {
            d_in,
            d_pad,
            hidden,
            n_out,
            w1,
            b1,
            w2,
            b2,
            threshold,
        })
    }
}

/// The predictors of all layers of one model.
#[derive(Debug, Clone, PartialEq)]
pub struct PredictorSet {
    /// Caller-computed id of the model the predictors were trained for.
    pub model_fingerprint: u64,
    /// One predictor per layer.
    pub layers: Vec<Predictor>,
}

impl PredictorSet {
    /// Writes the set atomically (a temporary in the same folder, fsync, rename).
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let mut w = Writer::default();
        w.u64(self.model_fingerprint);
        w.u32(self.layers.len() as u32);
        for p in &self.layers {
            p.write(&mut w);
        }
        write_atomic(path.as_ref(), PREDICTOR_MAGIC, PREDICTOR_VERSION, &w.0)
    }

    /// Reads a set; corrupt, truncated, foreign or wrong-version files are errors naming `path`.
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let payload = read_checked(path, PREDICTOR_MAGIC, "predictor", PREDICTOR_VERSION)?;
        let mut r = Reader::new(path, &payload);
        let model_fingerprint = r.u64("model fingerprint")?;
        let n = r.u32("layer count")? as usize;
        let mut layers = Vec::new();
        for li in 0..n {
            layers.push(Predictor::read(&mut r, li)?);
        }
        r.finish()?;
        Ok(PredictorSet {
            model_fingerprint,
            layers,
        })
    }
}

// ---------------------------------------------------------------------------------------------------------
// Training.

/// Trains one layer's predictor on `data` (see the module docs for the procedure and the acceptance rule)
/// and reports its held-out quality. `progress` receives an event per epoch and per candidate.
pub fn train(
    data: &Dataset,
    cfg: &TrainConfig,
    progress: &mut dyn FnMut(TrainProgress),
) -> Result<(Predictor, LayerReport)> {
    if data.is_empty() || data.d_in == 0 || data.n_out == 0 {
        return input_err(format!(
            "train: empty dataset ({} samples, d_in {}, n_out {})",
            data.len(),
            data.d_in,
            data.n_out
        ));
    }
    if !(cfg.target_recall > 0.0 && cfg.target_recall <= 1.0) {
        return input_err(format!(
            "train: target_recall {} not in (0, 1]",
            cfg.target_recall
        ));
    }
    let Some(mut sizes) = cfg
        .hidden_sizes
        .iter()
        .map(|&h| h.max(1).checked_next_multiple_of(32))
        .collect::<Option<Vec<usize>>>()
    else {
        return input_err(format!(
            "train: hidden sizes {:?} overflow",
            cfg.hidden_sizes
        ));
    };
    sizes.sort_unstable();
    sizes.dedup();
    if sizes.is_empty() {
        return input_err("train: no hidden sizes to try");
    }
    let (train_set, mut hold) = data.split(cfg.holdout, cfg.seed);
    if hold.is_empty() {
        hold = train_set.clone();
    }
    let train_set = if train_set.is_empty() {
        hold.clone()
    } else {
        train_set
    };
    let norm = Norm::fit(&train_set);
    let xs = norm.apply_all(&train_set);
    let p = f64::from(train_set.active_frac());
    let pos_weight = if cfg.pos_weight > 0.0 {
        cfg.pos_weight
    } else if p > 0.0 {
        (((1.0 - p) / p).sqrt() as f32).clamp(1.0, 16.0)
    } else {
        1.0
    };
    let true_frac = hold.active_frac();
    let limit = (1.25 * true_frac).max(true_frac + 0.05);

    let mut best: Option<(Predictor, LayerReport)> = None;
    for (ci, &hidden) in sizes.iter().enumerate() {
        let est = q8_bytes(hidden, data.d_in.next_multiple_of(32)).unwrap_or(usize::MAX)
            + q8_bytes(data.n_out, hidden).unwrap_or(usize::MAX)
            + 4 * (hidden + data.n_out);
        if ci > 0 && est > cfg.max_bytes {
            break;
        }
        let seed = cfg.seed ^ (hidden as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let mut model = Mlp::init(data.d_in, hidden, data.n_out, &train_set, seed);
        let mut rng = Rng::new(seed.rotate_left(17));
        model.fit(&xs, &train_set, cfg, pos_weight, &mut rng, progress)?;
        let (w1, b1) = norm.fold(&model.w1, &model.b1, hidden);
        let mut pred = Predictor::from_f32(
            data.d_in, hidden, data.n_out, &w1, &b1, &model.w2, &model.b2, 0.0,
        )?;
        let report = calibrate(&mut pred, &hold, cfg.target_recall)?;
        let accepted = report.predicted_frac <= limit;
        progress(TrainProgress::Candidate { report, accepted });
        let better = match &best {
            None => true,
            Some((_, b)) => report.predicted_frac < b.predicted_frac,
        };
        if accepted {
            return Ok((pred, report));
        }
        if better {
            best = Some((pred, report));
        }
    }
    best.ok_or_else(|| PredictorError::Input("train: no candidate trained".into()))
}

/// Chooses `pred`'s threshold on `hold` (recall >= target with the fewest predictions) and reports.
fn calibrate(pred: &mut Predictor, hold: &Dataset, target_recall: f32) -> Result<LayerReport> {
    let n = hold.len();
    let n_out = pred.n_out;
    let mut logits = vec![0f32; n * n_out];
    const CHUNK: usize = 64;
    logits
        .par_chunks_mut(CHUNK * n_out)
        .enumerate()
        .try_for_each(|(ci, out)| -> Result<()> {
            let mut s = Scratch::new();
            for (k, row) in out.chunks_exact_mut(n_out).enumerate() {
                let i = ci * CHUNK + k;
                pred.scores_with(
                    &hold.inputs[i * hold.d_in..(i + 1) * hold.d_in],
                    &mut s,
                    row,
                )?;
            }
            Ok(())
        })?;
    let mut pos: Vec<f32> = Vec::new();
    for (i, row) in logits.chunks_exact(n_out).enumerate() {
        for (j, &z) in row.iter().enumerate() {
            if hold.is_active(i, j) {
                pos.push(z);
            }
        }
    }
    let threshold = if pos.is_empty() {
        f32::INFINITY
    } else {
        pos.sort_unstable_by(|a, b| a.total_cmp(b));
        let miss = ((1.0 - f64::from(target_recall)) * pos.len() as f64).floor() as usize;
        next_down(pos[miss.min(pos.len() - 1)])
    };
    pred.threshold = threshold;
    let (mut tp, mut predicted) = (0u64, 0u64);
    for (i, row) in logits.chunks_exact(n_out).enumerate() {
        for (j, &z) in row.iter().enumerate() {
            if z > threshold {
                predicted += 1;
                tp += u64::from(hold.is_active(i, j));
            }
        }
    }
    let total = (n * n_out) as f64;
    Ok(LayerReport {
        hidden: pred.hidden,
        recall: if pos.is_empty() {
            1.0
        } else {
            (tp as f64 / pos.len() as f64) as f32
        },
        precision: if predicted == 0 {
            1.0
        } else {
            (tp as f64 / predicted as f64) as f32
        },
        predicted_frac: (predicted as f64 / total) as f32,
        true_frac: (pos.len() as f64 / total) as f32,
        bytes: pred.bytes(),
        threshold,
    })
}

/// Per-dimension standardization `(x - mean) / std` fitted on the training samples.
struct Norm {
    mean: Vec<f32>,
    inv_std: Vec<f32>,
}

impl Norm {
    fn fit(d: &Dataset) -> Self {
        let n = d.len().max(1) as f64;
        let mut sum = vec![0f64; d.d_in];
        let mut sq = vec![0f64; d.d_in];
        for x in d.inputs.chunks_exact(d.d_in) {
            for i in 0..d.d_in {
                let v = f64::from(x[i]);
                sum[i] += v;
                sq[i] += v * v;
            }
        }
        let mut mean = Vec::with_capacity(d.d_in);
        let mut std = Vec::with_capacity(d.d_in);
        for i in 0..d.d_in {
            let m = sum[i] / n;
            let var = (sq[i] / n - m * m).max(0.0);
            mean.push(if m.is_finite() { m as f32 } else { 0.0 });
            std.push(if var.is_finite() { var.sqrt() } else { 0.0 });
        }
        // Nearly constant dimensions would get huge folded weights, which would ruin the Q8_0 scale of
        // their block: their std is floored at 5% of the median std (1 if all are 0).
        let mut sorted = std.clone();
        sorted.sort_by(f64::total_cmp);
        let median = sorted.get(sorted.len() / 2).copied().unwrap_or(1.0);
        let floor = if median > 0.0 { 0.05 * median } else { 1.0 };
        let inv_std = std.iter().map(|&s| (1.0 / s.max(floor)) as f32).collect();
        Norm { mean, inv_std }
    }

    fn apply_all(&self, d: &Dataset) -> Vec<f32> {
        let mut out = d.inputs.clone();
        for x in out.chunks_exact_mut(d.d_in) {
            for ((v, m), s) in x.iter_mut().zip(&self.mean).zip(&self.inv_std) {
                *v = (*v - m) * s;
            }
        }
        out
    }

    /// `W1 · ((x - mean) * inv_std) + b1 = W1' · x + b1'`.
    fn fold(&self, w1: &[f32], b1: &[f32], hidden: usize) -> (Vec<f32>, Vec<f32>) {
        let d = self.mean.len();
        let mut w = w1.to_vec();
        let mut b = b1.to_vec();
        for r in 0..hidden {
            let row = &mut w[r * d..(r + 1) * d];
            let mut shift = 0f64;
            for ((v, s), m) in row.iter_mut().zip(&self.inv_std).zip(&self.mean) {
                *v *= s;
                shift += f64::from(*v) * f64::from(*m);
            }
            b[r] -= shift as f32;
        }
        (w, b)
    }
}

/// Adam state of one parameter tensor.
struct Adam {
    m: Vec<f32>,
    v: Vec<f32>,
}

impl Adam {
    fn new(n: usize) -> Self {
        Adam {
            m: vec![0.0; n],
            v: vec![0.0; n],
        }
    }

    fn step(&mut self, p: &mut [f32], g: &[f32], lr: f32, t: i32) {
        const B1: f32 = 0.9;
        const B2: f32 = 0.999;
        let c1 = 1.0 - B1.powi(t);
        let c2 = 1.0 - B2.powi(t);
        let a = lr * c2.sqrt() / c1;
        // Elementwise, so the parallel split does not change the result.
        p.par_chunks_mut(PAR_CHUNK)
            .zip(g.par_chunks(PAR_CHUNK))
            .zip(self.m.par_chunks_mut(PAR_CHUNK))
            .zip(self.v.par_chunks_mut(PAR_CHUNK))
            .for_each(|(((p, g), m), v)| {
                for (((p, &g), m), v) in p.iter_mut().zip(g).zip(m).zip(v) {
                    *m = B1 * *m + (1.0 - B1) * g;
                    *v = B2 * *v + (1.0 - B2) * g * g;
                    *p -= a * *m / (v.sqrt() + 1e-8);
                }
            });
    }
}

/// Elements per parallel work item of the elementwise training steps.
const PAR_CHUNK: usize = 16 * 1024;

/// f32 MLP under training: `w1` hidden × d_in, `w2` n_out × hidden.
struct Mlp {
    d: usize,
    h: usize,
    o: usize,
    w1: Vec<f32>,
    b1: Vec<f32>,
    w2: Vec<f32>,
    b2: Vec<f32>,
}

/// `y = X · Wᵀ` via `kernels_neon::matmul` on an f32 matrix: `w` is `rows × cols`, `x` is `n × cols`,
/// `y` is `n × rows` (resized). `buf` holds the byte copy of `w` (the kernels take bytes).
fn mm(
    w: &[f32],
    rows: usize,
    cols: usize,
    x: &[f32],
    n: usize,
    y: &mut Vec<f32>,
    buf: &mut Vec<u8>,
) -> Result<()> {
    buf.resize(w.len() * 4, 0);
    buf.par_chunks_mut(PAR_CHUNK * 4)
        .zip(w.par_chunks(PAR_CHUNK))
        .for_each(|(b, w)| {
            for (b, v) in b.chunks_exact_mut(4).zip(w) {
                b.copy_from_slice(&v.to_le_bytes());
            }
        });
    y.resize(n * rows, 0.0);
    let m = QMatrix::new(WeightFormat::F32, rows, cols, buf)?;
    matmul(&m, x, n, y, Precision::Exact)?;
    Ok(())
}

/// `dst` (cols × rows) = transpose of `src` (rows × cols), in parallel over bands of `dst` rows.
fn transpose(src: &[f32], rows: usize, cols: usize, dst: &mut Vec<f32>) {
    dst.resize(rows * cols, 0.0);
    if rows == 0 || cols == 0 {
        return;
    }
    const T: usize = 16;
    dst.par_chunks_mut(T * rows)
        .enumerate()
        .for_each(|(bi, band)| {
            let c0 = bi * T;
            let nc = band.len() / rows;
            for r0 in (0..rows).step_by(T) {
                let r1 = (r0 + T).min(rows);
                for r in r0..r1 {
                    let s = &src[r * cols + c0..r * cols + c0 + nc];
                    for (k, &v) in s.iter().enumerate() {
                        band[k * rows + r] = v;
                    }
                }
            }
        });
}

impl Mlp {
    fn init(d: usize, h: usize, o: usize, data: &Dataset, seed: u64) -> Self {
        let mut rng = Rng::new(seed);
        let a1 = (6.0 / d as f32).sqrt();
        let w1 = (0..h * d).map(|_| (rng.f32() * 2.0 - 1.0) * a1).collect();
        let a2 = (3.0 / h as f32).sqrt() * 0.5;
        let w2 = (0..o * h).map(|_| (rng.f32() * 2.0 - 1.0) * a2).collect();
        // Output biases start at the logit of each neuron's training frequency.
        let n = data.len().max(1) as f32;
        let b2 = (0..o)
            .map(|j| {
                let c = (0..data.len()).filter(|&i| data.is_active(i, j)).count() as f32;
                let f = ((c + 0.5) / (n + 1.0)).clamp(1e-4, 1.0 - 1e-4);
                (f / (1.0 - f)).ln()
            })
            .collect();
        Mlp {
            d,
            h,
            o,
            w1,
            b1: vec![0.0; h],
            w2,
            b2,
        }
    }

    fn fit(
        &mut self,
        xs: &[f32],
        data: &Dataset,
        cfg: &TrainConfig,
        pos_weight: f32,
        rng: &mut Rng,
        progress: &mut dyn FnMut(TrainProgress),
    ) -> Result<()> {
        let (d, h, o) = (self.d, self.h, self.o);
        let n = data.len();
        let bs = cfg.batch.max(1);
        let mut a_w1 = Adam::new(h * d);
        let mut a_b1 = Adam::new(h);
        let mut a_w2 = Adam::new(o * h);
        let mut a_b2 = Adam::new(o);
        let mut order: Vec<usize> = (0..n).collect();
        let mut buf = Vec::new();
        let v = || Vec::<f32>::new();
        let (mut xb, mut xbt, mut hb, mut ht, mut zt, mut g, mut w2t) =
            (v(), v(), v(), v(), v(), v(), v());
        let (mut dw2, mut dh, mut dht, mut dw1t, mut dw1, mut loss_rows) =
            (v(), v(), v(), v(), v(), v());
        let (mut db1, mut db2) = (vec![0f32; h], vec![0f32; o]);
        let words = data.words;
        let mut t = 0i32;
        // The loss (for progress reports only) is estimated on the first rows of each minibatch: log1p on
        // every element would cost more than the matrix products.
        const LOSS_ROWS: usize = 8;
        for epoch in 0..cfg.epochs {
            rng.shuffle(&mut order);
            let mut loss_sum = 0f64;
            let mut loss_n = 0usize;
            for chunk in order.chunks(bs) {
                let b = chunk.len();
                loss_n += b.min(LOSS_ROWS) * o;
                xb.clear();
                for &i in chunk {
                    xb.extend_from_slice(&xs[i * d..(i + 1) * d]);
                }
                // Forward. H (b × h) = relu(X · W1ᵀ + b1).
                mm(&self.w1, h, d, &xb, b, &mut hb, &mut buf)?;
                for row in hb.chunks_exact_mut(h) {
                    for (v, bias) in row.iter_mut().zip(&self.b1) {
                        *v = (*v + bias).max(0.0);
                    }
                }
                transpose(&hb, b, h, &mut ht);
                // Zᵀ (o × b) = W2 · Hᵀ (b2 added below).
                mm(&hb, b, h, &self.w2, o, &mut zt, &mut buf)?;
                // Gᵀ = dL/dZᵀ of the weighted cross-entropy averaged over the minibatch, in place of Zᵀ;
                // db2 = row sums. Rows are independent, so the parallel split does not change the result.
                let inv_b = 1.0 / b as f32;
                let labels = &data.labels;
                loss_rows.resize(o, 0.0);
                zt.par_chunks_mut(b)
                    .zip(db2.par_iter_mut())
                    .zip(loss_rows.par_iter_mut())
                    .zip(self.b2.par_iter())
                    .enumerate()
                    .for_each(|(j, (((row, db), loss), &bias))| {
                        let (w, bit) = (j / 64, j % 64);
                        let mut sum = 0f32;
                        let mut l = 0f32;
                        for (k, (zv, &i)) in row.iter_mut().zip(chunk).enumerate() {
                            let z = *zv + bias;
                            let s = 1.0 / (1.0 + (-z).exp());
                            let y = (labels[i * words + w] >> bit) & 1 == 1;
                            let gv = if y {
                                pos_weight * (s - 1.0) * inv_b
                            } else {
                                s * inv_b
                            };
                            if k < LOSS_ROWS {
                                let sp = |v: f32| if v > 20.0 { v } else { v.exp().ln_1p() };
                                l += if y { pos_weight * sp(-z) } else { sp(z) };
                            }
                            *zv = gv;
                            sum += gv;
                        }
                        *db = sum;
                        *loss = l;
                    });
                loss_sum += loss_rows.iter().map(|&l| f64::from(l)).sum::<f64>();
                let gt = &zt;
                // dW2 (o × h) = Gᵀ · H.
                mm(&ht, h, b, gt, o, &mut dw2, &mut buf)?;
                // dH (b × h) = G · W2, masked by ReLU.
                transpose(gt, o, b, &mut g);
                transpose(&self.w2, o, h, &mut w2t);
                mm(&w2t, h, o, &g, b, &mut dh, &mut buf)?;
                for (dv, &hv) in dh.iter_mut().zip(&hb) {
                    if hv <= 0.0 {
                        *dv = 0.0;
                    }
                }
                db1.fill(0.0);
                for row in dh.chunks_exact(h) {
                    for (a, &v) in db1.iter_mut().zip(row) {
                        *a += v;
                    }
                }
                // dW1 (h × d) = dHᵀ · X, computed as dW1ᵀ (d × h) = Xᵀ · dH.
                transpose(&dh, b, h, &mut dht);
                transpose(&xb, b, d, &mut xbt);
                mm(&dht, h, b, &xbt, d, &mut dw1t, &mut buf)?;
                transpose(&dw1t, d, h, &mut dw1);
                t += 1;
                a_w1.step(&mut self.w1, &dw1, cfg.lr, t);
                a_b1.step(&mut self.b1, &db1, cfg.lr, t);
                a_w2.step(&mut self.w2, &dw2, cfg.lr, t);
                a_b2.step(&mut self.b2, &db2, cfg.lr, t);
            }
            let loss = (loss_sum / loss_n.max(1) as f64) as f32;
            progress(TrainProgress::Epoch {
                hidden: h,
                epoch: epoch + 1,
                epochs: cfg.epochs,
                loss,
            });
        }
        Ok(())
    }
}
