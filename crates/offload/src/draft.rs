//! The FFN of a speculative draft that never waits for flash ([`ResidentOnly`], `--self-draft`):
//! the same model over the same neuron store and cache, computing only the units in memory.

use transformer::ffn::{FfnExecutor, FfnLayer, FfnScratch};

use crate::{Offload, SparseFfn};

/// A [`SparseFfn`] over a neuron store computing each token from the units in memory only (hot, or
/// in the cold region): the neurons of the others are left out, nothing is read from flash, and no
/// counter moves (`Offload::decode_resident`). Its output is an approximation of the model's, for
/// drafting tokens that a verification step of the whole model then checks.
pub struct ResidentOnly<'s> {
    sparse: &'s SparseFfn,
    off: &'s Offload,
}

impl SparseFfn {
    /// This FFN computing from memory only, when its weights are in a neuron store (`None` in
    /// memory: there is nothing cheaper to draft with).
    pub fn resident_only(&self) -> Option<ResidentOnly<'_>> {
        Some(ResidentOnly {
            sparse: self,
            off: self.offload()?,
        })
    }
}

impl FfnExecutor for ResidentOnly<'_> {
    fn decode(
        &self,
        l: FfnLayer<'_, '_>,
        x: &[f32],
        out: &mut [f32],
        scratch: &mut FfnScratch,
    ) -> transformer::Result<()> {
        self.batch(l, x, 1, out, scratch)
    }

    /// Every step, a prompt's too, token by token from memory (a prompt over the store would
    /// stream it).
    fn batch(
        &self,
        l: FfnLayer<'_, '_>,
        x: &[f32],
        n: usize,
        out: &mut [f32],
        _: &mut FfnScratch,
    ) -> transformer::Result<()> {
        let rows = self.sparse.token_rows(l.index, x, n, None)?;
        let refs: Vec<&[u32]> = rows.iter().map(Vec::as_slice).collect();
        let rule = self.sparse.layer_rule(l.index);
        self.off
            .decode_resident(rule, l.index, &refs, x, out, l.precision)?;
        Ok(())
    }

    fn owns_weights(&self) -> bool {
        true
    }
}
