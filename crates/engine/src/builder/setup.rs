//! An engine's FFN as the builder's options ask: dense, every layer on an accelerator, sparse
//! (profile thresholds, predictors, a plan's dense layers), hybrid decode (each layer's hot neurons
//! on the accelerator, the rest sparse) or over a resident file's neuron store under its budget.

use super::EngineBuilder;
use crate::bundle::SparsePlan;
use crate::error::Result;
use crate::generate::Engine;
use offload::accel::AccelKind;
use offload::budget::MemoryBudget;
use offload::sparse::SparseFfn;
use offload::{HotSplit, HybridFfn};

impl EngineBuilder {
    /// Sets up `eng`'s FFN as these options ask (a resident file is always sparse, over its
    /// neuron store). An accelerator that cannot be opened is a warning and the CPU.
    pub fn setup(&self, eng: &mut Engine<'_>) -> Result<()> {
        self.warn_moot_options(eng);
        let offloaded = eng.model().config.ffn_store.is_some();
        if offloaded && eng.model().config.moe.is_some() {
            return self.setup_experts(eng);
        }
        if let (Some(kind), false, false) = (&self.accel, self.sparse, offloaded) {
            self.setup_accel(eng, kind);
        }
        if !self.sparse && !offloaded {
            // Dense in memory with no budget: decode and short prompts may read repacked copies
            // (AVX2 or AVX-512, `Fast`); under a budget the copies' bytes are not planned for, so
            // none is made, nor for an engine of prompts only.
            if self.budget.process().is_some() || self.prompts_only {
                return Ok(());
            }
            let ffn = eng.accel().is_none();
            if let Some(short) = copies_short_of_memory(eng, ffn) {
                self.note(&short);
                return Ok(());
            }
            let (n, bytes) = eng.pack_q40x8(ffn);
            if n > 0 {
                self.note(&format!(
                    "{n} Q4_0/Q4_1/Q5_0/Q5_1/IQ4_NL/Q4_K/Q5_K/Q6_K/Q8_0 matrices repacked eight rows at a time for decode ({:.1} MiB in memory beside the mapped file)",
                    super::mib(bytes as u64)
                ));
            }
            return Ok(());
        }
        let plan = match (offloaded, self.budget.process(), self.context) {
            (true, Some(_), None) => self.fit_context(eng)?,
            _ => SparsePlan::new(eng, &self.sidecars, self.budget, self.offload.clone())?,
        };
        if let Some(model_bundle::manifest::ManifestStatus::Missing(m)) = &plan.manifest {
            self.note(&format!("warning: {} is missing: this bundle's parts are not checked (converted by an older sparrow; `sparrow convert` again writes one)", m.display()));
        }
        if let Some(s) = &plan.budget {
            let mib = super::mib;
            self.note(&format!("memory budget {:.1} MiB = {:.1} MiB resident (process, file, KV cache, predictors, reads ahead) + {:.1} MiB FFN cache ({:.0}% of the {:.1} MiB FFN){}{}", mib(s.budget), mib(s.resident), mib(s.cache()), s.cached_percent(), mib(s.ffn),
                if plan.stream_weights { format!("; the embedding and output projection ({:.1} MiB) stay on flash", mib(eng.model().streamed_bytes())) } else { String::new() },
                if s.planned.is_some() { "; the neuron cache is the plan's" } else { "" }));
        }
        eng.set_streamed(plan.stream_weights);
        eng.set_output_proxy(!self.full_output);
        let sp = self.sparse_ffn(eng, &plan)?;
        // An offloaded model's FFN is on flash: the accelerator takes the prompt steps' layers as
        // they are streamed (NPU-centric prefill) and each layer's hottest units in decode.
        if let (Some(kind), true) = (&self.accel, sp.offload().is_some()) {
            return self.setup_store_accel(eng, sp, kind);
        }
        match &self.accel {
            Some(kind) => self.setup_hybrid(eng, sp, &plan, kind),
            None => {
                eng.set_sparse(Some(sp));
                Ok(())
            }
        }
    }

