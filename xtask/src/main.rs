//! Project automation, in the style of rust-analyzer's xtask: `cargo xtask <command>`.
//!
//! - `ci [--quick [--base REV]]`: everything CI checks, in one build per target: tool setup,
//!   `cargo fmt --check`, clippy and the host tests with the planner's Z3 feature folded in, the doc tests
//!   (the `ci` profile); beside them, on a thread of their own, the aarch64 tests of the crates with
//!   target-specific code under qemu, the static aarch64 `sparrow` benched on a fixture model under qemu
//!   (`deploy --emulate`) and `cargo check` of the library crates for aarch64-linux-android (the
//!   `ci-cross` and `ci-android` profiles, in `target/cross`); then the minutes each step took, and a warning past 25. `--quick`: fmt,
//!   clippy and host tests of the crates a change touches (see `ci.rs`).
//! - `tidy`: `cargo fmt --check` and `cargo clippy --workspace --all-targets -- -D warnings` (ci profile).
//! - `setup`: installs what the tests need (rustup targets; Debian's aarch64 cross toolchain and qemu).
//! - `test-aarch64`: runs the tests of kernels-neon, ufs-io, npu-qnn-sys and npu-qnn for
//!   aarch64-unknown-linux-gnu under qemu.
//! - `check-android`: `cargo check` of the library crates for aarch64-linux-android (no NDK: no linking).
//! - `android`: a static `sparrow` for `aarch64-unknown-linux-musl` (runs from `adb shell` without the NDK),
//!   checked to be a static AArch64 executable, then `check-android` (see `android.rs`).
//! - `deploy [--serial S] --model M [--emulate[=DIR]] [--out FILE] [-- BENCH-ARGS]`: pushes that binary
//!   and the model bundle with `adb`, runs `sparrow bench --json` on the device and pulls the result;
//!   `--emulate` does the same steps against a local folder with the binary under `qemu-aarch64`
//!   (see `android.rs`).
//! - `arm-count [--model GGUF] [--cpu max,cortex-a76] [-p 64] [-n 16] [--profile P] [--no-llama]
//!   [--record DIR] [--where K] [-- BENCH-ARGS]`: the NEON proxy: guest instructions per prompt and decoded token of
//!   that binary's `sparrow bench` and of llama.cpp's aarch64 `llama-bench` (cross-built statically
//!   into `target/llama.cpp/build-aarch64*`) under `qemu-aarch64 -cpu CPU` with an instruction-counting
//!   TCG plugin (`xtask/qemu/insn_count.c`, built with the host gcc); see `arm_count.rs`. `--where K`:
//!   the K functions with the most instructions per decoded token, per program (`arm_where.rs`).
//! - `fixtures [--no-gguf]`: rewrites the tiny synthetic models in `fixtures/` (see `fixtures.rs`), then the
//!   dequantization fixtures made by the PyPI `gguf` package in a venv under `target/` (see
//!   `gguf_fixtures.rs`; `--no-gguf` skips them, e.g. offline).
//! - `z3`: installs the Z3 library of the PyPI wheel `z3-solver` under `target/z3/lib` and prints the
//!   variables that build and run the planner's `z3` feature against it (`z3.rs`); `ci` builds and tests
//!   the workspace with that feature.
//! - `synth-model`: writes a SYNTHETIC model of a realistic shape (default 32 layers, d 4096, ff 14336, ReLU,
//!   Q4_0, 4.0 GB) with random weights whose activations follow a planted power law, streamed to
//!   `target/synth/` (see `synth.rs`; `--help` lists the options). A dev build re-runs it as a release build
//!   (`cargo run --release -p xtask -- synth-model ...`): unoptimized generation is about 6x slower.
//!   `--arch qwen3` writes the qwen3 family instead (Qwen3-0.6B's shape by default, SiLU, per-head q/k
//!   norms, `--head-dim`; see `synth_arch.rs`). With `--arch qwen3moe|mixtral|olmoe|qwen2moe` it writes a
//!   synthetic Mixture-of-Experts model of that architecture's real shape in llama.cpp's layout
//!   (`synth_moe.rs`; `--arch A --help` lists its options).
//! - `synth-reference --model GGUF --out DIR [--text FILE] [--ctx N] [--chunks K] [-n N]`: llama.cpp's
//!   token ids, perplexity and greedy continuations on a synthetic model file, written as a reference
//!   fixture that tests compare the engine with (see `synth_reference.rs`); llama.cpp as for
//!   `capped-bench`. (`llama-reference` does the same for a named model, in its own format: to unify.)
//! - `fuzz [--time S] [--cases N] [--seed X] [--targets a,b]`: a longer round of the stable fuzzer
//!   (`crates/engine/tests/it/fuzz_round.rs`; CI runs a short one with the test suite) over the parsers of
//!   untrusted files: targets `gguf`, `hf`, `tokenizer`, `chat_template`, `profile`, `predictor`,
//!   `store`, `manifest`. Each target runs S seconds (default 30) or N cases, whichever ends first
//!   (`--cases` alone: no time limit); `--seed` defaults to the clock, and is printed so a finding is reproduced
//!   by passing it again. Prints executions, accepted and refused inputs and findings per target; a
//!   panic (or a case over 2 s) is a finding, its input saved under `target/tmp/fuzz-PID/findings/`,
//!   and fails the task. `--libfuzzer`: the cargo-fuzz targets of `fuzz/` (same names) instead, each for
//!   S seconds with `-rss_limit_mb=1024 -timeout=10`, seeded from the round's seeds (`fuzz/corpus/<target>/`);
//!   installs the nightly toolchain (rustup) and cargo-fuzz (`cargo install`) when missing. Crashes
//!   are left in `fuzz/artifacts/<target>/`.
//! - `load-test [--clients 8] [--secs 60] [--max-tokens 32] [--model M] [--threads T] [--record DIR]`: a bounded load test
//!   of `sparrow serve` on loopback (see `load_test.rs`): p50/p99 latency, tokens/s, errors (any fails the
//!   task), server RSS before and after. Measure on a quiet machine. `--abuse [--secs 600] [--profile P]
//!   [--memory-budget SIZE]`: hostile clients (silent, slow-loris, oversized, never-ending, malformed,
//!   cancelled) mixed with normal greedy ones for 10 minutes; fails if a normal request fails or its text
//!   differs from `sparrow run`'s, or if the server's peak RSS passes the budget (else its RSS after
//!   warm-up) + 64 MiB + 2 MiB per connection (`abuse.rs`).
//! - `capped-bench --model GGUF [--bundle RESIDENT.gguf] [--cap 50%|SIZE] [--budget SIZE] [--rounds 3] [-n 16]
//!   [-p 0] [--record DIR --record-id ID] [-- SPARROW BENCH ARGS]`: llama.cpp's `llama-bench` (default, and repack off where it can) and
//!   `sparrow bench` under the same cgroup memory limit, page cache dropped before each run, interleaved
//!   rounds; decode ratios, peak RSS, the cgroup's peak and OOM kills (see `capped.rs`). Root, Linux.
//! - `bench-formats [--isa native|avx2] [--rounds R] [-p N] [-n N] [--formats F,...] [--model A.gguf,...]
//!   [--profile P] [--record DIR [--record-id ID]]`: one SYNTHETIC model in every weight format
//!   (written in F16 by `synth-model`, the others made by llama.cpp's `llama-quantize`), or the files of
//!   `--model`, `llama-bench` and `sparrow bench` on each in turn; a table of prompt and decode tok/s and
//!   ratios (see `bench_formats.rs`). llama.cpp is built as for `capped-bench` (`llama.rs`); with
//!   `--isa avx2` a second build without AVX-512 (`target/llama.cpp/build-avx2`) against sparrow's AVX2
//!   kernels (`SPARROW_KERNELS=avx2`).
//! - `bench-report [--check]`: regenerates the table at the top of docs/BENCHMARKS.md (every target, its
//!   latest value, date, machine and command) and the plots it embeds (`docs/plots/*.svg`) from the result
//!   files in `docs/benchmarks/results/`; `--check` fails instead of writing when they differ (see
//!   `bench_report.rs`). `load-test --record DIR`, `capped-bench --record DIR --record-id ID` and
//!   `bench-formats --record DIR` write such result files (a row that exists keeps what it is and its
//!   target; its value, date, machine and command are replaced).
//! - `cli-docs [--check]`: regenerates docs/CLI.md from the `sparrow` CLI's clap definitions
//!   (`sparrow __cli-markdown`); `--check` fails instead of writing when it differs.
//! - `llama-reference [--model gemma3-270m] [--gguf PATH] [--only tokenize|perplexity|completion]`: llama.cpp's
//!   outputs on a named model (`llama-tokenize` ids of a few hundred texts, `llama-perplexity` on WikiText-2,
//!   greedy `llama-completion` ids) written under `fixtures/<model>/` for the
//!   tests, which never build or run llama.cpp (see `llama_reference.rs`; it needs llama.cpp already
//!   built in `target/llama.cpp/build/bin/`).
//!
//! Invariant: every step that CI needs is here or in a test's own setup; `.ci/run` only calls `cargo xtask ci`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

