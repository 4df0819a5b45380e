//! [`ObservedFfn`]: the dense FFN with every layer's activations shown to an observer.

use std::sync::Mutex;

use rayon::prelude::*;

use crate::error::Result;
use crate::ffn::{FfnExecutor, FfnLayer, FfnScratch};
use crate::ops::mm;

/// What an FFN observer sees of one layer of one forward step (all `n` tokens of the step).
pub struct FfnSample<'a> {
    /// Layer index.
    pub layer: usize,
    /// Tokens in the step.
    pub n: usize,
    /// The FFN input after RMSNorm (`n × d_model`): what a predictor sees.
    pub input: &'a [f32],
    /// `act(gate · x)` per token and neuron (`n × d_ff`), before any sparsity mask.
    pub act_gate: &'a [f32],
    /// `up · x` (`n × d_ff`).
    pub up: &'a [f32],
}

/// Called once per layer with an [`FfnSample`] (profiling, calibration).
pub type FfnObserver<'o> = &'o mut (dyn FnMut(FfnSample<'_>) + Send);

/// The dense FFN (gate and up of every neuron, the model's down matrix) that shows every layer's
/// activations to an observer, then zeroes the neurons `mask` would not compute (if any).
pub struct ObservedFfn<'m, 'o> {
    activation: kernels_neon::Activation,
    mask: Option<&'m dyn FfnExecutor>,
    // The observer runs on the forward pass's thread, once per layer: the lock is never contended.
    observer: Mutex<FfnObserver<'o>>,
}

impl<'m, 'o> ObservedFfn<'m, 'o> {
    /// An observed FFN with the model's activation, masked as `mask` computes (dense without one).
    pub fn new(
        activation: crate::config::Activation,
        mask: Option<&'m dyn FfnExecutor>,
        observer: FfnObserver<'o>,
    ) -> Self {
        ObservedFfn {
            activation,
            mask,
            observer: Mutex::new(observer),
        }
    }
}

impl FfnExecutor for ObservedFfn<'_, '_> {
    fn decode(
        &self,
        l: FfnLayer<'_, '_>,
        x: &[f32],
        out: &mut [f32],
        scratch: &mut FfnScratch,
    ) -> Result<()> {
        self.batch(l, x, 1, out, scratch)
    }

    fn batch(
        &self,
        l: FfnLayer<'_, '_>,
        x: &[f32],
        n: usize,
        out: &mut [f32],
        scratch: &mut FfnScratch,
    ) -> Result<()> {
        let (w, li) = (l.weights, l.index);
        let (g, u) = scratch.gate_up(n * w.gate.rows());
        mm(&w.gate, x, n, g, l.precision, "ffn gate")?;
        mm(&w.up, x, n, u, l.precision, "ffn up")?;
        let act = self.activation;
        g.par_chunks_mut(1024).for_each(|c| {
            c.iter_mut()
                .for_each(|v| *v = kernels_neon::act_value(act, *v))
        });
        {
            let mut obs = self.observer.lock().unwrap_or_else(|e| e.into_inner());
            (*obs)(FfnSample {
                layer: li,
                n,
                input: x,
                act_gate: g,
                up: u,
            });
        }
        if let Some(m) = self.mask {
            m.mask(li, x, n, g, u)?;
        }
        g.par_chunks_mut(1024)
            .zip(u.par_chunks(1024))
            .for_each(|(a, b)| a.iter_mut().zip(b).for_each(|(a, b)| *a *= b));
        mm(&w.down, g, n, out, l.precision, "ffn down")
    }
}