    /// The sparse FFN of `plan`, with the plan's dense layers and batch sizes (in memory, without
    /// an accelerator: hybrid decode splits every layer).
    fn sparse_ffn(&self, eng: &Engine<'_>, plan: &SparsePlan) -> Result<SparseFfn> {
        let mut sp = plan.build(eng)?;
        let planned = &self.planned;
        if self.accel.is_none() && sp.offload().is_none() {
            if planned.dense_layers.iter().any(|&d| d) {
                sp = sp.with_dense_layers(planned.dense_layers.clone())?;
            }
            sp = sp.with_dense_batches(planned.dense_batches.clone())?;
        }
        let n_layers = eng.model().config.n_layers;
        self.note(&format!(
            "sparse FFN from {} (profiled on {}, {:?} score{}){}{}",
            plan.profile_path.display(),
            plan.profile.corpus,
            plan.profile.score,
            match &plan.predictor {
                Some(p) => format!(", predictors from {}", p.display()),
                None => ", no predictor".into(),
            },
            match (0..n_layers).filter(|&l| sp.is_dense(l)).count() {
                0 => String::new(),
                n => format!("; {n} of {n_layers} layers dense, as planned"),
            },
            match (2..=64).find(|&n| sp.dense_batch(n)) {
                Some(n) => format!("; decode steps of {n} sequences or more dense, as planned"),
                None => String::new(),
            }
        ));
        Ok(sp)
    }

    /// Hybrid decode in memory: each layer's hot neurons on `kind`, the rest sparse here; more of
    /// them for larger batches (from the plan, else from the device profile's split, else from the
    /// profile's batch frequencies). A split with no neuron on the accelerator, or a backend that
    /// cannot be opened, leaves `sp` sparse on the CPU alone.
    fn setup_hybrid(
        &self,
        eng: &mut Engine<'_>,
        sp: SparseFfn,
        plan: &SparsePlan,
        kind: &AccelKind,
    ) -> Result<()> {
        let (planned_split, source) = self.hybrid_split(eng, kind);
        // A plan that puts no neuron on the accelerator at any batch size: sparse on the CPU alone.
        let nothing_planned = planned_split
            .as_ref()
            .is_some_and(|c| c.iter().all(|c| c[3] == 0));
        if nothing_planned {
            self.note("the plan puts no neuron on the accelerator: sparse on the CPU alone");
        }
        if nothing_planned || self.accel_hot == Some(0.0) {
            eng.set_sparse(Some(sp));
            return Ok(());
        }
        let (split, source) = match &planned_split {
            Some(counts) => (HotSplit::planned(&plan.profile, counts)?, source.as_str()),
            None => (
                HotSplit::from_profile(&plan.profile, self.accel_hot.unwrap_or(0.1)),
                "from the profile",
            ),
        };
        match eng.install(|| HybridFfn::open_blocks(kind, eng.model(), &split)) {
            Ok(accel) => {
                let h = HybridFfn::new(sp, accel, eng.model(), &split)?;
                let d_ff = (eng.model().config.d_ff * split.counts.len()).max(1) as f64;
                let share = |b: usize| {
                    split.counts.iter().map(|c| c[b]).sum::<usize>() as f64 / d_ff * 100.0
                };
                self.note(&format!(
                    "hybrid decode: the hottest {:.0}% of each layer's neurons on the {} accelerator at batch size 1 ({:.0}% at 2, {:.0}% at 4, {:.0}% at 8 or more, {source}), the rest sparse on the CPU",
                    share(0),
                    h.accelerator().name(),
                    share(1),
                    share(2),
                    share(3)
                ));
                eng.set_hybrid(Some(h));
            }
            Err(e) => {
                self.warn(&format!("warning: {e}; sparse on the CPU alone"));
                eng.set_sparse(Some(sp));
            }
        }
        Ok(())
    }

