//! A prompt step's FFN over the neuron store ([`Offload::prefill`]): every unit of the layer, the hot
//! ones from their pinned clusters and the rest read from flash in large sequential chunks by a
//! reader thread while this thread computes the chunk before (PowerInfer-2 streams a prompt's weights
//! this way), each chunk as batched products over all the step's tokens, or handed to an
//! accelerator ([`Offload::set_prompt_accel`]: NPU-centric prefill). Token by token decode over the
//! store, which a prompt used before, reads the same units once per token.

use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::Instant;

use kernels_neon::{Activation, Precision, QMatrix};
use neuron_store::StoreIndex;
use rayon::prelude::*;
use ufs_io::AlignedBuf;

use super::prompt_accel::PromptAccel;
use super::runtime::Offload;
use crate::accel::{Accelerator, StreamedRows};
use crate::error::{kernel, EngineError, Result};
use crate::neurons::{LayerRule, Score};

/// Which neurons each token of a prompt step computes, besides the layer's threshold.
#[derive(Clone, Copy)]
pub(crate) struct PrefillMask<'a> {
    /// `n × d_ff`: the predictor's candidates of each token (every neuron when `None`).
    pub keep: Option<&'a [bool]>,
    /// `d_ff`: neurons computed elsewhere (an accelerator), left out here.
    pub skip: Option<&'a [bool]>,
}

/// The gate, up and down rows of one chunk's neurons, gathered from its units back to back (each
/// part a row-major matrix in its store format), and the neuron id of each row.
#[derive(Default)]
struct Chunk {
    ids: Vec<u32>,
    gate: Vec<u8>,
    up: Vec<u8>,
    down: Vec<u8>,
}

