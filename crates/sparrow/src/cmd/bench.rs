//! `sparrow bench`: prefill and decode speed (the measurement is `engine::bench`; this parses the
//! options, builds the engines and prints the report as text or JSON).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use engine::bench::{mean_sd, quantile};
use engine::{
    BenchMode, BenchOptions, BenchReport, Engine, EngineBuilder, ModeRuns, ModelFile, Overlay, Plan,
};

use crate::args::ModelArgs;
use crate::builtin::{TextSource, EVAL};
use crate::load::builder;
use crate::parse::SweepBudget;
use crate::plot::{Curve, Latencies};
use crate::ui::{mib, precision_name};

#[derive(Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt tokens for the prefill test (pp).
    #[arg(long, short = 'p', default_value_t = 512, value_parser = crate::parse::tokens)]
    pub n_prompt: usize,
    /// Generated tokens for the decode test (tg).
    #[arg(long, short = 'n', default_value_t = 128, value_parser = crate::parse::tokens)]
    pub n_gen: usize,
    /// Repetitions of each test (the report gives the mean and spread).
    #[arg(long, short = 'r', default_value_t = 3)]
    pub reps: usize,
    /// Take the tokens from this text file instead of pseudo-random ids (decode is then
    /// teacher-forced: the file's next token is fed whatever the model predicted). With --sparse or a
    /// resident model the default is a built-in evaluation text (34 KB of Shakespeare), since
    /// sparsity depends on what the text is.
    #[arg(long)]
    pub text: Option<PathBuf>,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    /// With --sparse: also run this resident file (`sparrow convert` of the same model) over its
    /// neuron store, alternating with in-memory sparse decode, and report offloaded/in-memory ratios
    /// with per-token latency, cache misses and flash reads (the --memory-budget options apply to it).
    #[arg(long, requires = "sparse", conflicts_with = "budgets")]
    pub offload: Option<PathBuf>,
    /// For a resident model (`sparrow convert`): run the bench once per memory budget, each a share
    /// of the FFN kept in memory (`40%`) or a process budget (`150M`), e.g. `--budgets
    /// 20%,40%,60%,80%,100%`; reports (and plots) decode speed against the FFN cache size.
    #[arg(long, value_delimiter = ',', value_parser = crate::parse::sweep_budget, conflicts_with_all = ["memory_budget", "ffn_resident"])]
    pub budgets: Vec<SweepBudget>,
    /// For a model in memory: the sparsity / perplexity / speed trade-off. Dense first, then once per
    /// activation sparsity (output-score thresholds calibrated on the built-in calibration text, as
    /// `sparrow profile --sparsity` does), each with its perplexity over --ppl-windows windows of 256
    /// tokens of the evaluation text and its decode speed; e.g. `--sparsities 0.3,0.5,0.7,0.9`.
    #[arg(long, value_delimiter = ',', value_parser = crate::parse::unit_f32, conflicts_with_all = ["budgets", "offload", "sparse"])]
    pub sparsities: Vec<f32>,
    /// Windows of 256 tokens (at most --ctx) of the evaluation text (--text or built-in) scored by
    /// --sparsities.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=256))]
    pub ppl_windows: u64,
    /// Also draw the run as an SVG file: the per-token decode latency histogram of each mode, and
    /// decode tok/s across the modes compared (dense/sparse, in-memory/offloaded) or the --budgets.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// Batched decode instead of pp/tg: N continuations of the -p prompt tokens, -n steps each,
    /// decoded one sequence after another and as one batch (as `run --best-of N` does), with the
    /// total decode tok/s of both and their ratio.
    #[arg(long, value_name = "N", value_parser = crate::parse::best_of, conflicts_with_all = ["budgets", "sparsities", "offload", "plot"])]
    pub best_of: Option<usize>,
    /// Speculative decoding instead of pp/tg: each prompt of --prompts generated greedily (up to -n
    /// tokens, chat template applied) without and with prompt lookup of up to N drafted tokens, back
    /// to back; reports both decode tok/s, their ratio, the share of drafted tokens kept and the
    /// tokens per verification step, and fails if the outputs differ.
    #[arg(long, value_name = "N", value_parser = crate::parse::lookup, conflicts_with_all = ["budgets", "sparsities", "offload", "plot", "best_of"])]
    pub lookup: Option<usize>,
    /// With --lookup, --self-draft or --draft: the prompts, one JSON object `{"prompt": "..."}` a line (default: 8 built-in
    /// code-editing prompts: take a function, return it with a change).
    #[arg(long, value_name = "FILE.jsonl")]
    pub prompts: Option<PathBuf>,
    /// `--self-draft` and `--draft MODEL` measure as --lookup does (and the bytes read from flash
    /// per token both ways, over a bundle).
    #[command(flatten)]
    pub spec: crate::spec::SpecArgs,
}

