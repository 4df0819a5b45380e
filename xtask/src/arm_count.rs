//! `cargo xtask arm-count`: the NEON proxy, guest instructions per token of the static aarch64
//! `sparrow bench` and of llama.cpp's aarch64 `llama-bench` under `qemu-aarch64`, until a device run
//! exists (docs/BENCHMARKS.md, "NEON proxy").
//!
//! - The counter is a qemu TCG plugin (`xtask/qemu/insn_count.c`, built with the host `gcc -shared`
//!   into `target/qemu-plugin/libinsn_count.so`): one inline add per translated block executed.
//! - sparrow: the static binary of `cargo xtask android` ([`crate::android::build_static`],
//!   `--profile`).
//! - llama.cpp: `llama-bench` cross-built statically with Debian's `aarch64-linux-gnu-gcc/g++` from
//!   the same unpacked PyPI sdist as the x86 build (`llama.rs`), into
//!   `target/llama.cpp/build-aarch64` (`armv8.2-a+dotprod+i8mm+fp16`, for `-cpu max`) or
//!   `build-aarch64-dotprod` (`armv8.2-a+dotprod+fp16`, for a CPU model without i8mm such as
//!   `cortex-a76`: an i8mm build would stop there on an illegal instruction).
//! - Per token: each program runs four times, one thread, no warm-up run counted twice: a prompt of
//!   P and of P/2 tokens (no decode), a decode of N and of N/2 tokens (no prompt); a token's
//!   instructions are the difference of the two counts over the difference of tokens, so loading,
//!   start-up and the fixed costs cancel.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

use crate::android::{build_static, RELEASE};
use crate::arm_where;
use crate::bench_report::{record_value, Measurement, NEON_GROUP};
use crate::{have, root, run};

const USAGE: &str = "usage: cargo xtask arm-count [--model GGUF] [--cpu max[,cortex-a76,...]] [-p 64] [-n 16]
  [--profile release] [--no-llama] [--record DIR] [--where K | --where-prompt K] [-- SPARROW-BENCH-ARGS]
  Guest instructions per prompt and per decoded token of sparrow and llama.cpp under qemu-aarch64 -cpu CPU
  (one thread each), and their ratio (llama.cpp / sparrow: above 1, sparrow executes fewer).
  --where K: instead, the K functions with the most instructions per decoded token, for each program;
  --where-prompt K: the same per prompt token (a prompt of -p tokens against one of half as many).";

/// The model of the proxy by default (fetched by `sparrow bench -m smollm2-135m` when absent).
const DEFAULT_MODEL: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// What a run is asked for.
struct Opts {
    model: PathBuf,
    cpus: Vec<String>,
    n_prompt: usize,
    n_gen: usize,
    profile: String,
    llama: bool,
    record: Option<PathBuf>,
    sparrow_args: Vec<String>,
    /// `--where K`: the top K functions per decoded token instead of the totals.
    top: usize,
    /// `--where-prompt K`: [`Opts::top`] per prompt token instead.
    where_prompt: bool,
}

