//! [`MoeFfn`]: what a layer's [`crate::layer::LayerFfn::Moe`] holds (the layer's MoE weights and how
//! its block computes), and the step the forward pass runs on it ([`MoeFfn::step`]), with its
//! buffers kept per thread across layers and steps.

use std::cell::RefCell;

use kernels_neon::Precision;

use super::block::{MoeBlock, MoeScratch};
use super::copies::PackedExperts;
use super::weights::MoeLayer;
use crate::error::Result;
use crate::ops::StepKind;

/// One layer's Mixture-of-Experts FFN.
#[derive(Debug, Clone)]
pub struct MoeFfn<'w> {
    /// The router, the experts and the shared expert.
    pub weights: MoeLayer<'w>,
    /// How the block computes (experts used, top-k normalisation, activation).
    pub block: MoeBlock,
}

thread_local! {
    /// The MoE block's buffers of this thread: a forward pass runs its layers on the calling thread,
    /// so they are sized by the first step and reused by every later layer and step.
    static SCRATCH: RefCell<MoeScratch> = RefCell::new(MoeScratch::default());
}

impl MoeFfn<'_> {
    /// `out` (`n × d`) = the block over the step's `n` tokens `x` (`n × d`, already normed), batched
    /// by expert ([`MoeBlock::forward`]), over the experts' repacked copies `packed` where given
    /// (the same bits): one token in `Fast` by [`MoeBlock::forward_packed`], several by
    /// [`MoeBlock::forward_over`] (the products that run the decode kernels read the copies).
    pub fn step(
        &self,
        x: &[f32],
        n: usize,
        out: &mut [f32],
        precision: Precision,
        kind: StepKind,
        packed: Option<&PackedExperts>,
    ) -> Result<()> {
        let one = n == 1 && precision == Precision::Fast;
        SCRATCH.with(|s| match s.try_borrow_mut() {
            Ok(mut s) => {
                match packed {
                    Some(p) if one => {
                        self.block
                            .forward_packed(&self.weights, p, x, out, &mut s)?
                    }
                    _ => self.block.forward_over(
                        &self.weights,
                        packed,
                        x,
                        n,
                        out,
                        precision,
                        kind,
                        &mut s,
                    )?,
                }
                // A calibration run counts the routes (`RoutingRecorder`); nothing otherwise.
                super::profile::note(&self.weights.router, s.routes(), self.block.n_used);
                Ok(())
            }
            // Not reentrant in practice; a nested call gets buffers of its own.
            Err(_) => self.block.forward(
                &self.weights,
                x,
                n,
                out,
                precision,
                kind,
                &mut MoeScratch::default(),
            ),
        })
    }

    /// Bytes of the layer's FFN matrices: router, every expert, shared expert.
    pub fn bytes(&self) -> usize {
        let w = &self.weights;
        let expert = |e: &super::ExpertFfn<'_>| {
            e.gate.data().len() + e.up.data().len() + e.down.data().len()
        };
        w.router.data().len()
            + w.experts.iter().map(expert).sum::<usize>()
            + w.shared.as_ref().map_or(0, |s| expert(&s.ffn))
    }

    /// Bytes of the FFN matrices one token reads: router, `n_used` experts (of the average size),
    /// shared expert.
    pub fn bytes_per_token(&self) -> usize {
        let w = &self.weights;
        let expert = |e: &super::ExpertFfn<'_>| {
            e.gate.data().len() + e.up.data().len() + e.down.data().len()
        };
        let all: usize = w.experts.iter().map(expert).sum();
        let used = self.block.n_used.min(w.experts.len());
        w.router.data().len()
            + all / w.experts.len().max(1) * used
            + w.shared.as_ref().map_or(0, |s| expert(&s.ffn))
    }
}
