//! The transformer forward pass: batched over the tokens of a step, with a KV cache.

use kernels_neon::{KvChunks, Precision};
use rayon::prelude::*;

use crate::error::{kernel, ModelError, Result};
use crate::ffn::{layer_step, DenseFfn, FfnExecutor, FfnScratch, ObservedFfn};
pub use crate::ffn::{FfnObserver, FfnSample};
pub use crate::kv_cache::{KvCache, KV_CHUNK};
use crate::layer::HeadShape;
use crate::model::Model;
use crate::ops::{mm_step, StepKind};
use crate::prompt_attention::{attend_prompt, Heads};

/// How the FFN runs in a forward step.
#[derive(Default)]
pub struct FfnMode<'s, 'o> {
    /// The FFN executor of every layer (dense from the model's matrices when `None`). A sparse
    /// executor (`offload::sparse::SparseFfn`) computes only active neurons in decode steps and
    /// masks the same neurons out of a dense computation in batched steps (over a neuron store,
    /// a prompt's layer streamed once for all its tokens).
    pub exec: Option<&'s dyn FfnExecutor>,
    /// Sees every layer's FFN activations (forces the dense path, then masks as `exec` says).
    pub observer: Option<FfnObserver<'o>>,
    /// Nanoseconds spent in the FFN blocks are added here.
    pub ffn_nanos: Option<&'s std::sync::atomic::AtomicU64>,
}

/// Which logits a forward step returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// Only the last token's logits (`vocab` floats): generation.
    Last,
    /// Every token's logits (`n × vocab` floats): scoring, perplexity.
    All,
    /// None (the leading steps of a prompt run in several): the output projection is skipped.
    None,
}

/// Elements from which [`rms_norm_rows`] runs its rows in parallel.
const PAR_NORM_MIN: usize = 1 << 15;

/// RMSNorm of each row of `x` (as ggml sums the squares, in f64, in `Precision::Ggml`).
fn rms_norm_rows(x: &[f32], w: &[f32], eps: f32, out: &mut [f32], p: Precision) {
    let d = w.len();
    let norm = match p {
        Precision::Ggml => kernels_neon::rms_norm_ggml,
        _ => kernels_neon::rms_norm,
    };
    if x.len() < PAR_NORM_MIN {
        // A decode step's few rows: waking the other threads costs more than the rows.
        out.chunks_mut(d)
            .zip(x.chunks(d))
            .for_each(|(o, xi)| norm(xi, w, eps, o));
    } else {
        out.par_chunks_mut(d)
            .zip(x.par_chunks(d))
            .for_each(|(o, xi)| norm(xi, w, eps, o));
    }
}

/// `x += y`, or `x += rmsnorm(y, w)` where the layer norms its block's output first (`scratch`:
/// `y.len()` floats).
fn add_residual(
    x: &mut [f32],
    y: &[f32],
    (norm, eps): (Option<&[f32]>, f32),
    scratch: &mut [f32],
    p: Precision,
) {
    let y = match norm {
        Some(w) => {
            rms_norm_rows(y, w, eps, scratch, p);
            &scratch[..]
        }
        None => y,
    };
    x.iter_mut().zip(y).for_each(|(a, b)| *a += b);
}

/// Each token's RoPE rotations for every RoPE base the model's layers use (the first the first
/// layer's): one table per base, computed once per step (as ggml computes them in `Ggml`).
fn rope_tables(
    model: &Model<'_>,
    place: &[Place],
    precision: Precision,
) -> Vec<(f32, Vec<kernels_neon::RopeAngles>)> {
    let angles = match precision {
        Precision::Ggml => kernels_neon::RopeAngles::new_ggml,
        _ => kernels_neon::RopeAngles::new,
    };
    let cfg = &model.config;
    let mut bases: Vec<f32> = Vec::new();
    for l in &model.layers {
        if !bases
            .iter()
            .any(|b| b.to_bits() == l.span.rope_base.to_bits())
        {
            bases.push(l.span.rope_base);
        }
    }
    if bases.is_empty() {
        bases.push(cfg.rope_base);
    }
    bases
        .into_iter()
        .map(|base| {
            let angles = place
                .iter()
                .map(|p| angles(cfg.head_dim, cfg.rope_dim, p.pos, base))
                .collect();
            (base, angles)
        })
        .collect()
}

