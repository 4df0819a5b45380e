//! Attention of one query head over a KV cache: scores `scale · q·k_j`, softmax, and the weighted sum
//! of the values, with the dot products and the value accumulation on the SIMD path (each checked
//! against the scalar reference, `tests/it/attention.rs`).

use crate::{arch, check_len, check_path, KernelError, KernelPath, KvFormat, LayoutError};

/// Where one head's rows sit in a KV cache of f32 rows: the row of position `j` is
/// `cache[j * stride + offset..j * stride + offset + head_dim]` (for a cache of `kv_heads × head_dim`
/// per position, `stride = kv_heads * head_dim` and `offset = kv_head * head_dim`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvLayout {
    /// Elements from one position's row to the next.
    pub stride: usize,
    /// The head's first element within a position's row.
    pub offset: usize,
    /// Elements per head.
    pub head_dim: usize,
}

/// `out = Σ_{j < ctx} softmax(scale · q·k_j)_j · v_j` over the first `ctx` positions of the key and
/// value caches `k` and `v` (same layout). `scores` is scratch (left holding the attention weights).
/// `ctx == 0` gives `out = 0`.
#[allow(clippy::too_many_arguments)]
pub fn attend(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    layout: KvLayout,
    ctx: usize,
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) -> Result<(), KernelError> {
    attend_with(
        crate::active_path(),
        q,
        k,
        v,
        layout,
        ctx,
        scale,
        scores,
        out,
    )
}

/// [`attend`] on an explicit path (for tests and benchmarks).
#[doc(hidden)]
#[allow(clippy::too_many_arguments)]
pub fn attend_with(
    path: KernelPath,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    layout: KvLayout,
    ctx: usize,
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) -> Result<(), KernelError> {
    check_path(path)?;
    let KvLayout {
        stride,
        offset,
        head_dim: hd,
    } = layout;
    check_len("attend q", hd, q.len())?;
    check_len("attend out", hd, out.len())?;
    if offset.checked_add(hd).is_none_or(|e| e > stride) {
        return Err(KernelError::LengthMismatch {
            what: "attend layout: offset + head_dim within stride",
            expected: stride,
            actual: offset.saturating_add(hd),
        });
    }
    let need = ctx
        .checked_mul(stride)
        .ok_or(KernelError::Layout(LayoutError::Overflow {
            rows: ctx,
            cols: stride,
        }))?;
    for (what, cache) in [("attend k cache", k), ("attend v cache", v)] {
        if cache.len() < need {
            return Err(KernelError::LengthMismatch {
                what,
                expected: need,
                actual: cache.len(),
            });
        }
    }
    // Position j's row of the head: in bounds, since (j + 1) * stride <= ctx * stride <= len.
    let row = |j: usize| j * stride + offset..j * stride + offset + hd;
    scores.clear();
    scores.extend((0..ctx).map(|j| scale * arch::dot_f32(path, q, &k[row(j)])));
    crate::softmax_inplace(scores);
    out.fill(0.0);
    for (j, &s) in scores.iter().enumerate() {
        arch::axpy_f32(path, s, &v[row(j)], out);
    }
    Ok(())
}

/// One layer's keys or values in a KV cache of any [`KvFormat`], held in chunks: chunk `c` holds
/// positions `c * chunk ..` (at most `chunk` of them), each position a row of `layout.stride`
/// elements in `format` (`format.row_bytes(stride)` bytes), so the row of position `j` starts at
/// byte `(j % chunk) * row_bytes` of chunk `j / chunk`. A cache grows a chunk at a time.
#[derive(Debug, Clone, Copy)]
pub struct KvChunks<'a> {
    /// How the rows are stored.
    pub format: KvFormat,
    /// Positions per chunk (the last chunk may hold fewer).
    pub chunk: usize,
    /// The chunks, in position order.
    pub chunks: &'a [Vec<u8>],
}

/// [`attend`] over keys `k` and values `v` stored in a chunked cache of any [`KvFormat`] (same format,
/// chunking and `layout`, in elements): the scores and the weighted sum read each row in its format
/// (f32 loads, f16 converted by F16C / NEON `fcvtl`, `q8_0` blocks scaled per 32 elements), never an
/// f32 copy of the cache. For `q8_0` the head's offset and width must be multiples of 32.
#[allow(clippy::too_many_arguments)]
pub fn attend_cache(
    q: &[f32],
    k: KvChunks<'_>,
    v: KvChunks<'_>,
    layout: KvLayout,
    ctx: usize,
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) -> Result<(), KernelError> {
    attend_cache_with(
        crate::active_path(),
        q,
        k,
        v,
        layout,
        ctx,
        scale,
        scores,
        out,
    )
}

