//! Turning [`ModelArgs`] into a running engine: open (or fetch) the model, re-quantize it, the engine's
//! options, sparse decode from the model's sidecars; and reading a corpus.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use engine::{Engine, EngineOptions, ModelFile, Overlay, Precision, SparsePlan};

use crate::args::{CorpusArgs, LoadArgs, ModelArgs};
use crate::ui::mib;

/// The model `--model` names, or the default model (fetched if absent; `quiet` hides the messages).
pub fn open_model(args: &LoadArgs, quiet: bool) -> Result<ModelFile> {
    Ok(ModelFile::open(model_path(args.model.as_deref(), quiet)?)?)
}

/// What a command given `args` reads besides its own inputs, for the output guard
/// (`engine::outputs::guard`, which adds a resident file's bundle): the model at `model`, its
/// profile and predictors when they exist (read under `--sparse`), and the `--profile`,
/// `--predictor` and `--plan` given.
pub fn model_inputs(args: &ModelArgs, model: &Path) -> Vec<PathBuf> {
    let mut v = vec![model.to_path_buf()];
    let b = engine::ModelBundle::new(model);
    v.extend(
        [b.profile(), b.predictor()]
            .into_iter()
            .filter(|p| p.exists()),
    );
    v.extend(args.profile.clone());
    v.extend(args.predictor.clone());
    v.extend(args.plan.clone());
    v
}

/// Refuses a resident file (`sparrow convert`'s output) for a command that needs the model's own FFN
/// weights (`what`: "profile", "train-predictor"): its FFN is in the store, so the command would read
/// empty matrices. The error names the file and says what to run instead.
pub fn refuse_resident(eng: &Engine<'_>, what: &str) -> Result<()> {
    if eng.model().config.ffn_store.is_some() {
        anyhow::bail!(
            "{}: a resident file (sparrow convert's output, its FFN in a neuron store) cannot be given to `sparrow {what}`: run it on the original model, then `sparrow convert` again to carry the result into the bundle",
            eng.model().path().display()
        );
    }
    Ok(())
}

/// The file behind `--model`: a path as given; a known model's name (`sparrow models`), fetched into
/// the cache if absent; none: the default model.
pub fn model_path(model: Option<&Path>, quiet: bool) -> Result<PathBuf> {
    let log = |line: &str| {
        if !quiet {
            eprintln!("sparrow: {line}");
        }
    };
    let Some(p) = model else {
        return Ok(engine::fetch::ensure_default_model(log)?);
    };
    if !p.exists() {
        if let Some(known) = p.to_str().and_then(engine::fetch::known_model) {
            return Ok(engine::fetch::ensure_model(known, log)?);
        }
    }
    Ok(p.to_path_buf())
}

/// The load-time re-quantization `--requant` asks for (built before the engine, which borrows it).
pub fn build_overlay(file: &ModelFile, args: &LoadArgs, quiet: bool) -> Result<Option<Overlay>> {
    let Some(r) = args.requant else {
        return Ok(None);
    };
    let t = Instant::now();
    let o = Overlay::build(file, r)
        .with_context(|| format!("re-quantizing {} to {r}", file.path().display()))?;
    if !quiet {
        eprintln!(
            "sparrow: re-quantized {} layer matrices to {r} in {:.1} s: {:.1} MiB, {:.3} bits per weight",
            o.len(),
            t.elapsed().as_secs_f64(),
            mib(o.bytes() as u64),
            o.bits_per_weight()
        );
    }
    Ok(Some(o))
}