    /// Hybrid decode's split and where it came from: the plan's, else (without `accel_hot`) the
    /// planner's for the device profile in the model cache folder, else none.
    fn hybrid_split(&self, eng: &Engine<'_>, kind: &AccelKind) -> (Option<Vec<[u32; 4]>>, String) {
        if let Some(c) = &self.planned.split {
            return (Some(c.clone()), "planned".to_string());
        }
        if self.accel_hot.is_some() {
            return (None, String::new());
        }
        match self.device_split(eng, kind) {
            Ok(Some(c)) => (
                Some(c),
                format!(
                    "planned for {}",
                    crate::planning::default_device_path().display()
                ),
            ),
            Ok(None) => (None, String::new()),
            Err(e) => {
                self.note(&format!(
                    "note: no planned hybrid split ({e}); the profile's 10% share serves"
                ));
                (None, String::new())
            }
        }
    }

    /// The planner's split in memory (`planner::hybrid_split`: per layer and batch size, the block
    /// on `kind` that minimizes the FFN step against the CPU's sparse work) from the device profile
    /// in the model cache folder; `None` without one.
    fn device_split(&self, eng: &Engine<'_>, kind: &AccelKind) -> Result<Option<Vec<[u32; 4]>>> {
        let path = crate::planning::default_device_path();
        if !path.is_file() {
            return Ok(None);
        }
        let device = planner::DeviceProfile::load(&path)?;
        let summary = crate::planning::model_summary(eng, &self.sidecars)?;
        let threads = eng.options().threads.max(1) as u32;
        let split = planner::hybrid_split(&device, &summary, kind.name(), threads)?;
        Ok(Some(split.counts))
    }

    /// Every layer's FFN on `kind`; one that cannot be opened is a warning and the CPU.
    fn setup_accel(&self, eng: &mut Engine<'_>, kind: &AccelKind) {
        match eng.install(|| offload::AccelFfn::open(kind, eng.model())) {
            Ok(ffn) => {
                self.note(&format!(
                    "FFN on the {} accelerator",
                    ffn.accelerator().name()
                ));
                eng.set_accel(Some(ffn));
            }
            Err(e) => self.warn(&format!("warning: {e}; running on the CPU")),
        }
    }

    /// Warnings about options the loaded model makes moot: a context past its training context
    /// (the engine caps it) and a budget for a model that runs neither sparse nor from a store.
    fn warn_moot_options(&self, eng: &Engine<'_>) {
        let cfg = &eng.model().config;
        if let Some(ctx) = self.context.filter(|&c| c > cfg.context_length) {
            self.note(&format!(
                "warning: --ctx {ctx} is past the model's training context of {} tokens; using {}",
                cfg.context_length, cfg.context_length
            ));
        }
        if !self.sparse && cfg.ffn_store.is_none() {
            let flag = match self.budget {
                MemoryBudget::Process(_) | MemoryBudget::Planned { .. } => "--memory-budget",
                MemoryBudget::Share(_) => "--ffn-resident",
                _ => return,
            };
            self.note(&format!("warning: {flag} applies to a resident file (`sparrow convert`) or with --sparse; ignored for this dense model"));
        }
    }
}

/// Why no repacked copies are made, when the copies and the model file together would need more
/// than the memory this process may still take ([`crate::sys::memory_room`]): without a budget the
/// copies are held beside the mapped file, whose pages a prompt reads back, so both must fit (on a
/// phone a model of half its memory would not).
fn copies_short_of_memory(eng: &Engine<'_>, ffn: bool) -> Option<String> {
    let copies = eng.q40x8_planned_bytes(ffn) as u64;
    if copies == 0 {
        return None;
    }
    let room = crate::sys::memory_room()?;
    let file = std::fs::metadata(eng.model().path()).map_or(0, |m| m.len());
    let mib = super::mib;
    (copies + file > room).then(|| {
        format!(
            "Q4_0/Q4_1/Q5_0/Q5_1/IQ4_NL/Q4_K/Q5_K/Q6_K/Q8_0 matrices not repacked for decode: {:.1} MiB of copies beside the {:.1} MiB file would pass the {:.1} MiB of memory available",
            mib(copies),
            mib(file),
            mib(room)
        )
    })
}
