//! [`HybridFfn`]: PowerInfer-2's hybrid decode. Each layer's hot neurons (the most frequently active
//! ones in the profile) run as one dense block on an accelerator ([`crate::accel`]); the rest stay
//! sparse on the CPU cores ([`SparseFfn`], the predicted neurons that pass the thresholds, hot ones
//! left out); the two run side by side (`rayon::join`) and are summed. A step with no neuron on the
//! accelerator is the sparse FFN's. Batched steps do the same with
//! the accelerator's batch graphs and the sparse executor's batched path.
//!
//! How many neurons are hot depends on the batch size ([`HotSplit`]): a batch of N sequences fires
//! the union of their neurons, so more neurons are worth computing densely. The block holds the
//! largest set; a step of `n` tokens runs its first `counts[bucket(n)]` neurons there and leaves the
//! rest of the layer to the CPU.
//!
//! The hot block is computed densely (no neuron of it skipped), so the result is the sparse FFN with
//! the hot neurons always on: with every neuron hot it is the dense FFN, with none it is the sparse
//! one. Over a neuron store the blocks are each layer's leading units (its hottest neurons, read once
//! at start-up, [`crate::Offload::accel_blocks`]) at every batch size, and the CPU reads only
//! the other neurons. An accelerator that fails mid-run is reported once ([`HybridFfn::failure`]) and the CPU
//! computes the whole layer sparsely from then on.

use accel::{AccelError, Failure};

use crate::accel::{blocks_for_model, open, AccelKind, Accelerator};
use crate::error::{OffloadError, Result};
use crate::sparse::SparseFfn;
use transformer::ffn::{FfnExecutor, FfnLayer, FfnScratch};
use transformer::model::Model;

/// Hot blocks on an accelerator, the rest sparse on the CPU.
pub struct HybridFfn {
    sparse: SparseFfn,
    accel: Box<dyn Accelerator>,
    /// `counts[l][b]`: the first neurons of layer `l`'s block that run on the accelerator in a step
    /// of batch bucket `b` ([`bucket`]).
    counts: Vec<[usize; BUCKETS]>,
    /// `hot[l][b][j]`: neuron `j` of layer `l` is among them (one mask per bucket).
    hot: Vec<[Vec<bool>; BUCKETS]>,
    failure: Failure,
}

/// Batch buckets: steps of 1, 2-3, 4-7 and 8 or more tokens (the accelerator's graph sizes,
/// [`crate::accel::BATCH_SIZES`]).
pub const BUCKETS: usize = 4;

/// The bucket of a step of `n` tokens: the largest graph size up to `n`, as an index of 1, 2, 4, 8.
pub fn bucket(n: usize) -> usize {
    match n {
        0 | 1 => 0,
        2 | 3 => 1,
        4..=7 => 2,
        _ => 3,
    }
}

/// Each layer's hot neurons per batch bucket: `order[l]` (the accelerator's block, hottest first)
/// and `counts[l][b]`, how many of its first neurons run there in a step of bucket `b` ([`bucket`]),
/// non-decreasing in `b` and at most `order[l].len()`.
#[derive(Debug, Clone, PartialEq)]
pub struct HotSplit {
    /// The block of each layer, hottest first.
    pub order: Vec<Vec<u32>>,
    /// Neurons of the block per batch bucket.
    pub counts: Vec<[usize; BUCKETS]>,
}

impl HotSplit {
    /// The same hot neurons `hot[l]` (in that order) at every batch size.
    pub fn fixed(hot: Vec<Vec<u32>>) -> HotSplit {
        let counts = hot.iter().map(|h| [h.len(); BUCKETS]).collect();
        HotSplit { order: hot, counts }
    }

