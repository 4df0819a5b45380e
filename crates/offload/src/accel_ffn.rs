//! [`AccelFfn`]: the FFN step on an accelerator backend ([`crate::accel::Accelerator`]): each layer's
//! block, for one token or a batch (prefill: PowerInfer-2's NPU-centric prefill runs the dense layers
//! there). Its blocks hold every neuron, so it computes the dense FFN.
//!
//! An accelerator that fails mid-run (a QNN call returning an error, a graph that does not build)
//! does not fail the step: the layer is computed on the CPU ([`DenseFfn`]), the first failure is kept
//! for the caller to report ([`AccelFfn::failure`]), and every later step stays on the CPU.

use accel::Failure;

use crate::accel::{blocks_for_model, open, AccelKind, Accelerator};
use crate::error::{OffloadError, Result};
use transformer::config::Activation;
use transformer::ffn::{DenseFfn, FfnExecutor, FfnLayer, FfnScratch};
use transformer::model::Model;

/// The FFN of every layer on one accelerator, whose blocks hold every neuron; the CPU when it fails.
pub struct AccelFfn {
    accel: Box<dyn Accelerator>,
    d_ff: usize,
    cpu: DenseFfn,
    failure: Failure,
}

impl AccelFfn {
    /// The FFN on `accel`, whose blocks must each hold all `d_ff` neurons of their `layers` layers;
    /// `activation` is the model's (for the CPU fallback).
    pub fn new(
        accel: Box<dyn Accelerator>,
        layers: usize,
        d_ff: usize,
        activation: Activation,
    ) -> Result<AccelFfn> {
        if let Some(l) = (0..layers).find(|&l| accel.block_neurons(l) != d_ff) {
            return Err(OffloadError::Request(format!(
                "the {} accelerator's block of layer {l} holds {} of the layer's {d_ff} neurons: \
                 a whole-layer FFN needs them all",
                accel.name(),
                accel.block_neurons(l)
            )));
        }
        Ok(AccelFfn {
            accel,
            d_ff,
            cpu: DenseFfn::new(activation),
            failure: Failure::default(),
        })
    }

    /// Opens backend `kind` with every layer of `model` as its blocks. A library that cannot be
    /// loaded or set up is an [`OffloadError::Accel`]; the caller stays on the CPU.
    pub fn open(kind: &AccelKind, model: &Model<'_>) -> Result<AccelFfn> {
        let cfg = &model.config;
        let accel = open(kind, blocks_for_model(model, None))?;
        AccelFfn::new(accel, cfg.n_layers, cfg.d_ff, cfg.activation)
    }

    /// The backend.
    pub fn accelerator(&self) -> &dyn Accelerator {
        self.accel.as_ref()
    }

    /// Neurons per layer.
    pub fn d_ff(&self) -> usize {
        self.d_ff
    }

    /// The accelerator's first failure, after which every layer ran on the CPU.
    pub fn failure(&self) -> Option<String> {
        self.failure.first()
    }

    /// `n` tokens of layer `l` on the accelerator, or on the CPU once it has failed.
    fn run(
        &self,
        l: FfnLayer<'_, '_>,
        x: &[f32],
        n: usize,
        out: &mut [f32],
        scratch: &mut FfnScratch,
    ) -> Result<()> {
        if !self.failure.happened() {
            let all = self.accel.block_neurons(l.index);
            match self.accel.ffn(l.index, all, x, n, out) {
                Ok(()) => return Ok(()),
                Err(e) => self.failure.record(&e),
            }
        }
        if n == 1 {
            Ok(self.cpu.decode(l, x, out, scratch)?)
        } else {
            Ok(self.cpu.batch(l, x, n, out, scratch)?)
        }
    }
}

impl FfnExecutor for AccelFfn {
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
