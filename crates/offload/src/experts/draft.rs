//! [`ExpertResidentOnly`]: the MoE layers of a self-draft over a bundle of experts (`--self-draft`):
//! each token's routed experts that the cache holds, computed as the step computes them, the
//! others left out and the kept ones' weights scaled up to the token's whole routing weight;
//! nothing is read, queued or counted, and the cache's recency and scores do not move. Its output
//! approximates the model's, for drafting tokens that a verification step of the whole model
//! then checks.

use transformer::ffn::{FfnExecutor, FfnLayer, FfnScratch, MoeStep};

use super::{dense_layer, id, step_output, ExpertOffload};
use crate::error::Result;

/// An [`ExpertOffload`] computing from its cached experts only ([`ExpertOffload::resident_only`]).
pub struct ExpertResidentOnly<'x> {
    x: &'x ExpertOffload,
}

impl ExpertOffload {
    /// This offload computing from its cached experts only, for drafting.
    pub fn resident_only(&self) -> ExpertResidentOnly<'_> {
        ExpertResidentOnly { x: self }
    }

    /// One MoE layer step over `n` tokens from the cached experts only (see the module docs).
    fn step_resident(
        &self,
        step: MoeStep<'_, '_>,
        x: &[f32],
        n: usize,
        out: &mut [f32],
    ) -> Result<()> {
        let (l, d) = (step.index, step.moe.weights.router.cols());
        let out = step_output(&step, x, n, out)?;
        if n == 0 {
            return Ok(());
        }
        let mut guard = self.lock();
        let st = &mut *guard;
        Self::route_step(st, &step, x, n)?;
        let needed: Vec<usize> = st.s.groups.iter().map(|(e, _, _)| e).collect();
        if st.s.outs.len() < needed.len() {
            st.s.outs.resize_with(needed.len(), Vec::new);
        }
        let mut cached = vec![false; needed.len()];
        for (i, &e) in needed.iter().enumerate() {
            if let Some(b) = st.cache.peek(id(l, e)) {
                self.expert(st, &step, i, &b, x)?;
                cached[i] = true;
            }
        }
        // Per token, its whole routing weight and the part of it on cached experts.
        let (mut all, mut kept) = (vec![0f32; n], vec![0f32; n]);
        for (i, (_, tokens, weights)) in st.s.groups.iter().enumerate() {
            for (&t, &wt) in tokens.iter().zip(weights) {
                all[t as usize] += wt;
                if cached[i] {
                    kept[t as usize] += wt;
                }
            }
        }
        for (i, (_, tokens, weights)) in st.s.groups.iter().enumerate() {
            if !cached[i] {
                continue;
            }
            let ys = &st.s.outs[i];
            for (j, (&t, &wt)) in tokens.iter().zip(weights).enumerate() {
                let t = t as usize;
                // `kept[t] > 0`: this expert is one of the token's cached ones.
                let wt = wt * all[t] / kept[t];
                kernels_neon::axpy_f32(wt, &ys[j * d..(j + 1) * d], &mut out[t * d..(t + 1) * d]);
            }
        }
        self.shared(st, &step, x, n, out)
    }
}

experts_only_executor!(ExpertResidentOnly<'_>, |s, step, x, n, out| s
    .x
    .step_resident(step, x, n, out));
