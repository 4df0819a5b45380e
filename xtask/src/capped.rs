//! `cargo xtask capped-bench`: llama.cpp and Sparrow on the same model under the same cgroup memory
//! limit (v1 or v2), the page cache dropped before every run, in interleaved rounds.
//!
//! Each run gets a fresh cgroup (`sparrow-capped-PID-N` under the memory hierarchy) with
//! `memory.limit_in_bytes` (v1) or `memory.max` (v2) set to the cap and swap off where the kernel
//! allows; the program joins it before `exec` (a `sh` wrapper writes its pid to `cgroup.procs`). After
//! the run: the program's decode tok/s (llama-bench's `-o json` tg entry, `sparrow bench --json`'s
//! `tg_tok_s`) and, with `-p N`, its prompt tok/s (the pp entry, `pp_tok_s`; the time to first token
//! of an `N`-token prompt is `N` over it), its peak RSS (`wait4`'s `ru_maxrss`), its disk reads
//! (`ru_inblock`: page faults of the mapped file and direct reads alike; per decoded token with
//! `-p 0`), the cgroup's peak usage (`memory.max_usage_in_bytes` / `memory.peak`) and OOM kills
//! (`memory.oom_control` / `memory.events`). llama.cpp runs twice per round when its build can turn
//! weight repacking off (`--repack 0`): its default (which repacks Q4_0 into anonymous memory;
//! `--no-default` skips it) and its best configuration under a cap (repack off). The ratios are
//! Sparrow's decode (and prompt) speed over each llama.cpp configuration's, per round and as medians.
//! With a speculative `sparrow bench` (`-- --self-draft 4`, `--lookup N`, `--draft M`), which times
//! its prompts without and with speculation in one process, both decode speeds get their ratios
//! (and `--record` writes `ID-decode-spec.json` beside `ID-decode.json`, the one without).
//!
//! llama.cpp is built as docs/BENCHMARKS.md says, from the source vendored in the PyPI sdist
//! `llama-cpp-python==0.3.36` (`cmake` from a venv when absent), into `target/llama.cpp/`.
//! Needs root (cgroups, `drop_caches`) and Linux.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

use crate::llama::{has_no_repack, llama_speeds, median, sparrow_speeds, Speeds};

struct Opts {
    model: PathBuf,
    bundle: Option<PathBuf>,
    cap: Cap,
    budget: Option<u64>,
    rounds: usize,
    n_gen: usize,
    n_prompt: usize,
    threads: usize,
    /// Skip llama.cpp's default configuration (repacking into anonymous memory), which on a model
    /// much larger than the cap pages for many minutes or is OOM-killed.
    no_default: bool,
    sparrow_args: Vec<String>,
    /// `--record DIR --record-id ID`: result files `ID-decode.json` (and `ID-ttft.json` with `-p`)
    /// for `cargo xtask bench-report`.
    record: Option<(PathBuf, String)>,
}

#[derive(Clone, Copy)]
enum Cap {
    /// A share of the model file's size.
    Percent(f64),
    Bytes(u64),
}

fn usage() -> &'static str {
    "usage: cargo xtask capped-bench --model GGUF [--bundle RESIDENT.gguf] [--cap 50%|SIZE] [--budget SIZE] [--rounds 3] [-n 16] [-p 0] [--threads 2] [--no-default] [--record DIR --record-id ID] [-- SPARROW BENCH ARGS...]"
}

fn parse_size(s: &str) -> Result<u64> {
    let s = s.trim();
    let (num, mult) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1u64 << 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    let v: f64 = num
        .parse()
        .with_context(|| format!("`{s}` is not a size"))?;
    if !(v.is_finite() && v > 0.0) {
        bail!("`{s}` is not a positive size");
    }
    Ok((v * mult as f64) as u64)
}

