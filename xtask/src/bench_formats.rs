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
//!
//! `--isa avx2` compares AVX2 kernels on any x86_64 machine with AVX2, AVX-512 or not: sparrow runs
//! with `SPARROW_KERNELS=avx2` and llama-bench is the build without AVX-512
//! (`target/llama.cpp/build-avx2`, [`crate::llama::AVX2_FLAGS`]); `--isa native` (the default)
//! compares what each detects. `--model A.gguf,B.gguf` benches those files as they are instead of the
//! synthetic set (a real model, or the 7B-shaped synthetic Q4_0 of `synth-model`). `--profile P`
//! builds sparrow in cargo profile `P` (default `release`).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::llama::{llama_speeds, median, sparrow_speeds, Isa, Speeds};

mod record;
use record::{record, record_model};

/// llama-quantize's names of the files compared, in the table's order.
const FORMATS: [&str; 15] = [
    "F32", "F16", "BF16", "Q8_0", "Q6_K", "Q5_K_M", "Q5_1", "Q5_0", "Q4_K_M", "Q4_1", "Q4_0",
    "IQ4_NL", "IQ4_XS", "Q3_K_M", "Q2_K",
];

const USAGE: &str = "usage: cargo xtask bench-formats [--isa native|avx2] [--rounds R] [-p N] [-n N] [--threads T] \
[--formats F32,Q4_0,...] [--shape LAYERS,D,FF,HEADS,KV_HEADS,VOCAB] [--model A.gguf,...] [--profile P] \
[--record DIR [--record-id ID]]
  defaults: --isa native, 1 round, -p 512, -n 32, 2 threads, every format, shape 16,1024,2816,16,4,32000,
  --profile release; --model benches those files instead of the synthetic formats (--record then needs one
  file and --record-id)";

struct Opts {
    rounds: usize,
    n_prompt: usize,
    n_gen: usize,
    threads: usize,
    formats: Vec<String>,
    shape: [usize; 6],
    /// Result files for `cargo xtask bench-report` (a run of every format, or of one `--model`).
    record: Option<PathBuf>,
    /// The result id of a `--model` run (`ID-decode`, `ID-prefill`).
    record_id: Option<String>,
    /// Which instruction sets both sides run on.
    isa: Isa,
    /// Files benched as they are instead of the synthetic formats.
    models: Vec<PathBuf>,
    /// The cargo profile sparrow is built in.
    profile: String,
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
        record_id: None,
        isa: Isa::Native,
        models: Vec::new(),
        profile: "release".into(),
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
            "--record-id" => o.record_id = Some(value.clone()),
            "--isa" => {
                o.isa = Isa::parse(value)
                    .with_context(|| format!("--isa takes native or avx2, not `{value}`"))?
            }
            "--model" => o.models = value.split(',').map(PathBuf::from).collect(),
            "--profile" => o.profile = value.clone(),
            "--shape" => {
                let v: Vec<usize> = value.split(',').map(int).collect::<Result<_>>()?;
                o.shape = v.try_into().map_err(|_| {
                    anyhow::anyhow!("--shape takes six numbers: LAYERS,D,FF,HEADS,KV_HEADS,VOCAB")
                })?;
            }
            _ => bail!("unknown argument `{flag}`\n{USAGE}"),
        }
    }
    if let Some(m) = o.models.iter().find(|m| !m.is_file()) {
        bail!("--model {}: not a file", m.display());
    }
    if o.record.is_some() && !o.models.is_empty() && (o.models.len() != 1 || o.record_id.is_none())
    {
        bail!("--record with --model needs one file and --record-id ID");
    }
    Ok(o)
}

/// The F16 model, written by `synth-model` (built in cargo profile `profile`) when absent.
fn f16_model(dir: &Path, shape: &[usize; 6], profile: &str) -> Result<PathBuf> {
    let [layers, d, ff, heads, kv, vocab] = *shape;
    let path = dir.join(format!("synth-{layers}x{d}x{ff}-f16.gguf"));
    if !path.is_file() {
        let mut c = super::cargo();
        c.args([
            "run",
            "--profile",
            profile,
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

/// Runs `program` (with the environment variables `env`) and returns its stdout; a failed run is
/// reported and gives no figures.
fn bench(program: &Path, args: &[String], env: &[(&str, &str)]) -> String {
    let shown: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v} ")).collect();
    eprintln!(
        "xtask: $ {}{} {}",
        shown.concat(),
        program.display(),
        args.join(" ")
    );
    match Command::new(program)
        .args(args)
        .envs(env.iter().copied())
        .output()
    {
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
    let llama = crate::llama::tool_for(root, o.isa, "llama-bench")?;
    super::run(super::cargo().args(["build", "--profile", &o.profile, "-p", "sparrow"]))?;
    // Cargo's `dev` profile builds into `debug`.
    let out_dir = if o.profile == "dev" {
        "debug"
    } else {
        &o.profile
    };
    let sparrow = root.join("target").join(out_dir).join("sparrow");
    let files: Vec<(String, PathBuf)> = if o.models.is_empty() {
        let quantize = crate::llama::tool(root, "llama-quantize")?;
        let dir = root.join("target").join("synth").join("formats");
        std::fs::create_dir_all(&dir)?;
        let f16 = f16_model(&dir, &o.shape, &o.profile)?;
        o.formats
            .iter()
            .map(|f| Ok((f.clone(), quantized(&quantize, &f16, f, o.threads)?)))
            .collect::<Result<_>>()?
    } else {
        o.models
            .iter()
            .map(|m| {
                (
                    m.file_name()
                        .unwrap_or_default()
                        .to_string_lossy()
                        .into_owned(),
                    m.clone(),
                )
            })
            .collect()
    };
    let env: &[(&str, &str)] = match o.isa {
        Isa::Avx2 => &[("SPARROW_KERNELS", "avx2")],
        Isa::Native => &[],
    };
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
            l.push(llama_speeds(&bench(&llama, &la.map(String::from), &[])));
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
            s.push(sparrow_speeds(&bench(&sparrow, &sa.map(String::from), env)));
        }
    }
    let [layers, d, ff, heads, kv, vocab] = o.shape;
    let what = if o.models.is_empty() {
        format!(
            "SYNTHETIC model {layers} layers, d {d}, ff {ff}, {heads}/{kv} heads, vocab {vocab}"
        )
    } else {
        "the files given".to_string()
    };
    let isa = match o.isa {
        Isa::Native => "each side's own instruction sets",
        Isa::Avx2 => "AVX2 only (sparrow SPARROW_KERNELS=avx2, llama.cpp built without AVX-512)",
    };
    println!(
        "{what}; {isa}; {} thread(s), medians of {} round(s)\n",
        o.threads, o.rounds
    );
    println!(
        "| {} | MiB | llama.cpp pp{p} | sparrow pp{p} | prefill ratio | llama.cpp tg{n} | sparrow tg{n} | decode ratio |",
        if o.models.is_empty() { "format" } else { "file" }
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
    match (&o.record, o.models.is_empty()) {
        (Some(dir), true) => record(dir, &o, args, &ratios)?,
        (Some(dir), false) => record_model(dir, &o, args, &ratios[0])?,
        (None, _) => {}
    }
    Ok(())
}

/// A format's name, its prefill ratio and its decode ratio (sparrow / llama.cpp).
type FormatRatios = (String, Option<f64>, Option<f64>);