/// Runs the subcommand and prints its result.
pub fn run(a: BenchArgs) -> Result<()> {
    let mut b = builder(&a.model, a.json);
    let path = b.model_path()?;
    if let Some(plot) = &a.plot {
        let mut inputs = crate::load::model_inputs(&a.model, &path);
        inputs.extend(a.text.clone());
        inputs.extend(a.offload.clone());
        inputs.extend(a.prompts.clone());
        engine::outputs::guard(&[(plot, engine::outputs::OutputKind::Other)], &inputs)?;
    }
    // A given text is read first: a bad file is refused in one line before the model loads (and
    // before the engine's notes on stderr).
    let mut given_text = match &a.text {
        Some(p) => Some(
            TextSource::or_builtin(Some(p), &EVAL)
                .read()
                .context("give another text with --text")?,
        ),
        None => None,
    };
    b.model = Some(path);
    let loaded = b.open()?;
    let (file, overlay, plan, b) = (
        loaded.file(),
        loaded.overlay(),
        loaded.plan(),
        loaded.options(),
    );
    let mut eng = loaded.engine()?;
    let opts = BenchOptions {
        n_prompt: a.n_prompt,
        n_gen: a.n_gen,
        reps: a.reps,
        teacher_forced: false,
    };
    let need = opts.tokens_needed();
    let text = (a.text.is_some()
        || b.sparse
        || !a.sparsities.is_empty()
        || eng.model().config.ffn_store.is_some())
    .then(|| TextSource::or_builtin(a.text.as_deref(), &EVAL));
    let tokens: Vec<u32> = match &text {
        Some(src) => {
            let t = match given_text.take() {
                Some(t) => t,
                None => src.read().context("give another text with --text")?,
            };
            engine::bench::text_tokens(&eng, &t, Path::new(&src.name()), need)?
        }
        None => engine::bench::synthetic_tokens(need, eng.model().config.vocab_size as u32),
    };
    // With --sparse every repetition runs dense and sparse back to back (alternating which goes
    // first), so the ratio compares the two on the same machine state. With --offload the pair is
    // in-memory sparse and offloaded sparse (a second engine over the resident file). A resident
    // model alone runs only sparse (its FFN is in the store).
    let off_file = a.offload.as_ref().map(ModelFile::open).transpose()?;
    let off_eng = match &off_file {
        Some(f) => {
            let mut e = Engine::new(f, b.engine_options())?;
            if e.model().config.ffn_store.is_none() {
                bail!(
                    "--offload {}: not a resident file (make one with `sparrow convert`)",
                    f.path().display()
                );
            }
            let mut ob = b.clone();
            ob.model = Some(f.path().to_path_buf());
            ob.sidecars.profile = None;
            ob.sidecars.predictor = None;
            ob.setup(&mut e)?;
            Some(e)
        }
        None => None,
    };
    let opts = BenchOptions {
        teacher_forced: text.is_some(),
        ..opts
    };
    if !a.budgets.is_empty() {
        return sweep(&a, b, &mut eng, file, text.as_ref(), &tokens, &opts);
    }
    if !a.sparsities.is_empty() {
        return sparsity_sweep(&a, &mut eng, file, text.as_ref(), &tokens, &opts);
    }
    let draft_file = a.spec.open_draft()?;
    let draft_eng = crate::spec::draft_engine(draft_file.as_ref(), &eng)?;
    if let Some(d) = crate::spec::drafting(a.lookup, &a.spec, draft_eng.as_ref()) {
        return crate::cmd::bench_lookup::run(&a, &eng, d);
    }
    if let Some(n) = a.best_of {
        return best_of(&a, &eng, &tokens[..a.n_prompt.max(1)], n);
    }
    let report = engine::bench::run(&mut eng, off_eng.as_ref(), &tokens, &opts)?;
    if let Some(path) = &a.plot {
        write_plot(path, &report, a.json)?;
    }
    let out = Printed {
        a: &a,
        eng: &eng,
        file,
        overlay,
        text: text.as_ref(),
        report: &report,
        plan,
        planned_split: b.planned.split.is_some(),
    };
    if a.json {
        out.json()
    } else {
        out.text();
        Ok(())
    }
}