fn resident_needs_sparse(model: &Model<'_>) -> ModelError {
    ModelError::Request(format!(
        "{}: the FFN weights of this resident file are in its neuron store: run it with --sparse \
         (profiling and calibration need the original model)",
        model.path().display()
    ))
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
    let mut logits = Vec::new();
    forward_with_into(model, cache, tokens, precision, want, ffn, &mut logits)?;
    Ok(logits)
}

/// [`forward_with`] into `logits` (resized to what the step returns), so that a decode loop reuses
/// one buffer.
pub fn forward_with_into(
    model: &Model<'_>,
    cache: &mut KvCache,
    tokens: &[u32],
    precision: Precision,
    want: Logits,
    ffn: FfnMode<'_, '_>,
    logits: &mut Vec<f32>,
) -> Result<()> {
    one_sequence(
        model,
        cache,
        tokens,
        StepKind::Prompt,
        precision,
        want,
        ffn,
        logits,
    )
}

/// `tokens` appended to one sequence's `cache` in one step of `kind`.
#[allow(clippy::too_many_arguments)]
fn one_sequence(
    model: &Model<'_>,
    cache: &mut KvCache,
    tokens: &[u32],
    kind: StepKind,
    precision: Precision,
    want: Logits,
    ffn: FfnMode<'_, '_>,
    logits: &mut Vec<f32>,
) -> Result<()> {
    let start = cache.len;
    let place: Vec<Place> = (0..tokens.len())
        .map(|t| Place {
            seq: 0,
            pos: start + t,
        })
        .collect();
    let step = Step {
        tokens,
        place: &place,
        kind,
    };
    forward_core(model, &mut [cache], step, precision, want, ffn, logits)
}

/// One decode step of several sequences at once (Best-of-N): token `i` is the next token of the
/// sequence whose cache is `caches[i]`, at position `caches[i].len()`. Each token is computed as a
/// one-token [`forward_with`] step on its own cache would compute it (the same kernels; only the
/// weights are read once for the batch, [`kernels_neon::matvec_batch`]), and the FFN executor's
/// `batch` is told so ([`crate::ffn::FfnLayer::kind`]). Returns `tokens.len() × vocab` logits,
/// the sequences' in order. On error every cache is left as it was.
pub fn forward_seqs(
    model: &Model<'_>,
    caches: &mut [&mut KvCache],
    tokens: &[u32],
    precision: Precision,
    ffn: FfnMode<'_, '_>,
) -> Result<Vec<f32>> {
    let mut logits = Vec::new();
    forward_seqs_into(model, caches, tokens, precision, ffn, &mut logits)?;
    Ok(logits)
}

/// [`forward_seqs`] into `logits` (resized to `tokens.len() × vocab`), so that a decode loop
/// reuses one buffer.
pub fn forward_seqs_into(
    model: &Model<'_>,
    caches: &mut [&mut KvCache],
    tokens: &[u32],
    precision: Precision,
    ffn: FfnMode<'_, '_>,
    logits: &mut Vec<f32>,
) -> Result<()> {
    if caches.len() != tokens.len() {
        return Err(ModelError::Request(format!(
            "a batched decode step needs one token per sequence: {} tokens for {} sequences",
            tokens.len(),
            caches.len()
        )));
    }
    let place: Vec<Place> = caches
        .iter()
        .enumerate()
        .map(|(seq, c)| Place { seq, pos: c.len })
        .collect();
    let step = Step {
        tokens,
        place: &place,
        kind: StepKind::Decode,
    };
    forward_core(model, caches, step, precision, Logits::All, ffn, logits)
}

/// Speculative verification: `tokens` continue the one sequence of `cache` (positions
/// `cache.len()..`), each computed as a one-token [`forward_with`] step would compute it (the
/// decode kernels, [`StepKind::Decode`]: the weights read once for all the tokens, each token's
/// products those of a decode step), so that greedy decoding with speculation gives the tokens it
/// gives without. Returns `tokens.len() × vocab` logits; on error the cache is left as it was.
pub fn forward_verify_into(
    model: &Model<'_>,
    cache: &mut KvCache,
    tokens: &[u32],
    precision: Precision,
    ffn: FfnMode<'_, '_>,
    logits: &mut Vec<f32>,
) -> Result<()> {
    one_sequence(
        model,
        cache,
        tokens,
        StepKind::Decode,
        precision,
        Logits::All,
        ffn,
        logits,
    )
}

/// Where a token of a step goes: the cache of its sequence and its position there.
#[derive(Clone, Copy)]
struct Place {
    seq: usize,
    pos: usize,
}

