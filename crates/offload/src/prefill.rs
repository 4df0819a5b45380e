//! A prompt step's FFN over the neuron store ([`Offload::prefill`]): every unit of the layer, the hot
//! ones from their pinned clusters and the rest read from flash in large sequential chunks by a
//! reader thread while this thread computes the chunk before (PowerInfer-2 streams a prompt's weights
//! this way), each chunk as batched products over all the step's tokens, or handed to an
//! accelerator ([`Offload::set_prompt_accel`]: NPU-centric prefill). Token by token decode over the
//! store, which a prompt used before, reads the same units once per token.

use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, PoisonError};
use std::time::Instant;

use kernels_neon::{Precision, QMatrix};
use rayon::prelude::*;
use ufs_io::AlignedBuf;

use super::chunk::Chunk;
use super::live::HotSet;
use super::prompt_accel::PromptAccel;
use super::runtime::Offload;
use crate::accel::{Accelerator, StreamedRows};
use crate::error::{kernel, OffloadError, Result};
use crate::neurons::{LayerRule, Score};

/// Which neurons each token of a prompt step computes, besides the layer's threshold.
#[derive(Clone, Copy)]
pub(crate) struct PrefillMask<'a> {
    /// `n × d_ff`: the predictor's candidates of each token (every neuron when `None`).
    pub keep: Option<&'a [bool]>,
    /// `d_ff`: neurons computed elsewhere (an accelerator), left out here.
    pub skip: Option<&'a [bool]>,
}

/// `g[t][j] = act(g)·u` of chunk neuron `j` (id `ids[j]`) for token `t` where the neuron is chosen
/// (`mask` and `rule`'s threshold), else 0 (`g`, `u`: `n × ids.len()`).
fn select(
    rule: &LayerRule<'_>,
    mask: PrefillMask<'_>,
    ids: &[u32],
    ff: usize,
    g: &mut [f32],
    u: &[f32],
) {
    let k = ids.len();
    // The chunk's norms and left-out neurons, in chunk order.
    let norms: Vec<f32> = ids.iter().map(|&i| rule.norms[i as usize]).collect();
    let skip: Option<Vec<bool>> = mask
        .skip
        .map(|s| ids.iter().map(|&i| s[i as usize]).collect());
    g.par_chunks_mut(k)
        .zip(u.par_chunks(k))
        .enumerate()
        .for_each(|(t, (gt, ut))| {
            let keep = mask.keep.map(|m| &m[t * ff..(t + 1) * ff]);
            let chosen = |j: usize| {
                keep.is_none_or(|m| m[ids[j] as usize]) && skip.as_ref().is_none_or(|s| !s[j])
            };
            if rule.score == Score::OutputNorm {
                // The score is |act(g)·u|·‖down‖: the products first, with the SIMD kernels.
                kernels_neon::act_mul_inplace(rule.activation, gt, ut);
                let t = rule.threshold;
                if keep.is_none() && skip.is_none() {
                    // Branch-free, so that it vectorizes.
                    for (h, &nj) in gt.iter_mut().zip(&norms) {
                        *h = if h.abs() * nj > t { *h } else { 0.0 };
                    }
                    return;
                }
                for (j, (h, &nj)) in gt.iter_mut().zip(&norms).enumerate() {
                    if !(h.abs() * nj > t && chosen(j)) {
                        *h = 0.0;
                    }
                }
                return;
            }
            for (j, ((v, &uv), &nj)) in gt.iter_mut().zip(ut).zip(&norms).enumerate() {
                let a = rule.act(*v);
                let pass = rule.score.of(a, uv, nj) > rule.threshold && chosen(j);
                *v = if pass { a * uv } else { 0.0 };
            }
        });
}

