//! `cargo xtask bench-formats`: one SYNTHETIC model in every weight format Sparrow reads, and
//! llama.cpp's `llama-bench` and `sparrow bench` on each in turn, in one run: prompt (`-p`) and
//! decode (`-n`) tok/s and their ratios, a row per format.
//!
//! The model is written once by `synth-model` in F16 (random weights; by default 16 layers, d 1024,
//! ff 2816, 16 query and 4 key/value heads, a 32000-token vocabulary: every width a multiple of 256,
//! so the K-quants apply to every matrix), then llama.cpp's own `llama-quantize` makes each file as
//! a user gets it: `Q3_K_M`, `Q4_K_M` and `Q5_K_M` are llama.cpp's mixes (Q6_K and more bits where it
//! puts them), the others one format throughout except where llama.cpp keeps more bits (the output
//! projection, for instance). Files go to `target/synth/formats/` and are reused. Each round runs,
//! per format, llama-bench (its default configuration, the fastest in memory) then sparrow bench; the
//! table has the medians over rounds. llama.cpp is built as docs/BENCHMARKS.md says
//! ([`crate::llama::tool`]).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::llama::{llama_speeds, median, sparrow_speeds, Speeds};

/// llama-quantize's names of the files compared, in the table's order.
const FORMATS: [&str; 15] = [
    "F32", "F16", "BF16", "Q8_0", "Q6_K", "Q5_K_M", "Q5_1", "Q5_0", "Q4_K_M", "Q4_1", "Q4_0",
    "IQ4_NL", "IQ4_XS", "Q3_K_M", "Q2_K",
];

const USAGE: &str = "usage: cargo xtask bench-formats [--rounds R] [-p N] [-n N] [--threads T] \
[--formats F32,Q4_0,...] [--shape LAYERS,D,FF,HEADS,KV_HEADS,VOCAB] [--record DIR]
  defaults: 1 round, -p 512, -n 32, 2 threads, every format, shape 16,1024,2816,16,4,32000";

struct Opts {
    rounds: usize,
    n_prompt: usize,
    n_gen: usize,
    threads: usize,
    formats: Vec<String>,
    shape: [usize; 6],
    /// Result files for `cargo xtask bench-report` (a run of every format only).
    record: Option<PathBuf>,
}

fn parse(args: &[String]) -> Result<Opts> {
    let mut o = Opts {
        rounds: 1,
        n_prompt: 512,
        n_gen: 32,
        threads: 2,
        formats: FORMATS.iter().map(|f| f.to_string()).collect(),
        shape: [16, 1024, 2816, 16, 4, 32000],
        record: None,
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        if flag == "--help" || flag == "-h" {
            bail!("{USAGE}");
        }
        let value = it
            .next()
            .with_context(|| format!("{flag} needs a value\n{USAGE}"))?;
        let int = |v: &str| -> Result<usize> {
            v.parse()
                .with_context(|| format!("{flag} takes a whole number, not `{v}`"))
        };
        match flag.as_str() {
            "--rounds" => o.rounds = int(value)?.max(1),
            "-p" => o.n_prompt = int(value)?,
            "-n" => o.n_gen = int(value)?,
            "--threads" | "-t" => o.threads = int(value)?.max(1),
            "--formats" => {
                o.formats = value.split(',').map(|f| f.trim().to_uppercase()).collect();
                if let Some(f) = o.formats.iter().find(|f| !FORMATS.contains(&f.as_str())) {
                    bail!("--formats: `{f}` is not one of {}", FORMATS.join(", "));
                }
            }
            "--record" => o.record = Some(PathBuf::from(value)),
            "--shape" => {
                let v: Vec<usize> = value.split(',').map(int).collect::<Result<_>>()?;
                o.shape = v.try_into().map_err(|_| {
                    anyhow::anyhow!("--shape takes six numbers: LAYERS,D,FF,HEADS,KV_HEADS,VOCAB")
                })?;
            }
            _ => bail!("unknown argument `{flag}`\n{USAGE}"),
        }
    }
    Ok(o)
}

/// The F16 model, written by `synth-model` (as a release build) when absent.
fn f16_model(dir: &Path, shape: &[usize; 6]) -> Result<PathBuf> {
    let [layers, d, ff, heads, kv, vocab] = *shape;
    let path = dir.join(format!("synth-{layers}x{d}x{ff}-f16.gguf"));
    if !path.is_file() {
        let mut c = super::cargo();
        c.args([
            "run",
            "--release",
            "-p",
            "xtask",
            "--",
            "synth-model",
            "--format",
            "f16",
        ]);
        for (flag, v) in [
            ("--layers", layers),
            ("--d", d),
            ("--ff", ff),
            ("--heads", heads),
            ("--kv-heads", kv),
            ("--vocab", vocab),
        ] {
            c.arg(flag).arg(v.to_string());
        }
        super::run(c.arg("--out").arg(&path))?;
    }
    Ok(path)
}