mod abuse;
mod android;
mod arm_count;
mod arm_where;
mod bench_formats;
mod bench_report;
mod capped;
mod ci;
mod cli_docs;
mod fixtures;
mod gguf_fixtures;
mod llama;
mod llama_reference;
mod load_test;
mod synth;
mod synth_arch;
mod synth_moe;
mod synth_reference;
mod synth_relu;
mod synth_routing;
mod sys;
mod z3;

/// Library crates checked for Android (everything but the binaries).
const ANDROID_CRATES: &[&str] = &[
    "tensor-types",
    "atomic-out",
    "kernels-neon",
    "model-format",
    "model-tokenizer",
    "ufs-io",
    "neuron-cache",
    "neuron-store",
    "predictor",
    "sampling",
    "model-fetch",
    "accel",
    "accel-qnn",
    "transformer",
    "offload",
    "model-bundle",
    "calibrate",
    "engine",
    "server",
    "npu-qnn-sys",
    "npu-qnn",
    "qnn-double",
];
/// Debian packages for the aarch64 cross tests.
const APT_PACKAGES: &[&str] = &[
    "gcc-aarch64-linux-gnu",
    "libc6-dev-arm64-cross",
    "qemu-user",
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask sits in the workspace root")
        .to_path_buf()
}

fn run(cmd: &mut Command) -> Result<()> {
    eprintln!("xtask: $ {:?}", cmd);
    let status = cmd
        .status()
        .with_context(|| format!("starting {:?}", cmd.get_program()))?;
    if !status.success() {
        bail!("{:?} failed: {status}", cmd.get_program());
    }
    Ok(())
}

