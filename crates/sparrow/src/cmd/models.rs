//! `sparrow models`: the models `--model NAME` fetches, their sizes and licences, and whether each is
//! in the cache.

use anyhow::Result;
use clap::Args;
use engine::fetch::{model_cache_dir, KNOWN_MODELS};

#[derive(Args)]
pub struct ModelsArgs {
    /// Print one JSON array instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Runs the subcommand and prints its result.
pub fn run(a: ModelsArgs) -> Result<()> {
    if a.json {
        let list: Vec<serde_json::Value> = KNOWN_MODELS
            .iter()
            .map(|m| {
                serde_json::json!({
                    "name": m.name,
                    "description": m.description,
                    "bytes": m.bytes,
                    "licence": m.licence,
                    "cached": m.is_cached(),
                    "path": m.path(),
                    "packages": m.parts.iter().map(|p| p.package).collect::<Vec<_>>(),
                })
            })
            .collect();
        println!("{}", serde_json::Value::Array(list));
        return Ok(());
    }
    println!(
        "{:<20} {:>8}  {:<10} {:<7} description",
        "name", "size", "licence", "cached"
    );
    for (i, m) in KNOWN_MODELS.iter().enumerate() {
        println!(
            "{:<20} {:>5.0} MB  {:<10} {:<7} {}{}",
            m.name,
            m.bytes as f64 / 1e6,
            m.licence,
            if m.is_cached() { "yes" } else { "no" },
            m.description,
            if i == 0 { " (default)" } else { "" }
        );
    }
    println!("cache: {}", model_cache_dir().display());
    Ok(())
}
