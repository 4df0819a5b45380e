//! [`PackedExperts`]: a Mixture-of-Experts layer's experts repacked eight rows at a time
//! ([`Q40x8`]: Q4_0 and the other formats it takes; made at load with the dense matrices' copies,
//! `crate::packed`). Steps read them wherever their products run the decode kernels: one token
//! ([`MoeBlock::forward_packed`], `packed.rs`), a decode step or a `Fast` prompt's groups of fewer
//! than 32 tokens ([`MoeBlock::forward_over`]): bit for bit [`MoeBlock::forward`] over the
//! originals.

use kernels_neon::{Q40x8, QMatrix};

use super::weights::{ExpertFfn, MoeLayer};
#[cfg(doc)]
use super::MoeBlock;

/// One layer's repacked experts: made only when every expert (and the shared expert) repacks.
pub struct PackedExperts {
    /// Gate, up and down of every expert, in order.
    pub experts: Vec<[Q40x8; 3]>,
    /// The shared expert's.
    pub shared: Option<[Q40x8; 3]>,
}

impl PackedExperts {
    /// The copies of `w`'s experts made by `repack`, or `None` when the layer holds no experts (a
    /// resident file's) or one of its matrices is not taken (`takes`).
    pub fn new(
        w: &MoeLayer<'_>,
        takes: &dyn Fn(&QMatrix<'_>) -> bool,
        repack: &dyn Fn(&QMatrix<'_>) -> Option<Q40x8>,
    ) -> Option<PackedExperts> {
        if w.experts.is_empty() || !w.expert_matrices().all(takes) {
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
