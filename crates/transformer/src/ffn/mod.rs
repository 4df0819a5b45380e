//! The FFN step of a layer behind one trait: [`FfnExecutor`]. The forward pass calls it once per
//! layer and does not know which executor it has; each kind is its own type (and file):
//!
//! * [`DenseFfn`] (`dense.rs`): the model's gate, up and down matrices, every neuron;
//! * `offload::SparseFfn` (the `offload` crate's `sparse.rs`): activation sparsity, with its weights in memory or in a
//!   neuron store (`offload/`);
//! * [`ObservedFfn`] (`observed.rs`): dense, showing every activation to an observer (profiling,
//!   calibration), optionally masked as another executor would compute.
//!
//! * `offload::AccelFfn` (`accel_ffn.rs`): every layer's block on an accelerator backend (`accel`);
//! * `offload::HybridFfn` (`hybrid.rs`, beside `sparse.rs`, which it builds on): each layer's hot
//!   neurons on an accelerator, the rest sparse on the CPU, summed.

mod dense;
mod observed;

pub use dense::DenseFfn;
pub use observed::{FfnObserver, FfnSample, ObservedFfn};

use kernels_neon::Precision;

use crate::error::Result;
use crate::layer::{GatedFfn, LayerFfn};
use crate::moe::MoeFfn;
pub use crate::ops::StepKind;
use crate::packed::PackedLayer;

/// The layer an FFN step runs on.
#[derive(Clone, Copy)]
pub struct FfnLayer<'a, 'w> {
    /// Layer index.
    pub index: usize,
    /// The layer's gated FFN matrices (empty for a resident file).
    pub weights: &'a GatedFfn<'w>,
    /// Precision of the step.
    pub precision: Precision,
    /// How the step's tokens relate: a prompt's, or one decode token of each of several sequences
    /// (then `batch` should compute each token as `decode` would; [`DenseFfn`] does, bit for bit).
    pub kind: StepKind,
    /// The layer's repacked copies ([`crate::packed`]) in `Fast` where the model has them:
    /// [`DenseFfn`] takes each where the step does (`packed::step_reads`; bit for bit the same
    /// results where the copy is exact).
    pub packed: Option<&'a PackedLayer>,
}

/// A Mixture-of-Experts layer's step handed to [`FfnExecutor::moe_step`].
#[derive(Clone, Copy)]
pub struct MoeStep<'a, 'w> {
    /// Layer index.
    pub index: usize,
    /// The layer's block (router, shared expert; its experts may be in a store).
    pub moe: &'a MoeFfn<'w>,
    /// The next layer's block, if it is one (its router predicts the next layer's experts).
    pub next: Option<&'a MoeFfn<'w>>,
    /// Precision of the step.
    pub precision: Precision,
    /// How the step's tokens relate.
    pub kind: StepKind,
}

/// Buffers an FFN step may use: gate and up outputs of the step's tokens (`n × d_ff` each), sized on
/// first use and kept for the layers of one forward step.
#[derive(Default)]
pub struct FfnScratch {
    g: Vec<f32>,
    u: Vec<f32>,
}

impl FfnScratch {
    /// The gate and up buffers, `len` floats each.
    pub fn gate_up(&mut self, len: usize) -> (&mut [f32], &mut [f32]) {
        if self.g.len() < len {
            self.g.resize(len, 0.0);
            self.u.resize(len, 0.0);
        }
        (&mut self.g[..len], &mut self.u[..len])
    }
}

/// One layer's FFN: `out = down(act(gate · x) ⊙ (up · x))` as the executor computes it.
pub trait FfnExecutor: Send + Sync {
    /// One token (`x`, `out`: `d_model`).
    fn decode(
        &self,
        layer: FfnLayer<'_, '_>,
        x: &[f32],
        out: &mut [f32],
        scratch: &mut FfnScratch,
    ) -> Result<()>;

    /// `n` tokens of one step (`x`, `out`: `n × d_model`).
    fn batch(
        &self,
        layer: FfnLayer<'_, '_>,
        x: &[f32],
        n: usize,
        out: &mut [f32],
        scratch: &mut FfnScratch,
    ) -> Result<()>;

    /// Zeroes, in `act` (`n × d_ff` activated gate values) of layer `layer`, every neuron this
    /// executor would not compute for that token (an [`ObservedFfn`] masks so). Default: none.
    fn mask(&self, layer: usize, x: &[f32], n: usize, act: &mut [f32], up: &[f32]) -> Result<()> {
        let _ = (layer, x, n, act, up);
        Ok(())
    }

    /// Whether this executor reads the FFN weights from somewhere other than the model's matrices
    /// (a resident file has none). Default: false.
    fn owns_weights(&self) -> bool {
        false
    }

    /// Runs a Mixture-of-Experts layer's step over `n` tokens (`x`, `out`: `n × d_model`) when this
    /// executor holds the experts (an expert store); `None` (the default): the block's own step.
    fn moe_step(
        &self,
        step: MoeStep<'_, '_>,
        x: &[f32],
        n: usize,
        out: &mut [f32],
    ) -> Option<Result<()>> {
        let _ = (step, x, n, out);
        None
    }

    /// Whether [`FfnExecutor::moe_step`] runs MoE layers (an MoE model may then use this
    /// executor). Default: false.
    fn runs_experts(&self) -> bool {
        false
    }
}

/// Runs layer `index`'s FFN block on the step's `n` tokens (`x`, `out`: `n × d_model`): what the
/// generic forward pass calls. A gated block runs through `exec` (`decode` for one token, over the
/// layer's copies `packed` where given; `batch` otherwise); a Mixture-of-Experts block runs its own
/// step ([`crate::moe::MoeFfn::step`], over the experts' copies for any `n`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn layer_step(
    (ffn, next, packed): (&LayerFfn<'_>, Option<&LayerFfn<'_>>, Option<&PackedLayer>),
    exec: &dyn FfnExecutor,
    index: usize,
    precision: Precision,
    kind: StepKind,
    (x, n): (&[f32], usize),
    out: &mut [f32],
    scratch: &mut FfnScratch,
) -> Result<()> {
    match ffn {
        LayerFfn::Gated(weights) => {
            let at = FfnLayer {
                index,
                weights,
                precision,
                kind,
                packed,
            };
            if n == 1 {
                exec.decode(at, x, out, scratch)
            } else {
                exec.batch(at, x, n, out, scratch)
            }
        }
        // The forward pass refuses an MoE model with any executor but the dense one and one that
        // runs experts (from an expert store).
        LayerFfn::Moe(moe) => {
            let step = MoeStep {
                index,
                moe,
                next: next.and_then(LayerFfn::moe),
                precision,
                kind,
            };
            match exec.moe_step(step, x, n, out) {
                Some(r) => r,
                None => moe.step(
                    x,
                    n,
                    out,
                    precision,
                    kind,
                    packed.and_then(|p| p.experts.as_ref()),
                ),
            }
        }
    }
}
