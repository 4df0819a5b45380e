//! [`DenseFfn`]: every neuron, from the model's matrices.

use crate::config::Activation;
use crate::error::{kernel, Result};
use crate::ffn::{FfnExecutor, FfnLayer, FfnScratch};
use crate::ops::{mm, mm_step, StepKind};
use crate::packed::PackedLayer;
use kernels_neon::Q40x8;

/// The dense FFN: gate and up of every neuron, the activation fused with the product, down.
pub struct DenseFfn {
    activation: Activation,
}

impl DenseFfn {
    /// A dense FFN with the model's activation.
    pub fn new(activation: Activation) -> Self {
        DenseFfn { activation }
    }

    fn act_mul(&self, g: &mut [f32], u: &[f32]) {
        kernels_neon::act_mul_inplace(self.activation, g, u);
    }

    /// [`FfnExecutor::decode`] over the layer's repacked copies where it has them (bit for bit
    /// the same results); `g` is the gate buffer.
    fn decode_packed(
        &self,
        l: FfnLayer<'_, '_>,
        p: &PackedLayer,
        x: &[f32],
        g: &mut [f32],
        out: &mut [f32],
    ) -> Result<()> {
        let w = l.weights;
        match &p.gate_up {
            Some([gate, up]) => Q40x8::matvec_gated(gate, up, self.activation, x, g),
            None => {
                kernels_neon::matvec_gated(&w.gate, &w.up, self.activation, x, 1, g, l.precision)
            }
        }
        .map_err(kernel("ffn gate/up"))?;
        match &p.down {
            Some(down) => down.matvec(g, out).map_err(kernel("ffn down")),
            None => mm(&w.down, g, 1, out, l.precision, "ffn down"),
        }
    }

    /// The down projection of a batch's `n` activations `g`: over the layer's copy where the step
    /// takes it (`packed::step_reads`).
    fn batch_down(&self, l: FfnLayer<'_, '_>, g: &[f32], n: usize, out: &mut [f32]) -> Result<()> {
        match l
            .packed
            .and_then(|p| p.down.as_ref())
            .filter(|d| crate::packed::step_reads(d, l.kind, n))
        {
            Some(down) => down.matvec_batch(g, n, out).map_err(kernel("ffn down")),
            None => mm_step(l.kind, &l.weights.down, g, n, out, l.precision, "ffn down"),
        }
    }
}

impl FfnExecutor for DenseFfn {
    fn decode(
        &self,
        l: FfnLayer<'_, '_>,
        x: &[f32],
        out: &mut [f32],
        scratch: &mut FfnScratch,
    ) -> Result<()> {
        let w = l.weights;
        let (g, _) = scratch.gate_up(w.gate.rows());
        if let Some(p) = l.packed {
            return self.decode_packed(l, p, x, g, out);
        }
        // One quantization of the normed vector and one parallel region for gate, up and the
        // activation.
        kernels_neon::matvec_gated(&w.gate, &w.up, self.activation, x, 1, g, l.precision)
            .map_err(kernel("ffn gate/up"))?;
        mm(&w.down, g, 1, out, l.precision, "ffn down")
    }

    fn batch(
        &self,
        l: FfnLayer<'_, '_>,
        x: &[f32],
        n: usize,
        out: &mut [f32],
        scratch: &mut FfnScratch,
    ) -> Result<()> {
        let w = l.weights;
        let (g, u) = scratch.gate_up(n * w.gate.rows());
        if let Some(Some([gate, up])) = l.packed.map(|p| p.gate_up.as_ref()) {
            if [gate, up]
                .iter()
                .all(|w| crate::packed::step_reads(w, l.kind, n))
            {
                // Each token as `decode` over the copies computes it.
                gate.matvec_batch(x, n, g).map_err(kernel("ffn gate"))?;
                up.matvec_batch(x, n, u).map_err(kernel("ffn up"))?;
                self.act_mul(g, u);
                return self.batch_down(l, g, n, out);
            }
        }
        if l.kind == StepKind::Decode {
            // One quantization of each token and one parallel region for gate, up and the
            // activation.
            kernels_neon::matvec_gated(&w.gate, &w.up, self.activation, x, n, g, l.precision)
                .map_err(kernel("ffn gate/up"))?;
        } else {
            mm_step(l.kind, &w.gate, x, n, g, l.precision, "ffn gate")?;
            mm_step(l.kind, &w.up, x, n, u, l.precision, "ffn up")?;
            self.act_mul(g, u);
        }
        self.batch_down(l, g, n, out)
    }
}