fn parse(args: &[String]) -> Result<Opts> {
    let mut model = None;
    let mut o = Opts {
        model: PathBuf::new(),
        bundle: None,
        cap: Cap::Percent(50.0),
        budget: None,
        rounds: 3,
        n_gen: 16,
        n_prompt: 0,
        threads: 2,
        no_default: false,
        sparrow_args: Vec::new(),
        record: None,
    };
    let (mut record_dir, mut record_id) = (None, None);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--model" | "-m" => model = Some(PathBuf::from(value()?)),
            "--bundle" => o.bundle = Some(PathBuf::from(value()?)),
            "--cap" => {
                let v = value()?;
                o.cap = match v.strip_suffix('%') {
                    Some(p) => {
                        let p: f64 = p.parse().context("--cap: a percentage")?;
                        if !(p > 0.0 && p <= 100.0) {
                            bail!("--cap must be in (0%, 100%]");
                        }
                        Cap::Percent(p)
                    }
                    None => Cap::Bytes(parse_size(v)?),
                }
            }
            "--budget" => o.budget = Some(parse_size(value()?)?),
            "--rounds" => o.rounds = value()?.parse().context("--rounds: a count")?,
            "-n" => o.n_gen = value()?.parse().context("-n: a count")?,
            "-p" => o.n_prompt = value()?.parse().context("-p: a count")?,
            "--threads" => o.threads = value()?.parse().context("--threads: a count")?,
            "--no-default" => o.no_default = true,
            "--record" => record_dir = Some(PathBuf::from(value()?)),
            "--record-id" => record_id = Some(value()?.clone()),
            "--" => o.sparrow_args = it.by_ref().cloned().collect(),
            "-h" | "--help" => {
                eprintln!("{}", usage());
                std::process::exit(0);
            }
            _ => bail!("capped-bench: unknown option `{a}`\n{}", usage()),
        }
    }
    o.model = model.with_context(|| format!("--model is required\n{}", usage()))?;
    o.record = match (record_dir, record_id) {
        (Some(d), Some(i)) => Some((d, i)),
        (None, None) => None,
        _ => bail!("--record DIR and --record-id ID go together"),
    };
    if o.rounds == 0 || o.n_gen == 0 || o.threads == 0 {
        bail!("--rounds, -n and --threads must be at least 1");
    }
    Ok(o)
}

/// A memory cgroup of one run, removed when dropped.
struct Cgroup {
    dir: PathBuf,
    v2: bool,
}

impl Cgroup {
    fn new(limit: u64, n: usize) -> Result<Cgroup> {
        let name = format!("sparrow-capped-{}-{n}", std::process::id());
        let unified = Path::new("/sys/fs/cgroup");
        let v1 = unified.join("memory");
        let (dir, v2) = if v1.join("memory.limit_in_bytes").exists() {
            (v1.join(name), false)
        } else if std::fs::read_to_string(unified.join("cgroup.controllers"))
            .is_ok_and(|c| c.split_whitespace().any(|w| w == "memory"))
        {
            (unified.join(name), true)
        } else {
            bail!("no memory cgroup found (neither /sys/fs/cgroup/memory nor a cgroup v2 mount with the memory controller)");
        };
        std::fs::create_dir(&dir)
            .with_context(|| format!("creating {} (capped-bench needs root)", dir.display()))?;
        let cg = Cgroup { dir, v2 };
        if v2 {
            cg.write("memory.max", &limit.to_string())?;
            // Swap would let a run exceed the cap unseen; absent without swap accounting.
            let _ = cg.write("memory.swap.max", "0");
        } else {
            cg.write("memory.limit_in_bytes", &limit.to_string())?;
            let _ = cg.write("memory.memsw.limit_in_bytes", &limit.to_string());
        }
        Ok(cg)
    }

    fn write(&self, file: &str, value: &str) -> Result<()> {
        std::fs::write(self.dir.join(file), value)
            .with_context(|| format!("writing {value} to {}", self.dir.join(file).display()))
    }

    fn read(&self, file: &str) -> Option<String> {
        std::fs::read_to_string(self.dir.join(file)).ok()
    }

