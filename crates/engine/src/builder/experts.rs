//! A resident file of a Mixture-of-Experts model: its MoE layers run with their experts from the
//! bundle's expert store ([`offload::ExpertOffload`]), cached under the budget.

use super::{mib, EngineBuilder};
use crate::error::{EngineError, Result};
use crate::generate::Engine;
use model_bundle::bundle_parts::BundleParts;
use offload::budget::{ffn_cache_bytes, Resident};
use offload::{ExpertOffload, ExpertOffloadOptions};
use transformer::moe::RoutingProfile;

impl EngineBuilder {
    /// Opens the expert store of `eng`'s resident MoE file and sets the engine to run from it.
    pub(super) fn setup_experts(&self, eng: &mut Engine<'_>) -> Result<()> {
        let model = eng.model();
        let r = model.config.ffn_store.as_ref().ok_or_else(|| {
            EngineError::Request(format!("{}: not a resident file", model.path().display()))
        })?;
        let parts = BundleParts::of(model.path(), r)?;
        let experts: Vec<usize> = model
            .layers
            .iter()
            .map(|l| l.ffn.moe().map_or(0, |m| m.weights.n_experts()))
            .collect();
        let profile = match RoutingProfile::load(&parts.profile) {
            Ok(p) => Some(p),
            Err(e) => {
                self.warn(&format!("warning: no hot experts pinned: {e}"));
                None
            }
        };
        let store_bytes = offload::budget::store_ffn_bytes(&parts.store)?;
        let len = |p: &std::path::Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
        // What stays resident besides the cache, measured once; only the KV cache depends on the
        // context tried.
        let measured = Resident {
            process: crate::sys::rss_besides(model.path())
                .or_else(crate::sys::rss_bytes)
                .unwrap_or(0),
            file: len(model.path()).saturating_sub(model.header_bytes()),
            kv_cache: 0,
            predictors: 0,
            // The experts of a step being read and computed, outside the cache: a queue's worth.
            read_ahead: store_bytes / experts.iter().sum::<usize>().max(1) as u64 * 32,
        };
        let resident = |context: usize| Resident {
            kv_cache: model
                .config
                .kv_cache_bytes(context.max(1), eng.cache_type()),
            ..measured
        };
        let mut context = eng.options().context;
        if let (Some(budget), None) = (self.budget.process(), self.context) {
            // No context asked for: the longest whose KV cache takes no more of the budget than
            // the expert cache gets (as for a neuron store, `context.rs`).
            let format = eng.cache_type();
            context = super::context::fitted_context(context, |ctx| {
                ffn_cache_bytes(self.budget, store_bytes, ctx, || resident(ctx)).is_ok_and(
                    |(cache, _)| cache as u64 >= model.config.kv_cache_bytes(ctx, format),
                )
            });
            self.note(&format!(
                "context {context} tokens, sized to --memory-budget {:.1} MiB (its KV cache {:.1} MiB; give --ctx to choose)",
                mib(budget),
                mib(model.config.kv_cache_bytes(context, format))
            ));
        }
        let (cache, split) =
            ffn_cache_bytes(self.budget, store_bytes, context, || resident(context))?;
        if let Some(s) = &split {
            self.note(&format!(
                "memory budget {:.1} MiB = {:.1} MiB resident (process, file, KV cache, reads in flight) + {:.1} MiB expert cache ({:.0}% of the {:.1} MiB of experts)",
                mib(s.budget),
                mib(s.resident),
                mib(s.cache()),
                s.cached_percent(),
                mib(s.ffn)
            ));
        }
        let off = ExpertOffload::open(
            &parts.store,
            &experts,
            profile.as_ref(),
            ExpertOffloadOptions {
                cache_bytes: cache,
                ..ExpertOffloadOptions::default()
            },
        )?;
        if context != eng.options().context {
            eng.set_context(context)?;
        }
        eng.set_experts(Some(off));
        Ok(())
    }
}
