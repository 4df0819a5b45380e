//! `sparrow perplexity`: perplexity of a model on a text file.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

use crate::args::ModelArgs;
use crate::builtin::{TextSource, EVAL};
use crate::load::builder;
use crate::ui::{bar, precision_name};

#[derive(Args)]
pub struct PplArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The text file to score [default: a built-in evaluation text, 34 KB of Shakespeare].
    #[arg(long, short = 'f')]
    pub file: Option<PathBuf>,
    /// Tokens per window.
    #[arg(long, default_value_t = 512)]
    pub window: usize,
    /// Number of windows (from the start of the file).
    #[arg(long, default_value_t = 16)]
    pub windows: usize,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Runs the subcommand and prints its result.
pub fn run(a: PplArgs) -> Result<()> {
    // The text first: a bad file is refused before the model is loaded (and before the engine's
    // notes on stderr), in one line.
    let src = TextSource::or_builtin(a.file.as_deref(), &EVAL);
    let text = src.read()?;
    let loaded = engine::EngineBuilder {
        prompts_only: true,
        ..builder(&a.model, a.json)
    }
    .open()?;
    let (file, overlay) = (loaded.file(), loaded.overlay());
    let eng = loaded.engine()?;
    let tokens = eng.tokenizer().encode(&text, false)?;
    let bar = bar(a.windows as u64, "windows");
    let r = eng.perplexity(&tokens, a.window, a.windows, |done, _| {
        bar.set_position(done as u64)
    })?;
    bar.finish_and_clear();
    if a.json {
        let mut v = serde_json::to_value(&r)?;
        v["model"] = serde_json::json!(file.path());
        v["file"] = serde_json::json!(src.name());
        v["precision"] = serde_json::json!(precision_name(eng.options().precision));
        v["sparse"] = serde_json::json!(eng.sparse().is_some());
        v["requant"] = serde_json::json!(overlay.map(|o| o.requant().to_string()));
        v["requant_bits_per_weight"] = serde_json::json!(overlay.map(|o| o.bits_per_weight()));
        println!("{}", serde_json::to_string(&v)?);
    } else {
        println!(
            "perplexity {:.4} (mean NLL {:.6}) over {} windows of {} tokens of {} ({} tokens in file), {:.1} tok/s, {} mode{}",
            r.ppl,
            r.mean_nll,
            r.windows,
            r.window,
            src.name(),
            r.tokens_in_text,
            r.tokens_per_s,
            precision_name(eng.options().precision),
            overlay.map(|o| format!(", layers re-quantized to {}", o.requant())).unwrap_or_default()
                + if eng.sparse().is_some() { ", sparse FFN" } else { "" }
        );
    }
    Ok(())
}
