//! `cargo xtask load-test`: a bounded load test of `sparrow serve` on loopback. Builds the release
//! binary, starts the server on a free loopback port, runs `--clients` concurrent clients sending
//! completion requests for `--secs` seconds, stops the server, and reports requests, errors, p50/p99
//! latency, generated tokens per second and the server's RSS before and after. Fails when any request
//! failed. Figures are only meaningful on a quiet machine. `--abuse` runs the hostile soak instead
//! (`abuse.rs`; `--secs` defaults to 600 there); `--profile P` builds and runs that cargo profile's
//! binary (default `release`); `--memory-budget SIZE` is passed to the server.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

struct Opts {
    clients: usize,
    secs: f64,
    max_tokens: usize,
    model: Option<String>,
    threads: usize,
    record: Option<std::path::PathBuf>,
    abuse: bool,
    profile: String,
    memory_budget: Option<String>,
}

fn parse(args: &[String]) -> Result<Opts> {
    let mut o = Opts {
        clients: 8,
        secs: 60.0,
        max_tokens: 32,
        model: None,
        threads: 0,
        record: None,
        abuse: false,
        profile: "release".into(),
        memory_budget: None,
    };
    let mut secs_given = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--clients" => o.clients = value()?.parse().context("--clients: a count")?,
            "--secs" => {
                o.secs = value()?.parse().context("--secs: seconds")?;
                secs_given = true;
            }
            "--abuse" => o.abuse = true,
            "--profile" => o.profile = value()?.clone(),
            "--memory-budget" => o.memory_budget = Some(value()?.clone()),
            "--max-tokens" => o.max_tokens = value()?.parse().context("--max-tokens: a count")?,
            "--model" | "-m" => o.model = Some(value()?.clone()),
            "--threads" => o.threads = value()?.parse().context("--threads: a count")?,
            "--record" => o.record = Some(value()?.into()),
            "-h" | "--help" => {
                eprintln!("usage: cargo xtask load-test [--clients 8] [--secs 60] [--max-tokens 32] [--model M] [--threads T] [--record DIR] [--abuse] [--profile release] [--memory-budget SIZE]");
                std::process::exit(0);
            }
            _ => bail!("load-test: unknown option `{a}` (try --help)"),
        }
    }
    if o.abuse && !secs_given {
        o.secs = 600.0;
    }
    if !(1..=256).contains(&o.clients) {
        bail!("--clients must be between 1 and 256");
    }
    if !(o.secs > 0.0 && o.secs <= 3600.0) {
        bail!("--secs must be in (0, 3600]");
    }
    if o.max_tokens == 0 {
        bail!("--max-tokens must be at least 1");
    }
    Ok(o)
}

/// A size as `--memory-budget` takes it (`160M`, `1.5G`, bytes).
fn parse_size(s: &str) -> Result<u64> {
    let t = s.trim();
    let (num, mul) = match t.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&t[..t.len() - 1], 1u64 << 10),
        Some('M') => (&t[..t.len() - 1], 1 << 20),
        Some('G') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    let v: f64 = num
        .parse()
        .with_context(|| format!("--memory-budget: `{s}` is not a size"))?;
    if !(v.is_finite() && v >= 0.0) {
        bail!("--memory-budget: `{s}` is not a size");
    }
    Ok((v * mul as f64) as u64)
}

/// Resident set size of `pid` in bytes (Linux `/proc`).
fn rss(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .context("no VmRSS in /proc/PID/status")?;
    Ok(kb * 1024)
}

/// One completion request → (status, completion tokens).
fn complete(addr: SocketAddr, body: &str) -> Result<(u16, u64)> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(900)))?;
    write!(
        s,
        "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut resp = String::new();
    s.read_to_string(&mut resp)?;
    let status: u16 = resp
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context("no status line")?;
    let json = resp.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    let tokens = serde_json::from_str::<serde_json::Value>(json)
        .ok()
        .and_then(|v| v["usage"]["completion_tokens"].as_u64())
        .unwrap_or(0);
    Ok((status, tokens))
}

struct ServerProc(Child);

impl Drop for ServerProc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