fn cargo() -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(root());
    c
}

fn have(program: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {program} >/dev/null 2>&1"))
        .status()
        .is_ok_and(|s| s.success())
}

fn setup() -> Result<()> {
    let installed = String::from_utf8(
        Command::new("rustup")
            .args(["target", "list", "--installed"])
            .output()?
            .stdout,
    )?;
    for target in [
        "aarch64-unknown-linux-gnu",
        "aarch64-linux-android",
        android::MUSL_TARGET,
    ] {
        if !installed.lines().any(|l| l.trim() == target) {
            run(Command::new("rustup").args(["target", "add", target]))?;
        }
    }
    let missing = !have("aarch64-linux-gnu-gcc")
        || !have("qemu-aarch64")
        || !Path::new("/usr/aarch64-linux-gnu/lib").is_dir();
    if missing {
        let sudo: &[&str] = if have("sudo") && !is_root() {
            &["sudo"]
        } else {
            &[]
        };
        let apt = |args: &[&str]| {
            let mut c = Command::new(sudo.first().copied().unwrap_or("apt-get"));
            if !sudo.is_empty() {
                c.arg("apt-get");
            }
            c.args(args).env("DEBIAN_FRONTEND", "noninteractive");
            run(&mut c)
        };
        apt(&["update", "-qq"])?;
        let mut args = vec!["install", "-y", "-qq", "--no-install-recommends"];
        args.extend_from_slice(APT_PACKAGES);
        apt(&args)?;
    }
    Ok(())
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout.starts_with(b"0"))
        .unwrap_or(false)
}

