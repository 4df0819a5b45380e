//! `--accel` on a resident file (the FFN in a neuron store): prompt steps stream each layer onto the
//! accelerator (NPU-centric prefill), and decode is hybrid: each layer's hottest neurons (its leading
//! units in the store) are read once into the accelerator's blocks, in memory the neuron cache gives
//! up for them, and the CPU computes the other neurons from the cache (its hot prefix now the next
//! hottest units) and flash.

use super::{mib, EngineBuilder};
use crate::error::Result;
use crate::generate::Engine;
use offload::accel::AccelKind;
use offload::sparse::SparseFfn;
use offload::{HotSplit, HybridFfn};

/// The share of each layer's units on the accelerator without `--accel-hot` or a plan.
const DEFAULT_SHARE: f64 = 0.1;

impl EngineBuilder {
    /// Installs `sp` on `eng` with `kind`'s accelerator: for prompt steps always, and for decode over
    /// each layer's hottest units as far as the cache's budget holds them in the backend's form
    /// (none: prompt steps only): `accel_hot`'s share of them, else the plan's split (made over this
    /// store within its cache, `planner::hybrid_split_over_store`), else a 10% share. A backend that
    /// cannot be opened is a warning and leaves everything on the CPU.
    pub(super) fn setup_store_accel(
        &self,
        eng: &mut Engine<'_>,
        mut sp: SparseFfn,
        kind: &AccelKind,
    ) -> Result<()> {
        let say = |line: String| self.note(&line);
        let Some(off) = sp.offload_mut() else {
            eng.set_sparse(Some(sp));
            return Ok(());
        };
        let prompt = match eng.install(|| offload::accel::open(kind, std::iter::empty())) {
            Ok(a) => a,
            Err(e) => {
                self.warn(&format!("warning: {e}; the FFN on the CPU"));
                eng.set_sparse(Some(sp));
                return Ok(());
            }
        };
        let ix = off.store().index();
        let (d, format) = (ix.d_model, ix.formats.gate);
        let control = off.control();
        let report = control.report();
        let cache = report.cache_asked;
        let (want, source) = match (self.accel_hot, &self.planned.split) {
            (Some(share), _) => (off.share_units(share), format!("--accel-hot {share}")),
            (None, Some(counts)) => {
                let neurons: Vec<u32> = counts.iter().map(|c| c[0]).collect();
                (off.units_for_neurons(&neurons), "planned".to_string())
            }
            (None, None) => (
                off.share_units(DEFAULT_SHARE),
                format!("{DEFAULT_SHARE} of the units: no plan"),
            ),
        };
        let units = off.accel_units(&want, cache, |k| prompt.block_bytes(k, d, format));
        let order = off.leading_neurons(&units);
        let bytes: u64 = order
            .iter()
            .map(|n| prompt.block_bytes(n.len(), d, format))
            .sum();
        say(format!("prompt steps on the {} accelerator: each layer's FFN streamed from flash onto it in chunks, dense (NPU-centric prefill)", prompt.name()));
        off.set_prompt_accel(Some(prompt));
        if units.iter().all(|&u| u == 0) {
            say(if want.iter().all(|&w| w == 0) {
                format!("decode sparse on the CPU ({source}: no neuron on the accelerator)")
            } else {
                format!(
                "decode sparse on the CPU ({source}: no unit of a layer fits the accelerator in the {:.1} MiB FFN cache)",
                mib(report.cache_budget)
            )
            });
            eng.set_sparse(Some(sp));
            return Ok(());
        }
        // The cache lets its units go while the blocks are built and gives them that memory (its
        // pinned hot prefixes then start after the blocks' units), so that both never take memory at
        // once.
        let activation = eng.model().config.activation;
        let accel = control.reserve_with(bytes, &units, || {
            let a =
                eng.install(|| offload::accel::open(kind, off.accel_blocks(&units, activation)));
            // The blocks' f32 forms were freed layer by layer on the pool's threads: hand that back.
            crate::sys::release_free_memory();
            a
        })?;
        let split = HotSplit::fixed(order);
        let hot: usize = split.order.iter().map(Vec::len).sum();
        let all = (eng.model().config.d_ff * split.order.len()).max(1);
        say(format!(
        "hybrid decode: the hottest {:.0}% of each layer's neurons on the {} accelerator ({source}; its blocks {:.1} MiB, the neuron cache {:.1} MiB), the rest sparse on the CPU from the cache and flash",
        hot as f64 / all as f64 * 100.0,
        accel.name(),
        mib(bytes),
        mib(control.report().cache_budget)
    ));
        let h = HybridFfn::new(sp, accel, eng.model(), &split)?;
        eng.set_hybrid(Some(h));
        Ok(())
    }
}