/// Runs the load test (arguments after `load-test`).
pub fn run(root: &std::path::Path, args: &[String]) -> Result<()> {
    let o = parse(args)?;
    let st = Command::new(env!("CARGO"))
        .args(["build", "--profile", &o.profile, "-p", "sparrow"])
        .current_dir(root)
        .status()?;
    if !st.success() {
        bail!("building sparrow failed");
    }
    let dir = if o.profile == "dev" {
        "debug"
    } else {
        &o.profile
    };
    let bin = root.join("target").join(dir).join("sparrow");
    let mut cmd = Command::new(&bin);
    cmd.args(["serve", "--host", "127.0.0.1", "--port", "0"])
        .args(["--queue", &if o.abuse { 16 } else { o.clients }.to_string()])
        .args(["--threads", &o.threads.to_string()]);
    if let Some(m) = &o.model {
        cmd.args(["--model", m]);
    }
    if let Some(b) = &o.memory_budget {
        cmd.args(["--memory-budget", b]);
    }
    if o.abuse {
        cmd.args([
            "--max-connections",
            &crate::abuse::MAX_CONNECTIONS.to_string(),
        ]);
    }
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let stderr = child.stderr.take().context("stderr")?;
    let server = ServerProc(child);
    let mut lines = BufReader::new(stderr).lines();
    let mut addr: Option<SocketAddr> = None;
    for line in lines.by_ref() {
        let line = line?;
        eprintln!("{line}");
        if let Some(a) = line.split(" on http://").nth(1) {
            addr = Some(a.trim().parse().context("the server's address")?);
            break;
        }
    }
    let addr = addr.context("the server exited before listening")?;
    std::thread::spawn(move || lines.map_while(Result::ok).for_each(|l| eprintln!("{l}")));
    let pid = server.0.id();
    let body = |client: usize, k: usize| {
        serde_json::json!({
            "prompt": format!("Story {k} for reader {client}: once upon a time"),
            "max_tokens": o.max_tokens, "temperature": 0.8, "seed": k, "ignore_eos": true,
        })
        .to_string()
    };
    // Warm-up (page the weights in) before the first RSS reading.
    let (s, _) = complete(addr, &body(0, 0))?;
    if s != 200 {
        bail!("the warm-up request failed with status {s}");
    }
    let rss_before = rss(pid)?;
    if o.abuse {
        let budget = match &o.memory_budget {
            Some(b) => Some(parse_size(b)?),
            None => None,
        };
        return crate::abuse::soak(
            &bin,
            addr,
            pid,
            o.model.as_deref(),
            o.threads,
            o.secs,
            budget,
            rss_before,
        );
    }
    eprintln!(
        "xtask: load test: {} clients, {} s, {} tokens per request, on http://{addr}",
        o.clients, o.secs, o.max_tokens
    );
    let t0 = Instant::now();
    let end = t0 + Duration::from_secs_f64(o.secs);
    let handles: Vec<_> = (0..o.clients)
        .map(|c| {
            let bodies: Vec<String> = (1..=4096).map(|k| body(c, k)).collect();
            std::thread::spawn(move || {
                let mut lat = Vec::new();
                let (mut tokens, mut errors) = (0u64, 0u64);
                for b in bodies.iter().cycle() {
                    if Instant::now() >= end {
                        break;
                    }
                    let t = Instant::now();
                    match complete(addr, b) {
                        Ok((200, n)) => {
                            lat.push(t.elapsed().as_secs_f64());
                            tokens += n;
                        }
                        _ => errors += 1,
                    }
                }
                (lat, tokens, errors)
            })
        })
        .collect();
    let mut lat = Vec::new();
    let (mut tokens, mut errors) = (0u64, 0u64);
    for h in handles {
        let (l, t, e) = h.join().expect("a client thread");
        lat.extend(l);
        tokens += t;
        errors += e;
    }
    let wall = t0.elapsed().as_secs_f64();
    let rss_after = rss(pid)?;
    drop(server);
    lat.sort_by(f64::total_cmp);
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    println!(
        "load test: {} requests ({} errors) in {wall:.1} s from {} clients | latency p50 {:.3} s, p99 {:.3} s | {:.1} generated tok/s | RSS {:.1} MiB before, {:.1} MiB after ({:+.1} MiB)",
        lat.len(),
        errors,
        o.clients,
        percentile(&lat, 0.50),
        percentile(&lat, 0.99),
        tokens as f64 / wall,
        mib(rss_before),
        mib(rss_after),
        mib(rss_after) - mib(rss_before),
    );
    if let Some(dir) = &o.record {
        let rows = [
            (
                "server-errors",
                format!("failed requests, {} clients, {} s", o.clients, o.secs),
                errors as f64,
                "",
                Some(0.0),
            ),
            (
                "server-p50",
                format!(
                    "request latency p50, {} clients queued on one engine, {} tokens",
                    o.clients, o.max_tokens
                ),
                percentile(&lat, 0.50),
                " s",
                None,
            ),
            (
                "server-p99",
                format!(
                    "request latency p99, {} clients queued on one engine, {} tokens",
                    o.clients, o.max_tokens
                ),
                percentile(&lat, 0.99),
                " s",
                None,
            ),
            (
                "server-rss",
                format!("server RSS growth over {} s of load", o.secs),
                mib(rss_after) - mib(rss_before),
                " MiB",
                None,
            ),
        ];
        let mut command = format!(
            "cargo xtask load-test --clients {} --secs {} --max-tokens {}",
            o.clients, o.secs, o.max_tokens
        );
        if let Some(m) = &o.model {
            command.push_str(&format!(" --model {m}"));
        }
        if o.threads > 0 {
            command.push_str(&format!(" --threads {}", o.threads));
        }
        for (id, measures, value, unit, at_most) in rows {
            let m = crate::bench_report::Measurement {
                id: id.into(),
                group: "Server latency and load".into(),
                measures,
                model: o
                    .model
                    .clone()
                    .unwrap_or_else(|| "SmolLM2-135M-Instruct Q4_1".into()),
                synthetic: false,
                value: Some((value * 1000.0).round() / 1000.0),
                unit: unit.into(),
                target: at_most.map(|b| crate::bench_report::Target {
                    at_least: None,
                    at_most: Some(b),
                }),
                date: crate::bench_report::today(),
                machine: crate::bench_report::this_machine(),
                command: command.clone(),
                source: "recorded by `cargo xtask load-test --record`".into(),
                history: "benchmarks/server.md".into(),
                note: Some(format!(
                    "{} requests in {wall:.1} s",
                    lat.len() as u64 + errors
                )),
                plot: None,
            };
            crate::bench_report::record_value(dir, m)?;
        }
    }
    if errors > 0 {
        bail!("{errors} requests failed");
    }
    Ok(())
}
