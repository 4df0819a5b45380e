//! Per-layer neuron activation predictors (PowerInfer section 5.1): a one-hidden-layer MLP
//! `sigmoid(W2 · relu(W1 · x + b1) + b2)` from the FFN input `x` (after the FFN RMSNorm, `d_in` floats) to
//! "which of the `n_out` FFN neurons fire".
//!
//! # Training ([`train()`])
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

mod dataset;
mod train;

pub use dataset::Dataset;
pub(crate) use dataset::Rng;
pub use train::{train, LayerReport, TrainConfig, TrainProgress};

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
