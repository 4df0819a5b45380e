//! The engine as a library: [`EngineBuilder`] turns what a front end was asked (a model by path or
//! by name, a memory budget or a plan, sparse decode, an accelerator, threads, context) into a
//! running [`Engine`], its FFN set up (dense, sparse, offloaded to a neuron store, on an accelerator
//! or hybrid). `sparrow run`, `bench`, `perplexity` and `serve` build their engines here and only
//! parse flags and print; `crates/engine/examples/budget.rs` runs a model under a budget with it.
//!
//! Two steps, because an engine borrows its file: [`EngineBuilder::open`] finds (or fetches) the
//! model, applies a plan to a copy of the builder's options (`plan`, or for a memory budget one made
//! on the spot from the device profile, `plan.rs`) and re-quantizes; [`Loaded::engine`] starts the
//! engine and sets up its FFN ([`EngineBuilder::setup`], `setup.rs`). A budgeted run over a resident
//! file without a `context` sizes its context to what the budget leaves (`context.rs`).
//!
//! The builder says what it decided through its [`Log`] (one line each; none by default): notes
//! a quiet front end hides, and warnings (something asked for that could not be had) it shows.

mod context;
mod experts;
mod plan;
mod setup;
mod store_accel;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use kernels_neon::{KvFormat, Precision};

use crate::bundle::SparseSidecars;
use crate::error::Result;
use crate::generate::{Engine, EngineOptions};
use offload::accel::AccelKind;
use offload::budget::MemoryBudget;
use offload::OffloadOptions;
use transformer::model::ModelFile;
use transformer::requant::{Overlay, Requant};

pub use plan::{Plan, PlanInputs, Solver, SpecAcceptance};

/// The context without an explicit one (the engine caps it at the model's training context).
pub const DEFAULT_CONTEXT: usize = 4096;

/// How much a line of the builder's [`Log`] matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// What was decided (a quiet front end hides these).
    Note,
    /// Something asked for that could not be had, and what runs instead.
    Warning,
}

/// Where the builder's lines go.
pub type Log = Arc<dyn Fn(Level, &str) + Send + Sync>;

/// What a plan decided beyond the builder's public options (set by [`EngineBuilder::open`]).
#[derive(Debug, Clone, Default)]
pub struct Planned {
    /// Hybrid decode's split, per layer and batch size 1/2/4/8.
    pub split: Option<Vec<[u32; 4]>>,
    /// The layers a partly sparse plan keeps dense (empty: none).
    pub dense_layers: Vec<bool>,
    /// Per further batch size, whether a sparse plan runs it dense (empty: none).
    pub dense_batches: Vec<(usize, bool)>,
    /// Each MoE layer's expert cache, bytes, as a plan sized it (empty: none; equal shares in whole
    /// reads).
    pub expert_cache: Vec<u64>,
}

/// Everything that decides how a model runs; every field public, `Default` the dense CPU engine
/// of the default model. See the module documentation.
#[derive(Clone)]
pub struct EngineBuilder {
    /// A GGUF file, an HF directory, or a known model's name (`fetch::KNOWN_MODELS`), fetched into
    /// the model cache if absent; `None`: the default model.
    pub model: Option<PathBuf>,
    /// Compute threads (0: one per core; more than the cores here are capped, with a warning).
    pub threads: usize,
    /// How weights and activations are computed.
    pub precision: Precision,
    /// Weight rows per parallel work item of the dense kernels (0: automatic; process-wide).
    pub chunk_rows: usize,
    /// Context in tokens (0: the training context); `None`: [`DEFAULT_CONTEXT`], or under a memory
    /// budget over a resident file what the budget leaves.
    pub context: Option<usize>,
    /// Load-time re-quantization of the layer matrices.
    pub requant: Option<Requant>,
    /// The KV cache's element format (`None`: the precision's default).
    pub cache_type: Option<KvFormat>,
    /// Sparse FFN from the model's profile and predictors (a resident file is always sparse).
    pub sparse: bool,
    /// Which profile and predictors sparse decode reads.
    pub sidecars: SparseSidecars,
    /// A plan file (`sparrow plan`) whose settings apply where no option of their own was set.
    pub plan: Option<PathBuf>,
    /// The accelerator: every layer's FFN alone, hybrid decode with `sparse`, prompt steps and
    /// hybrid decode over a resident file.
    pub accel: Option<AccelKind>,
    /// Hybrid decode's share of each layer's neurons on the accelerator (`None`: the plan's split,
    /// else the device profile's, else 0.1).
    pub accel_hot: Option<f64>,
    /// The memory budget, carried as given to the neuron cache.
    pub budget: MemoryBudget,
    /// Offload settings besides the budget (`ffn_budget` and `outside_ffn_bytes` are worked out).
    pub offload: OffloadOptions,
    /// Read a streamed output projection whole instead of through its proxy.
    pub full_output: bool,
    /// The engine runs prompts only (perplexity): no repacked copies for decode, which its long
    /// windows do not read (only prompts of fewer than 32 tokens, or 64 on AVX-512, would;
    /// `Engine::pack_q40x8`).
    pub prompts_only: bool,
    /// Measured acceptance of the draft sources, for the plan's speculation (`sparrow plan
    /// --measure-speculation`; none: the planner's defaults).
    pub spec_acceptance: SpecAcceptance,
    /// What a plan decided (filled by [`EngineBuilder::open`]).
    pub planned: Planned,
    /// Where the builder's lines go (none by default; [`EngineBuilder::log`]).
    pub log: Log,
}

