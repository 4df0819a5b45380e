//! A plan applied to the builder's options: `plan`'s file, or for a memory budget over a model
//! that runs sparse, one made on the spot from this device's profile (`sparrow calibrate`). Each
//! setting of the plan applies only where the options have none of their own.

use std::path::Path;

use planner::{Constraints, DeviceProfile};

use super::EngineBuilder;
use crate::error::Result;
use crate::generate::Engine;
use crate::planning::{default_device_path, load_plan, model_summary, PlanSettings};
use offload::budget::MemoryBudget;
use offload::OffloadOptions;
use transformer::model::{Model, ModelFile};

pub use planner::{Plan, Solver, SpecAcceptance};

/// The device profile and the model's summary a plan is made from ([`EngineBuilder::plan_inputs`]).
pub struct PlanInputs {
    device: DeviceProfile,
    summary: planner::ModelSummary,
}

impl EngineBuilder {
    /// Applies the plan (checked against the model in `file` and this machine) to these options:
    /// its threads, chunk rows, dense or sparse, neuron-cache size and whether the embedding and
    /// output stay on flash, I/O core and queue depth, each only where no option of their own was
    /// set. Without `plan`, a process budget over a model that runs sparse is planned on the spot
    /// from this device's profile, when there is one. Returns the plan.
    pub(crate) fn apply_plan(&mut self, file: &ModelFile) -> Result<Option<Plan>> {
        let budgeted = self.budget.process().is_some();
        if self.plan.is_none() && !budgeted {
            return Ok(None);
        }
        let model = Model::load(file)?;
        let resident = model.config.ffn_store.is_some();
        let (plan, s) = match self.plan.clone() {
            Some(path) => {
                let fingerprint = calibrate::device_fingerprint().1;
                let (plan, s) = load_plan(&path, &model, Some(fingerprint))?;
                self.note(&format!(
                    "{}: {}",
                    path.display(),
                    plan.describe().trim_end()
                ));
                (plan, s)
            }
            None => {
                drop(model);
                match self.auto_plan(file, resident)? {
                    Some(plan) => {
                        let s = PlanSettings::of(&plan);
                        (plan, s)
                    }
                    None => return Ok(None),
                }
            }
        };
        self.apply_settings(file.path(), &plan, s, resident);
        Ok(Some(plan))
    }

    fn apply_settings(&mut self, model: &Path, plan: &Plan, s: PlanSettings, resident: bool) {
        if self.threads == 0 {
            self.threads = s.threads;
        }
        if self.chunk_rows == 0 {
            self.chunk_rows = s.chunk_rows;
        }
        if !resident && s.sparse {
            // Sparse needs the model's activation profile: a plan made without one (every neuron
            // counted as firing) can still come out sparse when the measured rates are close.
            let profile =
                crate::ModelBundle::new(model).profile_or(self.sidecars.profile.as_deref());
            if profile.is_file() {
                // The plan's dense layers, unless sparse was asked for (every layer).
                if !self.sparse {
                    self.planned.dense_layers = s.dense_layers.clone();
                    self.planned.dense_batches = s.dense_batches.clone();
                }
                self.sparse = true;
            } else {
                self.note(&format!(
                    "note: the plan runs the FFN sparse, but {} does not exist: dense",
                    profile.display()
                ));
            }
        }
        match self.budget {
            MemoryBudget::All if resident => {
                self.budget = MemoryBudget::Bytes(s.ffn_cache_bytes);
            }
            // A plan made for this budget: its neuron cache, at the context it was made for.
            MemoryBudget::Process(b) if resident && plan.memory_budget == Some(b) => {
                self.budget = MemoryBudget::Planned {
                    budget: b,
                    cache: s.ffn_cache_bytes,
                };
                self.context.get_or_insert(plan.context as usize);
            }
            _ => {}
        }
        if resident && !matches!(self.budget, MemoryBudget::Share(_)) {
            // Under a budget too: the plan weighed the embedding and output against the neuron
            // cache by time saved per byte, where the engine's own rule always gives the cache
            // first.
            self.offload.stream_weights = Some(s.stream_weights);
        }
        let o = &mut self.offload;
        if o.pin_core.is_none() {
            o.pin_core = s.io_core;
        }
        if o.queue_depth == OffloadOptions::default().queue_depth {
            o.queue_depth = s.queue_depth;
        }
        if let (Some(x), true) = (&plan.experts, resident) {
            self.planned.expert_cache = x.cache_bytes.clone();
        }
        if let (Some(h), Some(kind), None) = (&plan.hybrid, &self.accel, self.accel_hot) {
            if h.accelerator == kind.name() {
                self.planned.split = Some(h.counts.clone());
            }
        }
    }

