//! Attention of a prompt step (several consecutive tokens of a sequence): each sequence's keys and
//! values of a KV head are decoded to f32 once per layer (`kernels_neon::HeadCache`), then blocks of
//! up to [`BLOCK`] tokens × the query heads sharing that KV head go through the block kernel
//! (`kernels_neon::attend_head_span`: each row from the first position its layer's window lets it
//! see), in parallel. Decode steps keep the one-row kernel (`kernels_neon::attend_cache_span`).

use kernels_neon::{attend_head_span, HeadCache, KernelError, KvChunks, KvLayout};

use crate::layer::AttnSpan;
use rayon::prelude::*;

/// Query tokens per block.
const BLOCK: usize = 16;

/// The attention heads of a model.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Heads {
    /// Query heads.
    pub n_heads: usize,
    /// KV heads (each shared by `n_heads / n_kv_heads` query heads).
    pub n_kv_heads: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// Score scale (`1 / sqrt(head_dim)`).
    pub scale: f32,
}

/// `att[t]` (the token's `n_heads` head outputs) for every token `t` of the step: sequence
/// `place[t].0` at position `place[t].1`, seeing that sequence's positions `0..=place[t].1` in
/// `views[seq]` (keys, values), with queries `q[t]` (`n_heads × head_dim`); on a sliding-window
/// layer (`span.window`) only the last `window` of them.
pub(crate) fn attend_prompt(
    q: &[f32],
    place: &[(usize, usize)],
    views: &[(KvChunks<'_>, KvChunks<'_>)],
    heads: Heads,
    span: AttnSpan,
    att: &mut [f32],
) -> Result<(), KernelError> {
    let Heads {
        n_heads,
        n_kv_heads,
        head_dim: hd,
        scale,
    } = heads;
    let group = n_heads / n_kv_heads.max(1);
    let qd = n_heads * hd;
    // Runs of consecutive tokens of one sequence, cut into blocks.
    let mut blocks = Vec::new();
    let mut t = 0;
    while t < place.len() {
        let mut e = t + 1;
        while e < place.len() && place[e].0 == place[t].0 && e - t < BLOCK {
            e += 1;
        }
        blocks.push(t..e);
        t = e;
    }
    // Every (sequence, KV head) the step touches, decoded up to the furthest position it sees.
    let mut seqs: Vec<(usize, usize)> = Vec::new(); // (sequence, positions)
    for &(s, p) in place {
        match seqs.iter_mut().find(|(q, _)| *q == s) {
            Some(e) => e.1 = e.1.max(p + 1),
            None => seqs.push((s, p + 1)),
        }
    }
    let caches = seqs
        .par_iter()
        .flat_map_iter(|&(s, len)| (0..n_kv_heads).map(move |h| (s, len, h)))
        .map(|(s, len, h)| {
            let layout = KvLayout {
                stride: n_kv_heads * hd,
                offset: h * hd,
                head_dim: hd,
            };
            let mut c = HeadCache::default();
            let (k, v) = views[s];
            c.load(k, v, layout, len)?;
            Ok(c)
        })
        .collect::<Result<Vec<HeadCache>, KernelError>>()?;
    let cache_of = |s: usize, h: usize| {
        let i = seqs.iter().position(|&(q, _)| q == s).unwrap_or(0);
        &caches[i * n_kv_heads + h]
    };
    // Each block × KV head: its rows (token-major, then the group's heads) through the kernel.
    let items: Vec<(usize, usize)> = (0..blocks.len())
        .flat_map(|b| (0..n_kv_heads).map(move |h| (b, h)))
        .collect();
    let outs = items
        .par_iter()
        .map_init(Vec::new, |scores, &(b, h)| {
            let tokens = blocks[b].clone();
            let mut qb = Vec::with_capacity(tokens.len() * group * hd);
            let mut lens = Vec::with_capacity(tokens.len() * group);
            // First positions seen: none without a window (every row from 0).
            let mut starts = Vec::new();
            for t in tokens.clone() {
                let heads = h * group..(h + 1) * group;
                qb.extend_from_slice(&q[t * qd + heads.start * hd..t * qd + heads.end * hd]);
                lens.extend(std::iter::repeat_n(place[t].1 + 1, group));
                if span.window.is_some() {
                    starts.extend(std::iter::repeat_n(span.first_seen(place[t].1), group));
                }
            }
            let mut out = vec![0f32; qb.len()];
            let head = cache_of(place[tokens.start].0, h);
            attend_head_span(&qb, &starts, &lens, head, scale, scores, &mut out)?;
            Ok(out)
        })
        .collect::<Result<Vec<Vec<f32>>, KernelError>>()?;
    for (&(b, h), out) in items.iter().zip(&outs) {
        let row = group * hd;
        for (t, o) in blocks[b].clone().zip(out.chunks_exact(row)) {
            let at = t * qd + h * row;
            att[at..at + row].copy_from_slice(o);
        }
    }
    Ok(())
}