/// Applies `--plan` to `args` (checked against the model in `file` and this machine): the plan's
/// threads, chunk rows, dense or sparse, neuron-cache size and whether the embedding and output
/// stay on flash, I/O core and queue depth, each only
/// where the user gave no flag of their own. Without `--plan`, a `--memory-budget` over a model that
/// runs sparse is planned on the spot from this device's profile (`sparrow calibrate`), when there is
/// one. Returns the plan, to print its predictions beside the measured figures.
pub fn apply_plan(
    file: &ModelFile,
    args: &mut ModelArgs,
    quiet: bool,
) -> Result<Option<engine::planner::Plan>> {
    if args.plan.is_none() && args.offload.memory_budget.is_none() {
        return Ok(None);
    }
    let model = engine::Model::load(file)?;
    let resident = model.config.ffn_store.is_some();
    let (plan, s) = match args.plan.clone() {
        Some(path) => {
            let (plan, s) = engine::load_plan(&path, &model, Some(engine::device_fingerprint().1))?;
            if !quiet {
                eprint!("sparrow: {}: {}", path.display(), plan.describe());
            }
            (plan, s)
        }
        None => {
            drop(model);
            match auto_plan(file, args, resident, quiet)? {
                Some(plan) => {
                    let s = engine::PlanSettings::of(&plan);
                    (plan, s)
                }
                None => return Ok(None),
            }
        }
    };
    if args.threads == 0 {
        args.threads = s.threads;
    }
    if args.chunk_rows == 0 {
        args.chunk_rows = s.chunk_rows;
    }
    if !resident && s.sparse {
        // Sparse needs the model's activation profile: a plan made without one (every neuron
        // counted as firing) can still come out sparse when the measured rates are close.
        let profile = engine::ModelBundle::new(file.path()).profile_or(args.profile.as_deref());
        if profile.is_file() {
            // The plan's dense layers, unless the user asked for a sparse FFN (every layer).
            if !args.sparse {
                args.dense_layers = s.dense_layers.clone();
                args.dense_batches = s.dense_batches.clone();
            }
            args.sparse = true;
        } else if !quiet {
            eprintln!(
                "sparrow: note: the plan runs the FFN sparse, but {} does not exist: dense",
                profile.display()
            );
        }
    }
    let o = &mut args.offload;
    if resident && o.memory_budget.is_none() && o.ffn_resident.is_none() {
        o.ffn_cache_bytes = Some(s.ffn_cache_bytes);
    }
    if resident && o.ffn_resident.is_none() {
        // Under a budget too: the plan weighed the embedding and output against the neuron cache
        // by time saved per byte, where the engine's own rule always gives the cache first.
        o.stream_weights = Some(s.stream_weights);
    }
    if o.io_core.is_none() {
        o.io_core = s.io_core;
    }
    if o.io_depth == crate::args::DEFAULT_IO_DEPTH {
        o.io_depth = s.queue_depth;
    }
    if let (Some(h), Some(kind), None) = (&plan.hybrid, &args.accel, args.accel_hot) {
        if h.accelerator == kind.name() {
            args.planned_split = Some(h.counts.clone());
        }
    }
    Ok(Some(plan))
}

/// The plan for `--memory-budget` without `--plan`: made with the search solver from the device
/// profile in the model cache folder, over a resident file or a model run `--sparse`. `None` (with a
/// note) when there is no device profile or no plan can be made (the engine's own budget split then
/// applies, as without a profile), and when nothing is to be planned.
fn auto_plan(
    file: &ModelFile,
    args: &ModelArgs,
    resident: bool,
    quiet: bool,
) -> Result<Option<engine::planner::Plan>> {
    let Some(budget) = args.offload.memory_budget else {
        return Ok(None);
    };
    if !resident && !args.sparse {
        return Ok(None);
    }
    let device_path = engine::default_device_path();
    if !device_path.is_file() {
        if !quiet {
            eprintln!(
                "sparrow: note: no device profile at {}: the default settings serve --memory-budget (run `sparrow calibrate` once for a planned configuration)",
                device_path.display()
            );
        }
        return Ok(None);
    }
    let planned = || -> Result<engine::planner::Plan> {
        let device = engine::planner::DeviceProfile::load(&device_path)?;
        let mut eng = Engine::new(file, engine_options(args))?;
        eng.set_output_proxy(!args.offload.full_output);
        let summary = engine::model_summary(&eng, &args.sidecars())?;
        let c = constraints(&eng, args, None);
        Ok(engine::planner::make_plan(
            &device,
            &summary,
            &c,
            engine::planner::Solver::Search,
        )?)
    };
    // The user asked for a budget, not for a plan: a plan that cannot be made leaves the defaults.
    match planned() {
        Ok(plan) => {
            if !quiet {
                eprint!(
                    "sparrow: planned with {} (--plan FILE or explicit flags override): {}",
                    device_path.display(),
                    plan.describe()
                );
            }
            Ok(Some(plan))
        }
        Err(e) => {
            if !quiet {
                eprintln!(
                    "sparrow: warning: no plan for --memory-budget {:.1} MiB with {}: {e:#}; using the default settings",
                    mib(budget),
                    device_path.display()
                );
            }
            Ok(None)
        }
    }
}

