//! The one-token step over a Mixture-of-Experts layer's repacked experts ([`PackedExperts`],
//! `copies.rs`): [`MoeBlock::forward_packed`], bit for bit [`MoeBlock::forward`] over the
//! originals.

use kernels_neon::{PackedExpertJob, Q40x8, QMatrix};

use super::block::{MoeBlock, MoeScratch};
use super::copies::PackedExperts;
use super::weights::MoeLayer;
use crate::error::{kernel, Result};

impl MoeBlock {
    /// [`MoeBlock::forward`] of one token (`x`, `out`: `d`) in `Precision::Fast`, the experts' products
    /// over `p` (the copies of `w`'s experts): the same routing, the same results bit for bit.
    pub fn forward_packed(
        &self,
        w: &MoeLayer<'_>,
        p: &PackedExperts,
        x: &[f32],
        out: &mut [f32],
        s: &mut MoeScratch,
    ) -> Result<()> {
        let d = w.router.cols();
        super::block::check_lens(d, x, 1, out)?;
        let (fast, decode) = (kernels_neon::Precision::Fast, crate::ops::StepKind::Decode);
        self.route_step(w, x, 1, fast, decode, s)?;
        let (x, out) = (&x[..d], &mut out[..d]);
        out.fill(0.0);
        // Each job's original gate, which names the expert to a neuron trace.
        let mut gates: Vec<&QMatrix<'_>> = Vec::new();
        let mut jobs: Vec<PackedExpertJob<'_>> = Vec::new();
        fn job(m: &[Q40x8; 3], weight: f32) -> PackedExpertJob<'_> {
            let [gate, up, down] = m;
            PackedExpertJob {
                gate,
                up,
                down,
                weight,
            }
        }
        for (e, _, weights) in s.groups().iter() {
            jobs.push(job(&p.experts[e], weights[0]));
            gates.push(&w.experts[e].gate);
        }
        if let (Some(sh), Some(ps)) = (&w.shared, &p.shared) {
            jobs.push(job(ps, super::block::shared_weight(sh, x)));
            gates.push(&sh.ffn.gate);
        }
        let mut note = |j: usize, g: &[f32]| {
            let gate = gates[j];
            super::neurons::note(gate.data().as_ptr(), 1, gate.rows(), g);
        };
        kernels_neon::experts_ffn_packed(&jobs, self.activation, x, out, &mut note)
            .map_err(kernel("moe experts"))
    }
}