/// The tokens of one forward step and where each goes.
struct Step<'a> {
    tokens: &'a [u32],
    place: &'a [Place],
    kind: StepKind,
}

/// Runs a step; on error every cache is cut back to the positions it held.
fn forward_core(
    model: &Model<'_>,
    caches: &mut [&mut KvCache],
    step: Step<'_>,
    precision: Precision,
    want: Logits,
    ffn: FfnMode<'_, '_>,
    logits: &mut Vec<f32>,
) -> Result<()> {
    let starts: Vec<usize> = caches.iter().map(|c| c.len).collect();
    let out = forward_inner(model, caches, &step, precision, want, ffn, logits);
    if out.is_err() {
        for (c, &s) in caches.iter_mut().zip(&starts) {
            c.truncate(s);
        }
    }
    out
}

fn forward_inner(
    model: &Model<'_>,
    caches: &mut [&mut KvCache],
    step: &Step<'_>,
    precision: Precision,
    want: Logits,
    ffn: FfnMode<'_, '_>,
    logits: &mut Vec<f32>,
) -> Result<()> {
    let tokens = step.tokens;
    let cfg = &model.config;
    let n = tokens.len();
    if n == 0 {
        return Err(ModelError::Request("forward pass over zero tokens".into()));
    }
    let ends = ends_after(caches, step)?;
    let (d, qd, kvd) = (cfg.d_model, cfg.q_dim(), cfg.kv_dim());
    let (heads, head_shape) = head_shapes(cfg);
    let eps = cfg.rms_eps;

    let mut x = vec![0.0f32; n * d];
    for (row, &t) in x.chunks_mut(d).zip(tokens) {
        model.embed_token(t, row)?;
    }
    prefetch_output(model, want, n);
    check_ffn_mode(model, &ffn)?;
    let (dense, observed);
    let exec: &dyn FfnExecutor = match (ffn.exec, ffn.observer) {
        (mask, Some(obs)) => {
            observed = ObservedFfn::new(cfg.activation, mask, obs);
            &observed
        }
        (Some(e), None) => e,
        (None, None) => {
            dense = DenseFfn::new(cfg.activation);
            &dense
        }
    };
    let mut xn = vec![0.0f32; n * d];
    let mut q = vec![0.0f32; n * qd];
    let mut k = vec![0.0f32; n * kvd];
    let mut v = vec![0.0f32; n * kvd];
    let mut att = vec![0.0f32; n * qd];
    let mut o = vec![0.0f32; n * d];
    let mut scratch = FfnScratch::default();
    for (c, &end) in caches.iter_mut().zip(&ends) {
        c.grow_to(end);
    }
    let kind = step.kind;
    // Each token's rotations, computed once for all layers of each RoPE base.
    let ropes = rope_tables(model, step.place, precision);
    // A prompt step's attention runs in blocks (`prompt_attention`): where each token goes, once.
    let prompt_place: Vec<(usize, usize)> = if kind == StepKind::Prompt && n > 1 {
        step.place.iter().map(|p| (p.seq, p.pos)).collect()
    } else {
        Vec::new()
    };

    for (li, layer) in model.layers.iter().enumerate() {
        // The layer's copies, each product taking its own where the step does
        // (`packed::step_reads`).
        let packed = packed_layer(model, li, precision);
        // Attention.
        rms_norm_rows(&x, &layer.attn_norm, cfg.rms_eps, &mut xn, precision);
        let qkv = packed.and_then(|p| p.qkv.as_ref());
        project_qkv(
            layer,
            qkv,
            kind,
            (&xn, n),
            [&mut q, &mut k, &mut v],
            precision,
        )?;
        layer
            .attn_step
            .before_rope(&mut q, &mut k, &mut v, &head_shape);
        apply_rope(&ropes, layer.span.rope_base, cfg, &mut q, &mut k);
        for (t, p) in step.place.iter().enumerate() {
            let rows = t * kvd..(t + 1) * kvd;
            caches[p.seq].write(li, p.pos, &k[rows.clone()], &v[rows])?;
        }
        let views: Vec<_> = caches.iter().map(|c| c.layer(li)).collect();
        if precision == Precision::Ggml {
            // llama.cpp's attention rounds per query row; a prompt's rows as decode's.
            decode_attention(&q, step.place, &views, heads, layer.span, &mut att, true)?;
        } else if !prompt_place.is_empty() {
            attend_prompt(&q, &prompt_place, &views, heads, layer.span, &mut att)
                .map_err(kernel("attention"))?;
        } else {
            decode_attention(&q, step.place, &views, heads, layer.span, &mut att, false)?;
        }
        let wo = (&layer.wo, packed.and_then(|p| p.wo.as_ref()));
        project_out(wo, kind, (&att, n), &mut o, precision)?;
        let post = (layer.post_norms.attn.as_deref(), eps);
        add_residual(&mut x, &o, post, &mut xn, precision);

        // FFN (timed when asked).
        timed(ffn.ffn_nanos, || {
            rms_norm_rows(&x, &layer.ffn_norm, cfg.rms_eps, &mut xn, precision);
            let rows = (&xn[..], n);
            layer_step(
                (&layer.ffn, model.layers.get(li + 1).map(|l| &l.ffn), packed),
                exec,
                li,
                precision,
                kind,
                rows,
                &mut o,
                &mut scratch,
            )
        })?;
        let post = (layer.post_norms.ffn.as_deref(), eps);
        add_residual(&mut x, &o, post, &mut xn, precision);
    }
    for (c, &end) in caches.iter_mut().zip(&ends) {
        c.len = end;
    }

    output_logits(model, &x, n, want, kind, precision, logits)
}