/// Byte geometry of a chunked cache for one head: bytes per position and the head's byte offset in
/// a position's row.
fn chunk_geometry(c: &KvChunks<'_>, layout: KvLayout) -> Result<(usize, usize), KernelError> {
    let bad = |what, expected, actual| KernelError::LengthMismatch {
        what,
        expected,
        actual,
    };
    if c.chunk == 0 {
        return Err(bad("attend_cache positions per chunk", 1, 0));
    }
    let b = c.format.block();
    for (what, n) in [
        (
            "attend_cache row width: a multiple of the format's block",
            layout.stride,
        ),
        (
            "attend_cache head offset: a multiple of the format's block",
            layout.offset,
        ),
        (
            "attend_cache head width: a multiple of the format's block",
            layout.head_dim,
        ),
    ] {
        if n % b != 0 {
            return Err(bad(what, n.next_multiple_of(b), n));
        }
    }
    let bytes = |n: usize| {
        c.format
            .row_bytes(n)
            .ok_or(KernelError::Layout(LayoutError::Overflow {
                rows: c.chunk,
                cols: layout.stride,
            }))
    };
    Ok((bytes(layout.stride)?, bytes(layout.offset)?))
}

/// Checks that `layout`'s head lies within a position's row and that keys `k` and values `v`
/// share a format and chunking and hold the first `ctx` positions' rows; returns the bytes per position and the head's byte offset.
pub(crate) fn check_cache(
    k: &KvChunks<'_>,
    v: &KvChunks<'_>,
    layout: KvLayout,
    ctx: usize,
) -> Result<(usize, usize), KernelError> {
    if layout
        .offset
        .checked_add(layout.head_dim)
        .is_none_or(|e| e > layout.stride)
    {
        return Err(KernelError::LengthMismatch {
            what: "attend layout: offset + head_dim within stride",
            expected: layout.stride,
            actual: layout.offset.saturating_add(layout.head_dim),
        });
    }
    if k.format != v.format || k.chunk != v.chunk {
        return Err(KernelError::LengthMismatch {
            what: "attend_cache: keys and values in the same format and chunks",
            expected: k.chunk,
            actual: v.chunk,
        });
    }
    let (pos_bytes, off) = chunk_geometry(k, layout)?;
    let chunk = k.chunk;
    // Every chunk the first `ctx` positions touch must hold its positions' rows.
    for (what, c) in [("attend k cache", k), ("attend v cache", v)] {
        let needed = ctx.div_ceil(chunk);
        if c.chunks.len() < needed {
            return Err(KernelError::LengthMismatch {
                what,
                expected: needed * chunk,
                actual: c.chunks.len() * chunk,
            });
        }
        for (i, bytes) in c.chunks[..needed].iter().enumerate() {
            let m = (ctx - i * chunk).min(chunk);
            if bytes.len() < m * pos_bytes {
                return Err(KernelError::LengthMismatch {
                    what,
                    expected: m * pos_bytes,
                    actual: bytes.len(),
                });
            }
        }
    }
    Ok((pos_bytes, off))
}

/// [`attend_cache`] on an explicit path (for tests and benchmarks).
#[doc(hidden)]
#[allow(clippy::too_many_arguments)]
pub fn attend_cache_with(
    path: KernelPath,
    q: &[f32],
    k: KvChunks<'_>,
    v: KvChunks<'_>,
    layout: KvLayout,
    ctx: usize,
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) -> Result<(), KernelError> {
    attend_cache_span_with(path, q, k, v, layout, 0..ctx, scale, scores, out)
}

/// [`attend_cache`] over positions `span` only (`span.start < span.end`, or an empty span giving
/// `out = 0`): a sliding-window layer's query sees the last positions of the cache, not the
/// first. `scores` is left holding the weights of the span's positions. Over `0..ctx` it computes
/// what [`attend_cache`] does, bit for bit.
#[allow(clippy::too_many_arguments)]
pub fn attend_cache_span(
    q: &[f32],
    k: KvChunks<'_>,
    v: KvChunks<'_>,
    layout: KvLayout,
    span: std::ops::Range<usize>,
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) -> Result<(), KernelError> {
    attend_cache_span_with(
        crate::active_path(),
        q,
        k,
        v,
        layout,
        span,
        scale,
        scores,
        out,
    )
}

/// [`attend_cache_span`] on an explicit path (for tests and benchmarks).
#[doc(hidden)]
#[allow(clippy::too_many_arguments)]
pub fn attend_cache_span_with(
    path: KernelPath,
    q: &[f32],
    k: KvChunks<'_>,
    v: KvChunks<'_>,
    layout: KvLayout,
    span: std::ops::Range<usize>,
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) -> Result<(), KernelError> {
    let cache = (k, v, layout);
    attend_span_inner(path, q, cache, span, scale, false, scores, out)
}