/// `tidy`: formatting and lints, as CI checks them (`cargo fmt --check`, `cargo clippy -D warnings` on every
/// crate and target of the workspace in CI's profile, with the planner's Z3 feature when its library is
/// installed under `target/z3/lib`, as `cargo xtask z3` or `ci` leave it).
fn tidy() -> Result<()> {
    ci::fmt_check()?;
    let lib = root().join("target").join("z3").join("lib");
    let z3 = lib.join("libz3.so").is_file().then_some(lib);
    ci::clippy(z3.as_deref(), &["--workspace"])
}

/// Set in the environment of the release build that `synth-model` re-runs itself as.
const SYNTH_RELEASE_ENV: &str = "SPARROW_XTASK_SYNTH_RELEASE";

/// `synth-model`. Unoptimized (`cargo xtask` is a dev build) generation is about 6x slower, so a dev build
/// checks the options, then re-runs the task as `cargo run --release -p xtask`.
fn synth_model() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(2).collect();
    let help = args.iter().any(|a| a == "-h" || a == "--help");
    // `--arch` names the family: the MoE ones are `synth_moe.rs`'s, the dense ones `synth.rs`'s.
    let arch = args
        .iter()
        .enumerate()
        .find_map(|(i, a)| match a.strip_prefix("--arch=") {
            Some(v) => Some(v),
            None if a == "--arch" => args.get(i + 1).map(|v| v.as_str()),
            None => None,
        });
    let moe = arch.is_some_and(|a| synth_moe::ARCHES.contains(&a));
    if moe && help {
        println!("{}", synth_moe::USAGE);
        return Ok(());
    }
    if cfg!(debug_assertions) && !help && std::env::var_os(SYNTH_RELEASE_ENV).is_none() {
        if moe {
            synth_moe::Options::parse(&args)?;
        } else {
            synth::Options::parse(&args)?;
        }
        eprintln!("xtask: synth-model runs optimized: re-running as `cargo run --release -p xtask -- synth-model`");
        // Not `cargo()`: the working directory stays, so a relative `--out` means the same.
        let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        c.args(["run", "--release", "--manifest-path"])
            .arg(root().join("Cargo.toml"));
        c.args(["-p", "xtask", "--", "synth-model"])
            .args(&args)
            .env(SYNTH_RELEASE_ENV, "1");
        return run(&mut c);
    }
    if moe {
        return synth_moe::main(&args, &root());
    }
    synth::main(&args, &root())
}

