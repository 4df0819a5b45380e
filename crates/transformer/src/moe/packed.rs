//! [`PackedExperts`]: a Mixture-of-Experts layer's Q4_0 experts repacked eight rows at a time
//! ([`Q40x8`], made at load with the dense matrices' copies, `crate::packed`), and the one-token
//! step over them ([`MoeBlock::forward_packed`]): bit for bit [`MoeBlock::forward`] over the
//! originals, which prompts and batched steps keep reading.

use kernels_neon::{PackedExpertJob, Q40x8, QMatrix};

use super::block::{MoeBlock, MoeScratch};
use super::weights::{ExpertFfn, MoeLayer};
use crate::error::{kernel, Result};

/// One layer's repacked experts: made only when every expert (and the shared expert) repacks.
pub struct PackedExperts {
    /// Gate, up and down of every expert, in order.
    pub experts: Vec<[Q40x8; 3]>,
    /// The shared expert's.
    pub shared: Option<[Q40x8; 3]>,
}

impl PackedExperts {
    /// The copies of `w`'s experts made by `repack`, or `None` when the layer holds no experts (a
    /// resident file's) or one of its matrices does not repack.
    pub fn new(
        w: &MoeLayer<'_>,
        repack: &dyn Fn(&QMatrix<'_>) -> Option<Q40x8>,
    ) -> Option<PackedExperts> {
        let fits = |f: &ExpertFfn<'_>| [&f.gate, &f.up, &f.down].into_iter().all(Q40x8::fits);
        let shared_fits = w.shared.as_ref().is_none_or(|s| fits(&s.ffn));
        if w.experts.is_empty() || !w.experts.iter().all(fits) || !shared_fits {
            return None;
        }
        let three = |f: &ExpertFfn<'_>| -> Option<[Q40x8; 3]> {
            Some([repack(&f.gate)?, repack(&f.up)?, repack(&f.down)?])
        };
        Some(PackedExperts {
            experts: w.experts.iter().map(three).collect::<Option<_>>()?,
            shared: match &w.shared {
                Some(s) => Some(three(&s.ffn)?),
                None => None,
            },
        })
    }

    /// Bytes of every copy.
    pub fn bytes(&self) -> usize {
        self.all().map(Q40x8::bytes).sum()
    }

    /// Matrices repacked.
    pub fn count(&self) -> usize {
        self.all().count()
    }

    fn all(&self) -> impl Iterator<Item = &Q40x8> {
        self.experts.iter().chain(&self.shared).flatten()
    }
}

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