    /// The plan for a process budget without `plan`: made with the search solver from the device
    /// profile in the model cache folder, over a resident file or a model run sparse. `None` (with
    /// a note) when there is no device profile or no plan can be made (the engine's own budget
    /// split then applies), and when nothing is to be planned.
    fn auto_plan(&self, file: &ModelFile, resident: bool) -> Result<Option<Plan>> {
        let Some(budget) = self.budget.process() else {
            return Ok(None);
        };
        if !resident && !self.sparse {
            return Ok(None);
        }
        let device_path = default_device_path();
        if !device_path.is_file() {
            self.note(&format!(
                "note: no device profile at {}: the default settings serve --memory-budget (run `sparrow calibrate` once for a planned configuration)",
                device_path.display()
            ));
            return Ok(None);
        }
        let planned = || -> Result<Plan> {
            let mut eng = Engine::new(file, self.engine_options())?;
            eng.set_output_proxy(!self.full_output);
            if resident && self.context.is_none() {
                // Planned at the context the budget leaves room for (the plan's neuron cache is
                // what the budget leaves beside the KV cache at the context it is made for).
                if eng.model().config.moe.is_some() {
                    self.fit_expert_context(&mut eng)?;
                } else {
                    self.fit_context(&mut eng)?;
                }
            }
            self.make_plan(&eng, &device_path, None, Solver::Search)
        };
        // A budget was asked for, not a plan: a plan that cannot be made leaves the defaults.
        match planned() {
            Ok(plan) => {
                self.note(&format!(
                    "planned with {} (--plan FILE or explicit flags override): {}",
                    device_path.display(),
                    plan.describe().trim_end()
                ));
                Ok(Some(plan))
            }
            Err(e) => {
                self.note(&format!(
                    "warning: no plan for --memory-budget {:.1} MiB with {}: {e}; using the default settings",
                    super::mib(budget),
                    device_path.display()
                ));
                Ok(None)
            }
        }
    }

    /// The plan for `eng` (made with these options) on the device profiled at `device` with
    /// `solver`, under these options' memory budget and thread limit and at least `min_tok_s`.
    pub fn make_plan(
        &self,
        eng: &Engine<'_>,
        device: &Path,
        min_tok_s: Option<f64>,
        solver: Solver,
    ) -> Result<Plan> {
        let inputs = self.plan_inputs(eng, device)?;
        self.plan_with(eng, &inputs, min_tok_s, solver)
    }

    /// What [`Self::make_plan`] reads from the device profile at `device` and from `eng`, the
    /// process's memory included: read it before anything runs on `eng` whose buffers the plan
    /// must not count (`sparrow plan --measure-speculation` generates text in between).
    pub fn plan_inputs(&self, eng: &Engine<'_>, device: &Path) -> Result<PlanInputs> {
        Ok(PlanInputs {
            device: DeviceProfile::load(device)?,
            summary: model_summary(eng, &self.sidecars)?,
        })
    }

    /// [`Self::make_plan`] from `inputs` read before ([`Self::plan_inputs`]).
    pub fn plan_with(
        &self,
        eng: &Engine<'_>,
        inputs: &PlanInputs,
        min_tok_s: Option<f64>,
        solver: Solver,
    ) -> Result<Plan> {
        let c = self.constraints(eng, min_tok_s);
        Ok(planner::make_plan(
            &inputs.device,
            &inputs.summary,
            &c,
            solver,
        )?)
    }

    /// The planner's constraints for `eng` under these options' memory budget and thread limit.
    fn constraints(&self, eng: &Engine<'_>, min_tok_s: Option<f64>) -> Constraints {
        let context = eng.options().context as u32;
        let store = eng.model().config.ffn_store.is_some();
        Constraints {
            memory_budget: self.budget.process(),
            context,
            attended: context.min(512),
            min_tok_s,
            max_threads: (self.threads > 0).then_some(self.threads as u32),
            // The plan splits hybrid decode in memory (sparse) and over a neuron store (within
            // the neuron cache, which gives the block its memory: `store_accel`).
            accelerator: self
                .accel
                .as_ref()
                .filter(|_| self.sparse || store)
                .map(|k| k.name().to_string()),
            accel_neuron_bytes: match (&self.accel, store) {
                (Some(kind), true) => crate::planning::accel_neuron_bytes(eng, kind)
                    .ok()
                    .flatten(),
                _ => None,
            },
            spec_acceptance: self.spec_acceptance,
        }
    }
}