    /// From the profile's batch frequencies: at batch size 1 the `share` most frequently active
    /// neurons of each layer (at least one when `share > 0`, by `freq` at batch size 1); at batch
    /// size N every neuron whose frequency of being active in a group of N tokens (the profile's
    /// `freq` at the largest profiled batch size up to N) reaches that of the last one of them. A
    /// neuron costs the accelerator the same whether it fires or not, and the CPU only when it
    /// fires in the batch, so the same frequency is the break-even at every batch size. The block
    /// is ordered by the frequency at the largest bucket (then at batch size 1), so each bucket's
    /// set is a prefix of it.
    pub fn from_profile(profile: &predictor::Profile, share: f64) -> HotSplit {
        let sizes = [1u32, 2, 4, 8];
        let index = |n: u32| batch_index(profile, n);
        let mut order = Vec::with_capacity(profile.layers.len());
        let mut counts = Vec::with_capacity(profile.layers.len());
        for l in &profile.layers {
            let n = l.n_neurons as usize;
            let k1 = ((share.clamp(0.0, 1.0) * n as f64).round() as usize)
                .max(usize::from(share > 0.0))
                .min(n);
            if k1 == 0 || l.freq.is_empty() {
                order.push((0..k1 as u32).collect());
                counts.push([k1; BUCKETS]);
                continue;
            }
            let freq = |bi: usize, j: u32| freq_at(l, bi, j);
            let by1 = l.hot_order(0).unwrap_or_default();
            // The break-even frequency: that of the last hot neuron at batch size 1.
            let theta = freq(0, by1[k1 - 1]);
            let mut c = [0usize; BUCKETS];
            for (b, &size) in sizes.iter().enumerate() {
                let bi = index(size);
                c[b] = if b == 0 {
                    k1
                } else {
                    (0..n as u32).filter(|&j| freq(bi, j) >= theta).count()
                };
            }
            for b in 1..BUCKETS {
                c[b] = c[b].max(c[b - 1]).min(n);
            }
            order.push(block_order(l, index(sizes[BUCKETS - 1]), c[BUCKETS - 1]));
            counts.push(c);
        }
        HotSplit { order, counts }
    }

    /// The counts a plan gives (`planner::HybridSplit::counts`: per layer, the hottest neurons on
    /// the accelerator at batch sizes 1, 2, 4 and 8), each layer's block ordered as
    /// [`HotSplit::from_profile`] orders it. Counts past a layer's neurons are capped; a plan for
    /// another number of layers, or whose counts shrink as the batch grows, is an error.
    pub fn planned(profile: &predictor::Profile, counts: &[[u32; BUCKETS]]) -> Result<HotSplit> {
        if counts.len() != profile.layers.len() {
            return Err(OffloadError::Request(format!(
                "the plan's hybrid split has {} layers, the profile {}",
                counts.len(),
                profile.layers.len()
            )));
        }
        let top = batch_index(profile, 8);
        let mut order = Vec::with_capacity(counts.len());
        let mut out = Vec::with_capacity(counts.len());
        for (l, c) in profile.layers.iter().zip(counts) {
            if c.windows(2).any(|w| w[1] < w[0]) {
                return Err(OffloadError::Request(format!(
                    "the plan's hybrid split shrinks as the batch grows: {c:?}"
                )));
            }
            let c = c.map(|k| (k as usize).min(l.n_neurons as usize));
            order.push(block_order(l, top, c[BUCKETS - 1]));
            out.push(c);
        }
        Ok(HotSplit { order, counts: out })
    }

    /// The hot neurons of layer `l` in a step of `n` tokens.
    pub fn neurons(&self, l: usize, n: usize) -> &[u32] {
        &self.order[l][..self.counts[l][bucket(n)]]
    }
}

/// The profile's batch size index for a step of `n` tokens: the largest profiled size up to `n`.
fn batch_index(profile: &predictor::Profile, n: u32) -> usize {
    profile
        .batch_sizes
        .iter()
        .enumerate()
        .filter(|&(_, &b)| b <= n)
        .max_by_key(|&(_, &b)| b)
        .map_or(0, |(i, _)| i)
}

/// Neuron `j`'s frequency at the profile's batch size index `bi` (0 where not profiled).
fn freq_at(l: &predictor::LayerProfile, bi: usize, j: u32) -> f32 {
    l.freq
        .get(bi)
        .and_then(|f| f.get(j as usize))
        .copied()
        .unwrap_or(0.0)
}