/// The planner's constraints for `eng` under `args`' memory budget and thread limit.
pub fn constraints(
    eng: &Engine<'_>,
    args: &ModelArgs,
    min_tok_s: Option<f64>,
) -> engine::planner::Constraints {
    let context = eng.options().context as u32;
    let store = eng.model().config.ffn_store.is_some();
    engine::planner::Constraints {
        memory_budget: args.offload.memory_budget,
        context,
        attended: context.min(512),
        min_tok_s,
        max_threads: (args.threads > 0).then_some(args.threads as u32),
        // The plan splits hybrid decode in memory (`--sparse`) and over a neuron store (within
        // the neuron cache, which gives the block its memory: `store_accel`).
        accelerator: args
            .accel
            .as_ref()
            .filter(|_| args.sparse || store)
            .map(|k| k.name().to_string()),
        accel_neuron_bytes: match (&args.accel, store) {
            (Some(kind), true) => engine::accel_neuron_bytes(eng, kind).ok().flatten(),
            _ => None,
        },
    }
}

/// The context when `--ctx` is not given (the engine caps it at the model's training context).
const DEFAULT_CTX: usize = 4096;

/// The engine options of `args` (and the kernels' process-wide `--chunk-rows`).
pub fn engine_options(args: &LoadArgs) -> EngineOptions {
    // The kernels' work-item size is process-wide.
    engine::set_chunk_rows(args.chunk_rows);
    EngineOptions {
        threads: capped_threads(args.threads),
        precision: if args.exact {
            Precision::Exact
        } else if args.int8 {
            Precision::Int8
        } else {
            Precision::Fast
        },
        context: args.ctx.unwrap_or(DEFAULT_CTX),
        cache_type: args.cache_type,
    }
}

/// `--threads`, capped at the cores this process may use (more threads than cores only wait on each
/// other), with a warning once.
fn capped_threads(asked: usize) -> usize {
    static WARN: std::sync::Once = std::sync::Once::new();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if asked <= cores {
        return asked;
    }
    WARN.call_once(|| {
        eprintln!("sparrow: warning: --threads {asked} is more than the {cores} cores here; using {cores}")
    });
    cores
}

/// Warnings about flags that the loaded model makes moot: a `--ctx` past its training context (the
/// engine caps it) and offload flags for a model that runs neither sparse nor from a store.
fn warn_moot_flags(eng: &Engine<'_>, args: &ModelArgs) {
    let cfg = &eng.model().config;
    if let Some(ctx) = args.ctx.filter(|&c| c > cfg.context_length) {
        eprintln!(
            "sparrow: warning: --ctx {ctx} is past the model's training context of {} tokens; using {}",
            cfg.context_length, cfg.context_length
        );
    }
    if !args.sparse && cfg.ffn_store.is_none() {
        let o = &args.offload;
        for (given, flag) in [
            (o.memory_budget.is_some(), "--memory-budget"),
            (o.ffn_resident.is_some(), "--ffn-resident"),
        ] {
            if given {
                eprintln!("sparrow: warning: {flag} applies to a resident file (`sparrow convert`) or with --sparse; ignored for this dense model");
            }
        }
    }
}