/// `format`'s file, made from the F16 one by llama-quantize when absent (through a temporary name,
/// so that a killed run leaves no half-written file under the final one).
fn quantized(quantize: &Path, f16: &Path, format: &str, threads: usize) -> Result<PathBuf> {
    let name = f16.file_name().unwrap().to_string_lossy();
    let out =
        f16.with_file_name(name.replace("-f16.gguf", &format!("-{}.gguf", format.to_lowercase())));
    if format == "F16" || out.is_file() {
        return Ok(if format == "F16" {
            f16.to_path_buf()
        } else {
            out
        });
    }
    let tmp = out.with_extension("gguf.part");
    super::run(
        Command::new(quantize)
            .arg(f16)
            .arg(&tmp)
            .arg(format)
            .arg(threads.to_string()),
    )?;
    std::fs::rename(&tmp, &out).with_context(|| format!("renaming {}", tmp.display()))?;
    Ok(out)
}

/// Runs `program` and returns its stdout; a failed run is reported and gives no figures.
fn bench(program: &Path, args: &[String]) -> String {
    eprintln!("xtask: $ {} {}", program.display(), args.join(" "));
    match Command::new(program).args(args).output() {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).into_owned(),
        Ok(out) => {
            let err = String::from_utf8_lossy(&out.stderr);
            eprintln!(
                "xtask: {} failed ({}): {}",
                program.display(),
                out.status,
                err.lines().last().unwrap_or("")
            );
            String::new()
        }
        Err(e) => {
            eprintln!("xtask: cannot run {}: {e}", program.display());
            String::new()
        }
    }
}

fn cell(v: Option<f64>) -> String {
    v.map_or("-".into(), |x| format!("{x:.1}"))
}

fn ratio(s: Option<f64>, l: Option<f64>) -> String {
    match (s, l) {
        (Some(s), Some(l)) if l > 0.0 => format!("**{:.2}x**", s / l),
        _ => "-".into(),
    }
}

