//! `sparrow profile`: profile FFN activations over a corpus, calibrate the sparsity thresholds, and
//! write the model's profile.

use std::path::PathBuf;
use std::sync::atomic::Ordering;

use anyhow::{bail, Result};
use clap::Args;
use engine::{Engine, ModelBundle};

use crate::args::{CorpusArgs, LoadArgs};
use crate::load::{load_builder, read_corpus};
use crate::ui::{bar, stop_flag};

#[derive(Args)]
pub struct ProfileArgs {
    #[command(flatten)]
    pub model: LoadArgs,
    #[command(flatten)]
    pub corpus: CorpusArgs,
    /// Windows profiled (statistics).
    #[arg(long, default_value_t = 24)]
    pub windows: usize,
    /// Windows used to calibrate thresholds (the first ones of the corpus).
    #[arg(long, default_value_t = 8)]
    pub calib_windows: usize,
    /// Target share of inactive neurons per layer.
    #[arg(long, conflicts_with = "ppl_budget", value_parser = crate::parse::unit_f32)]
    pub sparsity: Option<f32>,
    /// Instead of --sparsity: the highest sparsity whose perplexity on held-out validation windows
    /// stays within this relative increase over dense (e.g. 0.03 for +3%).
    #[arg(long, value_parser = crate::parse::share_f32)]
    pub ppl_budget: Option<f32>,
    /// What thresholds apply to: `output` (|act(gate)·up|·‖down_j‖, best quality), `gate`
    /// (|act(gate)|, CATS) or `gate-norm` (|act(gate)|·‖down_j‖).
    #[arg(long, default_value = "output")]
    pub score: String,
    /// Output file (default: `<model>.sparrow-profile`).
    #[arg(long, short = 'o')]
    pub out: Option<PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

/// After Ctrl-C (`stop` set), any error of a stopped step is the interruption: nothing is written.
fn interrupted(stop: &std::sync::atomic::AtomicBool, e: engine::EngineError) -> anyhow::Error {
    if stop.load(Ordering::Relaxed) {
        anyhow::anyhow!("interrupted: nothing written")
    } else {
        e.into()
    }
}

/// Runs the subcommand and prints its result.
pub fn run(a: ProfileArgs) -> Result<()> {
    use engine::sparse::{thresholds_for_sparsity, Score, SparseFfn, DEFAULT_DOWN_FORMAT};
    let loaded = load_builder(&a.model, a.json).open()?;
    let mut eng = loaded.start()?;
    let out = a
        .out
        .clone()
        .unwrap_or_else(|| ModelBundle::new(eng.model().path()).profile());
    let mut inputs = vec![eng.model().path().to_path_buf()];
    inputs.extend(a.corpus.corpus.clone());
    engine::outputs::guard(&[(&out, engine::outputs::OutputKind::Profile)], &inputs)?;
    crate::load::refuse_resident(&eng, "profile")?;
    let tokens = read_corpus(&eng, &a.corpus)?;
    // A window no longer than the context the engine holds (a short-context model's training
    // context is below the default 512).
    let w = a.corpus.window.min(eng.options().context.max(1));
    let score = match a.score.as_str() {
        "output" => Score::OutputNorm,
        "gate" => Score::Gate,
        "gate-norm" => Score::GateNorm,
        s => bail!("--score {s}: expected output, gate or gate-norm"),
    };
    let n_layers = eng.model().config.n_layers;
    let mut base =
        eng.install(|| SparseFfn::new(eng.model(), vec![0.0; n_layers], DEFAULT_DOWN_FORMAT))?;
    // From here on Ctrl-C stops the run before the next window (before, it ends the process at
    // once: nothing has been written).
    let stop = stop_flag()?;
    base.score = score;
    let b = bar(a.calib_windows as u64, "calibration windows");
    let samples = engine::profile::sample_scores_until(
        &eng,
        &base,
        &tokens,
        w,
        a.calib_windows,
        3,
        &stop,
        |d, _| b.set_position(d as u64),
    )
    .map_err(|e| interrupted(&stop, e))?;
    b.finish_and_clear();
    let build = |eng: &Engine<'_>, s: f32| -> Result<SparseFfn> {
        let t = thresholds_for_sparsity(&mut samples.clone(), s)?;
        let mut sp = eng.install(|| SparseFfn::new(eng.model(), t, DEFAULT_DOWN_FORMAT))?;
        sp.score = score;
        Ok(sp)
    };
    let mut curve = Vec::new();
    let sparsity = match (a.sparsity, a.ppl_budget) {
        (Some(s), _) => s,
        (None, budget) => search_sparsity(
            &mut eng,
            &build,
            &tokens[(a.calib_windows * w).min(tokens.len())..],
            w,
            budget.unwrap_or(0.03),
            (&stop, a.json),
            &mut curve,
        )?,
    };
    let sp = build(&eng, sparsity)?;
    let opts = engine::profile::ProfileOptions {
        window: w,
        windows: a.windows,
        batch_sizes: vec![1, 2, 4, 8],
        corpus: a.corpus.source().name(),
    };
    let b = bar(a.windows as u64, "windows profiled");
    let profile = engine::profile::profile_corpus(&eng, &sp, &tokens, &opts, &stop, |d, _| {
        b.set_position(d as u64)
    })?;
    b.finish_and_clear();
    if stop.load(Ordering::Relaxed) {
        bail!("interrupted: nothing written");
    }
    profile.save(&out)?;
    print_profile(
        &profile,
        &out,
        loaded.file().path(),
        &opts.corpus,
        sparsity,
        &curve,
        a.json,
    )
}