/// Positions each cache holds after the step (a sequence's tokens are consecutive from its end);
/// an error when one would pass its capacity.
fn ends_after(caches: &[&mut KvCache], step: &Step<'_>) -> Result<Vec<usize>> {
    let mut ends: Vec<usize> = caches.iter().map(|c| c.len).collect();
    for p in step.place {
        ends[p.seq] = ends[p.seq].max(p.pos + 1);
    }
    for (c, &end) in caches.iter().zip(&ends) {
        if end > c.capacity {
            return Err(ModelError::Request(format!(
                "context is full: {} positions held + {} new > {} (raise --ctx)",
                c.len,
                end - c.len,
                c.capacity
            )));
        }
    }
    Ok(ends)
}

/// Starts reading a streamed output projection while the layers run: its first chunk (the
/// proxy's, where a short step reads that); direct reads start with the projection.
fn prefetch_output(model: &Model<'_>, want: Logits, n: usize) {
    if model.streamed() && !model.output_direct() && want != Logits::None {
        let short = want == Logits::Last || n <= crate::proxy_step::PROXY_MAX_ROWS;
        let first = match model.output_proxy() {
            Some(p) if short && model.output_proxy_used() => p,
            _ => &model.output,
        };
        crate::stream::prefetch_output(first);
    }
}

/// The attention output projection of a step's `n` rows `att`, over its repacked copy where given
/// and the step takes it ([`crate::packed::step_reads`]).
fn project_out(
    (wo, packed): (&kernels_neon::QMatrix<'_>, Option<&kernels_neon::Q40x8>),
    kind: StepKind,
    (att, n): (&[f32], usize),
    o: &mut [f32],
    precision: Precision,
) -> Result<()> {
    match packed {
        Some(p) if n == 1 => p.matvec(att, o).map_err(kernel("attention output")),
        Some(p) if crate::packed::step_reads(p, kind, n) => p
            .matvec_batch(att, n, o)
            .map_err(kernel("attention output")),
        _ => mm_step(kind, wo, att, n, o, precision, "attention output"),
    }
}

/// Layer `li`'s repacked copies ([`crate::packed`]) in `precision`; each product takes its copy
/// where the step does ([`crate::packed::step_reads`]: one token, a decode step's tokens
/// (speculation's verification, one token of several sequences) where the copy batches them, a
/// prompt's where the copy beats the prompt tile).
fn packed_layer<'m>(
    model: &'m Model<'_>,
    li: usize,
    precision: Precision,
) -> Option<&'m crate::packed::PackedLayer> {
    model.packed(precision).and_then(|p| p.layers.get(li))
}