/// `fuzz`: runs the fuzz round test (release build) with the limits passed as its environment.
fn fuzz(args: &[String]) -> Result<()> {
    let mut time: Option<f64> = None;
    let mut cases: Option<u64> = None;
    let mut seed: Option<u64> = None;
    let mut targets: Option<String> = None;
    let mut libfuzzer = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || {
            it.next()
                .with_context(|| format!("{a} needs a value"))
                .cloned()
        };
        match a.as_str() {
            "--time" => time = Some(value()?.parse().context("--time: seconds")?),
            "--cases" => cases = Some(value()?.parse().context("--cases: a count")?),
            "--seed" => seed = Some(value()?.parse().context("--seed: an integer")?),
            "--targets" => targets = Some(value()?),
            "--libfuzzer" => libfuzzer = true,
            "-h" | "--help" => {
                eprintln!(
                    "usage: cargo xtask fuzz [--time S] [--cases N] [--seed X] [--targets a,b]"
                );
                return Ok(());
            }
            _ => bail!("fuzz: unknown option `{a}` (try --help)"),
        }
    }
    if libfuzzer {
        return fuzz_libfuzzer(time.unwrap_or(30.0), cases, targets);
    }
    let (time, cases) = match (time, cases) {
        (None, Some(n)) => (1e9, n),
        (t, n) => (t.unwrap_or(30.0), n.unwrap_or(u64::MAX)),
    };
    let seed = seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    eprintln!("xtask: fuzz seed {seed} (pass --seed {seed} to repeat this round)");
    let mut c = cargo();
    c.args(["test", "--release", "-p", "engine", "--test", "it"])
        .args(["--", "fuzz_round::fuzz_round", "--exact", "--nocapture"])
        .env("SPARROW_FUZZ_TIME", time.to_string())
        .env("SPARROW_FUZZ_CASES", cases.to_string())
        .env("SPARROW_FUZZ_SEED", seed.to_string())
        .env("SPARROW_FUZZ_TARGETS", targets.unwrap_or_default());
    run(&mut c)
}

/// Targets of the `fuzz/` crate (the stable round's names).
const FUZZ_TARGETS: &[&str] = &[
    "gguf",
    "hf",
    "tokenizer",
    "chat_template",
    "profile",
    "predictor",
    "store",
    "manifest",
    "plan",
    "server_request",
];

/// Seeds of the `server_request` target (its stable round is a proptest in the server crate, so the
/// engine's round exports none): the endpoint byte (1: chat) then a body.
const SERVER_REQUEST_SEEDS: &[&str] = &[
    "\0{\"prompt\": \"hello\", \"max_tokens\": 4, \"temperature\": 0.5, \"top_p\": 0.9, \"stop\": [\"x\"], \"seed\": 3, \"n\": 2}",
    "\0{\"prompt\": [1, 2, 3], \"stream\": true, \"stream_options\": {\"include_usage\": true}}",
    "\u{1}{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"hi\"}]}], \"max_tokens\": 3}",
];