/// The largest sparsity (bisection over 0..0.95, six steps) whose perplexity over the held-out
/// windows `held` stays within `budget` of the dense model's; each step is pushed onto `curve` as
/// (sparsity, perplexity, dense perplexity).
fn search_sparsity(
    eng: &mut Engine<'_>,
    build: &dyn Fn(&Engine<'_>, f32) -> Result<engine::sparse::SparseFfn>,
    held: &[u32],
    w: usize,
    budget: f32,
    (stop, json): (&std::sync::Arc<std::sync::atomic::AtomicBool>, bool),
    curve: &mut Vec<(f32, f64, f64)>,
) -> Result<f32> {
    let n_eval = 4;
    let base_ppl = eng
        .perplexity_until(held, w, n_eval, stop, |_, _| {})
        .map_err(|e| interrupted(stop, e))?
        .ppl;
    let (mut lo, mut hi) = (0.0f32, 0.95f32);
    for _ in 0..6 {
        if stop.load(Ordering::Relaxed) {
            bail!("interrupted: nothing written");
        }
        let mid = (lo + hi) / 2.0;
        eng.set_sparse(Some(build(eng, mid)?));
        let p = eng
            .perplexity_until(held, w, n_eval, stop, |_, _| {})
            .map_err(|e| interrupted(stop, e))?
            .ppl;
        eng.set_sparse(None);
        if !json {
            eprintln!("sparrow: sparsity {mid:.3}: held-out validation ppl {p:.3} (dense {base_ppl:.3}, {:+.2}%)", (p / base_ppl - 1.0) * 100.0);
        }
        curve.push((mid, p, base_ppl));
        if p <= base_ppl * (1.0 + budget as f64) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok(lo)
}

/// Prints the profile's per-layer figures, as JSON with `json`.
fn print_profile(
    profile: &engine::Profile,
    out: &std::path::Path,
    model: &std::path::Path,
    corpus: &str,
    sparsity: f32,
    curve: &[(f32, f64, f64)],
    json: bool,
) -> Result<()> {
    let layers: Vec<_> = profile
        .layers
        .iter()
        .enumerate()
        .map(|(l, lp)| {
            serde_json::json!({
                "layer": l, "threshold": lp.threshold,
                "sparsity_b1": lp.sparsity(0), "sparsity_b2": lp.sparsity(1), "sparsity_b4": lp.sparsity(2), "sparsity_b8": lp.sparsity(3),
                "share_for_80pct": lp.share_for_mass(0.8),
                "hot_overlap_b1_b8_top20": lp.overlap_top(0, 3, 0.2),
            })
        })
        .collect();
    if json {
        let v = serde_json::json!({"profile": out, "tokens": profile.tokens, "target_sparsity": sparsity, "score": format!("{:?}", profile.score),
            "calibration": curve.iter().map(|(s, p, b)| serde_json::json!({"sparsity": s, "ppl": p, "dense_ppl": b})).collect::<Vec<_>>(),
            "layers": layers});
        println!("{}", serde_json::to_string(&v)?);
        return Ok(());
    }
    println!(
        "profile of {} over {} tokens of {} (target sparsity {:.3}, {:?} score) -> {}",
        model.display(),
        profile.tokens,
        corpus,
        sparsity,
        profile.score,
        out.display()
    );
    println!("layer  threshold  sparsity@1  @2     @4     @8     neurons for 80% of activations  hot-set overlap b1/b8 (top 20%)");
    for (l, lp) in profile.layers.iter().enumerate() {
        println!(
            "{l:>5}  {:>9.4}  {:>9.3}  {:>5.3}  {:>5.3}  {:>5.3}  {:>30.1}%  {:>6.3}",
            lp.threshold,
            lp.sparsity(0).unwrap_or(0.0),
            lp.sparsity(1).unwrap_or(0.0),
            lp.sparsity(2).unwrap_or(0.0),
            lp.sparsity(3).unwrap_or(0.0),
            lp.share_for_mass(0.8) * 100.0,
            lp.overlap_top(0, 3, 0.2).unwrap_or(0.0)
        );
    }
    Ok(())
}
