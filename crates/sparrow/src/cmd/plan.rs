//! `sparrow plan`: the planner's configuration for a model on this device under a memory budget,
//! printed in words and saved for `--plan`.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use engine::Solver;

use crate::args::ModelArgs;
use crate::builtin::{TextSource, CODE_EDIT};
use crate::load::builder;

/// Which solver `sparrow plan` uses.
#[derive(Clone, Copy, ValueEnum)]
pub enum SolverArg {
    /// Exhaustive over the discrete settings, memory by benefit per byte (always available).
    Search,
    /// Z3's optimizer (exact; needs a build with `--features z3`).
    Z3,
}

#[derive(Args)]
pub struct PlanArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The device profile (`sparrow calibrate`) [default: the one in the model cache folder].
    #[arg(long)]
    pub device: Option<PathBuf>,
    /// The solver.
    #[arg(long, value_enum, default_value = "search")]
    pub solver: SolverArg,
    /// Refuse plans slower than this many tokens per second.
    #[arg(long, value_parser = crate::parse::positive_f64)]
    pub min_tok_s: Option<f64>,
    /// Where to save the plan (default: `<model>.sparrow-plan`).
    #[arg(long, short = 'o')]
    pub output: Option<PathBuf>,
    /// Print the plan as JSON on stdout instead of words.
    #[arg(long)]
    pub json: bool,
    /// Measure the share of drafted tokens prompt lookup keeps on these prompts (one JSON object
    /// `{"prompt": "..."}` a line, as `bench --prompts` takes; without a file: the 8 built-in
    /// code-editing prompts), generating each greedily up to --measure-tokens tokens with up to 8
    /// drafted a step, and plan speculation with it instead of the default rate. (A self-draft's
    /// rate depends on the cache the plan sizes: its default stands.)
    #[arg(long, value_name = "PROMPTS", num_args = 0..=1)]
    pub measure_speculation: Option<Option<PathBuf>>,
    /// With --measure-speculation: most tokens generated per prompt.
    #[arg(long, value_name = "N", default_value_t = 64, value_parser = crate::parse::some_tokens, requires = "measure_speculation")]
    pub measure_tokens: usize,
}

/// Drafted tokens a step while measuring lookup's acceptance.
const MEASURE_DRAFT: usize = 8;

/// Prompt lookup's share of drafts kept on the prompts of `--measure-speculation`, printed.
fn measure_lookup(a: &PlanArgs, eng: &engine::Engine<'_>) -> Result<Option<f64>> {
    let Some(file) = &a.measure_speculation else {
        return Ok(None);
    };
    let src = TextSource::or_builtin(file.as_deref(), &CODE_EDIT);
    let all = crate::cmd::bench_lookup::prompts(eng, &src)?;
    // Each generation must fit the context, with a verification step's drafts beyond it.
    let room = eng.options().context;
    let fits = |p: &Vec<u32>| p.len() + a.measure_tokens + MEASURE_DRAFT < room;
    let set: Vec<Vec<u32>> = all.iter().filter(|p| fits(p)).cloned().collect();
    if set.is_empty() {
        anyhow::bail!(
            "{}: no prompt and {} tokens fit the context of {room} positions (raise --ctx or lower --measure-tokens)",
            src.name(),
            a.measure_tokens
        );
    }
    let req = engine::GenerateRequest {
        max_tokens: a.measure_tokens,
        ..Default::default()
    };
    let s = engine::bench_spec::lookup_acceptance(eng, &set, &req, MEASURE_DRAFT)
        .with_context(|| format!("measuring prompt lookup on {}", src.name()))?;
    eprintln!(
        "sparrow: prompt lookup on {} ({} of {} prompts fit the context): {:.0}% of {} drafted tokens kept, {:.2} tokens per verification step",
        src.name(),
        set.len(),
        all.len(),
        100.0 * s.acceptance_rate(),
        s.drafted,
        s.tokens_per_step()
    );
    Ok(Some(s.acceptance_rate()))
}

/// Runs the subcommand and prints its result.
pub fn run(a: PlanArgs) -> Result<()> {
    let device_path = a.device.clone().unwrap_or_else(engine::default_device_path);
    if !device_path.exists() {
        anyhow::bail!(
            "{}: no device profile; run `sparrow calibrate` first (or give one with --device)",
            device_path.display()
        );
    }
    let b = builder(&a.model, a.json);
    let file = engine::ModelFile::open(b.model_path()?)?;
    let out = a
        .output
        .clone()
        .unwrap_or_else(|| engine::bundle::sidecar(file.path(), ".sparrow-plan"));
    let mut inputs = crate::load::model_inputs(&a.model, file.path());
    inputs.push(device_path.clone());
    inputs.extend(a.measure_speculation.clone().flatten());
    engine::outputs::guard(&[(&out, engine::outputs::OutputKind::Plan)], &inputs)?;
    let mut eng = engine::Engine::new(&file, b.engine_options())?;
    eng.set_output_proxy(!a.model.offload.full_output);
    let solver = match a.solver {
        SolverArg::Search => Solver::Search,
        SolverArg::Z3 => Solver::Z3,
    };
    let planning = || format!("planning {}", file.path().display());
    // The memory is read before the measurement's generations grow the process.
    let plan_in = b.plan_inputs(&eng, &device_path).with_context(planning)?;
    let b = engine::EngineBuilder {
        spec_acceptance: engine::SpecAcceptance {
            lookup: measure_lookup(&a, &eng)?,
            self_draft: None,
        },
        ..b
    };
    let plan = b
        .plan_with(&eng, &plan_in, a.min_tok_s, solver)
        .with_context(planning)?;
    plan.save(&out)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&plan)?);
    } else {
        print!("{}", plan.describe());
    }
    eprintln!(
        "sparrow: plan saved to {} (use it with --plan)",
        out.display()
    );
    Ok(())
}