/// Applies `--sparse` (profile thresholds, predictors) to the engine; a resident file (`sparrow
/// convert`) is always sparse, over its neuron store.
pub fn setup_sparse(eng: &mut Engine<'_>, args: &ModelArgs, quiet: bool) -> Result<()> {
    if !quiet {
        warn_moot_flags(eng, args);
    }
    let offloaded = eng.model().config.ffn_store.is_some();
    if let (Some(kind), false, false) = (&args.accel, args.sparse, offloaded) {
        setup_accel(eng, kind, quiet);
    }
    if !args.sparse && !offloaded {
        return Ok(());
    }
    let plan = SparsePlan::new(
        eng,
        &args.sidecars(),
        args.offload.budget(),
        args.offload.options(),
    )?;
    if let (Some(engine::manifest::ManifestStatus::Missing(m)), false) = (&plan.manifest, quiet) {
        eprintln!("sparrow: warning: {} is missing: this bundle's parts are not checked (converted by an older sparrow; `sparrow convert` again writes one)", m.display());
    }
    if let (Some(s), false) = (&plan.budget, quiet) {
        eprintln!("sparrow: memory budget {:.1} MiB = {:.1} MiB resident (process, file, KV cache, predictors, reads ahead) + {:.1} MiB FFN cache ({:.0}% of the {:.1} MiB FFN){}", mib(s.budget), mib(s.resident), mib(s.cache()), s.cached_percent(), mib(s.ffn),
            if plan.stream_weights { format!("; the embedding and output projection ({:.1} MiB) stay on flash", mib(eng.model().streamed_bytes())) } else { String::new() });
    }
    eng.set_streamed(plan.stream_weights);
    eng.set_output_proxy(!args.offload.full_output);
    let mut sp = plan.build(eng)?;
    // A plan's dense layers and batch sizes (in memory, without an accelerator: hybrid decode
    // splits every layer).
    if args.accel.is_none() && sp.offload().is_none() {
        if args.dense_layers.iter().any(|&d| d) {
            sp = sp.with_dense_layers(args.dense_layers.clone())?;
        }
        sp = sp.with_dense_batches(args.dense_batches.clone())?;
    }
    if !quiet {
        eprintln!(
            "sparrow: sparse FFN from {} (profiled on {}, {:?} score{}){}{}",
            plan.profile_path.display(),
            plan.profile.corpus,
            plan.profile.score,
            match &plan.predictor {
                Some(p) => format!(", predictors from {}", p.display()),
                None => ", no predictor".into(),
            },
            match (0..eng.model().config.n_layers)
                .filter(|&l| sp.is_dense(l))
                .count()
            {
                0 => String::new(),
                n => format!(
                    "; {n} of {} layers dense, as planned",
                    eng.model().config.n_layers
                ),
            },
            match (2..=64).find(|&n| sp.dense_batch(n)) {
                Some(n) => format!("; decode steps of {n} sequences or more dense, as planned"),
                None => String::new(),
            }
        );
    }
    // An offloaded model's FFN is on flash: the accelerator takes the prompt steps' layers as they
    // are streamed (NPU-centric prefill) and each layer's hottest units in decode.
    if let (Some(kind), true) = (&args.accel, sp.offload().is_some()) {
        return crate::store_accel::setup(eng, sp, kind, args, quiet);
    }
    // Without a plan's split or `--accel-hot`, the planner's split for this device.
    let (planned_split, planned_source) = match (&args.planned_split, &args.accel, args.accel_hot) {
        (Some(c), _, _) => (Some(c.clone()), "planned".to_string()),
        (None, Some(kind), None) => match device_split(eng, args, kind) {
            Ok(Some(c)) => (
                Some(c),
                format!("planned for {}", engine::default_device_path().display()),
            ),
            Ok(None) => (None, String::new()),
            Err(e) => {
                if !quiet {
                    eprintln!("sparrow: note: no planned hybrid split ({e:#}); the profile's 10% share serves");
                }
                (None, String::new())
            }
        },
        _ => (None, String::new()),
    };
    // A plan that puts no neuron on the accelerator at any batch size: sparse on the CPU alone.
    let nothing_planned = planned_split
        .as_ref()
        .is_some_and(|c| c.iter().all(|c| c[3] == 0));
    if let (true, false) = (nothing_planned, quiet) {
        eprintln!("sparrow: the plan puts no neuron on the accelerator: sparse on the CPU alone");
    }
    let nothing_planned = nothing_planned || args.accel_hot == Some(0.0);
    if let (Some(kind), false) = (&args.accel, nothing_planned) {
        // Hybrid decode: each layer's hot neurons on the accelerator, the rest sparse here; more
        // of them for larger batches (from the plan, else from the profile's batch frequencies).
        let (split, source) = match &planned_split {
            Some(counts) => (
                engine::HotSplit::planned(&plan.profile, counts)?,
                planned_source.as_str(),
            ),
            None => (
                engine::HotSplit::from_profile(&plan.profile, args.accel_hot.unwrap_or(0.1)),
                "from the profile",
            ),
        };
        match eng.install(|| engine::HybridFfn::open_blocks(kind, eng.model(), &split)) {
            Ok(accel) => {
                let h = engine::HybridFfn::new(sp, accel, eng.model(), &split)?;
                if !quiet {
                    let d_ff = (eng.model().config.d_ff * split.counts.len()).max(1) as f64;
                    let share = |b: usize| {
                        split.counts.iter().map(|c| c[b]).sum::<usize>() as f64 / d_ff * 100.0
                    };
                    eprintln!(
                        "sparrow: hybrid decode: the hottest {:.0}% of each layer's neurons on the {} accelerator at batch size 1 ({:.0}% at 2, {:.0}% at 4, {:.0}% at 8 or more, {source}), the rest sparse on the CPU",
                        share(0),
                        h.accelerator().name(),
                        share(1),
                        share(2),
                        share(3)
                    );
                }
                eng.set_hybrid(Some(h));
                return Ok(());
            }
            Err(e) => eprintln!("sparrow: warning: {e}; sparse on the CPU alone"),
        }
    }
    eng.set_sparse(Some(sp));
    Ok(())
}