/// The first `k` neurons of layer `l` by their frequency at the profile's batch size index `top`
/// (then at batch size 1, then by index): the accelerator's block, each batch size's set a prefix.
fn block_order(l: &predictor::LayerProfile, top: usize, k: usize) -> Vec<u32> {
    let freq = |bi: usize, j: u32| freq_at(l, bi, j);
    let mut ord: Vec<u32> = (0..l.n_neurons).collect();
    ord.sort_by(|&a, &b| {
        freq(top, b)
            .total_cmp(&freq(top, a))
            .then(freq(0, b).total_cmp(&freq(0, a)))
            .then(a.cmp(&b))
    });
    ord.truncate(k);
    ord
}

impl HybridFfn {
    /// The hybrid FFN of `model`: the blocks `split.order[l]` of every layer on `accel`, whose
    /// blocks must be those neurons ([`HybridFfn::open_blocks`]), of which a step of `n` tokens runs
    /// the first `split.counts[l][bucket(n)]` there; the rest on `sparse`, in memory or over a
    /// neuron store (whose blocks come from [`crate::Offload::accel_blocks`]).
    pub fn new(
        sparse: SparseFfn,
        accel: Box<dyn Accelerator>,
        model: &Model<'_>,
        split: &HotSplit,
    ) -> Result<HybridFfn> {
        let cfg = &model.config;
        model.refuse_moe("hybrid decode (--accel with --sparse)")?;
        if split.order.len() != cfg.n_layers || split.counts.len() != cfg.n_layers {
            return Err(OffloadError::Request(format!(
                "hybrid decode: hot neurons for {} layers, the model has {}",
                split.order.len(),
                cfg.n_layers
            )));
        }
        if let Some(l) = (0..cfg.n_layers).find(|&l| sparse.is_dense(l)) {
            return Err(OffloadError::Request(format!(
                "hybrid decode: layer {l} of the sparse FFN runs dense (hybrid decode splits sparse layers)"
            )));
        }
        let mut hot = Vec::with_capacity(cfg.n_layers);
        for (l, (ids, counts)) in split.order.iter().zip(&split.counts).enumerate() {
            if accel.block_neurons(l) != ids.len() {
                return Err(OffloadError::Request(format!(
                    "hybrid decode: the {} accelerator's block of layer {l} holds {} neurons, not \
                     the {} hot ones",
                    accel.name(),
                    accel.block_neurons(l),
                    ids.len()
                )));
            }
            if let Some(bad) = ids.iter().find(|&&j| j as usize >= cfg.d_ff) {
                return Err(OffloadError::Request(format!(
                    "hybrid decode: hot neuron {bad} of layer {l} is past the layer's {}",
                    cfg.d_ff
                )));
            }
            if counts.iter().any(|&c| c > ids.len()) || counts.windows(2).any(|w| w[0] > w[1]) {
                return Err(OffloadError::Request(format!(
                    "hybrid decode: layer {l}'s hot counts {counts:?} are not non-decreasing up to \
                     its block of {}",
                    ids.len()
                )));
            }
            let masks: [Vec<bool>; BUCKETS] = std::array::from_fn(|b| {
                let mut m = vec![false; cfg.d_ff];
                for &j in &ids[..counts[b]] {
                    m[j as usize] = true;
                }
                m
            });
            hot.push(masks);
        }
        Ok(HybridFfn {
            sparse,
            accel,
            counts: split.counts.clone(),
            hot,
            failure: Failure::default(),
        })
    }

    /// Opens backend `kind` with `split.order[l]` of every layer of `model` as its blocks. A
    /// library that cannot be loaded or set up is an [`OffloadError::Accel`].
    pub fn open_blocks(
        kind: &AccelKind,
        model: &Model<'_>,
        split: &HotSplit,
    ) -> Result<Box<dyn Accelerator>> {
        open(kind, blocks_for_model(model, Some(&split.order)))
    }

    /// Neurons of layer `l` on the accelerator in a step of `n` tokens.
    pub fn hot_count(&self, l: usize, n: usize) -> usize {
        self.counts[l][bucket(n)]
    }

    /// The sparse part.
    pub fn sparse(&self) -> &SparseFfn {
        &self.sparse
    }

