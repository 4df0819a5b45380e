//! `sparrow`: run LLMs on phone-class hardware from the command line.
//!
//! Subcommands: `run` (generate, streaming, with speed figures), `perplexity` (score a text file),
//! `bench` (prefill/decode speed like llama-bench's pp/tg). `sparrow --help` lists the options.
//!
//! Layout: `args.rs` (argument groups shared by the subcommands), `load.rs` (model, overlay and
//! engine set-up from them), `ui.rs` (progress bars, Ctrl-C, units), and one module per subcommand
//! under `cmd/`. The CLI parses and prints; what it runs and measures is in the `engine` crate.

mod args;
mod builtin;
mod cli_markdown;
mod cmd;
mod load;
mod parse;
#[cfg(test)]
mod path_flags;
mod plot;
mod spec;

mod ui;

use anyhow::Result;
use clap::{CommandFactory, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "sparrow",
    version,
    about = "Run large language models on phone-class hardware"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt, or chat.
    Run(cmd::run::RunArgs),
    /// Perplexity of a model on a text file (non-overlapping windows, each scored on its own).
    Perplexity(cmd::perplexity::PplArgs),
    /// Prefill and decode speed (like llama-bench's pp and tg).
    Bench(cmd::bench::BenchArgs),
    /// Profile FFN activations over a corpus: calibrate sparsity thresholds and record per-neuron
    /// statistics (writes `<model>.sparrow-profile`).
    Profile(cmd::profile::ProfileArgs),
    /// Train the per-layer neuron predictors from a profile (writes `<model>.sparrow-predictor`).
    TrainPredictor(cmd::train::TrainArgs),
    /// Split a model for flash offload: a resident file (everything but the FFN) and a neuron store
    /// (the FFN, one bundle per neuron, hot neurons first), ordered by the model's profile.
    Convert(cmd::convert::ConvertArgs),
    /// Check every part of a converted bundle (resident file, neuron store, profile, predictors)
    /// against its manifest: sizes and hashes, one line per part.
    Verify(cmd::verify::VerifyArgs),
    /// The models `--model NAME` fetches: name, size, licence, and whether each is in the cache.
    Models(cmd::models::ModelsArgs),
    /// Serve the model over HTTP with an OpenAI-compatible API (completions, chat, streaming).
    Serve(cmd::serve::ServeArgs),
    /// Measure this device for the planner (kernels, DRAM, flash; about a minute) and save its profile.
    Calibrate(cmd::calibrate::CalibrateArgs),
    /// Plan a model on this device under a memory budget (threads, dense or sparse, neuron cache,
    /// I/O): print it in words and save it for `--plan`.
    Plan(cmd::plan::PlanArgs),
    /// Print docs/CLI.md: this command line in markdown (`cargo xtask cli-docs` writes it).
    #[command(name = "__cli-markdown", hide = true)]
    CliMarkdown,
}

/// Runs the command; an error prints as one `error: ...` line with its causes (never a backtrace, even
/// with `RUST_BACKTRACE` set) and exits with status 1.
fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match dispatch(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", one_line(&e));
            std::process::ExitCode::FAILURE
        }
    }
}

/// The error and its causes on one line, `: `-separated; a cause whose text its parent already
/// shows (errors that print their source) is not repeated.
fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line.replace('\n', " ")
}

fn dispatch(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Run(a) => cmd::run::run(a),
        Command::Perplexity(a) => cmd::perplexity::run(a),
        Command::Bench(a) => cmd::bench::run(a),
        Command::Profile(a) => cmd::profile::run(a),
        Command::TrainPredictor(a) => cmd::train::run(a),
        Command::Convert(a) => cmd::convert::run(a),
        Command::Verify(a) => cmd::verify::run(a),
        Command::Models(a) => cmd::models::run(a),
        Command::Serve(a) => cmd::serve::run(a),
        Command::Calibrate(a) => cmd::calibrate::run(a),
        Command::Plan(a) => cmd::plan::run(a),
        Command::CliMarkdown => {
            print!("{}", cli_markdown::render(&mut Cli::command()));
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::path_flags::{INPUT_FLAGS, OUTPUT_FLAGS, SCRATCH_FOLDER_FLAGS};

    /// Every flag of every command that takes a path is listed as an input, an output (which the
    /// output guard checks: `tests/it/bundle_misuse.rs` runs each) or a scratch folder: a new path flag fails
    /// here until it is classified, so no output can skip the guard.
    #[test]
    fn every_path_flag_is_classified_and_every_output_flag_exists() {
        use clap::CommandFactory;
        let cli = Cli::command();
        let mut outputs = Vec::new();
        for sub in cli.get_subcommands() {
            for arg in sub.get_arguments() {
                if arg.get_value_parser().type_id() != std::any::TypeId::of::<std::path::PathBuf>()
                {
                    continue;
                }
                let (name, id) = (sub.get_name(), arg.get_id().as_str());
                if OUTPUT_FLAGS.contains(&(name, id)) {
                    outputs.push((name, id));
                } else {
                    assert!(
                        INPUT_FLAGS.contains(&id) || SCRATCH_FOLDER_FLAGS.contains(&id),
                        "`sparrow {name} --{id}` takes a path that path_flags.rs does not classify"
                    );
                }
            }
        }
        outputs.sort();
        let mut listed = OUTPUT_FLAGS.to_vec();
        listed.sort();
        assert_eq!(
            outputs, listed,
            "an output flag listed is not a path flag of its command"
        );
    }
}
