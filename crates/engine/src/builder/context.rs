//! The context of a budgeted run over a resident file when none was asked for: a process budget
//! reserves the KV cache of the whole context up front (`budget.rs`), so a default context too
//! long for the budget would refuse to start though the cache only grows with the tokens held.

use super::{mib, EngineBuilder};
use crate::bundle::SparsePlan;
use crate::error::Result;
use crate::generate::Engine;
use offload::budget::MemoryBudget;

/// The shortest context a budget sizes (one chunk of the KV cache, [`crate::KV_CHUNK`]).
pub const MIN_FITTED_CONTEXT: usize = transformer::forward::KV_CHUNK;

/// The longest of `longest` (the engine's context) and its halvings down to
/// [`MIN_FITTED_CONTEXT`] (or `longest`, when shorter) for which `fits`; the shortest when none
/// does.
pub fn fitted_context(longest: usize, mut fits: impl FnMut(usize) -> bool) -> usize {
    let least = MIN_FITTED_CONTEXT.min(longest).max(1);
    let mut ctx = longest.max(least);
    while ctx > least && !fits(ctx) {
        ctx = (ctx / 2).max(least);
    }
    ctx
}

impl EngineBuilder {
    /// The sparse plan of `eng` (a resident file, under a process budget, no context asked for)
    /// at the longest context, of the engine's and its halvings, whose KV cache takes no more of
    /// the budget than the neuron cache gets; `eng`'s context is set to it, and a note says which.
    /// At the shortest, a budget that leaves nothing is the budget's error.
    pub(super) fn fit_context(&self, eng: &mut Engine<'_>) -> Result<SparsePlan> {
        let MemoryBudget::Process(budget) = self.budget else {
            return SparsePlan::new(eng, &self.sidecars, self.budget, self.offload.clone());
        };
        let mut plan = SparsePlan::sidecars(eng, &self.sidecars)?;
        let (cfg, format) = (&eng.model().config, eng.cache_type());
        let ctx = fitted_context(eng.options().context, |ctx| {
            let kv = cfg.kv_cache_bytes(ctx, format);
            plan.set_budget(eng, self.budget, self.offload.clone(), ctx)
                .is_ok_and(|()| plan.budget.is_some_and(|s| s.cache() >= kv))
        });
        let kv = cfg.kv_cache_bytes(ctx, format);
        plan.set_budget(eng, self.budget, self.offload.clone(), ctx)?;
        self.note(&format!(
            "context {ctx} tokens, sized to --memory-budget {:.1} MiB (its KV cache {:.1} MiB; give --ctx to choose)",
            mib(budget),
            mib(kv)
        ));
        eng.set_context(ctx)?;
        Ok(plan)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_context_that_fits_halving_down_to_one_chunk() {
        assert_eq!(fitted_context(4096, |_| true), 4096);
        assert_eq!(fitted_context(4096, |c| c <= 1024), 1024);
        assert_eq!(fitted_context(4096, |c| c <= 700), 512);
        // None fits: the shortest, whose error the budget then gives.
        assert_eq!(fitted_context(4096, |_| false), MIN_FITTED_CONTEXT);
        // A training context shorter than a chunk is the shortest.
        assert_eq!(fitted_context(100, |_| false), 100);
        assert_eq!(fitted_context(3000, |c| c <= 400), 375);
    }
}