/// [`attend_cache_span`] with llama.cpp's roundings of its CPU attention without flash attention
/// (`ggml_mul_mat` of the f16 cache and `ggml_soft_max_ext`): the query rounded to f16 before the
/// scores, the softmax's sum in f64 and each weight `exp(s - max) * (1/sum)` rounded to f16
/// before the weighted sum of the values. For an f16 cache that is ggml's product of f16 rows
/// up to f32 summation order.
#[allow(clippy::too_many_arguments)]
pub fn attend_cache_span_ggml(
    q: &[f32],
    k: KvChunks<'_>,
    v: KvChunks<'_>,
    layout: KvLayout,
    span: std::ops::Range<usize>,
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) -> Result<(), KernelError> {
    let path = crate::active_path();
    let cache = (k, v, layout);
    attend_span_inner(path, q, cache, span, scale, true, scores, out)
}

/// [`attend_cache_span_with`], with llama.cpp's roundings where `ggml` ([`attend_cache_span_ggml`]).
#[allow(clippy::too_many_arguments)]
fn attend_span_inner(
    path: KernelPath,
    q: &[f32],
    (k, v, layout): (KvChunks<'_>, KvChunks<'_>, KvLayout),
    span: std::ops::Range<usize>,
    scale: f32,
    ggml: bool,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) -> Result<(), KernelError> {
    check_path(path)?;
    let hd = layout.head_dim;
    check_len("attend q", hd, q.len())?;
    check_len("attend out", hd, out.len())?;
    let q16: Vec<f32>;
    let q = if ggml {
        q16 = q.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect();
        &q16[..]
    } else {
        q
    };
    let (lo, ctx) = (span.start, span.end);
    let (pos_bytes, off) = check_cache(&k, &v, layout, ctx)?;
    let chunk = k.chunk;
    let format = k.format;
    scores.clear();
    scores.resize(ctx.saturating_sub(lo), 0.0);
    // The span's positions, a run per chunk: (chunk, first byte of the run in it, its scores).
    let runs = || {
        (lo / chunk..ctx.div_ceil(chunk).max(lo / chunk)).map(move |c| {
            let first = (c * chunk).max(lo);
            let end = ((c + 1) * chunk).min(ctx);
            (c, (first - c * chunk) * pos_bytes, first - lo..end - lo)
        })
    };
    for (c, at, s) in runs() {
        arch::kv::scores(
            path,
            format,
            q,
            &k.chunks[c][at..],
            pos_bytes,
            off,
            scale,
            &mut scores[s],
        );
    }
    if ggml {
        softmax_ggml(scores);
    } else {
        crate::softmax_inplace(scores);
    }
    out.fill(0.0);
    for (c, at, s) in runs() {
        arch::kv::accumulate(
            path,
            format,
            &scores[s],
            &v.chunks[c][at..],
            pos_bytes,
            off,
            out,
        );
    }
    Ok(())
}

/// ggml's `soft_max` of one row of scores, its weights rounded to f16 as its product with an f16
/// cache rounds them: `e = exp(s - max)`, summed in f64, each weight `f16(e * f32(1/sum))`.
fn softmax_ggml(x: &mut [f32]) {
    let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    if x.is_empty() || max == f32::NEG_INFINITY {
        return crate::softmax_inplace(x);
    }
    let mut sum = 0f64;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += f64::from(*v);
    }
    let inv = (1.0 / sum) as f32;
    for v in x.iter_mut() {
        *v = half::f16::from_f32(*v * inv).to_f32();
    }
}

#[cfg(test)]
mod ggml_tests {
    use super::softmax_ggml;

    /// Weights are f16 values of the f32 probabilities (the f64 sum), largest where the score is.
    #[test]
    fn ggml_softmax_rounds_weights_to_f16() {
        let mut x = vec![0.1f32, 2.0, -1.5, 0.7, 2.0 - 1e-3];
        let want: Vec<f32> = {
            let m = 2.0f32;
            let e: Vec<f32> = x.iter().map(|v| (v - m).exp()).collect();
            let sum: f64 = e.iter().map(|&v| f64::from(v)).sum();
            e.iter().map(|&v| v * (1.0 / sum) as f32).collect()
        };
        softmax_ggml(&mut x);
        for (got, w) in x.iter().zip(&want) {
            assert_eq!(*got, half::f16::from_f32(*w).to_f32());
            assert!((got - w).abs() <= w * 1e-3, "{got} vs {w}");
        }
        assert_ne!(x, want, "some weight is not an f16 value");
    }
}