    /// The backend of the hot blocks.
    pub fn accelerator(&self) -> &dyn Accelerator {
        self.accel.as_ref()
    }

    /// The accelerator's first failure, after which the CPU computed every layer sparsely.
    pub fn failure(&self) -> Option<String> {
        self.failure.first()
    }

    fn run(
        &self,
        l: FfnLayer<'_, '_>,
        x: &[f32],
        n: usize,
        out: &mut [f32],
        scratch: &mut FfnScratch,
    ) -> Result<()> {
        let cold = |out: &mut [f32], scratch: &mut FfnScratch, skip: Option<&[bool]>| {
            if n == 1 {
                self.sparse.decode_except(l, x, out, skip)
            } else {
                self.sparse.batch_except(l, x, n, out, scratch, skip)
            }
        };
        let b = bucket(n);
        let k = self.counts[l.index][b];
        if k > 0 && !self.failure.happened() {
            let mut hot = vec![0f32; out.len()];
            let skip = Some(self.hot[l.index][b].as_slice());
            let block = |hot: &mut [f32]| self.accel.ffn(l.index, k, x, n, hot);
            let (h, c) = if self.accel.beside_cores() {
                // The accelerator's wait on a thread of its own: every pool thread takes the
                // CPU's part (under `rayon::join` the waiting one would sit out).
                std::thread::scope(|s| {
                    let waiting = s.spawn(|| block(&mut hot));
                    let c = cold(out, scratch, skip);
                    let h = waiting.join().unwrap_or_else(|_| {
                        Err(AccelError::Library {
                            library: self.accel.name().into(),
                            detail: "a block's call panicked".into(),
                        })
                    });
                    (h, c)
                })
            } else {
                rayon::join(|| block(&mut hot), || cold(out, scratch, skip))
            };
            c?;
            match h {
                Ok(()) => {
                    out.iter_mut().zip(&hot).for_each(|(o, h)| *o += h);
                    return Ok(());
                }
                Err(e) => self.failure.record(&e),
            }
        }
        cold(out, scratch, None)
    }
}

impl FfnExecutor for HybridFfn {
    /// Over a neuron store: the accelerator's blocks and the store hold every neuron.
    fn owns_weights(&self) -> bool {
        self.sparse.owns_weights()
    }

    fn decode(
        &self,
        l: FfnLayer<'_, '_>,
        x: &[f32],
        out: &mut [f32],
        scratch: &mut FfnScratch,
    ) -> transformer::Result<()> {
        Ok(self.run(l, x, 1, out, scratch)?)
    }