/// The `cargo xtask bench-formats` task.
pub fn run(root: &Path, args: &[String]) -> Result<()> {
    let o = parse(args)?;
    let llama = crate::llama::tool(root, "llama-bench")?;
    let quantize = crate::llama::tool(root, "llama-quantize")?;
    super::run(super::cargo().args(["build", "--release", "-p", "sparrow"]))?;
    let sparrow = root.join("target").join("release").join("sparrow");
    let dir = root.join("target").join("synth").join("formats");
    std::fs::create_dir_all(&dir)?;
    let f16 = f16_model(&dir, &o.shape)?;
    let files: Vec<(String, PathBuf)> = o
        .formats
        .iter()
        .map(|f| Ok((f.clone(), quantized(&quantize, &f16, f, o.threads)?)))
        .collect::<Result<_>>()?;
    let (t, p, n) = (
        o.threads.to_string(),
        o.n_prompt.to_string(),
        o.n_gen.to_string(),
    );
    let mut runs: Vec<(Vec<Speeds>, Vec<Speeds>)> = vec![Default::default(); files.len()];
    for round in 1..=o.rounds {
        eprintln!("bench-formats: round {round} of {}", o.rounds);
        for ((_, path), (l, s)) in files.iter().zip(&mut runs) {
            let m = path.display().to_string();
            let la = [
                "-m", &m, "-t", &t, "-p", &p, "-n", &n, "-r", "1", "-o", "json",
            ];
            l.push(llama_speeds(&bench(&llama, &la.map(String::from))));
            let sa = [
                "bench",
                "-m",
                &m,
                "--threads",
                &t,
                "-p",
                &p,
                "-n",
                &n,
                "-r",
                "1",
                "--json",
            ];
            s.push(sparrow_speeds(&bench(&sparrow, &sa.map(String::from))));
        }
    }
    let [layers, d, ff, heads, kv, vocab] = o.shape;
    println!(
        "SYNTHETIC model {layers} layers, d {d}, ff {ff}, {heads}/{kv} heads, vocab {vocab}; {} thread(s), medians of {} round(s)\n",
        o.threads, o.rounds
    );
    println!(
        "| format | MiB | llama.cpp pp{p} | sparrow pp{p} | prefill ratio | llama.cpp tg{n} | sparrow tg{n} | decode ratio |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let mut ratios: Vec<FormatRatios> = Vec::new();
    for ((format, path), (l, s)) in files.iter().zip(&runs) {
        let mib = std::fs::metadata(path)?.len() as f64 / 1048576.0;
        let m =
            |v: &[Speeds], f: fn(&Speeds) -> Option<f64>| median(v.iter().filter_map(f).collect());
        let (lp, sp) = (m(l, |x| x.pp), m(s, |x| x.pp));
        let (lt, st) = (m(l, |x| x.tg), m(s, |x| x.tg));
        println!(
            "| {format} | {mib:.0} | {} | {} | {} | {} | {} | {} |",
            cell(lp),
            cell(sp),
            ratio(sp, lp),
            cell(lt),
            cell(st),
            ratio(st, lt)
        );
        let r = |s: Option<f64>, l: Option<f64>| match (s, l) {
            (Some(s), Some(l)) if l > 0.0 => Some((s / l * 100.0).round() / 100.0),
            _ => None,
        };
        ratios.push((format.clone(), r(sp, lp), r(st, lt)));
    }
    if let Some(dir) = &o.record {
        record(dir, &o, args, &ratios)?;
    }
    Ok(())
}

/// A format's name, its prefill ratio and its decode ratio (sparrow / llama.cpp).
type FormatRatios = (String, Option<f64>, Option<f64>);

/// `--record DIR`: the median prefill and decode ratios over the formats, and the plot of every
/// format's ratios, as result files for `cargo xtask bench-report`.
fn record(dir: &Path, o: &Opts, args: &[String], ratios: &[FormatRatios]) -> Result<()> {
    use crate::bench_report::{record_value, Measurement, Plot, PlotKind, Series};
    if ratios.len() != FORMATS.len() || ratios.iter().any(|(_, p, t)| p.is_none() || t.is_none()) {
        eprintln!("bench-formats: not recording: the run did not measure every format");
        return Ok(());
    }
    let mut kept = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--record" {
            it.next();
        } else {
            kept.push(a.as_str());
        }
    }
    let command = format!("cargo xtask bench-formats {}", kept.join(" "))
        .trim_end()
        .to_string();
    let [layers, d, ..] = o.shape;
    let model = format!(
        "{layers}-layer d {d} model in {} weight formats (llama-quantize)",
        FORMATS.len()
    );
    let categories: Vec<String> = ratios.iter().map(|(f, ..)| f.clone()).collect();
    let series = |name: &str, get: fn(&FormatRatios) -> Option<f64>| Series {
        name: name.into(),
        points: ratios
            .iter()
            .enumerate()
            .map(|(i, r)| [i as f64, get(r).unwrap_or(0.0)])
            .collect(),
    };
    let (p, n) = (o.n_prompt, o.n_gen);
    let plot = Plot {
        file: "formats.svg".into(),
        title: "Speed per weight format against llama.cpp".into(),
        kind: PlotKind::Bars,
        x_label: "weight format".into(),
        y_label: "sparrow / llama.cpp".into(),
        log_y: false,
        reference_y: Some(1.0),
        reference_label: "parity with llama.cpp".into(),
        legend: String::new(),
        categories,
        series: vec![
            series(&format!("prefill pp{p}"), |r| r.1),
            series(&format!("decode tg{n}"), |r| r.2),
        ],
    };
    for (id, what, get, with_plot) in [
        (
            "mem8-formats-decode",
            format!(
                "decode tg{n} vs llama.cpp, median of {} weight formats",
                FORMATS.len()
            ),
            (|r| r.2) as fn(&FormatRatios) -> Option<f64>,
            true,
        ),
        (
            "mem9-formats-prefill",
            format!(
                "prefill pp{p} vs llama.cpp, median of {} weight formats",
                FORMATS.len()
            ),
            |r| r.1,
            false,
        ),
    ] {
        let mut v: Vec<(f64, &str)> = ratios
            .iter()
            .map(|r| (get(r).unwrap_or(0.0), r.0.as_str()))
            .collect();
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (lo, hi) = (v[0], v[v.len() - 1]);
        let m = Measurement {
            id: id.into(),
            group: "In memory against llama.cpp".into(),
            measures: what,
            model: model.clone(),
            synthetic: true,
            value: median(v.iter().map(|x| x.0).collect()),
            unit: "x".into(),
            target: None,
            date: crate::bench_report::today(),
            machine: crate::bench_report::this_machine(),
            command: command.clone(),
            source: "recorded by `cargo xtask bench-formats --record`".into(),
            history: "benchmarks/dense-vs-llama.md".into(),
            note: Some(format!(
                "{}x ({}) to {}x ({}); medians of {} round(s)",
                lo.0, lo.1, hi.0, hi.1, o.rounds
            )),
            plot: with_plot.then(|| plot.clone()),
        };
        record_value(dir, m)?;
    }
    Ok(())
}
