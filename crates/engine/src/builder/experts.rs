//! A resident file of a Mixture-of-Experts model: its MoE layers run with their experts from the
//! bundle's expert store ([`offload::ExpertOffload`]), cached under the budget: in equal shares per
//! layer (in whole reads), or in the shares a plan gave each layer (`Planned::expert_cache`).

use super::{mib, EngineBuilder};
use crate::error::{EngineError, Result};
use crate::generate::Engine;
use crate::planning::expert_reads_reserved;
use model_bundle::bundle_parts::BundleParts;
use offload::budget::{ffn_cache_bytes, Resident};
use offload::{ExpertOffload, ExpertOffloadOptions};
use transformer::moe::RoutingProfile;

/// An expert bundle's parts and what stays resident beside its expert cache.
struct ExpertBudget {
    parts: BundleParts,
    /// Experts per layer.
    experts: Vec<usize>,
    /// Bytes of the expert store.
    store_bytes: u64,
    /// Expert reads in flight at most (their buffers are reserved beside the cache).
    depth: u64,
    /// What stays resident, measured once, without the KV cache (which depends on the context).
    measured: Resident,
}

impl ExpertBudget {
    /// `limit`: expert reads in flight at most where `--io-depth` or a plan says (else
    /// [`expert_reads_reserved`]'s for the store's experts).
    fn of(eng: &Engine<'_>, limit: Option<usize>) -> Result<Self> {
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
        let store_bytes = offload::budget::store_ffn_bytes(&parts.store)?;
        let len = |p: &std::path::Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
        // A ReLU expert's read is its hot prefix, less than its share of the store.
        let blob = offload::expert_read_bytes(&parts.store, &experts)
            .unwrap_or(store_bytes / experts.iter().sum::<usize>().max(1) as u64);
        let reserved = expert_reads_reserved(blob);
        let depth = limit.map_or(reserved, |d| (d as u64).clamp(1, reserved));
        let measured = Resident {
            process: crate::sys::rss_besides(model.path())
                .or_else(crate::sys::rss_bytes)
                .unwrap_or(0),
            file: len(model.path()).saturating_sub(model.header_bytes()),
            kv_cache: 0,
            predictors: 0,
            // The experts of a step being read and computed, outside the cache: a queue's worth.
            read_ahead: blob * depth,
        };
        Ok(ExpertBudget {
            parts,
            experts,
            store_bytes,
            depth,
            measured,
        })
    }

    fn resident(&self, eng: &Engine<'_>, context: usize) -> Resident {
        Resident {
            kv_cache: eng
                .model()
                .config
                .kv_cache_bytes(context.max(1), eng.cache_type()),
            ..self.measured
        }
    }
}

impl EngineBuilder {
    /// The limit `--io-depth` or a plan's queue depth puts on expert reads in flight (`None`:
    /// neither; [`expert_reads_reserved`] decides).
    fn expert_queue_depth(&self) -> Option<usize> {
        match self.offload.queue_depth {
            d if d == offload::OffloadOptions::default().queue_depth => None,
            d => Some(d),
        }
    }

    /// The context of `eng` under a process budget when none was asked for: the longest whose KV
    /// cache takes no more of the budget than the expert cache gets (as for a neuron store,
    /// `context.rs`), said in a note; the engine's own without a process budget or with a context.
    fn expert_context(&self, eng: &Engine<'_>, b: &ExpertBudget) -> usize {
        let context = eng.options().context;
        let (Some(budget), None) = (self.budget.process(), self.context) else {
            return context;
        };
        let format = eng.cache_type();
        let cfg = &eng.model().config;
        let context = super::context::fitted_context(context, |ctx| {
            ffn_cache_bytes(self.budget, b.store_bytes, ctx, || b.resident(eng, ctx))
                .is_ok_and(|(cache, _)| cache as u64 >= cfg.kv_cache_bytes(ctx, format))
        });
        self.note(&format!(
            "context {context} tokens, sized to --memory-budget {:.1} MiB (its KV cache {:.1} MiB; give --ctx to choose)",
            mib(budget),
            mib(cfg.kv_cache_bytes(context, format))
        ));
        context
    }

    /// Sets `eng`'s context (an MoE resident file, a process budget, no context asked for) to
    /// what the budget leaves room for, as [`EngineBuilder::setup`] would: the context a plan for
    /// the budget is made at.
    pub(super) fn fit_expert_context(&self, eng: &mut Engine<'_>) -> Result<()> {
        let b = ExpertBudget::of(eng, self.expert_queue_depth())?;
        let context = self.expert_context(eng, &b);
        if context != eng.options().context {
            eng.set_context(context)?;
        }
        Ok(())
    }

    /// Opens the expert store of `eng`'s resident MoE file and sets the engine to run from it.
    pub(super) fn setup_experts(&self, eng: &mut Engine<'_>) -> Result<()> {
        let b = ExpertBudget::of(eng, self.expert_queue_depth())?;
        let profile = match RoutingProfile::load(&b.parts.profile) {
            Ok(p) => Some(p),
            Err(e) => {
                self.warn(&format!("warning: no hot experts pinned: {e}"));
                None
            }
        };
        let context = self.expert_context(eng, &b);
        let (cache, split) = ffn_cache_bytes(self.budget, b.store_bytes, context, || {
            b.resident(eng, context)
        })?;
        let shares = self.expert_shares(cache, b.experts.len());
        if let Some(s) = &split {
            self.note(&format!(
                "memory budget {:.1} MiB = {:.1} MiB resident (process, file, KV cache, reads in flight) + {:.1} MiB expert cache ({:.0}% of the {:.1} MiB of experts){}",
                mib(s.budget),
                mib(s.resident),
                mib(s.cache()),
                s.cached_percent(),
                mib(s.ffn),
                if shares.is_some() { "; the plan's share of each layer" } else { "" }
            ));
        }
        let o = ExpertOffloadOptions {
            cache_bytes: cache,
            shares,
            queue_depth: b.depth as usize,
            ..ExpertOffloadOptions::default()
        };
        let off = ExpertOffload::open(&b.parts.store, &b.experts, profile.as_ref(), o)?;
        if context != eng.options().context {
            eng.set_context(context)?;
        }
        eng.set_experts(Some(off));
        Ok(())
    }

    /// The plan's expert cache of each of `layers` layers (`None`: no plan's), scaled down in
    /// proportion where the budget leaves less than their sum (`cache` bytes).
    fn expert_shares(&self, cache: usize, layers: usize) -> Option<Vec<usize>> {
        let planned = &self.planned.expert_cache;
        if planned.len() != layers {
            return None;
        }
        let sum: u64 = planned.iter().sum();
        let usize_of = |b: u64| usize::try_from(b).unwrap_or(usize::MAX);
        if sum <= cache as u64 {
            return Some(planned.iter().map(|&b| usize_of(b)).collect());
        }
        let scale = cache as f64 / sum as f64;
        Some(
            planned
                .iter()
                .map(|&b| (b as f64 * scale) as usize)
                .collect(),
        )
    }
}