    fn batch(
        &self,
        l: FfnLayer<'_, '_>,
        x: &[f32],
        n: usize,
        out: &mut [f32],
        scratch: &mut FfnScratch,
    ) -> transformer::Result<()> {
        Ok(self.run(l, x, n, out, scratch)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use predictor::{ActivationKind, LayerProfile, Profile, ScoreKind};

    /// One layer of 8 neurons with these frequencies at batch sizes 1, 2, 4 and 8.
    fn profile(freq: Vec<Vec<f32>>) -> Profile {
        let n = freq[0].len();
        Profile {
            model: "m".into(),
            model_fingerprint: 0,
            corpus: "c".into(),
            tokens: 100,
            activation: ActivationKind::Silu,
            score: ScoreKind::OutputNorm,
            batch_sizes: vec![1, 2, 4, 8][..freq.len()].to_vec(),
            layers: vec![LayerProfile {
                n_neurons: n as u32,
                threshold: 0.1,
                freq,
                mean_abs: vec![0.0; n],
                max_abs: vec![0.0; n],
                coact_gate_up: vec![0.0; n],
                coact_gate_down: vec![0.0; n],
            }],
        }
    }

    /// Batch-1 frequencies of the tests' layer of 8 neurons.
    const F1: [f32; 8] = [0.9, 0.05, 0.5, 0.3, 0.02, 0.6, 0.1, 0.2];

    /// Independent neurons' chance of firing in a group of `n`: `1 - (1 - f)^n`.
    fn independent(f1: &[f32], n: i32) -> Vec<f32> {
        f1.iter().map(|f| 1.0 - (1.0 - f).powi(n)).collect()
    }

    #[test]
    fn larger_batches_take_every_neuron_as_likely_to_fire_as_the_last_hot_one() {
        let f1 = F1;
        let at = |n: i32| independent(&f1, n);
        let p = profile(vec![at(1), at(2), at(4), at(8)]);
        // A quarter at batch size 1: neurons 0 (0.9) and 5 (0.6); the break-even is 0.6.
        let s = HotSplit::from_profile(&p, 0.25);
        let [c1, c2, c4, c8] = s.counts[0];
        assert_eq!(c1, 2);
        let above = |v: Vec<f32>| v.iter().filter(|&&x| x >= 0.6).count();
        assert_eq!([c2, c4, c8], [above(at(2)), above(at(4)), above(at(8))]);
        assert!(c1 < c2 && c2 < c4 && c4 < c8, "{:?}", s.counts[0]);
        // The block is the batch-8 set, hottest first, and each bucket's set a prefix of it.
        assert_eq!(s.order[0].len(), c8);
        assert_eq!(s.neurons(0, 1), &[0, 5]);
        assert_eq!(s.neurons(0, 3).len(), c2);
        assert_eq!(s.neurons(0, 100).len(), c8);
        let mut want: Vec<u32> = (0..8).filter(|&j| at(8)[j as usize] >= 0.6).collect();
        want.sort_by(|&a, &b| f1[b as usize].total_cmp(&f1[a as usize]));
        assert_eq!(s.order[0], want);
    }

    #[test]
    fn a_planned_split_takes_the_plans_counts_over_the_profiles_block_order() {
        let f1 = F1;
        let at = |n: i32| independent(&f1, n);
        let p = profile(vec![at(1), at(2), at(4), at(8)]);
        let s = HotSplit::planned(&p, &[[1, 3, 3, 6]]).unwrap();
        assert_eq!(s.counts[0], [1, 3, 3, 6]);
        // The block: the six most likely to fire at batch size 8, hottest first.
        assert_eq!(s.order[0], [0, 5, 2, 3, 7, 6]);
        assert_eq!(s.neurons(0, 1), &[0]);
        assert_eq!(s.neurons(0, 5), &[0, 5, 2]);
        // The same order as the profile's own split.
        let own = HotSplit::from_profile(&p, 0.25);
        assert_eq!(own.order[0][..2], s.order[0][..2]);
        // Counts past the layer are capped; shrinking counts and other layer counts are refused.
        assert_eq!(
            HotSplit::planned(&p, &[[8, 9, 9, 99]]).unwrap().counts[0],
            [8; BUCKETS]
        );
        let e = HotSplit::planned(&p, &[[4, 2, 4, 4]])
            .unwrap_err()
            .to_string();
        assert!(e.contains("shrinks"), "{e}");
        let e = HotSplit::planned(&p, &[[1; 4], [1; 4]])
            .unwrap_err()
            .to_string();
        assert!(e.contains("2 layers"), "{e}");
    }

    #[test]
    fn without_batch_frequencies_or_share_the_split_is_fixed() {
        let f1 = vec![0.9f32, 0.05, 0.5, 0.3];
        // Only batch size 1 profiled: every bucket takes the batch-1 set.
        let s = HotSplit::from_profile(&profile(vec![f1.clone()]), 0.5);
        assert_eq!(s.counts[0], [2; BUCKETS]);
        assert_eq!(s.order[0], vec![0, 2]);
        // No share: nothing hot at any batch size.
        let s = HotSplit::from_profile(&profile(vec![f1.clone(), f1]), 0.0);
        assert_eq!(s.counts[0], [0; BUCKETS]);
        assert!(s.order[0].is_empty());
        assert_eq!(HotSplit::fixed(vec![vec![3, 1]]).counts, vec![[2; BUCKETS]]);
    }

    #[test]
    fn steps_fall_in_the_graph_size_buckets() {
        let b: Vec<usize> = [1, 2, 3, 4, 7, 8, 13].into_iter().map(bucket).collect();
        assert_eq!(b, [0, 1, 1, 2, 2, 3, 3]);
    }
}