/// `fuzz --libfuzzer`: nightly and cargo-fuzz (installed when missing), seeds exported by the stable
/// round, then each target for `time` seconds (or `cases` runs).
fn fuzz_libfuzzer(time: f64, cases: Option<u64>, targets: Option<String>) -> Result<()> {
    let toolchains = String::from_utf8(
        Command::new("rustup")
            .args(["toolchain", "list"])
            .output()
            .context("rustup is needed for --libfuzzer")?
            .stdout,
    )?;
    if !toolchains.lines().any(|l| l.starts_with("nightly")) {
        run(Command::new("rustup").args([
            "toolchain",
            "install",
            "nightly",
            "--profile",
            "minimal",
        ]))?;
    }
    let has_cargo_fuzz = cargo()
        .args(["fuzz", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_cargo_fuzz {
        run(cargo().args(["install", "cargo-fuzz", "--locked"]))?;
    }
    let corpus = root().join("fuzz").join("corpus");
    run(cargo()
        .args(["test", "--release", "-p", "engine", "--test", "it"])
        .args(["--", "fuzz_round::fuzz_round", "--exact"])
        .env("SPARROW_FUZZ_EXPORT", &corpus))?;
    let requests = corpus.join("server_request");
    std::fs::create_dir_all(&requests)?;
    for (i, seed) in SERVER_REQUEST_SEEDS.iter().enumerate() {
        std::fs::write(requests.join(format!("seed-{i}")), seed)?;
    }
    let chosen: Vec<&str> = match &targets {
        Some(t) => t.split(',').collect(),
        None => FUZZ_TARGETS.to_vec(),
    };
    let mut failed = Vec::new();
    for t in chosen {
        if !FUZZ_TARGETS.contains(&t) {
            bail!("unknown fuzz target `{t}` (known: {FUZZ_TARGETS:?})");
        }
        let mut c = Command::new("cargo");
        c.current_dir(root())
            .env_remove("RUSTUP_TOOLCHAIN")
            .env_remove("CARGO")
            .args(["+nightly", "fuzz", "run", "--release", t])
            .arg(corpus.join(t))
            // 1 GiB of memory and 10 s per input: an OOM or a hang is a finding, as a crash is.
            .args([
                "--",
                "-rss_limit_mb=1024",
                "-timeout=10",
                "-print_final_stats=1",
            ])
            .arg(format!("-max_total_time={}", time.ceil() as u64));
        if let Some(n) = cases {
            c.arg(format!("-runs={n}"));
        }
        if let Err(e) = run(&mut c) {
            eprintln!("xtask: fuzz target {t}: {e:#} (crash input in fuzz/artifacts/{t}/)");
            failed.push(t);
        }
    }
    if !failed.is_empty() {
        bail!("libFuzzer found crashes in {failed:?}");
    }
    Ok(())
}

fn main() -> Result<()> {
    let task = std::env::args().nth(1).unwrap_or_default();
    match task.as_str() {
        "ci" => ci::main(&std::env::args().skip(2).collect::<Vec<_>>()),
        "setup" => setup(),
        "tidy" => tidy(),
        "test-aarch64" => ci::test_aarch64(ci::CROSS_PROFILE),
        "ci-deploy-fixture" => ci::deploy_emulated_fixture(
            &std::env::args()
                .nth(2)
                .context("ci-deploy-fixture needs a cargo profile")?,
        ),
        "check-android" => ci::check_android(),
        "android" => android::android(),
        "arm-count" => arm_count::main(&std::env::args().skip(2).collect::<Vec<_>>()),
        "deploy" => {
            let args: Vec<String> = std::env::args().skip(2).collect();
            android::deploy(&android::DeployOptions::parse(&args)?).map(drop)
        }
        "fixtures" => {
            for p in fixtures::write_all(&root().join("fixtures"))? {
                eprintln!("xtask: wrote {}", p.display());
            }
            if !std::env::args().skip(2).any(|a| a == "--no-gguf") {
                for p in gguf_fixtures::write(&root())? {
                    eprintln!("xtask: wrote {}", p.display());
                }
            }
            Ok(())
        }
        "synth-model" => synth_model(),
        "z3" => z3::main(&root()),
        "fuzz" => fuzz(&std::env::args().skip(2).collect::<Vec<_>>()),
        "load-test" => load_test::run(&root(), &std::env::args().skip(2).collect::<Vec<_>>()),
        "capped-bench" => capped::run(&root(), &std::env::args().skip(2).collect::<Vec<_>>()),
        "llama-reference" => {
            llama_reference::run(&root(), &std::env::args().skip(2).collect::<Vec<_>>())
        }
        "synth-reference" => {
            synth_reference::run(&root(), &std::env::args().skip(2).collect::<Vec<_>>())
        }
        "bench-formats" => {
            bench_formats::run(&root(), &std::env::args().skip(2).collect::<Vec<_>>())
        }
        "bench-report" => bench_report::run(&root(), &std::env::args().skip(2).collect::<Vec<_>>()),
        "cli-docs" => cli_docs::run(&root(), &std::env::args().skip(2).collect::<Vec<_>>()),
        _ => {
            eprintln!("usage: cargo xtask <ci [--quick [--base REV]] | setup | tidy | test-aarch64 | check-android | android | deploy [--serial S] --model M [--emulate] | fixtures [--no-gguf] | synth-model [--help] | synth-reference --model GGUF --out DIR | fuzz [--time S] [--cases N] | load-test [--clients N] [--secs S] [--abuse] | capped-bench --model GGUF [--bundle B] [--cap 50%] | bench-formats [--isa native|avx2] [--rounds R] | bench-report [--check] | cli-docs [--check] | llama-reference [--model M] [--only tokenize|perplexity|completion] | z3>");
            bail!("unknown task `{task}`")
        }
    }
}