impl Default for EngineBuilder {
    fn default() -> Self {
        EngineBuilder {
            model: None,
            threads: 0,
            precision: Precision::Fast,
            chunk_rows: 0,
            context: None,
            requant: None,
            cache_type: None,
            sparse: false,
            sidecars: SparseSidecars::default(),
            plan: None,
            accel: None,
            accel_hot: None,
            budget: MemoryBudget::All,
            offload: OffloadOptions::default(),
            full_output: false,
            prompts_only: false,
            spec_acceptance: SpecAcceptance::default(),
            planned: Planned::default(),
            log: Arc::new(|_, _| {}),
        }
    }
}

/// A model opened by [`EngineBuilder::open`]: its file, its re-quantized matrices, the options with
/// the plan applied, and the plan.
pub struct Loaded {
    file: ModelFile,
    overlay: Option<Overlay>,
    options: EngineBuilder,
    plan: Option<Plan>,
}

impl EngineBuilder {
    /// A builder of the model at `model` (a path or a known model's name), the rest default.
    pub fn new(model: impl Into<PathBuf>) -> Self {
        EngineBuilder {
            model: Some(model.into()),
            ..Default::default()
        }
    }

    /// Sends the builder's lines to `log`.
    pub fn log(mut self, log: impl Fn(Level, &str) + Send + Sync + 'static) -> Self {
        self.log = Arc::new(log);
        self
    }

    /// With the memory budget `budget`.
    pub fn budget(mut self, budget: MemoryBudget) -> Self {
        self.budget = budget;
        self
    }

    pub(crate) fn note(&self, line: &str) {
        (self.log)(Level::Note, line);
    }

    pub(crate) fn warn(&self, line: &str) {
        (self.log)(Level::Warning, line);
    }

    /// The model file the options name (fetched into the model cache when it is a known model's
    /// name and no such path exists).
    pub fn model_path(&self) -> Result<PathBuf> {
        let log = |line: &str| self.note(line);
        let Some(p) = &self.model else {
            return Ok(model_fetch::ensure_default_model(log)?);
        };
        if !p.exists() {
            if let Some(known) = p.to_str().and_then(model_fetch::known_model) {
                return Ok(model_fetch::ensure_model(known, log)?);
            }
        }
        Ok(p.clone())
    }

    /// Opens the model, applies the plan to a copy of these options and re-quantizes.
    pub fn open(&self) -> Result<Loaded> {
        let file = ModelFile::open(self.model_path()?)?;
        let mut options = self.clone();
        let plan = options.apply_plan(&file)?;
        let overlay = options.overlay(&file)?;
        Ok(Loaded {
            file,
            overlay,
            options,
            plan,
        })
    }

    /// The load-time re-quantization `requant` asks for.
    pub fn overlay(&self, file: &ModelFile) -> Result<Option<Overlay>> {
        let Some(r) = self.requant else {
            return Ok(None);
        };
        let t = Instant::now();
        let o = Overlay::build(file, r).map_err(|e| {
            crate::EngineError::Request(format!(
                "re-quantizing {} to {r}: {e}",
                file.path().display()
            ))
        })?;
        self.note(&format!(
            "re-quantized {} layer matrices to {r} in {:.1} s: {:.1} MiB, {:.3} bits per weight",
            o.len(),
            t.elapsed().as_secs_f64(),
            mib(o.bytes() as u64),
            o.bits_per_weight()
        ));
        Ok(Some(o))
    }

    /// The engine's options (and the kernels' process-wide `chunk_rows`).
    pub fn engine_options(&self) -> EngineOptions {
        kernels_neon::set_chunk_rows(self.chunk_rows);
        EngineOptions {
            threads: self.capped_threads(),
            precision: self.precision,
            context: self.context.unwrap_or(DEFAULT_CONTEXT),
            cache_type: self.cache_type,
        }
    }

    /// `threads`, capped at the cores this process may use (more only wait on each other), with
    /// a warning once.
    fn capped_threads(&self) -> usize {
        static WARN: std::sync::Once = std::sync::Once::new();
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let asked = self.threads;
        if asked <= cores {
            return asked;
        }
        WARN.call_once(|| {
            self.warn(&format!(
                "warning: --threads {asked} is more than the {cores} cores here; using {cores}"
            ))
        });
        cores
    }

    /// An engine of `file` (and `overlay`) with these options, its FFN set up.
    pub fn engine<'a>(
        &self,
        file: &'a ModelFile,
        overlay: Option<&'a Overlay>,
    ) -> Result<Engine<'a>> {
        let mut eng = Engine::new_with_overlay(file, overlay, self.engine_options())?;
        self.setup(&mut eng)?;
        Ok(eng)
    }
}

impl Loaded {
    /// The model file.
    pub fn file(&self) -> &ModelFile {
        &self.file
    }

    /// The re-quantized layer matrices, when `requant` asked for them.
    pub fn overlay(&self) -> Option<&Overlay> {
        self.overlay.as_ref()
    }

    /// The options, the plan applied.
    pub fn options(&self) -> &EngineBuilder {
        &self.options
    }

    /// The plan applied, if any (`plan`, or the one made for a memory budget).
    pub fn plan(&self) -> Option<&Plan> {
        self.plan.as_ref()
    }

    /// The engine, its FFN set up.
    pub fn engine(&self) -> Result<Engine<'_>> {
        self.options.engine(&self.file, self.overlay.as_ref())
    }

    /// The engine as the file holds it: its FFN left dense in memory (for profiling and
    /// planning), whatever the options ask.
    pub fn start(&self) -> Result<Engine<'_>> {
        Engine::new_with_overlay(
            &self.file,
            self.overlay.as_ref(),
            self.options.engine_options(),
        )
    }
}

pub(crate) fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}