/// Hybrid decode's split in memory when neither a plan nor `--accel-hot` gives one: the planner's
/// (`planner::hybrid_split`: per layer and batch size, the block on `kind` that minimizes the FFN
/// step against the CPU's sparse work) from the device profile in the model cache folder. `None`
/// without a device profile (the profile's 10% share then serves).
fn device_split(
    eng: &Engine<'_>,
    args: &ModelArgs,
    kind: &engine::AccelKind,
) -> Result<Option<Vec<[u32; 4]>>> {
    let path = engine::default_device_path();
    if !path.is_file() {
        return Ok(None);
    }
    let device = engine::planner::DeviceProfile::load(&path)?;
    let summary = engine::model_summary(eng, &args.sidecars())?;
    let threads = eng.options().threads.max(1) as u32;
    let split = engine::planner::hybrid_split(&device, &summary, kind.name(), threads)?;
    Ok(Some(split.counts))
}

/// The corpus of `c` (`--corpus` or the built-in calibration text), tokenized, with a warning if it
/// looks like a test split.
pub fn read_corpus(eng: &Engine<'_>, c: &CorpusArgs) -> Result<Vec<u32>> {
    let src = c.source();
    let text = src
        .read()
        .context("reading the corpus (give another with --corpus)")?;
    // The file's name only: a folder named after tests (a checkout in `/work/tests`, say) says nothing
    // about the split.
    if src
        .file()
        .and_then(|p| p.file_name())
        .is_some_and(|n| n.to_string_lossy().contains("test"))
    {
        eprintln!(
            "sparrow: warning: {} looks like a test split; calibrate on validation data",
            src.name()
        );
    }
    Ok(eng.tokenizer().encode(&text, false)?)
}

/// `--accel KIND`: every layer's FFN on the accelerator; one that cannot be opened is a warning and
/// the engine stays on the CPU.
fn setup_accel(eng: &mut Engine<'_>, kind: &engine::AccelKind, quiet: bool) {
    match eng.install(|| engine::AccelFfn::open(kind, eng.model())) {
        Ok(ffn) => {
            if !quiet {
                eprintln!(
                    "sparrow: FFN on the {} accelerator",
                    ffn.accelerator().name()
                );
            }
            eng.set_accel(Some(ffn));
        }
        Err(e) => eprintln!("sparrow: warning: {e}; running on the CPU"),
    }
}

/// Reports an accelerator that failed during the run (its layers were computed on the CPU).
pub fn report_accel_failure(eng: &Engine<'_>) {
    let failure = eng
        .accel()
        .and_then(|a| a.failure())
        .or_else(|| eng.hybrid().and_then(|h| h.failure()))
        .or_else(|| {
            eng.sparse()
                .and_then(|s| s.offload())
                .and_then(|o| o.prompt_accel_failure())
        });
    if let Some(f) = failure {
        eprintln!("sparrow: warning: the accelerator failed ({f}); the CPU computed the rest");
    }
}
