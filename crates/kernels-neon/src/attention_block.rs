//! Causal attention of a block of query rows that share one KV head (a prompt's tokens × the query
//! heads of a GQA group) over a chunked cache: the head's keys and values are decoded to f32 once
//! ([`HeadCache::load`], keys transposed), then the scores and the weighted sum of each block are
//! small matrix products ([`attend_head`], `arch::attend_block`) instead of one dot product and one
//! axpy per key and row. Each row gets what [`crate::attend_cache`] gives it, up to f32 rounding
//! (checked in `tests/it/attention_block.rs`).

use crate::attention::check_cache;
use crate::{
    arch, check_len, check_path, kv_decode, KernelError, KernelPath, KvChunks, KvLayout,
    LayoutError,
};

/// One head's first positions of a chunked KV cache in f32, for [`attend_head`]: keys transposed
/// (`kt[d * padded + j]`, zero past the positions) where the head width is a multiple of 16, else
/// row-major like the values.
#[derive(Debug, Default)]
pub struct HeadCache {
    k: Vec<f32>,
    v: Vec<f32>,
    len: usize,
    padded: usize,
    head_dim: usize,
}

impl HeadCache {
    /// Decodes positions `0..len` of the head `layout` of keys `k` and values `v` (replacing what
    /// the cache held; its buffers are reused).
    pub fn load(
        &mut self,
        k: KvChunks<'_>,
        v: KvChunks<'_>,
        layout: KvLayout,
        len: usize,
    ) -> Result<(), KernelError> {
        let (pos_bytes, off) = check_cache(&k, &v, layout, len)?;
        let hd = layout.head_dim;
        let row_bytes =
            k.format
                .row_bytes(hd)
                .ok_or(KernelError::Layout(LayoutError::Overflow {
                    rows: len,
                    cols: hd,
                }))?;
        let blocked = hd > 0 && hd % arch::LANES == 0;
        self.padded = if blocked {
            len.next_multiple_of(arch::LANES)
        } else {
            len
        };
        (self.len, self.head_dim) = (len, hd);
        self.k.clear();
        self.k.resize(hd * self.padded, 0.0);
        self.v.clear();
        self.v.resize(len * hd, 0.0);
        let mut row = vec![0f32; hd];
        for j in 0..len {
            // In bounds: `check_cache` saw every chunk hold its first positions' whole rows.
            let (c, b) = (j / k.chunk, (j % k.chunk) * pos_bytes + off);
            if blocked {
                kv_decode(k.format, &k.chunks[c][b..b + row_bytes], &mut row)?;
                for (d, &x) in row.iter().enumerate() {
                    self.k[d * self.padded + j] = x;
                }
            } else {
                let dst = &mut self.k[j * hd..(j + 1) * hd];
                kv_decode(k.format, &k.chunks[c][b..b + row_bytes], dst)?;
            }
            let dst = &mut self.v[j * hd..(j + 1) * hd];
            kv_decode(v.format, &v.chunks[c][b..b + row_bytes], dst)?;
        }
        Ok(())
    }

    /// Positions held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no position is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// `out[i] = Σ_{j < lens[i]} softmax(scale · q_i·k_j)_j · v_j` for query rows `q_i` (`lens.len()`
/// rows of the head's width, row-major in `q` and `out`) over a [`HeadCache`] (each `lens[i]`
/// between 1 and its length). `scores` is scratch.
pub fn attend_head(
    q: &[f32],
    lens: &[usize],
    head: &HeadCache,
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) -> Result<(), KernelError> {
    attend_head_with(crate::active_path(), q, lens, head, scale, scores, out)
}

/// [`attend_head`] on an explicit path (for tests and benchmarks).
#[doc(hidden)]
pub fn attend_head_with(
    path: KernelPath,
    q: &[f32],
    lens: &[usize],
    head: &HeadCache,
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) -> Result<(), KernelError> {
    attend_head_span_with(path, q, &[], lens, head, scale, scores, out)
}

/// [`attend_head`] where row `i` sees keys `starts[i]..lens[i]` only (a sliding window; each
/// start below its row's length). Empty `starts`: every row from 0, as [`attend_head`].
pub fn attend_head_span(
    q: &[f32],
    starts: &[usize],
    lens: &[usize],
    head: &HeadCache,
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) -> Result<(), KernelError> {
    attend_head_span_with(
        crate::active_path(),
        q,
        starts,
        lens,
        head,
        scale,
        scores,
        out,
    )
}

/// [`attend_head_span`] on an explicit path (for tests and benchmarks).
#[doc(hidden)]
#[allow(clippy::too_many_arguments)]
pub fn attend_head_span_with(
    path: KernelPath,
    q: &[f32],
    starts: &[usize],
    lens: &[usize],
    head: &HeadCache,
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) -> Result<(), KernelError> {
    check_path(path)?;
    let hd = head.head_dim;
    check_len("attend_head q", lens.len() * hd, q.len())?;
    check_len("attend_head out", lens.len() * hd, out.len())?;
    if let Some(&l) = lens.iter().find(|&&l| l == 0 || l > head.len) {
        return Err(KernelError::LengthMismatch {
            what: "attend_head: keys seen by a row (1 to the head cache's positions)",
            expected: head.len,
            actual: l,
        });
    }
    if !starts.is_empty() {
        check_len("attend_head starts (one per row)", lens.len(), starts.len())?;
        if let Some((&s, &l)) = starts.iter().zip(lens).find(|(s, l)| s >= l) {
            return Err(KernelError::LengthMismatch {
                what: "attend_head: a row's first key (below its length)",
                expected: l,
                actual: s,
            });
        }
    }
    if lens.is_empty() || hd == 0 {
        return Ok(());
    }
    if hd % arch::LANES != 0 {
        // Row-major keys: one row at a time.
        let layout = KvLayout {
            stride: hd,
            offset: 0,
            head_dim: hd,
        };
        for (i, ((qi, oi), &l)) in q
            .chunks_exact(hd)
            .zip(out.chunks_exact_mut(hd))
            .zip(lens)
            .enumerate()
        {
            let st = starts.get(i).copied().unwrap_or(0);
            let (k, v) = (&head.k[st * hd..], &head.v[st * hd..]);
            crate::attend_with(path, qi, k, v, layout, l - st, scale, scores, oi)?;
        }
        return Ok(());
    }
    arch::attend_block(
        path,
        q,
        lens,
        starts,
        hd,
        &head.k,
        head.padded,
        &head.v,
        scale,
        scores,
        out,
    );
    Ok(())
}

/// [`HeadCache::load`] of the longest row's keys, then [`attend_head`]: a block of query rows over
/// the head `layout` of a chunked cache.
#[allow(clippy::too_many_arguments)]
pub fn attend_cache_block_with(
    path: KernelPath,
    q: &[f32],
    lens: &[usize],
    k: KvChunks<'_>,
    v: KvChunks<'_>,
    layout: KvLayout,
    scale: f32,
    head: &mut HeadCache,
    out: &mut [f32],
) -> Result<(), KernelError> {
    head.load(k, v, layout, lens.iter().copied().max().unwrap_or(0))?;
    attend_head_with(path, q, lens, head, scale, &mut Vec::new(), out)
}
