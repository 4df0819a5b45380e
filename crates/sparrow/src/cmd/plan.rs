//! `sparrow plan`: the planner's configuration for a model on this device under a memory budget,
//! printed in words and saved for `--plan`.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use engine::Solver;

use crate::args::ModelArgs;
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
    /// Where to save the plan [default: `<model>.sparrow-plan`].
    #[arg(long, short = 'o')]
    pub output: Option<PathBuf>,
    /// Print the plan as JSON on stdout instead of words.
    #[arg(long)]
    pub json: bool,
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
    engine::outputs::guard(&[(&out, engine::outputs::OutputKind::Plan)], &inputs)?;
    let mut eng = engine::Engine::new(&file, b.engine_options())?;
    eng.set_output_proxy(!a.model.offload.full_output);
    let solver = match a.solver {
        SolverArg::Search => Solver::Search,
        SolverArg::Z3 => Solver::Z3,
    };
    let plan = b
        .make_plan(&eng, &device_path, a.min_tok_s, solver)
        .with_context(|| format!("planning {}", file.path().display()))?;
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