    /// The most memory (page cache included) the group held.
    fn peak(&self) -> Option<u64> {
        let f = if self.v2 {
            "memory.peak"
        } else {
            "memory.max_usage_in_bytes"
        };
        self.read(f)?.trim().parse().ok()
    }

    /// Processes of the group the OOM killer ended.
    fn oom_kills(&self) -> u64 {
        let f = if self.v2 {
            "memory.events"
        } else {
            "memory.oom_control"
        };
        self.read(f)
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("oom_kill "))
                    .and_then(|v| v.trim().parse().ok())
            })
            .unwrap_or(0)
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// Writes back dirty pages and drops the page cache, so no run starts with the model in memory.
fn drop_caches() -> Result<()> {
    super::run(&mut Command::new("sync"))?;
    std::fs::write("/proc/sys/vm/drop_caches", "3")
        .context("dropping the page cache (/proc/sys/vm/drop_caches; capped-bench needs root)")
}

/// What one run gave.
struct Outcome {
    stdout: String,
    ok: bool,
    status: String,
    peak_rss: u64,
    /// Bytes the program's threads read from the disk (`wait4`'s `ru_inblock`, 512-byte blocks):
    /// page faults of a mapped file and direct reads alike, the whole run (load and warm-up too).
    disk_read: u64,
    cgroup_peak: Option<u64>,
    oom_kills: u64,
}

/// Runs `program args` inside a fresh cgroup limited to `cap` bytes, after dropping the page cache.
fn run_capped(program: &Path, args: &[String], cap: u64, n: usize, log: &Path) -> Result<Outcome> {
    drop_caches()?;
    let cg = Cgroup::new(cap, n)?;
    let procs = cg.dir.join("cgroup.procs");
    let stderr =
        std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg("echo $$ > \"$1\" && shift && exec \"$@\"")
        .arg("sh")
        .arg(&procs)
        .arg(program)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(stderr);
    eprintln!(
        "xtask: $ (cgroup {} MiB) {} {}",
        cap >> 20,
        program.display(),
        args.join(" ")
    );
    let mut child = c
        .spawn()
        .with_context(|| format!("starting {}", program.display()))?;
    let mut stdout = String::new();
    if let Some(mut out) = child.stdout.take() {
        out.read_to_string(&mut stdout).ok();
    }
    let (status, peak_rss, disk_read) = super::sys::wait_with_rusage(child.id())?;
    let ok = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
    let status = if libc::WIFSIGNALED(status) {
        format!("killed by signal {}", libc::WTERMSIG(status))
    } else {
        format!("exit {}", libc::WEXITSTATUS(status))
    };
    Ok(Outcome {
        stdout,
        ok,
        status,
        peak_rss,
        disk_read,
        cgroup_peak: cg.peak(),
        oom_kills: cg.oom_kills(),
    })
}

/// A benchmarked program: its name in the table, binary, arguments and decode tok/s from its stdout.
/// A figure the ratios are printed for: its name and where a run's [`Speeds`] hold it.
/// What a ratio compares: its name, the value of a llama.cpp run and that of a sparrow run.
type Metric = (
    &'static str,
    fn(&Speeds) -> Option<f64>,
    fn(&Speeds) -> Option<f64>,
);

type Program<'a> = (&'a str, &'a Path, Vec<String>, fn(&str) -> Speeds);

