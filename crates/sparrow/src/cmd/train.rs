//! `sparrow train-predictor`: train the per-layer neuron predictors from the model's profile.

use std::path::PathBuf;
use std::sync::atomic::Ordering;

use anyhow::{bail, Context, Result};
use clap::Args;
use engine::ModelBundle;

use crate::args::{CorpusArgs, LoadArgs};
use crate::load::{load_builder, read_corpus};
use crate::ui::{bar, mib, stop_flag};

#[derive(Args)]
pub struct TrainArgs {
    #[command(flatten)]
    pub model: LoadArgs,
    /// The model's profile (default: `<model>.sparrow-profile`; `sparrow profile` writes it).
    #[arg(long)]
    pub profile: Option<PathBuf>,
    #[command(flatten)]
    pub corpus: CorpusArgs,
    /// Windows of training samples (every token of each window is one sample per layer).
    #[arg(long, default_value_t = 32)]
    pub windows: usize,
    /// Recall each layer's predictor must reach on held-out samples. Misses compound over the
    /// layers: on SmolLM2, 0.95 cost +11.6% test perplexity and 0.99 +2.5% (docs/BENCHMARKS.md).
    #[arg(long, default_value_t = 0.99, value_parser = crate::parse::unit_f32)]
    pub recall: f32,
    /// Training seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Epochs per candidate hidden size.
    #[arg(long, default_value_t = 8)]
    pub epochs: usize,
    /// Largest predictor size per layer, as a share of that layer's FFN bytes (PowerInfer keeps
    /// predictors small next to the weights they save; larger hidden sizes are not tried).
    #[arg(long, default_value_t = 0.10, value_parser = crate::parse::share)]
    pub max_share: f64,
    /// Output file (default: `<model>.sparrow-predictor`).
    #[arg(long, short = 'o')]
    pub out: Option<PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Runs the subcommand and prints its result.
pub fn run(a: TrainArgs) -> Result<()> {
    let loaded = load_builder(&a.model, a.json).open()?;
    let eng = loaded.start()?;
    let bundle = ModelBundle::new(eng.model().path());
    let profile_path = bundle.profile_or(a.profile.as_deref());
    let out = a.out.clone().unwrap_or_else(|| bundle.predictor());
    let mut inputs = vec![eng.model().path().to_path_buf()];
    inputs.push(profile_path.clone());
    inputs.extend(a.corpus.corpus.clone());
    engine::outputs::guard(&[(&out, engine::outputs::OutputKind::Predictor)], &inputs)?;
    crate::load::refuse_resident(&eng, "train-predictor")?;
    let profile = engine::Profile::load(&profile_path).with_context(|| {
        "train-predictor needs the model's profile: run `sparrow profile` first".to_string()
    })?;
    let sp = engine::profile::sparse_from_profile(&eng, &profile, &profile_path)?;
    let tokens = read_corpus(&eng, &a.corpus)?;
    let stop = stop_flag()?;
    let b = bar(a.windows as u64, "windows of samples");
    let data = engine::profile::collect_datasets(
        &eng,
        &sp,
        &tokens,
        a.corpus.window,
        a.windows,
        &stop,
        |d, _| b.set_position(d as u64),
    )?;
    b.finish_and_clear();
    if stop.load(Ordering::Relaxed) {
        bail!("interrupted: nothing written");
    }
    if a.max_share.is_nan() || a.max_share <= 0.0 {
        bail!("--max-share must be > 0 (got {})", a.max_share);
    }
    let ffn_bytes = engine::budget::ffn_weight_bytes(eng.model());
    let max_bytes =
        engine::budget::predictor_max_bytes(ffn_bytes, eng.model().layers.len(), a.max_share);
    let cfg = engine::TrainConfig {
        seed: a.seed,
        target_recall: a.recall,
        epochs: a.epochs,
        max_bytes,
        ..Default::default()
    };
    let b = bar(data.len() as u64, "layers trained");
    let (set, reports) = engine::profile::train_predictors(&eng, &data, &cfg, |_, _| b.inc(1))?;
    b.finish_and_clear();
    if stop.load(Ordering::Relaxed) {
        bail!("interrupted: nothing written");
    }
    set.save(&out)?;
    let total: usize = reports.iter().map(|r| r.bytes).sum();
    let min_recall = reports
        .iter()
        .map(|r| r.recall)
        .fold(f32::INFINITY, f32::min);
    if a.json {
        let v = serde_json::json!({"predictor": out, "samples_per_layer": data.first().map(|d| d.len()), "total_bytes": total, "ffn_bytes": ffn_bytes,
            "layers": reports.iter().enumerate().map(|(l, r)| serde_json::json!({"layer": l, "hidden": r.hidden, "recall": r.recall, "precision": r.precision,
                "predicted_frac": r.predicted_frac, "true_frac": r.true_frac, "bytes": r.bytes})).collect::<Vec<_>>()});
        println!("{}", serde_json::to_string(&v)?);
        return Ok(());
    }
    println!("layer  hidden  recall  precision  predicted  active  bytes  (held-out samples)");
    for (l, r) in reports.iter().enumerate() {
        println!(
            "{l:>5}  {:>6}  {:>6.3}  {:>9.3}  {:>9.3}  {:>6.3}  {:>6}",
            r.hidden, r.recall, r.precision, r.predicted_frac, r.true_frac, r.bytes
        );
    }
    println!(
        "predictors: {:.2} MiB = {:.1}% of the FFN's {:.1} MiB; lowest held-out recall {:.3} -> {}",
        mib(total as u64),
        100.0 * total as f64 / ffn_bytes as f64,
        mib(ffn_bytes as u64),
        min_recall,
        out.display()
    );
    Ok(())
}
