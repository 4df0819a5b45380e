//! From the flags to the engine's builder ([`engine::EngineBuilder`], which opens the model, applies
//! a plan, sizes the budget and sets up the FFN), with its lines printed on stderr; and what the
//! commands print or check around it: the inputs an output must not replace, a resident file refused,
//! a corpus read, an accelerator's failure.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use engine::{Engine, EngineBuilder, Level, Precision};

use crate::args::{CorpusArgs, LoadArgs, ModelArgs};

/// The builder of `args` (the model and how it is computed), its lines on stderr (`quiet`: the
/// warnings only).
pub fn load_builder(args: &LoadArgs, quiet: bool) -> EngineBuilder {
    EngineBuilder {
        model: args.model.clone(),
        threads: args.threads,
        precision: if args.exact {
            Precision::Exact
        } else if args.int8 {
            Precision::Int8
        } else if args.ggml {
            Precision::Ggml
        } else {
            Precision::Fast
        },
        chunk_rows: args.chunk_rows,
        context: args.ctx,
        requant: args.requant,
        cache_type: args.cache_type,
        ..Default::default()
    }
    .log(printer(quiet))
}

/// Prints the builder's lines on stderr (`quiet`: the warnings only).
fn printer(quiet: bool) -> impl Fn(Level, &str) + Send + Sync + 'static {
    move |level, line| {
        if level == Level::Warning || !quiet {
            eprintln!("sparrow: {line}");
        }
    }
}

/// The builder of `args`: [`load_builder`] with sparse decode, the plan, the accelerator and the
/// memory budget.
pub fn builder(args: &ModelArgs, quiet: bool) -> EngineBuilder {
    EngineBuilder {
        sparse: args.sparse,
        sidecars: args.sidecars(),
        plan: args.plan.clone(),
        accel: args.accel.clone(),
        accel_hot: args.accel_hot,
        budget: args.offload.budget(),
        offload: args.offload.options(),
        full_output: args.offload.full_output,
        ..load_builder(args, quiet)
    }
}

/// The file behind `--model`: a path as given; a known model's name (`sparrow models`), fetched into
/// the cache if absent; none: the default model.
pub fn model_path(model: Option<&Path>, quiet: bool) -> Result<PathBuf> {
    let b = EngineBuilder {
        model: model.map(Path::to_path_buf),
        ..Default::default()
    };
    Ok(b.log(printer(quiet)).model_path()?)
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