impl Chunk {
    fn gather(&mut self, ix: &StoreIndex, layer: usize, units: &[(usize, &[u8])]) {
        let l = ix.layout;
        self.ids.clear();
        self.gate.clear();
        self.up.clear();
        self.down.clear();
        for &(u, bytes) in units {
            let ids = ix.neurons_of(layer, u);
            let k = ids.len();
            self.ids.extend_from_slice(ids);
            let (g, up, d) = (l.gate_range(), l.up_range(), l.down_range());
            self.gate
                .extend_from_slice(&bytes[g.start..g.start + k * l.gate_row]);
            self.up
                .extend_from_slice(&bytes[up.start..up.start + k * l.up_row]);
            self.down
                .extend_from_slice(&bytes[d.start..d.start + k * l.down_row]);
        }
    }
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
                match rule.activation {
                    Activation::Silu => kernels_neon::silu_mul_inplace(gt, ut),
                    Activation::Relu => kernels_neon::relu_mul_inplace(gt, ut),
                }
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
            return Err(EngineError::Request(format!(
                "offloaded prefill: layer {layer}, {n} tokens of {} floats do not match the store ({} layers of width {d})",
                x.len(),
                ix.layers.len()
            )));
        }
        let t0 = Instant::now();
        out.fill(0.0);
        let mut chunk = Chunk::default();
        let (mut g, mut u, mut y) = (Vec::new(), Vec::new(), vec![0f32; n * d]);
        // Hybrid prompt steps (`mask.skip`) keep the CPU path: the accelerator's chunk is dense.
        let accel = self.prompt_accel.as_ref().filter(|_| mask.skip.is_none());
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
            let on_accel = accel.is_some_and(|a| a.run(&rows, x, n, &mut y));
            if !on_accel {
                g.resize(n * k, 0.0);
                u.resize(n * k, 0.0);
                kernels_neon::matmul(&wg, x, n, &mut g, precision)
                    .map_err(kernel("offloaded prefill gate"))?;
                kernels_neon::matmul(&wu, x, n, &mut u, precision)
                    .map_err(kernel("offloaded prefill up"))?;
                select(&rule, mask, &chunk.ids, ff, &mut g, &u);
                kernels_neon::matmul_t(&wd, &g, n, &mut y)
                    .map_err(kernel("offloaded prefill down"))?;
            }
            out.par_chunks_mut(d)
                .zip(y.par_chunks(d))
                .for_each(|(o, yt)| kernels_neon::axpy_f32(1.0, yt, o));
            Ok(())
        })?;
        let c = &self.counters;
        c.prefill_ns
            .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Runs prompt steps on `accel` from the next step on (`None`: on the CPU): every chunk of
    /// every layer dense there, with the hybrid prompt steps' exception (see [`PromptAccel`]).
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

    /// Runs `f` (a prompt step) with `bytes` of the neuron cache lent to it: where the cache's budget
    /// binds (it cannot hold the whole FFN), the cache first shrinks by `bytes` (its least hot
    /// clusters dropped and their memory handed back) and afterwards grows back, reading them again.
    /// So a prompt step's working memory stays inside the process budget the cache is part of;
    /// decode keeps the whole cache. `f`'s error comes first, then one restoring the cache.
    pub(crate) fn lend_cache<R>(&self, bytes: usize, f: impl FnOnce() -> Result<R>) -> Result<R> {
        let budget = self.cache.stats().budget;
        if bytes == 0 || budget >= self.store.index().ffn_bytes() {
            return f();
        }
        self.live.lend(bytes)?;
        let out = f();
        // The step's buffers go back to the system before the clusters are read again.
        crate::sys::release_free_memory();
        let back = self.live.give_back(bytes);
        let out = out?;
        back.map(|()| out)
    }

    /// Calls `f` with every unit of `layer` as `(unit, bytes)`, in chunks of about
    /// [`super::OffloadOptions::prefill_neurons`] neurons whose bounds are fixed by unit index, so
    /// that a step's sums do not depend on which units are hot: the hot prefix's whole chunks from
    /// its pinned clusters, then the rest read sequentially (and verified) by a reader thread one
    /// chunk ahead of `f`, in two buffers used in turn (the chunk the hot prefix ends in gets its hot
    /// units from the clusters and the others from the first read). The first error, of a read or
    /// of `f`, stops the stream and is returned.
    pub(crate) fn stream_layer(
        &self,
        layer: usize,
        mut f: impl FnMut(&[(usize, &[u8])]) -> Result<()>,
    ) -> Result<()> {
        let ix = self.store.index();
        let ub = ix.layout.unit_bytes();
        let per = self.opts.prefill_neurons.div_ceil(ix.layout.neurons).max(1);
        let total = ix.units_per_layer();
        let hot = self.live.read_hot();
        let hot_units = hot.units[layer].min(total);
        let cu = self.opts.cluster_units.max(1);
        // The chunk the hot prefix ends in starts here; its hot units wait for the first read.
        let split = hot_units / per * per;
        let first_end = if hot_units == split {
            hot_units
        } else {
            (split + per).min(total)
        };
        let cold: Vec<Range<usize>> = std::iter::once(hot_units..first_end)
            .filter(|r| !r.is_empty())
            .chain(
                (first_end..total)
                    .step_by(per)
                    .map(|s| s..(s + per).min(total)),
            )
            .collect();
        let hot_unit = |u: usize| -> (usize, &[u8]) {
            let c: &[u8] = &hot.clusters[layer][u / cu];
            (u, &c[(u % cu) * ub..(u % cu + 1) * ub])
        };
        std::thread::scope(|s| {
            // A rendezvous channel: the reader fills the next buffer while `f` computes this one.
            let (tx, rx) = mpsc::sync_channel::<Result<(Range<usize>, AlignedBuf)>>(0);
            let (back_tx, back_rx) = mpsc::channel::<AlignedBuf>();
            s.spawn(move || {
                for r in cold {
                    let len = r.len() * ub;
                    let read = match back_rx.try_recv().ok().filter(|b| b.len() == len) {
                        Some(buf) => self.store.read_units_into(&self.io, layer, r.clone(), buf),
                        None => self.store.read_units(&self.io, layer, r.clone()),
                    };
                    if read.is_ok() {
                        self.counters
                            .prefill_bytes
                            .fetch_add(len as u64, Ordering::Relaxed);
                    }
                    let failed = read.is_err();
                    if tx.send(read.map(|b| (r, b)).map_err(Into::into)).is_err() || failed {
                        return;
                    }
                }
            });
            let mut units: Vec<(usize, &[u8])> = Vec::with_capacity(per);
            for start in (0..split).step_by(per) {
                units.clear();
                units.extend((start..start + per).map(hot_unit));
                f(&units)?;
            }
            // Hot units of a chunk that the reads complete (all of them when the whole layer is
            // hot and its last chunk is short).
            let mut lead: Vec<(usize, &[u8])> = (split..hot_units).map(hot_unit).collect();
            if hot_units == total && !lead.is_empty() {
                f(&lead)?;
                lead.clear();
            }
            for read in rx {
                let (r, buf) = read?;
                let mut units = std::mem::take(&mut lead);
                units.extend(
                    r.clone()
                        .enumerate()
                        .map(|(i, u)| (u, &buf[i * ub..(i + 1) * ub])),
                );
                f(&units)?;
                drop(units);
                // The reader may be done; a buffer nobody takes back is simply dropped.
                let _ = back_tx.send(buf);
            }
            Ok(())
        })
    }
}