/// The q, k and v projections of a step's `n` normed rows `xn`: one parallel region for all three
/// when one token (over the repacked copies `packed` where given) or one decode token per
/// sequence, else three batched products.
fn project_qkv(
    layer: &crate::layer::Layer<'_>,
    packed: Option<&[kernels_neon::Q40x8; 3]>,
    kind: StepKind,
    (xn, n): (&[f32], usize),
    [q, k, v]: [&mut Vec<f32>; 3],
    precision: Precision,
) -> Result<()> {
    let batched =
        packed.filter(|ws| n > 1 && ws.iter().all(|w| crate::packed::step_reads(w, kind, n)));
    if let (1, Some([wq, wk, wv])) = (n, packed) {
        kernels_neon::Q40x8::matvec_many(
            &[wq, wk, wv],
            xn,
            &mut [&mut q[..], &mut k[..], &mut v[..]],
        )
        .map_err(kernel("attention q/k/v"))?;
    } else if let Some([wq, wk, wv]) = batched {
        // A decode step's or prompt's tokens over the copies ([`crate::packed::step_reads`]).
        for (w, y) in [(wq, q), (wk, k), (wv, v)] {
            w.matvec_batch(xn, n, y)
                .map_err(kernel("attention q/k/v"))?;
        }
    } else if n == 1 {
        // One quantization of the normed vector and one parallel region for all three.
        kernels_neon::matvec_many(
            &[&layer.wq, &layer.wk, &layer.wv],
            xn,
            &mut [&mut q[..], &mut k[..], &mut v[..]],
            precision,
        )
        .map_err(kernel("attention q/k/v"))?;
    } else if kind == StepKind::Decode {
        // One decode token per sequence: as above, for every token at once.
        kernels_neon::matvec_batch_many(
            &[&layer.wq, &layer.wk, &layer.wv],
            xn,
            n,
            &mut [&mut q[..], &mut k[..], &mut v[..]],
            precision,
        )
        .map_err(kernel("attention q/k/v"))?;
    } else {
        mm_step(kind, &layer.wq, xn, n, q, precision, "attention q")?;
        mm_step(kind, &layer.wk, xn, n, k, precision, "attention k")?;
        mm_step(kind, &layer.wv, xn, n, v, precision, "attention v")?;
    }
    Ok(())
}

/// A decode step's attention: each token's heads over its own sequence's cache, causal (the last
/// `window` positions on a sliding-window layer), in parallel over (token, head); with llama.cpp's
/// roundings where `ggml` ([`kernels_neon::attend_cache_span_ggml`], [`Precision::Ggml`]).
fn decode_attention(
    q: &[f32],
    place: &[Place],
    views: &[(KvChunks<'_>, KvChunks<'_>)],
    heads: Heads,
    span: crate::layer::AttnSpan,
    att: &mut [f32],
    ggml: bool,
) -> Result<()> {
    let attend = match ggml {
        true => kernels_neon::attend_cache_span_ggml,
        false => kernels_neon::attend_cache_span,
    };
    let (hd, n_heads) = (heads.head_dim, heads.n_heads);
    let group = heads.n_heads / heads.n_kv_heads;
    let (qd, kvd) = (n_heads * hd, heads.n_kv_heads * hd);
    let scale = heads.scale;
    att.par_chunks_mut(hd)
        .enumerate()
        .try_for_each_init(Vec::new, |scores, (idx, out)| {
            let (t, h) = (idx / n_heads, idx % n_heads);
            let layout = kernels_neon::KvLayout {
                stride: kvd,
                offset: (h / group) * hd,
                head_dim: hd,
            };
            let qh = &q[t * qd + h * hd..t * qd + (h + 1) * hd];
            let p = place[t];
            let (kc, vc) = views[p.seq];
            // Causal: positions up to its own of its sequence (the last `window` of
            // them on a sliding-window layer).
            let seen = span.first_seen(p.pos)..p.pos + 1;
            attend(qh, kc, vc, layout, seen, scale, scores, out).map_err(kernel("attention"))
        })?;
    Ok(())
}