fn parse(args: &[String]) -> Result<Opts> {
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    let mut o = Opts {
        model: home.join(".cache/sparrow/models").join(DEFAULT_MODEL),
        cpus: vec!["max".into()],
        n_prompt: 64,
        n_gen: 16,
        profile: RELEASE.into(),
        llama: true,
        record: None,
        sparrow_args: Vec::new(),
        top: 0,
        where_prompt: false,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || {
            it.next()
                .with_context(|| format!("arm-count: {a} needs a value"))
        };
        match a.as_str() {
            "--model" | "-m" => o.model = PathBuf::from(value()?),
            "--cpu" => o.cpus = value()?.split(',').map(str::to_string).collect(),
            "-p" => o.n_prompt = value()?.parse().context("arm-count: -p: a token count")?,
            "-n" => o.n_gen = value()?.parse().context("arm-count: -n: a token count")?,
            "--profile" => o.profile = value()?.clone(),
            "--record" => o.record = Some(PathBuf::from(value()?)),
            "--no-llama" => o.llama = false,
            "--where" => o.top = value()?.parse().context("arm-count: --where: a count")?,
            "--where-prompt" => {
                o.top = value()?
                    .parse()
                    .context("arm-count: --where-prompt: a count")?;
                o.where_prompt = true;
            }
            "--" => {
                o.sparrow_args = it.by_ref().cloned().collect();
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            _ => bail!("arm-count: unknown option `{a}`\n{USAGE}"),
        }
    }
    if o.n_prompt < 2 || o.n_gen < 2 {
        bail!("arm-count: -p and -n need at least 2 tokens (each is measured against its half)");
    }
    if !o.model.is_file() {
        bail!(
            "arm-count: {}: no such model file (`sparrow bench -m smollm2-135m` fetches the default one)",
            o.model.display()
        );
    }
    Ok(o)
}

/// Builds the instruction-counting plugin (when its source is newer than the library) and returns
/// the library's path.
pub fn plugin() -> Result<PathBuf> {
    let src = root().join("xtask").join("qemu").join("insn_count.c");
    let dir = root().join("target").join("qemu-plugin");
    let lib = dir.join("libinsn_count.so");
    let mtime = |p: &Path| fs::metadata(p).and_then(|m| m.modified()).ok();
    if lib.is_file() && mtime(&lib) >= mtime(&src) {
        return Ok(lib);
    }
    fs::create_dir_all(&dir)?;
    run(Command::new("gcc")
        .args([
            "-shared",
            "-fPIC",
            "-O2",
            "-fvisibility=hidden",
            "-Wall",
            "-o",
        ])
        .arg(&lib)
        .arg(&src))
    .context("building the qemu plugin (needs the host gcc)")?;
    Ok(lib)
}

/// Guest instructions `bin args` executes under `qemu-aarch64 -cpu cpu` with the plugin `lib`.
pub fn count(lib: &Path, cpu: &str, bin: &Path, args: &[String]) -> Result<u64> {
    // One file per xtask process: two counts may run at once.
    let out = root()
        .join("target")
        .join("qemu-plugin")
        .join(format!("count-{}.txt", std::process::id()));
    let _ = fs::remove_file(&out);
    let mut plugin = std::ffi::OsString::from(lib);
    plugin.push(",out=");
    plugin.push(&out);
    let mut cmd = Command::new("qemu-aarch64");
    cmd.args(["-cpu", cpu]).arg("-plugin").arg(plugin);
    cmd.arg(bin).args(args).stdout(Stdio::null());
    eprintln!(
        "xtask: $ qemu-aarch64 -cpu {cpu} ... {} {}",
        bin.display(),
        args.join(" ")
    );
    let o = cmd
        .stderr(Stdio::piped())
        .output()
        .context("starting qemu-aarch64")?;
    if !o.status.success() {
        let err = String::from_utf8_lossy(&o.stderr);
        let tail: Vec<&str> = err.lines().rev().take(8).collect();
        bail!(
            "{} under qemu -cpu {cpu} failed ({}): {}",
            bin.display(),
            o.status,
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    let text = fs::read_to_string(&out).with_context(|| format!("reading {}", out.display()))?;
    text.trim()
        .parse()
        .with_context(|| format!("{}: not a count: {text:?}", out.display()))
}

/// llama.cpp's static aarch64 `llama-bench` for `cpu` (see the module's documentation).
fn llama_bench(cpu: &str) -> Result<PathBuf> {
    let (dir, arch) = if cpu.starts_with("max") {
        ("build-aarch64", "armv8.2-a+dotprod+i8mm+fp16")
    } else {
        ("build-aarch64-dotprod", "armv8.2-a+dotprod+fp16")
    };
    let llama = root().join("target").join("llama.cpp");
    let build = llama.join(dir);
    let bin = build.join("bin").join("llama-bench");
    if bin.is_file() {
        return Ok(bin);
    }
    // The x86 build unpacks the sdist (and makes a venv with cmake where there is none).
    crate::llama::tool(&root(), "llama-bench")?;
    let src = fs::read_dir(&llama)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.join("vendor").join("llama.cpp").is_dir())
        .context("no unpacked llama-cpp-python sdist under target/llama.cpp")?
        .join("vendor")
        .join("llama.cpp");
    let venv_cmake = llama.join("venv").join("bin").join("cmake");
    let cmake = if have("cmake") {
        PathBuf::from("cmake")
    } else {
        venv_cmake
    };
    if !have("aarch64-linux-gnu-g++") {
        bail!("arm-count: no aarch64-linux-gnu-g++ (apt-get install g++-aarch64-linux-gnu)");
    }
    run(Command::new(&cmake)
        .arg("-S")
        .arg(&src)
        .arg("-B")
        .arg(&build)
        .args([
            "-DCMAKE_BUILD_TYPE=Release",
            "-DLLAMA_CURL=OFF",
            "-DCMAKE_SYSTEM_NAME=Linux",
            "-DCMAKE_SYSTEM_PROCESSOR=aarch64",
            "-DCMAKE_C_COMPILER=aarch64-linux-gnu-gcc",
            "-DCMAKE_CXX_COMPILER=aarch64-linux-gnu-g++",
            "-DGGML_NATIVE=OFF",
            "-DGGML_OPENMP=OFF",
            "-DBUILD_SHARED_LIBS=OFF",
            "-DCMAKE_EXE_LINKER_FLAGS=-static",
            "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_SERVER=OFF",
        ])
        .arg(format!("-DGGML_CPU_ARM_ARCH={arch}")))?;
    run(Command::new(&cmake)
        .arg("--build")
        .arg(&build)
        .args(["--target", "llama-bench", "-j2"]))?;
    Ok(bin)
}

/// Instructions per prompt token and per decoded token.
#[derive(Debug, Clone, Copy)]
struct PerToken {
    prompt: f64,
    decode: f64,
}

/// Counts `bench(p, n)`'s instructions at (P, 0), (P/2, 0), (0, N), (0, N/2).
fn per_token(
    o: &Opts,
    lib: &Path,
    cpu: &str,
    bin: &Path,
    bench: impl Fn(usize, usize) -> Vec<String>,
) -> Result<PerToken> {
    let (p, n) = (o.n_prompt, o.n_gen);
    let c = |p, n| count(lib, cpu, bin, &bench(p, n));
    let prompt = (c(p, 0)? as f64 - c(p / 2, 0)? as f64) / (p - p / 2) as f64;
    let decode = (c(0, n)? as f64 - c(0, n / 2)? as f64) / (n - n / 2) as f64;
    Ok(PerToken { prompt, decode })
}

/// `cargo xtask arm-count`.
pub fn main(args: &[String]) -> Result<()> {
    let o = parse(args)?;
    let lib = plugin()?;
    let sparrow = build_static(&o.profile)?;
    let model = o.model.display().to_string();
    let ours_args = |p: usize, n: usize| {
        let mut a: Vec<String> = ["bench", "-m", &model, "-t", "1", "-r", "1"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        a.extend(["-p".into(), p.to_string(), "-n".into(), n.to_string()]);
        a.extend(o.sparrow_args.iter().cloned());
        a
    };
    let theirs_args = |p: usize, n: usize| {
        let a = [
            "-m",
            &model,
            "-t",
            "1",
            "-r",
            "1",
            "--no-warmup",
            "-o",
            "json",
        ];
        let mut a: Vec<String> = a.iter().map(|s| s.to_string()).collect();
        a.extend(["-p".into(), p.to_string(), "-n".into(), n.to_string()]);
        a
    };
    if o.top > 0 {
        let cpu = &o.cpus[0];
        let (n, h, unit) = if o.where_prompt {
            (o.n_prompt, o.n_prompt / 2, "prompt token")
        } else {
            (o.n_gen, o.n_gen / 2, "decoded token")
        };
        let where_ = |what: &str, bin: &Path, args: &dyn Fn(usize, usize) -> Vec<String>| {
            let run = |len: usize| {
                if o.where_prompt {
                    args(len, 0)
                } else {
                    args(0, len)
                }
            };
            let long = arm_where::profile(&lib, cpu, bin, &run(n))?;
            let short = arm_where::profile(&lib, cpu, bin, &run(h))?;
            arm_where::print_top(what, unit, &long, &short, (n, h), o.top);
            anyhow::Ok(())
        };
        where_("sparrow", &sparrow, &ours_args)?;
        if o.llama {
            where_("llama.cpp", &llama_bench(cpu)?, &theirs_args)?;
        }
        return Ok(());
    }
    let mut rows = Vec::new();
    for cpu in &o.cpus {
        let ours = per_token(&o, &lib, cpu, &sparrow, ours_args)?;
        let theirs = if o.llama {
            let bin = llama_bench(cpu)?;
            Some(per_token(&o, &lib, cpu, &bin, theirs_args)?)
        } else {
            None
        };
        rows.push((cpu.clone(), ours, theirs));
    }
    print_table(&o, &rows);
    if let Some(dir) = &o.record {
        record(dir, &o, args, &rows)?;
    }
    Ok(())
}

type Row = (String, PerToken, Option<PerToken>);

fn print_table(o: &Opts, rows: &[Row]) {
    let m = 1e6;
    println!(
        "{}: guest instructions per token (millions), one thread, prompt {} vs {} tokens, decode {} vs {}",
        o.model.display(),
        o.n_prompt,
        o.n_prompt / 2,
        o.n_gen,
        o.n_gen / 2
    );
    println!("| qemu -cpu | sparrow prompt | llama.cpp prompt | ratio | sparrow decode | llama.cpp decode | ratio |");
    println!("|---|---|---|---|---|---|---|");
    for (cpu, s, l) in rows {
        let (lp, ld) = l.map_or((f64::NAN, f64::NAN), |l| (l.prompt, l.decode));
        println!(
            "| {cpu} | {:.2} | {:.2} | {:.2}x | {:.2} | {:.2} | {:.2}x |",
            s.prompt / m,
            lp / m,
            lp / s.prompt,
            s.decode / m,
            ld / m,
            ld / s.decode
        );
    }
}

/// The short name of a model file in the results' ids. Sparrow's named models (`model_fetch::
/// KNOWN_MODELS`, by file name and size) by their first word, less a version after a dot
/// (`qwen2.5-coder-0.5b-...` -> `qwen`, `SmolLM2-135M-...` -> `smollm2`, `gemma-3-270m-...` ->
/// `gemma`); `bench-formats`' synthetic files (`synth-16x1024x2816-q5_k_m`) by their format
/// (`q5km`), which tells one from another; any other file by its whole name, lowercased, dots as
/// dashes, less underscores (`olmoe-4l`, `smollm2-f16`): a file made from a named model (re-quantized,
/// renamed) never takes that model's id, whose results it would overwrite.
fn short_name(file: &str, bytes: Option<u64>) -> String {
    let lower = file.to_lowercase();
    if let Some(rest) = lower.strip_prefix("synth-") {
        return rest.rsplit('-').next().unwrap_or(rest).replace('_', "");
    }
    let known = model_fetch::KNOWN_MODELS
        .iter()
        .any(|k| k.file.strip_suffix(".gguf") == Some(file) && bytes == Some(k.bytes));
    if !known {
        return lower.replace('.', "-").replace('_', "");
    }
    let word = lower.split('-').next().unwrap_or(&lower);
    match word.split_once('.') {
        Some((head, _)) => head
            .trim_end_matches(|c: char| c.is_ascii_digit())
            .to_string(),
        None => word.to_string(),
    }
}

/// The fewest prompt tokens whose count is recorded as a prefill figure: shorter prompts run
/// decode's kernels (a 2-token prompt against a 1-token one measures those).
const MIN_RECORDED_PROMPT: usize = 16;

/// `--record DIR`: the decode ratio of the first CPU model, and its prompt ratio where the prompt
/// has [`MIN_RECORDED_PROMPT`] tokens or more, as results of the NEON proxy group.
fn record(dir: &Path, o: &Opts, args: &[String], rows: &[Row]) -> Result<()> {
    let Some((cpu, s, Some(l))) = rows.first() else {
        eprintln!("arm-count: not recording: no llama.cpp count");
        return Ok(());
    };
    let mut kept = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--record" {
            it.next();
        } else {
            kept.push(a.as_str());
        }
    }
    let stem = o
        .model
        .file_name()
        .map(|f| f.to_string_lossy().to_string())
        .unwrap_or_default();
    let name = stem.trim_end_matches(".gguf");
    let bytes = std::fs::metadata(&o.model).ok().map(|m| m.len());
    let short = short_name(name, bytes);
    for (what, ours, theirs, n, run) in [
        ("decode", s.decode, l.decode, o.n_gen, "decode"),
        ("prefill", s.prompt, l.prompt, o.n_prompt, "prompts"),
    ] {
        if what == "prefill" && n < MIN_RECORDED_PROMPT {
            continue;
        }
        let m = Measurement {
            id: format!("neon-{short}-{what}"),
            group: NEON_GROUP.into(),
            measures: format!(
                "{what} instructions per token vs llama.cpp (qemu -cpu {cpu}, {run} of {n} vs {} tokens)",
                n / 2
            ),
            model: name.replace(".Q", " Q"),
            synthetic: name.to_lowercase().starts_with("synth-"),
            value: Some((theirs / ours * 100.0).round() / 100.0),
            unit: "x".into(),
            target: None,
            date: crate::bench_report::today(),
            machine: format!("qemu-aarch64 -cpu {cpu} (TCG instruction count) on {}", crate::bench_report::this_machine()),
            command: format!("cargo xtask arm-count {}", kept.join(" ")).trim_end().into(),
            source: "recorded by `cargo xtask arm-count --record`".into(),
            history: "benchmarks/neon-proxy.md".into(),
            note: Some(format!(
                "llama.cpp's guest instructions per token over sparrow's ({:.2}M vs {:.2}M): a proxy, not a speed",
                theirs / 1e6,
                ours / 1e6
            )),
            plot: None,
        };
        record_value(dir, m)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::short_name;

    #[test]
    fn short_names_are_the_results_ids() {
        let size = |f: &str| {
            let k = model_fetch::KNOWN_MODELS
                .iter()
                .find(|k| k.file == format!("{f}.gguf"));
            Some(k.map_or(1, |k| k.bytes))
        };
        for (file, want) in [
            ("qwen2.5-coder-0.5b-instruct-q4_k_m", "qwen"),
            ("SmolLM2-135M-Instruct.Q4_1", "smollm2"),
            ("gemma-3-270m-q4_k_m", "gemma"),
            ("synth-16x1024x2816-q5_k_m", "q5km"),
            ("synth-16x1024x2816-iq4_xs", "iq4xs"),
            ("model", "model"),
            ("olmoe-4l", "olmoe-4l"),
            // Made from a named model: their own ids, not the model's.
            ("smollm2-f16", "smollm2-f16"),
            ("SmolLM2-135M-Instruct.Q8_0", "smollm2-135m-instruct-q80"),
        ] {
            assert_eq!(short_name(file, size(file)), want, "{file}");
        }
        // A named model's file name on another file (re-quantized and renamed): not its id.
        let renamed = short_name("SmolLM2-135M-Instruct.Q4_1", Some(1));
        assert_eq!(renamed, "smollm2-135m-instruct-q41");
    }
}