/// The `cargo xtask capped-bench` task.
pub fn run(root: &Path, args: &[String]) -> Result<()> {
    let o = parse(args)?;
    let model_bytes = std::fs::metadata(&o.model)
        .with_context(|| format!("{}: cannot read the model", o.model.display()))?
        .len();
    let cap = match o.cap {
        Cap::Percent(p) => (model_bytes as f64 * p / 100.0) as u64,
        Cap::Bytes(b) => b,
    };
    // Sparrow's own budget leaves room for what the cgroup also charges (page cache of the binary,
    // buffers of the I/O thread).
    let budget = o.budget.unwrap_or(cap / 100 * 90);
    let llama = crate::llama::tool(root, "llama-bench")?;
    super::run(super::cargo().args(["build", "--release", "-p", "sparrow"]))?;
    let sparrow = root.join("target").join("release").join("sparrow");
    let logs = root.join("target").join("capped");
    std::fs::create_dir_all(&logs)?;
    let threads = o.threads.to_string();
    let (n_gen, n_prompt) = (o.n_gen.to_string(), o.n_prompt.to_string());
    let llama_args = |repack: bool| -> Vec<String> {
        let m = o.model.display().to_string();
        let mut a: Vec<String> = ["-m", &m, "-t", &threads, "-p", &n_prompt, "-n", &n_gen]
            .iter()
            .map(|s| s.to_string())
            .collect();
        a.extend(["-r", "1", "-o", "json"].map(String::from));
        if !repack {
            a.extend(["--repack", "0"].map(String::from));
        }
        a
    };
    let bundle = o.bundle.clone().unwrap_or_else(|| o.model.clone());
    let mut sparrow_args: Vec<String> = vec![
        "bench".into(),
        "-m".into(),
        bundle.display().to_string(),
        "--threads".into(),
        threads.clone(),
        "-p".into(),
        o.n_prompt.max(1).to_string(),
        "-n".into(),
        n_gen.clone(),
        "-r".into(),
        "1".into(),
        "--json".into(),
    ];
    if o.bundle.is_some() && !o.sparrow_args.iter().any(|a| a == "--memory-budget") {
        sparrow_args.extend(["--memory-budget".into(), budget.to_string()]);
    }
    sparrow_args.extend(o.sparrow_args.iter().cloned());
    let no_repack = has_no_repack(&llama);
    if o.no_default && !no_repack {
        bail!("--no-default: this llama-bench cannot turn repacking off, so it has no other configuration");
    }
    let mut programs: Vec<Program<'_>> = Vec::new();
    if !o.no_default {
        programs.push((
            "llama.cpp (default)",
            &llama,
            llama_args(true),
            llama_speeds,
        ));
    }
    if no_repack {
        programs.push((
            "llama.cpp (repack off)",
            &llama,
            llama_args(false),
            llama_speeds,
        ));
    }
    programs.push(("sparrow", &sparrow, sparrow_args, sparrow_speeds));

    eprintln!(
        "capped-bench: {} ({:.0} MiB), cap {:.0} MiB ({:.0}%), {} round(s), tg{}, pp{}, {} thread(s)",
        o.model.display(),
        model_bytes as f64 / 1048576.0,
        cap as f64 / 1048576.0,
        100.0 * cap as f64 / model_bytes as f64,
        o.rounds,
        o.n_gen,
        o.n_prompt,
        o.threads
    );
    let prompt = o.n_prompt > 0;
    let mut runs: Vec<Vec<Speeds>> = vec![Vec::new(); programs.len()];
    let mut n = 0;
    println!(
        "| round | program | tg tok/s |{} disk read MiB (whole run){} | peak RSS MiB | cgroup peak MiB | OOM kills | status |",
        if prompt {
            format!(" pp{0} tok/s | time to first token (pp{0}) s |", o.n_prompt)
        } else {
            String::new()
        },
        if prompt { "" } else { " | per decoded token" }
    );
    println!(
        "|---|---|---|{}---|---|---|---|---|{}",
        if prompt { "---|---|" } else { "" },
        if prompt { "" } else { "---|" }
    );
    let fmt = |v: Option<f64>| v.map_or("-".into(), |t| format!("{t:.2}"));
    for round in 1..=o.rounds {
        for (i, (name, bin, args, parse)) in programs.iter().enumerate() {
            n += 1;
            let log = logs.join(format!("run-{n}.stderr"));
            let r = run_capped(bin, args, cap, n, &log)?;
            let sp = if r.ok {
                parse(&r.stdout)
            } else {
                Speeds::default()
            };
            runs[i].push(sp);
            let pp = if prompt {
                format!(
                    " {} | {} |",
                    fmt(sp.pp),
                    fmt(sp.pp.map(|p| o.n_prompt as f64 / p))
                )
            } else {
                String::new()
            };
            let mib = r.disk_read as f64 / 1048576.0;
            // Without a prompt the run decodes only: its reads over its tokens (load and warm-up
            // included, so an upper bound for both programs).
            let per_token = if prompt {
                String::new()
            } else if sp.plain.is_some() {
                // A speculative bench decodes its prompts twice, each to its own length.
                " | -".into()
            } else {
                format!(" | {:.1}", mib / o.n_gen.max(1) as f64)
            };
            let tg = match sp.plain {
                Some(p) => format!("{} (without speculation {p:.2})", fmt(sp.tg)),
                None => fmt(sp.tg),
            };
            println!(
                "| {round} | {name} | {tg} |{pp} {mib:.0}{per_token} | {:.0} | {} | {} | {}{} |",
                r.peak_rss as f64 / 1048576.0,
                r.cgroup_peak
                    .map_or("-".into(), |p| format!("{:.0}", p as f64 / 1048576.0)),
                r.oom_kills,
                r.status,
                if r.ok { "" } else { " (see target/capped/)" }
            );
        }
    }
    let ours = &runs[programs.len() - 1];
    let spec = ours.iter().any(|s| s.plain.is_some());
    let mut metrics: Vec<Metric> = vec![(
        if spec {
            "decode with speculation"
        } else {
            "decode"
        },
        |s| s.tg,
        |s| s.tg,
    )];
    if spec {
        // A speculative bench times its prompts without speculation too, in the same process.
        metrics.push((
            "decode without speculation (the same sparrow runs)",
            |s| s.tg,
            |s| s.plain,
        ));
    }
    if prompt && !spec {
        metrics.push(("prompt (time to first token)", |s| s.pp, |s| s.pp));
    }
    for (i, (name, ..)) in programs.iter().enumerate().take(programs.len() - 1) {
        for (what, theirs, get) in &metrics {
            let ratios: Vec<String> = runs[i]
                .iter()
                .zip(ours)
                .map(|(t, s)| match (theirs(t), get(s)) {
                    (Some(t), Some(s)) if t > 0.0 => format!("{:.2}", s / t),
                    (_, Some(_)) => "∞ (llama.cpp failed)".into(),
                    _ => "- (sparrow failed)".into(),
                })
                .collect();
            let med = |v: &[Speeds], get: fn(&Speeds) -> Option<f64>| {
                median(v.iter().map(|s| get(s).unwrap_or(0.0)).collect())
            };
            println!(
                "sparrow / {name}, {what}: per round [{}], medians {} / {} tok/s",
                ratios.join(", "),
                med(ours, *get).map_or("-".into(), |v| format!("{v:.2}")),
                med(&runs[i], *theirs).map_or("-".into(), |v| format!("{v:.2}")),
            );
        }
    }
    if let Some((dir, id)) = &o.record {
        // Against the last llama.cpp configuration run: repack off where it can, its best under a cap.
        let last = programs.len() - 2; // programs end with sparrow after at least one llama.cpp
        let (name, ..) = programs[last];
        let theirs = &runs[last];
        let pct = 100.0 * cap as f64 / model_bytes as f64;
        let mut kept = Vec::new();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            if a == "--" {
                kept.push(a.as_str());
                kept.extend(it.by_ref().map(String::as_str));
            } else if a == "--record" || a == "--record-id" {
                it.next();
            } else {
                kept.push(a);
            }
        }
        let command = format!("cargo xtask capped-bench {}", kept.join(" "));
        for (suffix, what, get_theirs, get) in metrics.iter().map(|&(w, t, g)| {
            if w == "decode with speculation" {
                let what = format!("decode with speculation at a {pct:.0}% cap vs {name}");
                ("decode-spec", what, t, g)
            } else if w.starts_with("decode") {
                (
                    "decode",
                    format!("decode at a {pct:.0}% cap vs {name}"),
                    t,
                    g,
                )
            } else {
                (
                    "ttft",
                    format!(
                        "time to first token ({} tokens) at a {pct:.0}% cap vs {name}",
                        o.n_prompt
                    ),
                    t,
                    g,
                )
            }
        }) {
            let ratios: Vec<f64> = theirs
                .iter()
                .zip(ours)
                .filter_map(|(t, s)| match (get_theirs(t), get(s)) {
                    (Some(t), Some(s)) if t > 0.0 => Some(s / t),
                    _ => None,
                })
                .collect();
            if ratios.len() != ours.len() {
                eprintln!("capped-bench: not recording {id}-{suffix}: a round has no ratio (a failed run)");
                continue;
            }
            let worst = ratios.iter().copied().fold(f64::INFINITY, f64::min);
            let list: Vec<String> = ratios.iter().map(|r| format!("{r:.2}x")).collect();
            crate::bench_report::record_value(
                dir,
                crate::bench_report::Measurement {
                    id: format!("{id}-{suffix}"),
                    group: "Under a memory cap against llama.cpp".into(),
                    measures: what,
                    model: o
                        .model
                        .file_name()
                        .map_or("?".into(), |f| f.to_string_lossy().into_owned()),
                    synthetic: false,
                    value: Some((worst * 100.0).round() / 100.0),
                    unit: "x".into(),
                    target: None,
                    date: crate::bench_report::today(),
                    machine: crate::bench_report::this_machine(),
                    command: command.clone(),
                    source: "recorded by `cargo xtask capped-bench --record`".into(),
                    history: "benchmarks/capped.md".into(),
                    note: Some(format!(
                        "worst of {} round(s) ({})",
                        ratios.len(),
                        list.join(", ")
                    )),
                    plot: None,
                },
            )?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_outputs_parse() {
        assert_eq!(parse_size("512M").unwrap(), 512 << 20);
        assert_eq!(parse_size("1.5G").unwrap(), 3 << 29);
        assert!(parse_size("-1M").is_err() && parse_size("lots").is_err());
        let llama = r#"[{"n_prompt": 512, "n_gen": 0, "avg_ts": 300.0}, {"n_prompt": 0, "n_gen": 16, "avg_ts": 1.25}]"#;
        assert_eq!(
            llama_speeds(llama),
            Speeds {
                tg: Some(1.25),
                pp: Some(300.0),
                plain: None
            }
        );
        assert_eq!(llama_speeds("not json"), Speeds::default());
        assert_eq!(
            sparrow_speeds("noise\n{\"tg_tok_s\": 3.5, \"pp_tok_s\": 9.0}\n"),
            Speeds {
                tg: Some(3.5),
                pp: Some(9.0),
                plain: None
            }
        );
        // A speculative bench's report: the means of its repetitions with and without.
        let spec = r#"{"drafting": "self-draft", "lookup": {"plain_tok_s": [2.0, 4.0], "lookup_tok_s": [5.0, 7.0]}}"#;
        assert_eq!(
            sparrow_speeds(spec),
            Speeds {
                tg: Some(6.0),
                pp: None,
                plain: Some(3.0)
            }
        );
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        let args: Vec<String> = ["--model", "m.gguf", "--cap", "25%", "--", "--sparse"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let o = parse(&args).unwrap();
        assert!(matches!(o.cap, Cap::Percent(p) if p == 25.0));
        assert_eq!(o.sparrow_args, ["--sparse"]);
        assert!(!o.no_default);
        let args: Vec<String> = ["--model", "m.gguf", "--no-default"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert!(parse(&args).unwrap().no_default);
        assert!(parse(&["--cap".to_string(), "0%".to_string()]).is_err());
        let strings = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let o = parse(&strings(&[
            "-m",
            "m.gguf",
            "--record",
            "d",
            "--record-id",
            "cap1-x",
        ]))
        .unwrap();
        assert_eq!(o.record, Some((PathBuf::from("d"), "cap1-x".to_string())));
        assert!(parse(&strings(&["-m", "m.gguf", "--record", "d"])).is_err());
        assert!(parse(&strings(&["-m", "m.gguf", "--record-id", "x"])).is_err());
    }
}
