//! Training of one layer's predictor: configuration and reports, the input standardization, Adam and
//! the f32 MLP, and the calibration of the decision threshold.

use super::*;

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

/// Progress events of [`train()`].
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
        let mut t = 0i32;
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
                // Gᵀ = dL/dZᵀ in place of Zᵀ; db2 = its row sums.
                loss_sum += output_grad(
                    &mut zt,
                    chunk,
                    data,
                    pos_weight,
                    &self.b2,
                    &mut db2,
                    &mut loss_rows,
                );
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

/// Rows of each minibatch whose loss is computed (for progress reports only: log1p on every element
/// would cost more than the matrix products).
const LOSS_ROWS: usize = 8;

/// Replaces `zt` (`o × b`, the output logits less `b2` of the minibatch `chunk`) by the gradient of the
/// weighted cross-entropy averaged over the minibatch, writes its row sums to `db2`, and returns the
/// loss summed over the first [`LOSS_ROWS`] samples. Rows are independent, so the parallel split does
/// not change the result.
fn output_grad(
    zt: &mut [f32],
    chunk: &[usize],
    data: &Dataset,
    pos_weight: f32,
    b2: &[f32],
    db2: &mut [f32],
    loss_rows: &mut Vec<f32>,
) -> f64 {
    let b = chunk.len();
    let inv_b = 1.0 / b as f32;
    let (labels, words) = (&data.labels, data.words);
    loss_rows.resize(b2.len(), 0.0);
    zt.par_chunks_mut(b)
        .zip(db2.par_iter_mut())
        .zip(loss_rows.par_iter_mut())
        .zip(b2.par_iter())
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
    loss_rows.iter().map(|&l| f64::from(l)).sum::<f64>()
}