/// The logits `want` asks for from the last hidden rows `x` (`n × d_model`): the proxy step, the
/// streamed output projection or the one in memory.
fn output_logits(
    model: &Model<'_>,
    x: &[f32],
    n: usize,
    want: Logits,
    kind: StepKind,
    precision: Precision,
    logits: &mut Vec<f32>,
) -> Result<()> {
    let cfg = &model.config;
    let d = cfg.d_model;
    let vocab = cfg.vocab_size;
    let (rows, m) = match want {
        Logits::Last => (&x[(n - 1) * d..], 1),
        Logits::All => (x, n),
        Logits::None => {
            logits.clear();
            return Ok(());
        }
    };
    let mut normed = vec![0.0f32; m * d];
    rms_norm_rows(
        rows,
        &model.output_norm,
        cfg.rms_eps,
        &mut normed,
        precision,
    );
    logits.clear();
    logits.resize(m * vocab, 0.0);
    let proxy = model.output_proxy().filter(|_| {
        // One token's logits, or those of a batch of sequences' next tokens; never a prompt
        // scored whole.
        (m == 1 || (kind == StepKind::Decode && m <= crate::proxy_step::PROXY_MAX_ROWS))
            && model.output_proxy_used()
            && !matches!(precision, Precision::Exact | Precision::Ggml)
    });
    if let Some(proxy) = proxy {
        let source = model
            .output_file()
            .zip(model.proxy_offset())
            .map(|(file, at)| crate::proxy_step::ProxySource {
                file,
                proxy_offset: at,
            });
        crate::proxy_step::proxy_logits(
            kind,
            &model.output,
            proxy,
            source.as_ref(),
            &normed,
            logits,
            precision,
        )?;
    } else if model.streamed() {
        crate::stream::output_logits(
            kind,
            &model.output,
            model.output_file().map(|f| (f, f.offset)),
            &normed,
            m,
            logits,
            precision,
        )?;
    } else if let Some(out) = model
        .packed(precision)
        .and_then(|p| p.output.as_ref())
        .filter(|o| crate::packed::step_reads(o, kind, m))
    {
        // One token, or a decode step's or short prompt's tokens (each its one-token step's bits).
        match m {
            1 => out.matvec(&normed, logits),
            _ => out.matvec_batch(&normed, m, logits),
        }
        .map_err(kernel("output projection"))?;
    } else {
        mm_step(
            kind,
            &model.output,
            &normed,
            m,
            logits,
            precision,
            "output projection",
        )?;
    }
    Ok(())
}

/// The head layout as the attention kernels (with the `1/sqrt(head_dim)` scale) and the
/// families' attention steps (with the norm epsilon) see it.
fn head_shapes(cfg: &crate::config::ModelConfig) -> (Heads, HeadShape) {
    let hd = cfg.head_dim;
    let scale = 1.0 / (hd as f32).sqrt();
    let heads = Heads {
        n_heads: cfg.n_heads,
        n_kv_heads: cfg.n_kv_heads,
        head_dim: hd,
        scale,
    };
    let head_shape = HeadShape {
        n_heads: cfg.n_heads,
        n_kv_heads: cfg.n_kv_heads,
        head_dim: hd,
        rms_eps: cfg.rms_eps,
    };
    (heads, head_shape)
}

/// The FFN executor of a step must fit the model: a resident file has no FFN matrices, so only an
/// executor with its own weights can run it; an MoE block runs on the dense kernels only.
fn check_ffn_mode(model: &Model<'_>, ffn: &FfnMode<'_, '_>) -> Result<()> {
    if model.config.ffn_store.is_some()
        && (ffn.observer.is_some() || !ffn.exec.is_some_and(|e| e.owns_weights()))
    {
        return Err(resident_needs_sparse(model));
    }
    if ffn.exec.is_some_and(|e| !e.runs_experts()) || ffn.observer.is_some() {
        model.refuse_moe("a sparse, offloaded, accelerated or observed FFN")?;
    }
    Ok(())
}

/// Rotates each token's q and k rows by its angles at the layer's RoPE base (`ropes`: one table
/// per base, the first the model's own).
fn apply_rope(
    ropes: &[(f32, Vec<kernels_neon::RopeAngles>)],
    base: f32,
    cfg: &crate::config::ModelConfig,
    q: &mut [f32],
    k: &mut [f32],
) {
    let (qd, kvd) = (cfg.q_dim(), cfg.kv_dim());
    let rope = ropes
        .iter()
        .find(|(b, _)| b.to_bits() == base.to_bits())
        .map_or(&ropes[0].1, |(_, r)| r);
    for (t, angles) in rope.iter().enumerate() {
        angles.apply(&mut q[t * qd..(t + 1) * qd], cfg.n_heads, cfg.rope_style);
        angles.apply(
            &mut k[t * kvd..(t + 1) * kvd],
            cfg.n_kv_heads,
            cfg.rope_style,
        );
    }
}

/// Runs `f`, adding the nanoseconds it took to `acc` when given.
fn timed<T>(acc: Option<&std::sync::atomic::AtomicU64>, f: impl FnOnce() -> T) -> T {
    let t0 = acc.map(|_| std::time::Instant::now());
    let out = f();
    if let (Some(acc), Some(t0)) = (acc, t0) {
        acc.fetch_add(
            t0.elapsed().as_nanos() as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
    }
    out
}
