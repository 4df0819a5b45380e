//! [`HybridFfn`]: PowerInfer-2's hybrid decode. Each layer's hot neurons (the most frequently active
//! ones in the profile) run as one dense block on an accelerator ([`crate::accel`]); the rest stay
//! sparse on the CPU cores ([`SparseFfn`], the predicted neurons that pass the thresholds, hot ones
//! left out); the two run side by side (`rayon::join`) and are summed. Batched steps do the same with
//! the accelerator's batch graphs and the sparse executor's batched path.
//!
//! The hot block is computed densely (no neuron of it skipped), so the result is the sparse FFN with
//! the hot neurons always on: with every neuron hot it is the dense FFN, with none it is the sparse
//! one. An accelerator that fails mid-run is reported once ([`HybridFfn::failure`]) and the CPU
//! computes the whole layer sparsely from then on.

use crate::accel::{open, AccelKind, Accelerator, Failure, FfnBlock};
use crate::error::{EngineError, Result};
use crate::ffn::{FfnExecutor, FfnLayer, FfnScratch};
use crate::model::Model;
use crate::sparse::SparseFfn;

/// Hot blocks on an accelerator, the rest sparse on the CPU.
pub struct HybridFfn {
    sparse: SparseFfn,
    accel: Box<dyn Accelerator>,
    /// `hot[l][j]`: neuron `j` of layer `l` is in the accelerator's block.
    hot: Vec<Vec<bool>>,
    failure: Failure,
}

/// The `share` most frequently active neurons of every layer of `profile` (batch size 1), at least
/// one per layer when `share > 0`, in descending frequency.
pub fn hot_neurons(profile: &predictor::Profile, share: f64) -> Vec<Vec<u32>> {
    profile
        .layers
        .iter()
        .map(|l| {
            let n = l.n_neurons as usize;
            let k = ((share.clamp(0.0, 1.0) * n as f64).round() as usize)
                .max(usize::from(share > 0.0))
                .min(n);
            let mut order = l
                .hot_order(0)
                .unwrap_or_else(|| (0..n as u32).collect::<Vec<_>>());
            order.truncate(k);
            order
        })
        .collect()
}

impl HybridFfn {
    /// The hybrid FFN of `model`: `hot[l]` (neuron indices) of every layer on `accel`, whose blocks
    /// must be those neurons ([`HybridFfn::open_blocks`]), the rest on `sparse`, which must hold its
    /// weights in memory.
    pub fn new(
        sparse: SparseFfn,
        accel: Box<dyn Accelerator>,
        model: &Model<'_>,
        hot: &[Vec<u32>],
    ) -> Result<HybridFfn> {
        let cfg = &model.config;
        if sparse.offload().is_some() {
            return Err(EngineError::Request(
                "hybrid decode needs the FFN weights in memory (this is a resident file): \
                 run it without --accel"
                    .into(),
            ));
        }
        if hot.len() != cfg.n_layers {
            return Err(EngineError::Request(format!(
                "hybrid decode: hot neurons for {} layers, the model has {}",
                hot.len(),
                cfg.n_layers
            )));
        }
        let mut mask = Vec::with_capacity(hot.len());
        for (l, ids) in hot.iter().enumerate() {
            if accel.block_neurons(l) != ids.len() {
                return Err(EngineError::Request(format!(
                    "hybrid decode: the {} accelerator's block of layer {l} holds {} neurons, not \
                     the {} hot ones",
                    accel.name(),
                    accel.block_neurons(l),
                    ids.len()
                )));
            }
            let mut m = vec![false; cfg.d_ff];
            for &j in ids {
                m[j as usize] = true;
            }
            mask.push(m);
        }
        Ok(HybridFfn {
            sparse,
            accel,
            hot: mask,
            failure: Failure::default(),
        })
    }

    /// Opens backend `kind` with `hot[l]` of every layer of `model` as its blocks. A library that
    /// cannot be loaded or set up is an [`EngineError::Accelerator`].
    pub fn open_blocks(
        kind: &AccelKind,
        model: &Model<'_>,
        hot: &[Vec<u32>],
    ) -> Result<Box<dyn Accelerator>> {
        open(kind, FfnBlock::for_model(model, Some(hot)))
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
        if !self.failure.happened() {
            let mut hot = vec![0f32; out.len()];
            let (h, c) = rayon::join(
                || self.accel.ffn(l.index, x, n, &mut hot),
                || cold(out, scratch, Some(&self.hot[l.index])),
            );
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
    fn decode(
        &self,
        l: FfnLayer<'_, '_>,
        x: &[f32],
        out: &mut [f32],
        scratch: &mut FfnScratch,
    ) -> Result<()> {
        self.run(l, x, 1, out, scratch)
    }

    fn batch(
        &self,
        l: FfnLayer<'_, '_>,
        x: &[f32],
        n: usize,
        out: &mut [f32],
        scratch: &mut FfnScratch,
    ) -> Result<()> {
        self.run(l, x, n, out, scratch)
    }
}