/// `bench --plot`: each mode's token latencies, and its decode speed beside the others'.
fn write_plot(path: &Path, report: &engine::BenchReport, json: bool) -> Result<()> {
    let latencies = report
        .runs
        .iter()
        .zip(&report.modes)
        .map(|(r, &m)| Latencies {
            name: report.mode_name(m).to_string(),
            seconds: r.token_s.clone(),
        })
        .collect::<Vec<_>>();
    let curve = (report.modes.len() > 1).then(|| Curve {
        title: format!("Decode speed, {}", report.ratio_name()),
        x_desc: "mode".into(),
        categorical: true,
        points: report
            .runs
            .iter()
            .zip(&report.modes)
            .enumerate()
            .map(|(i, (r, &m))| (report.mode_name(m).to_string(), i as f64, mean_sd(&r.tg).0))
            .collect(),
    });
    crate::plot::write(path, &crate::plot::bench_svg(&latencies, curve.as_ref())?)?;
    if !json {
        eprintln!("sparrow: plot written to {}", path.display());
    }
    Ok(())
}

/// `--best-of N`: sequential against batched decode of N sequences, printed or as JSON.
fn best_of(a: &BenchArgs, eng: &Engine<'_>, prompt: &[u32], n: usize) -> Result<()> {
    let r = engine::bench_batch::best_of(eng, prompt, n, a.n_gen, a.reps)?;
    let (ratio, sd) = r.ratio();
    if a.json {
        let v = serde_json::json!({
            "model": eng.model().path(),
            "threads": eng.threads(),
            "n_prompt": prompt.len(),
            "best_of": r,
            "ratio_mean": ratio,
            "ratio_sd": sd,
        });
        println!("{}", serde_json::to_string(&v)?);
        return Ok(());
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    println!(
        "{}: {} threads, prompt {} tokens, {} sequences x {} decode steps, {} repetitions",
        eng.model().path().display(),
        eng.threads(),
        prompt.len(),
        n,
        a.n_gen,
        r.batched_tok_s.len()
    );
    println!(
        "sequential {:.2} tok/s | batched {:.2} tok/s (all sequences) | batched/sequential {:.2} +/- {:.2}",
        mean(&r.sequential_tok_s),
        mean(&r.batched_tok_s),
        ratio,
        sd
    );
    Ok(())
}

/// `--budgets`: the bench once per budget over the resident model, one line (or JSON entry) each,
/// and the plot of decode speed against the FFN cache that each budget left.
fn sweep(
    a: &BenchArgs,
    b: &EngineBuilder,
    eng: &mut Engine<'_>,
    file: &ModelFile,
    text: Option<&TextSource>,
    tokens: &[u32],
    opts: &BenchOptions,
) -> Result<()> {
    if eng.model().config.ffn_store.is_none() {
        bail!(
            "--budgets: {} is not a resident file (make one with `sparrow convert`)",
            file.path().display()
        );
    }
    let mut rows = Vec::new();
    for budget in &a.budgets {
        let bb = b.clone().budget(budget.budget);
        // The previous budget's cache is dropped before the next one is built.
        eng.set_sparse(None);
        bb.setup(eng)
            .with_context(|| format!("budget {}", budget.label))?;
        let report = engine::bench::run(eng, None, tokens, opts)
            .with_context(|| format!("budget {}", budget.label))?;
        let r = report.runs[0].clone();
        let cache_mib = r
            .offload
            .as_ref()
            .map_or(0.0, |o| mib(o.resident_bytes as u64));
        if !a.json {
            let (tm, ts) = mean_sd(&r.tg);
            println!(
                "budget {:>6}: FFN cache {:>7.1} MiB | tg{:<5} {:>8.1} ± {:.1} tok/s | per token P50 {:.1} ms, {:.2} MiB read",
                budget.label,
                cache_mib,
                a.n_gen,
                tm,
                ts,
                1e3 * quantile(&r.token_s, 0.5),
                r.offload.as_ref().map_or(0.0, |o| mib(o.bytes_read) / o.tokens.max(1) as f64),
            );
        }
        rows.push((budget.label.clone(), cache_mib, r));
    }
    if let Some(path) = &a.plot {
        let latencies = rows
            .iter()
            .map(|(l, _, r)| Latencies {
                name: format!("budget {l}"),
                seconds: r.token_s.clone(),
            })
            .collect::<Vec<_>>();
        let curve = Curve {
            title: "Decode speed against memory budget".into(),
            x_desc: "FFN cache (MiB)".into(),
            categorical: false,
            points: rows
                .iter()
                .map(|(l, c, r)| (l.clone(), *c, mean_sd(&r.tg).0))
                .collect(),
        };
        crate::plot::write(path, &crate::plot::bench_svg(&latencies, Some(&curve))?)?;
        if !a.json {
            eprintln!("sparrow: plot written to {}", path.display());
        }
    }
    if a.json {
        let entries: Vec<_> = rows
            .iter()
            .map(|(l, c, r)| {
                let (pm, ps) = mean_sd(&r.pp);
                let (tm, ts) = mean_sd(&r.tg);
                serde_json::json!({
                    "budget": l, "cache_resident_mib": c, "pp_tok_s": pm, "pp_tok_s_sd": ps,
                    "tg_tok_s": tm, "tg_tok_s_sd": ts, "token_ms_p50": 1e3 * quantile(&r.token_s, 0.5),
                    "miss_rate": r.offload.as_ref().map(|o| o.miss_rate()),
                    "mib_read_per_token": r.offload.as_ref().map(|o| mib(o.bytes_read) / o.tokens.max(1) as f64),
                })
            })
            .collect();
        let first = &entries[0];
        let v = serde_json::json!({
            "mode": "offloaded", "model": file.path(), "threads": eng.threads(),
            "precision": precision_name(eng.options().precision), "n_prompt": a.n_prompt,
            "n_gen": a.n_gen, "reps": a.reps, "text": text.map(TextSource::name),
            "pp_tok_s": first["pp_tok_s"], "tg_tok_s": first["tg_tok_s"],
            "budget_sweep": entries, "peak_rss_bytes": engine::sys::peak_rss_bytes(),
        });
        println!("{}", serde_json::to_string(&v)?);
    } else {
        println!(
            "peak RSS {:.1} MiB",
            mib(engine::sys::peak_rss_bytes().unwrap_or(0))
        );
    }
    Ok(())
}

/// Window of the perplexity measured by `--sparsities` (at most the engine's context).
const PPL_WINDOW: usize = 256;

/// `--sparsities`: dense, then sparse decode at each sparsity, each with its perplexity on the
/// evaluation text and its decode speed (paired with a dense run on the same machine state); one line
/// (or JSON entry) each and the trade-off plot.
fn sparsity_sweep(
    a: &BenchArgs,
    eng: &mut Engine<'_>,
    file: &ModelFile,
    text: Option<&TextSource>,
    tokens: &[u32],
    opts: &BenchOptions,
) -> Result<()> {
    use engine::sparse::{thresholds_for_sparsity, Score, SparseFfn, DEFAULT_DOWN_FORMAT};
    if eng.model().config.ffn_store.is_some() {
        bail!(
            "--sparsities: {} is a resident file; give the model it was converted from",
            file.path().display()
        );
    }
    let n_layers = eng.model().config.n_layers;
    let windows = a.ppl_windows as usize;
    // 256 tokens, or the engine's whole context when it is shorter.
    let window = PPL_WINDOW.min(eng.options().context).max(2);
    let calib_src = TextSource::or_builtin(None, &crate::builtin::CALIBRATION);
    let calib = engine::bench::text_tokens(
        eng,
        &calib_src.read()?,
        Path::new(&calib_src.name()),
        2 * window,
    )?;
    // `run` reads --text, or the built-in evaluation text, for --sparsities.
    let Some(eval_src) = text else {
        bail!("--sparsities needs an evaluation text");
    };
    let eval = engine::bench::text_tokens(
        eng,
        &eval_src.read()?,
        Path::new(&eval_src.name()),
        windows * window,
    )
    .context("--ppl-windows: give a longer --text or fewer windows")?;
    eng.set_sparse(None);
    let mut base =
        eng.install(|| SparseFfn::new(eng.model(), vec![0.0; n_layers], DEFAULT_DOWN_FORMAT))?;
    base.score = Score::OutputNorm;
    let samples = engine::profile::sample_scores(eng, &base, &calib, window, 2, 3, |_, _| {})?;
    drop(base);
    // (sparsity, perplexity, runs of this mode, the paired dense decode tok/s)
    let mut rows: Vec<(f32, f64, ModeRuns, f64)> = Vec::new();
    for s in std::iter::once(None).chain(a.sparsities.iter().copied().map(Some)) {
        eng.set_sparse(None);
        if let Some(s) = s {
            let t = thresholds_for_sparsity(&mut samples.clone(), s)?;
            let mut sp = eng.install(|| SparseFfn::new(eng.model(), t, DEFAULT_DOWN_FORMAT))?;
            sp.score = Score::OutputNorm;
            eng.set_sparse(Some(sp));
        }
        let ppl = eng.perplexity(&eval, window, windows, |_, _| {})?.ppl;
        let report = engine::bench::run(eng, None, tokens, opts)?;
        let dense = mean_sd(&report.runs[0].tg).0;
        let r = report.runs.last().cloned().unwrap_or_default();
        let label = s.map_or("dense".to_string(), |s| format!("sparsity {s}"));
        if !a.json {
            let (tm, ts) = mean_sd(&r.tg);
            println!(
                "{label:>14}: ppl {ppl:>8.3} | tg{:<5} {tm:>8.1} ± {ts:.1} tok/s ({:.3}x dense) | per token P50 {:.1} ms",
                a.n_gen,
                tm / dense.max(1e-9),
                1e3 * quantile(&r.token_s, 0.5),
            );
        }
        rows.push((s.unwrap_or(0.0), ppl, r, dense));
    }
    eng.set_sparse(None);
    if let Some(path) = &a.plot {
        sweep_plot(path, &rows, a.json)?;
    }
    if a.json {
        let entries: Vec<_> = rows
            .iter()
            .map(|(s, p, r, dense)| {
                let (tm, ts) = mean_sd(&r.tg);
                serde_json::json!({
                    "sparsity": s, "ppl": p, "tg_tok_s": tm, "tg_tok_s_sd": ts,
                    "dense_tg_tok_s": dense, "token_ms_p50": 1e3 * quantile(&r.token_s, 0.5),
                    "sparse_stats": r.stats.map(|s| serde_json::json!({
                        "gate_frac": s.gate_frac(), "up_frac": s.up_frac(), "down_frac": s.down_frac(),
                    })),
                })
            })
            .collect();
        let v = serde_json::json!({
            "model": file.path(), "threads": eng.threads(),
            "precision": precision_name(eng.options().precision), "n_prompt": a.n_prompt,
            "n_gen": a.n_gen, "reps": a.reps, "text": eval_src.name(),
            "ppl_window": window, "ppl_windows": windows,
            "sparsity_sweep": entries, "peak_rss_bytes": engine::sys::peak_rss_bytes(),
        });
        println!("{}", serde_json::to_string(&v)?);
    }
    Ok(())
}

/// `bench --sparsities --plot`: each sparsity's token latencies and its decode speed against its
/// sparsity, labelled with its perplexity.
fn sweep_plot(path: &Path, rows: &[(f32, f64, ModeRuns, f64)], json: bool) -> Result<()> {
    let name = |s: f32| {
        if s == 0.0 {
            "dense".to_string()
        } else {
            format!("sparsity {s}")
        }
    };
    let latencies = rows
        .iter()
        .map(|(s, _, r, _)| Latencies {
            name: name(*s),
            seconds: r.token_s.clone(),
        })
        .collect::<Vec<_>>();
    let curve = Curve {
        title: "Sparsity / perplexity / decode speed".into(),
        x_desc: "activation sparsity (share of FFN neurons skipped)".into(),
        categorical: false,
        points: rows
            .iter()
            .map(|(s, p, r, _)| (format!("ppl {p:.2},"), f64::from(*s), mean_sd(&r.tg).0))
            .collect(),
    };
    crate::plot::write(path, &crate::plot::bench_svg(&latencies, Some(&curve))?)?;
    if !json {
        eprintln!("sparrow: plot written to {}", path.display());
    }
    Ok(())
}

/// Seconds of the last repetition's prompt of `n_prompt` tokens (NaN without one).
fn prompt_s(r: &ModeRuns, n_prompt: usize) -> f64 {
    r.pp.last().map_or(f64::NAN, |pp| n_prompt as f64 / pp)
}

/// What the report is printed from.
struct Printed<'p, 'e> {
    a: &'p BenchArgs,
    eng: &'p Engine<'e>,
    file: &'p ModelFile,
    overlay: Option<&'p Overlay>,
    text: Option<&'p TextSource>,
    report: &'p BenchReport,
    plan: Option<&'p Plan>,
    /// Whether hybrid decode took the plan's split.
    planned_split: bool,
}

impl Printed<'_, '_> {
    fn json(&self) -> Result<()> {
        let (a, eng, report) = (self.a, self.eng, self.report);
        let (modes, runs) = (&report.modes, &report.runs);
        let offload_json = |r: &ModeRuns| {
            r.offload.as_ref().map(|o| {
                let n = o.tokens.max(1) as f64;
                serde_json::json!({
                    "miss_rate": o.miss_rate(), "units_per_token": o.units as f64 / n,
                    "mib_read_per_token": mib(o.bytes_read) / n, "io_wait_share": mean_sd(&r.wait_share).0,
                    "rest_skipped_per_token": o.rest_skipped as f64 / n,
                    "cache_resident_mib": mib(o.resident_bytes as u64),
                    "token_ms_p50": 1e3 * quantile(&r.token_s, 0.5), "token_ms_p90": 1e3 * quantile(&r.token_s, 0.9),
                    "token_ms_p99": 1e3 * quantile(&r.token_s, 0.99),
                })
            })
        };
        let mode_json = |r: &ModeRuns| {
            let (pm, ps) = mean_sd(&r.pp);
            let (tm, ts) = mean_sd(&r.tg);
            serde_json::json!({
                "pp_tok_s": pm, "pp_tok_s_sd": ps, "tg_tok_s": tm, "tg_tok_s_sd": ts,
                "pp_runs": r.pp, "tg_runs": r.tg, "ffn_time_share": mean_sd(&r.ffn_share).0,
                "sparse_stats": r.stats.map(|s| serde_json::json!({
                    "gate_frac": s.gate_frac(), "up_frac": s.up_frac(), "down_frac": s.down_frac(),
                })),
                "offload": offload_json(r),
                "experts": r.experts.as_ref().map(experts_json),
                "prompt_offload": r.prompt_offload.as_ref().map(|o| serde_json::json!({
                    "ffn_s": o.prefill_s, "ffn_time_share": o.prefill_s / prompt_s(r, a.n_prompt),
                    "mib_read": mib(o.prefill_bytes_read),
                    "reads_ahead": o.prefill_reads_ahead,
                })),
            })
        };
        let mut v = mode_json(&runs[0]);
        v["mode"] = serde_json::json!(report.mode_name(modes[0]));
        v["model"] = serde_json::json!(self.file.path());
        v["threads"] = serde_json::json!(eng.threads());
        v["precision"] = serde_json::json!(precision_name(eng.options().precision));
        v["n_prompt"] = serde_json::json!(a.n_prompt);
        v["n_gen"] = serde_json::json!(a.n_gen);
        v["reps"] = serde_json::json!(a.reps);
        v["text"] = serde_json::json!(self.text.map(TextSource::name));
        v["weight_bytes"] = serde_json::json!(eng.model().weight_bytes);
        v["requant"] = serde_json::json!(self.overlay.map(|o| o.requant().to_string()));
        v["peak_rss_bytes"] = serde_json::json!(engine::sys::peak_rss_bytes());
        if let Some(p) = self.plan {
            v["plan"] = serde_json::json!({
                "predicted_tg_tok_s": p.predicted[0].tok_s,
                "predicted_pp_tok_s": p.prompt.map(|c| c.tok_s(a.n_prompt)),
                "measured_over_predicted": mean_sd(&runs[0].tg).0 / p.predicted[0].tok_s,
                "solver": p.solver,
                "memory": p.memory,
                "predicted_hybrid_tg_tok_s": planned_hybrid_tok_s(p, self.planned_split),
                "predicted_expert_hit_rate": p.experts.as_ref().map(|x| x.hit_rate),
                "predicted_mib_read_per_token": p.experts.as_ref().map(|x| x.read_bytes_per_token / 1048576.0),
                "expert_cache_bytes": p.experts.as_ref().map(|x| &x.cache_bytes),
            });
        }
        if runs.len() == 2 {
            let key = match modes[1] {
                BenchMode::Offload => "offloaded",
                BenchMode::Hybrid => "hybrid",
                _ => "sparse",
            };
            v[key] = mode_json(&runs[1]);
            v[key]["tg_ratio"] = serde_json::json!(report.tg_ratio().map(|r| r.0));
            v[key]["pp_ratio"] = serde_json::json!(report.pp_ratio().map(|r| r.0));
        }
        println!("{}", serde_json::to_string(&v)?);
        Ok(())
    }

    fn text(&self) {
        let (a, eng, report) = (self.a, self.eng, self.report);
        let modes = &report.modes;
        let rq = self
            .overlay
            .map(|o| format!(" | layers re-quantized to {}", o.requant()))
            .unwrap_or_default();
        let src = self
            .text
            .map(|p| format!(" | tokens from {}", p.name()))
            .unwrap_or_default();
        println!(
            "model: {} | threads {} | {} mode{rq}{src} | {:.1} MiB weights read per token (dense)",
            self.file.path().display(),
            eng.threads(),
            precision_name(eng.options().precision),
            mib(eng.model().weight_bytes as u64)
        );
        let width = modes
            .iter()
            .map(|&m| report.mode_name(m).len())
            .max()
            .unwrap_or(0);
        for (r, &m) in report.runs.iter().zip(modes) {
            let name = if modes.len() == 2 || m == BenchMode::Offload {
                format!("{:<width$} ", report.mode_name(m))
            } else {
                String::new()
            };
            let (pm, ps) = mean_sd(&r.pp);
            let (tm, ts) = mean_sd(&r.tg);
            if !r.pp.is_empty() {
                println!("{name}pp{:<5} {:>8.1} ± {:.1} tok/s", a.n_prompt, pm, ps);
                if let Some(o) = &r.prompt_offload {
                    println!(
                        "{name}prompt: offloaded FFN {:.2} s ({:.0}% of the last run) | {:.1} MiB streamed from flash | {} layers' first chunk read while the layer before computed",
                        o.prefill_s,
                        100.0 * o.prefill_s / prompt_s(r, a.n_prompt),
                        mib(o.prefill_bytes_read),
                        o.prefill_reads_ahead,
                    );
                }
            }
            if !r.tg.is_empty() {
                let extra = match r.stats {
                    Some(s) => format!("  (FFN {:.0}% of time; rows computed: gate {:.0}%, up {:.0}%, down {:.0}%)", 100.0 * mean_sd(&r.ffn_share).0, 100.0 * s.gate_frac(), 100.0 * s.up_frac(), 100.0 * s.down_frac()),
                    None => format!("  ({:.2} GB/s of weights, FFN {:.0}% of time)", tm * eng.model().weight_bytes as f64 / 1e9, 100.0 * mean_sd(&r.ffn_share).0),
                };
                println!(
                    "{name}tg{:<5} {:>8.1} ± {:.1} tok/s{extra}",
                    a.n_gen, tm, ts
                );
            }
            if let Some(o) = &r.offload {
                let n = o.tokens.max(1) as f64;
                println!(
                    "{name}per token: latency P50 {:.1} / P90 {:.1} / P99 {:.1} ms | units needed {:.0} ({:.0}% hot, {:.0}% cold hits, {:.1}% misses{}) | {:.2} MiB read | waiting for flash {:.0}% of decode time | cache {:.1} MiB",
                    1e3 * quantile(&r.token_s, 0.5),
                    1e3 * quantile(&r.token_s, 0.9),
                    1e3 * quantile(&r.token_s, 0.99),
                    o.units as f64 / n,
                    100.0 * o.hot_hits as f64 / o.units.max(1) as f64,
                    100.0 * o.cold_hits as f64 / o.units.max(1) as f64,
                    100.0 * o.miss_rate(),
                    [
                        (o.read_ahead, "read ahead"),
                        (o.rest_skipped, "gate page only"),
                    ]
                    .iter()
                    .filter(|(k, _)| *k > 0)
                    .map(|(k, what)| format!(
                        ", {:.0}% of them {what}",
                        100.0 * *k as f64 / o.misses.max(1) as f64
                    ))
                    .collect::<String>(),
                    mib(o.bytes_read) / n,
                    100.0 * mean_sd(&r.wait_share).0,
                    mib(o.resident_bytes as u64),
                );
            }
        }
        for (mode, r) in report.modes.iter().zip(&report.runs) {
            if let Some(x) = &r.experts {
                experts_line(&format!("{}: ", report.mode_name(*mode)), x);
            }
        }
        self.plan_lines();
        let ratio_name = report.ratio_name();
        if let Some((m, s)) = report.pp_ratio() {
            println!("{ratio_name} pp: {m:.3} ± {s:.3} (per-repetition ratios)");
        }
        if let Some((m, s)) = report.tg_ratio() {
            println!("{ratio_name} tg: {m:.3} ± {s:.3} (per-repetition ratios)");
        }
        println!(
            "peak RSS {:.1} MiB",
            mib(engine::sys::peak_rss_bytes().unwrap_or(0))
        );
    }

    /// The plan's predicted speeds beside the measured ones (with `--plan`).
    fn plan_lines(&self) {
        let (a, report) = (self.a, self.report);
        // The run of the mode the plan chose: dense, or the sparse (or offloaded) one measured last.
        let planned = self.plan.and_then(|p| {
            let mode = if p.sparse.iter().any(|&s| s) {
                report.modes.iter().rposition(|m| *m != BenchMode::Dense)
            } else {
                report.modes.iter().position(|m| *m == BenchMode::Dense)
            };
            Some((p, &report.runs[mode?]))
        });
        if let Some((p, r)) = planned {
            if !r.tg.is_empty() {
                let measured = mean_sd(&r.tg).0;
                let predicted = p.predicted[0].tok_s;
                println!(
                    "plan: predicted tg {predicted:.1} tok/s, measured {measured:.1} tok/s ({:+.0}%)",
                    100.0 * (measured / predicted - 1.0)
                );
            }
            if let (Some(c), true) = (p.prompt, a.n_prompt > 1) {
                let (predicted, measured) = (c.tok_s(a.n_prompt), mean_sd(&r.pp).0);
                println!(
                    "plan: predicted pp{} {predicted:.1} tok/s ({:.2} s to the first token), measured {measured:.1} tok/s ({:+.0}%)",
                    a.n_prompt,
                    c.seconds(a.n_prompt),
                    100.0 * (measured / predicted - 1.0)
                );
            }
        }
        if let Some(p) = self.plan {
            // Hybrid decode with the plan's split (`--sparse --accel`, no `--accel-hot`): its own
            // prediction.
            let hybrid = report.modes.iter().position(|m| *m == BenchMode::Hybrid);
            if let (Some(i), Some(pred)) = (hybrid, planned_hybrid_tok_s(p, self.planned_split)) {
                let measured = mean_sd(&report.runs[i].tg).0;
                println!(
                    "plan: predicted hybrid tg {pred:.1} tok/s, measured {measured:.1} tok/s ({:+.0}%)",
                    100.0 * (measured / pred - 1.0)
                );
            }
        }
    }
}

/// The plan's predicted hybrid decode speed, where the run took the plan's split (no `--accel-hot`).
fn planned_hybrid_tok_s(p: &Plan, planned_split: bool) -> Option<f64> {
    p.hybrid
        .as_ref()
        .filter(|_| planned_split)
        .and_then(|h| h.tok_s())
}

/// [`experts_line`] as JSON: the counters of the last repetition's decode and the bound.
fn experts_json(x: &engine::ExpertBench) -> serde_json::Value {
    let c = &x.counters;
    serde_json::json!({
        "tokens": x.tokens, "lookups": c.lookups, "hits": c.hits, "hit_rate": c.hit_rate(),
        "read_ahead": c.ahead, "reads": c.reads, "predicted_reads": c.predicted_reads,
        "mib_read_per_token": x.bytes_per_token / (1024.0 * 1024.0),
        "min_mib_read_per_token": x.min_bytes_per_token / (1024.0 * 1024.0),
        "read_over_min": x.over_min(), "io_wait_share": x.wait_share,
        "min_mib_read_per_token_one_pool": x.min_bytes_per_token_one_pool.map(|b| b / (1024.0 * 1024.0)),
        "fixed_set_mib_read_per_token": x.fixed_set_bytes_per_token / (1024.0 * 1024.0),
        "peak_reads_in_flight": c.peak_in_flight, "cache_shares": x.cache_shares,
    })
}

/// The expert counters of a bundle of experts' decode, and the bound its reads are held to.
fn experts_line(name: &str, x: &engine::ExpertBench) {
    let c = &x.counters;
    println!(
        "{name}experts: hit rate {:.1}% ({} of {} needed; {} read ahead by the next layer's router) | {:.2} MiB read per token, {:.2} MiB the least an optimal cache of this size and split reads ({:.2}x; Belady's on this decode's routing: whole experts, each layer's share, from what the cache held when decode began{}; {:.2} MiB the best fixed set of each share, told how often but not when each expert is asked for) | waiting for flash {:.0}% of decode time",
        100.0 * c.hit_rate(),
        c.hits,
        c.lookups,
        c.ahead,
        mib(x.bytes_per_token as u64),
        mib(x.min_bytes_per_token as u64),
        x.over_min(),
        x.min_bytes_per_token_one_pool.map_or(String::new(), |b| format!(
            "; {:.2} MiB with one pool for all layers",
            mib(b as u64)
        )),
        mib(x.fixed_set_bytes_per_token as u64),
        100.0 * x.wait_share
    );
}
