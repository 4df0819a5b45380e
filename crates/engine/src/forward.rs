//! The transformer forward pass: batched over the tokens of a step, with a KV cache.

use kernels_neon::{Precision, QMatrix};
use rayon::prelude::*;

use crate::config::Activation;
use crate::error::{kernel, EngineError, Result};
use crate::model::Model;
use crate::sparse::SparseFfn;

/// What an FFN observer sees of one layer of one forward step (all `n` tokens of the step).
pub struct FfnSample<'a> {
    /// Layer index.
    pub layer: usize,
    /// Tokens in the step.
    pub n: usize,
    /// The FFN input after RMSNorm (`n × d_model`): what a predictor sees.
    pub input: &'a [f32],
    /// `act(gate · x)` per token and neuron (`n × d_ff`), before any sparsity mask.
    pub act_gate: &'a [f32],
    /// `up · x` (`n × d_ff`).
    pub up: &'a [f32],
}

/// Called once per layer with an [`FfnSample`] (profiling, calibration).
pub type FfnObserver<'o> = &'o mut (dyn FnMut(FfnSample<'_>) + Send);

/// How the FFN runs in a forward step.
#[derive(Default)]
pub struct FfnMode<'s, 'o> {
    /// Sparse FFN: decode steps (one token) compute only active neurons; batched steps mask the same
    /// neurons out of a dense computation.
    pub sparse: Option<&'s SparseFfn>,
    /// Sees every layer's FFN activations (forces the dense path, then masks as `sparse` says).
    pub observer: Option<FfnObserver<'o>>,
    /// Nanoseconds spent in the FFN blocks are added here.
    pub ffn_nanos: Option<&'s std::sync::atomic::AtomicU64>,
}

/// Keys and values of every layer for the positions seen so far (f32, `[position][kv_dim]`).
pub struct KvCache {
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    len: usize,
    capacity: usize,
    kv_dim: usize,
}

impl KvCache {
    /// An empty cache for `model` that can hold `capacity` positions. Memory grows as positions are added.
    pub fn new(model: &Model<'_>, capacity: usize) -> Self {
        let n = model.config.n_layers;
        KvCache {
            k: vec![Vec::new(); n],
            v: vec![Vec::new(); n],
            len: 0,
            capacity,
            kv_dim: model.config.kv_dim(),
        }
    }

    /// Positions held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no position is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Positions the cache can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Forgets every position after the first `len` (keeps the allocation).
    pub fn truncate(&mut self, len: usize) {
        let len = len.min(self.len);
        for buf in self.k.iter_mut().chain(self.v.iter_mut()) {
            buf.truncate(len * self.kv_dim);
        }
        self.len = len;
    }

    /// Bytes held by keys and values.
    pub fn bytes(&self) -> usize {
        self.k
            .iter()
            .chain(self.v.iter())
            .map(|b| b.capacity() * 4)
            .sum()
    }
}

/// Which logits a forward step returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// Only the last token's logits (`vocab` floats): generation.
    Last,
    /// Every token's logits (`n × vocab` floats): scoring, perplexity.
    All,
}

fn mm(w: &QMatrix<'_>, x: &[f32], n: usize, y: &mut [f32], p: Precision, what: &str) -> Result<()> {
    if n == 1 {
        kernels_neon::matvec(w, x, y, p).map_err(kernel(what))
    } else {
        kernels_neon::matmul(w, x, n, y, p).map_err(kernel(what))
    }
}

fn rms_norm_rows(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let d = w.len();
    out.par_chunks_mut(d)
        .zip(x.par_chunks(d))
        .for_each(|(o, xi)| kernels_neon::rms_norm(xi, w, eps, o));
}

fn add_bias(y: &mut [f32], bias: &Option<Vec<f32>>) {
    if let Some(b) = bias {
        for row in y.chunks_mut(b.len()) {
            row.iter_mut().zip(b).for_each(|(a, b)| *a += b);
        }
    }
}

/// Runs `tokens` (positions `cache.len()..`) through the model, appends their keys and values to
/// `cache`, and returns the logits asked for. On error the cache is left as it was.
pub fn forward(
    model: &Model<'_>,
    cache: &mut KvCache,
    tokens: &[u32],
    precision: Precision,
    want: Logits,
) -> Result<Vec<f32>> {
    forward_with(model, cache, tokens, precision, want, FfnMode::default())
}

/// [`forward`] with a choice of FFN computation (sparse, observed).
pub fn forward_with(
    model: &Model<'_>,
    cache: &mut KvCache,
    tokens: &[u32],
    precision: Precision,
    want: Logits,
    ffn: FfnMode<'_, '_>,
) -> Result<Vec<f32>> {
    let start = cache.len;
    let out = forward_inner(model, cache, tokens, precision, want, ffn);
    if out.is_err() {
        cache.truncate(start);
    }
    out
}

fn forward_inner(
    model: &Model<'_>,
    cache: &mut KvCache,
    tokens: &[u32],
    precision: Precision,
    want: Logits,
    mut ffn: FfnMode<'_, '_>,
) -> Result<Vec<f32>> {
    let cfg = &model.config;
    let n = tokens.len();
    if n == 0 {
        return Err(EngineError::Request("forward pass over zero tokens".into()));
    }
    let start = cache.len;
    if start + n > cache.capacity {
        return Err(EngineError::Request(format!(
            "context is full: {start} positions held + {n} new > {} (raise --ctx)",
            cache.capacity
        )));
    }
    let (d, qd, kvd, ff, hd) = (
        cfg.d_model,
        cfg.q_dim(),
        cfg.kv_dim(),
        cfg.d_ff,
        cfg.head_dim,
    );
    let group = cfg.n_heads / cfg.n_kv_heads;
    let scale = 1.0 / (hd as f32).sqrt();

    let mut x = vec![0.0f32; n * d];
    for (row, &t) in x.chunks_mut(d).zip(tokens) {
        model.embed_token(t, row)?;
    }
    let mut xn = vec![0.0f32; n * d];
    let mut q = vec![0.0f32; n * qd];
    let mut k = vec![0.0f32; n * kvd];
    let mut v = vec![0.0f32; n * kvd];
    let mut att = vec![0.0f32; n * qd];
    let mut o = vec![0.0f32; n * d];
    let mut g = vec![0.0f32; n * ff];
    let mut u = vec![0.0f32; n * ff];

    for (li, layer) in model.layers.iter().enumerate() {
        // Attention.
        rms_norm_rows(&x, &layer.attn_norm, cfg.rms_eps, &mut xn);
        if n == 1 {
            // One quantization of the normed vector and one parallel region for all three.
            kernels_neon::matvec_many(
                &[&layer.wq, &layer.wk, &layer.wv],
                &xn,
                &mut [&mut q[..], &mut k[..], &mut v[..]],
                precision,
            )
            .map_err(kernel("attention q/k/v"))?;
        } else {
            mm(&layer.wq, &xn, n, &mut q, precision, "attention q")?;
            mm(&layer.wk, &xn, n, &mut k, precision, "attention k")?;
            mm(&layer.wv, &xn, n, &mut v, precision, "attention v")?;
        }
        add_bias(&mut q, &layer.bq);
        add_bias(&mut k, &layer.bk);
        add_bias(&mut v, &layer.bv);
        for t in 0..n {
            let pos = start + t;
            kernels_neon::rope_inplace(
                &mut q[t * qd..(t + 1) * qd],
                cfg.n_heads,
                hd,
                cfg.rope_dim,
                pos,
                cfg.rope_base,
                cfg.rope_style,
            );
            kernels_neon::rope_inplace(
                &mut k[t * kvd..(t + 1) * kvd],
                cfg.n_kv_heads,
                hd,
                cfg.rope_dim,
                pos,
                cfg.rope_base,
                cfg.rope_style,
            );
        }
        cache.k[li].extend_from_slice(&k);
        cache.v[li].extend_from_slice(&v);
        let (kc, vc) = (&cache.k[li], &cache.v[li]);
        att.par_chunks_mut(hd)
            .enumerate()
            .try_for_each_init(Vec::new, |scores, (idx, out)| {
                let (t, h) = (idx / cfg.n_heads, idx % cfg.n_heads);
                let layout = kernels_neon::KvLayout {
                    stride: kvd,
                    offset: (h / group) * hd,
                    head_dim: hd,
                };
                let qh = &q[t * qd + h * hd..t * qd + (h + 1) * hd];
                let ctx = start + t + 1; // causal: positions 0..=start+t
                kernels_neon::attend(qh, kc, vc, layout, ctx, scale, scores, out)
                    .map_err(kernel("attention"))
            })?;
        mm(&layer.wo, &att, n, &mut o, precision, "attention output")?;
        x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);

        // Gated FFN.
        let ffn_t0 = ffn.ffn_nanos.map(|_| std::time::Instant::now());
        rms_norm_rows(&x, &layer.ffn_norm, cfg.rms_eps, &mut xn);
        match (ffn.sparse, &mut ffn.observer) {
            (Some(sp), None) if n == 1 => sp.decode(li, layer, &xn, &mut o, precision)?,
            // Offloaded weights: token by token over the neuron store (there are no matrices to batch).
            (Some(sp), None) if sp.offload().is_some() => {
                for (xt, ot) in xn.chunks(d).zip(o.chunks_mut(d)) {
                    sp.decode(li, layer, xt, ot, precision)?;
                }
            }
            _ if model.config.ffn_store.is_some() => {
                return Err(EngineError::Request(format!(
                    "{}: the FFN weights of this resident file are in its neuron store: run it with --sparse \
                     (profiling and calibration need the original model)",
                    model.path().display()
                )));
            }
            (None, None) => {
                if n == 1 {
                    kernels_neon::matvec_many(
                        &[&layer.gate, &layer.up],
                        &xn,
                        &mut [&mut g[..], &mut u[..]],
                        precision,
                    )
                    .map_err(kernel("ffn gate/up"))?;
                } else {
                    mm(&layer.gate, &xn, n, &mut g, precision, "ffn gate")?;
                    mm(&layer.up, &xn, n, &mut u, precision, "ffn up")?;
                }
                match cfg.activation {
                    Activation::Silu => kernels_neon::silu_mul_inplace(&mut g, &u),
                    Activation::Relu => kernels_neon::relu_mul_inplace(&mut g, &u),
                }
                mm(&layer.down, &g, n, &mut o, precision, "ffn down")?;
            }
            (sparse, observer) => {
                mm(&layer.gate, &xn, n, &mut g, precision, "ffn gate")?;
                mm(&layer.up, &xn, n, &mut u, precision, "ffn up")?;
                let act = cfg.activation;
                g.par_chunks_mut(1024)
                    .for_each(|c| c.iter_mut().for_each(|v| *v = act.apply(*v)));
                if let Some(obs) = observer {
                    obs(FfnSample {
                        layer: li,
                        n,
                        input: &xn,
                        act_gate: &g,
                        up: &u,
                    });
                }
                if let Some(sp) = sparse {
                    sp.mask(li, &xn, n, &mut g, &u)?;
                }
                g.par_chunks_mut(1024)
                    .zip(u.par_chunks(1024))
                    .for_each(|(a, b)| a.iter_mut().zip(b).for_each(|(a, b)| *a *= b));
                match sparse {
                    // The transposed down rows of sparse decode, so batched steps compute what it does.
                    Some(sp) if observer.is_none() => sp.down_batch(li, &g, n, &mut o)?,
                    _ => mm(&layer.down, &g, n, &mut o, precision, "ffn down")?,
                }
            }
        }
        if let (Some(acc), Some(t0)) = (ffn.ffn_nanos, ffn_t0) {
            acc.fetch_add(
                t0.elapsed().as_nanos() as u64,
                std::sync::atomic::Ordering::Relaxed,
            );
        }
        x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
    }
    cache.len = start + n;

    let vocab = cfg.vocab_size;
    let (rows, m) = match want {
        Logits::Last => (&x[(n - 1) * d..], 1),
        Logits::All => (&x[..], n),
    };
    let mut normed = vec![0.0f32; m * d];
    rms_norm_rows(rows, &model.output_norm, cfg.rms_eps, &mut normed);
    let mut logits = vec![0.0f32; m * vocab];
    mm(
        &model.output,
        &normed,
        m,
        &mut logits,
        precision,
        "output projection",
    )?;
    Ok(logits)
}