impl Offload {
    /// The FFN of `layer` for the `n` tokens of a prompt step (`x`, `out`: `n × d_model`): for every
    /// neuron the token's predictor candidates (`mask.keep`) include, that `mask.skip` does not leave
    /// out and whose score passes `rule`'s threshold, `out_t += act(gate·x_t)·(up·x_t) · down`: what
    /// sparse decode computes, as the in-memory sparse prefill masks it.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn prefill(
        &self,
        rule: LayerRule<'_>,
        mask: PrefillMask<'_>,
        layer: usize,
        x: &[f32],
        n: usize,
        out: &mut [f32],
        precision: Precision,
    ) -> Result<()> {
        let ix = self.store.index();
        let (d, ff) = (ix.d_model, ix.d_ff);
        if layer >= ix.layers.len()
            || x.len() != n * d
            || out.len() != n * d
            || mask.keep.is_some_and(|k| k.len() != n * ff)
            || mask.skip.is_some_and(|s| s.len() != ff)
        {
            return Err(OffloadError::Request(format!(
                "offloaded prefill: layer {layer}, {n} tokens of {} floats do not match the store ({} layers of width {d})",
                x.len(),
                ix.layers.len()
            )));
        }
        let t0 = Instant::now();
        out.fill(0.0);
        let mut chunk = Chunk::default();
        let (mut g, mut u, mut y) = (Vec::new(), Vec::new(), vec![0f32; n * d]);
        let accel = self.prompt_accel.as_ref();
        self.stream_layer(layer, |units| {
            chunk.gather(ix, layer, units);
            let k = chunk.ids.len();
            if k == 0 {
                return Ok(());
            }
            let wg = QMatrix::new(ix.formats.gate, k, d, &chunk.gate)
                .map_err(kernel("offloaded prefill gate"))?;
            let wu = QMatrix::new(ix.formats.up, k, d, &chunk.up)
                .map_err(kernel("offloaded prefill up"))?;
            let wd = QMatrix::new(ix.formats.down, k, d, &chunk.down)
                .map_err(kernel("offloaded prefill down"))?;
            let rows = StreamedRows {
                gate: wg,
                up: wu,
                down: wd,
                activation: rule.activation,
            };
            // The accelerator computes a chunk densely: not one with neurons left out for another
            // block (hybrid decode's, unless those are the units before the CPU's, as over a store).
            let whole = mask
                .skip
                .is_none_or(|s| !chunk.ids.iter().any(|&i| s[i as usize]));
            let on_accel = whole && accel.is_some_and(|a| a.run(&rows, x, n, &mut y));
            if !on_accel {
                g.resize(n * k, 0.0);
                u.resize(n * k, 0.0);
                kernels_neon::matmul(&wg, x, n, &mut g, precision)
                    .map_err(kernel("offloaded prefill gate"))?;
                kernels_neon::matmul(&wu, x, n, &mut u, precision)
                    .map_err(kernel("offloaded prefill up"))?;
                select(&rule, mask, &chunk.ids, ff, &mut g, &u);
                kernels_neon::matmul_t(&wd, &g, n, &mut y, precision)
                    .map_err(kernel("offloaded prefill down"))?;
            }
            out.par_chunks_mut(d)
                .zip(y.par_chunks(d))
                .for_each(|(o, yt)| kernels_neon::axpy_f32(1.0, yt, o));
            Ok(())
        })?;
        if self.cache_binds() {
            // glibc keeps what a layer's chunks and products freed in its arenas, scattered
            // between live blocks, so the process grew by about 40 MiB over a 512-token prompt
            // of 1216-neuron chunks on Qwen2.5-Coder-0.5B at a 211 MiB budget: handed back after
            // every layer, the prompt's memory stays inside what the cache lent it.
            drop((chunk, g, u, y));
            crate::sys::release_free_memory();
        }
        let c = &self.counters;
        c.prefill_ns
            .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Runs prompt steps on `accel` from the next step on (`None`: on the CPU): every chunk of
    /// every layer dense there, with the hybrid prompt steps' exception (see `PromptAccel`).
    pub fn set_prompt_accel(&mut self, accel: Option<Box<dyn Accelerator>>) {
        self.prompt_accel = accel.map(PromptAccel::new);
    }

    /// The accelerator of prompt steps, if any.
    pub fn prompt_accel(&self) -> Option<&dyn Accelerator> {
        self.prompt_accel.as_ref().map(PromptAccel::accel)
    }

    /// The prompt accelerator's first failure (after which prompt steps ran on the CPU), if any.
    pub fn prompt_accel_failure(&self) -> Option<String> {
        self.prompt_accel.as_ref().and_then(PromptAccel::failure)
    }

    /// Bytes the neuron cache may hold now.
    pub fn cache_budget(&self) -> usize {
        self.cache.stats().budget
    }

    /// Whether the neuron cache's budget binds: it cannot hold the whole FFN.
    fn cache_binds(&self) -> bool {
        self.cache_budget() < self.store.index().ffn_bytes()
    }

    /// Runs `f` (a prompt step) with `bytes` of the neuron cache lent to it: where the cache's budget
    /// binds (it cannot hold the whole FFN), the cache first shrinks by `bytes` (its least hot
    /// clusters dropped and their memory handed back) and afterwards grows back, reading them again.
    /// So a prompt step's working memory stays inside the process budget the cache is part of;
    /// decode keeps the whole cache. `f`'s error comes first, then one restoring the cache.
    pub fn lend_cache<R, E: From<OffloadError>>(
        &self,
        bytes: usize,
        f: impl FnOnce() -> Result<R, E>,
    ) -> Result<R, E> {
        if bytes == 0 || !self.cache_binds() {
            return f();
        }
        self.live.lend(bytes)?;
        let out = f();
        // The step's buffers go back to the system before the clusters are read again.
        crate::sys::release_free_memory();
        let back = self.live.give_back(bytes);
        let out = out?;
        Ok(back.map(|()| out)?)
    }

    /// Calls `f` with every unit of `layer` that is the CPU's (all but an accelerator's leading
    /// units, [`super::CacheControl::reserve`]) as `(unit, bytes)`, in chunks of at most
    /// [`super::OffloadOptions::prefill_neurons`] neurons (the layer split as evenly as whole units
    /// allow) whose bounds are fixed by unit index, so
    /// that a step's sums do not depend on which units are hot: the hot prefix's units from its
    /// pinned clusters, the rest read sequentially (and verified) by a reader thread one chunk ahead
    /// of `f`, in two buffers used in turn (a chunk the hot prefix ends in gets its hot units from
    /// the clusters and the others from its read). After the layer's reads the reader reads the next
    /// layer's first chunk, kept for that layer's call (PowerInfer-2's prefill: the next layer's
    /// weights read while this one computes). The first error, of a read or of `f`, stops the
    /// stream and is returned.
    pub(crate) fn stream_layer(
        &self,
        layer: usize,
        mut f: impl FnMut(&[(usize, &[u8])]) -> Result<()>,
    ) -> Result<()> {
        let ix = self.store.index();
        let ub = ix.layout.unit_bytes();
        let hot = self.live.read_hot();
        let cu = self.opts.cluster_units.max(1);
        let chunks = self.layer_chunks(layer, &hot);
        let mut reads: Vec<Range<usize>> = chunks
            .iter()
            .map(|(_, r)| r.clone())
            .filter(|r| !r.is_empty())
            .collect();
        // The first read, when the step's previous layer read it ahead (same units: the hot
        // prefixes have not moved since).
        let mut ahead = self
            .prefill_ahead
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .filter(|(l, r, _)| *l == layer && Some(r) == reads.first())
            .map(|(_, r, read)| read.map(|buf| (r, buf)));
        if ahead.is_some() {
            reads.remove(0);
        }
        // After its own reads the reader reads the next layer's first chunk, which the next call
        // takes: that read overlaps this layer's last chunk and the next layer's attention.
        let next = (layer + 1 < ix.layers.len())
            .then(|| {
                self.layer_chunks(layer + 1, &hot)
                    .into_iter()
                    .map(|(_, r)| r)
                    .find(|r| !r.is_empty())
            })
            .flatten();
        let hot_unit = |u: usize| -> (usize, &[u8]) {
            let (c, at) = hot
                .find(layer, u, cu, ub)
                .expect("a unit of the hot prefix");
            (u, &c[at..at + ub])
        };
        let read = |l: usize, r: Range<usize>, buf: Option<AlignedBuf>| {
            let len = r.len() * ub;
            let read = match buf.filter(|b| b.len() == len) {
                Some(buf) => self.store.read_units_into(&self.io, l, r, buf),
                None => self.store.read_units(&self.io, l, r),
            };
            if read.is_ok() {
                self.counters
                    .prefill_bytes
                    .fetch_add(len as u64, Ordering::Relaxed);
            }
            read
        };
        let streamed = std::thread::scope(|s| {
            // A rendezvous channel: the reader fills the next buffer while `f` computes this one.
            let (tx, rx) = mpsc::sync_channel::<Result<(Range<usize>, AlignedBuf)>>(0);
            let (back_tx, back_rx) = mpsc::channel::<AlignedBuf>();
            s.spawn(move || {
                for r in reads {
                    let got = read(layer, r.clone(), back_rx.try_recv().ok());
                    let failed = got.is_err();
                    if tx.send(got.map(|b| (r, b)).map_err(Into::into)).is_err() || failed {
                        return;
                    }
                }
                drop(tx);
                if let Some(r) = next {
                    // Kept with its outcome: a failed read fails the next layer's step, as its
                    // own read would have.
                    let got = read(layer + 1, r.clone(), back_rx.try_recv().ok());
                    *self
                        .prefill_ahead
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner) =
                        Some((layer + 1, r, got.map_err(Into::into)));
                    self.counters
                        .prefill_reads_ahead
                        .fetch_add(1, Ordering::Relaxed);
                }
            });
            let mut rx = rx.into_iter();
            for (c, cold) in chunks {
                let mut units: Vec<(usize, &[u8])> = Vec::with_capacity(c.len());
                for u in c.start..cold.start {
                    let (u, b) = hot_unit(u);
                    units.push((u, b));
                }
                if cold.is_empty() {
                    f(&units)?;
                    continue;
                }
                let (r, buf) = match ahead.take() {
                    Some(first) => first?,
                    None => rx.next().ok_or_else(|| {
                        OffloadError::Request("offloaded prompt: the reader stopped early".into())
                    })??,
                };
                debug_assert_eq!(r, cold);
                units.extend(r.enumerate().map(|(i, u)| (u, &buf[i * ub..(i + 1) * ub])));
                f(&units)?;
                drop(units);
                // The reader may be done; a buffer nobody takes back is simply dropped.
                let _ = back_tx.send(buf);
            }
            Ok(())
        });
        if streamed.is_err() {
            // A failed step keeps no read of the next layer.
            *self
                .prefill_ahead
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = None;
        }
        streamed
    }

    /// The chunks of a prompt step over `layer` as `(units, the cold ones read from flash)`, by unit
    /// index from the CPU's first unit (see [`Offload::stream_layer`]).
    fn layer_chunks(&self, layer: usize, hot: &HotSet) -> Vec<(Range<usize>, Range<usize>)> {
        let ix = self.store.index();
        let total = ix.units_per_layer();
        // At most `prefill_neurons` a chunk, as evenly as whole units allow.
        let most = self.opts.prefill_neurons.div_ceil(ix.layout.neurons).max(1);
        let per = total.div_ceil(total.div_ceil(most).max(1)).max(1);
        let lo = hot.first[layer].min(total);
        let hot_end = (lo + hot.units[layer]).min(total);
        // Each chunk's cold units follow its hot ones.
        (lo / per * per..total)
            .step_by(per)
            .map(|s| {
                let c = s.max(lo)..(s + per).min(total);
                let cold = c.start.max(hot_end).min(c.end)..c.end;
                (c, cold)
            })
            .collect()
    }
}
