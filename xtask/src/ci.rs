//! `cargo xtask ci` (everything CI checks) and `cargo xtask ci --quick` (the inner loop).
//!
//! The whole run builds the workspace once per target: clippy, rustdoc (every crate with its private
//! items, warnings as errors), the host tests and the doc tests use the
//! `ci` profile of the workspace's `Cargo.toml` (no LTO, no debug info), with the planner's `z3` feature
//! folded in (`sparrow/z3`, the PyPI wheel's library from [`crate::z3`]), so the planner's Z3 tests need
//! no build of their own. The host tests run under `cargo nextest` when it is installed (every test in a
//! process of its own, two at a time) and `cargo test` otherwise. Beside those host steps, on a thread of
//! their own, in `target/cross`, run the aarch64 steps: clippy and rustdoc of the aarch64-only code
//! (which the host's never see), the tests of the crates with target-specific code under qemu (the
//! lighter `ci-cross` profile), the static Android binary benched under qemu (`deploy --emulate`) and
//! `cargo check` for aarch64-linux-android (both in `ci-android`, unoptimised but for the kernels);
//! their log is `target/ci-logs/cross.log`. Each step's minutes are printed at the end, with a loud
//! warning past [`WARN_MINUTES`] (a warning, not a failure: these hosts vary twofold in speed from day to day).
//!
//! `--quick [--base REV]`: formatting, clippy and the host tests of the crates whose files changed since
//! `REV` (default: the uncommitted changes, or the last commit when there are none), found with
//! `git diff` and `cargo metadata`; a change outside every crate (the workspace's manifest, `.cargo/`,
//! `fixtures/`) takes the whole workspace, one to the docs alone takes none.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};

use crate::{android, cargo, root, run};

/// The cargo profile of CI's host builds (clippy, the tests).
pub const PROFILE: &str = "ci";
/// The cargo profile of CI's aarch64 test builds (`Cargo.toml` says why it differs).
pub const CROSS_PROFILE: &str = "ci-cross";
/// The cargo profile of CI's static Android binary and Android check: unoptimised but for the kernels.
pub const ANDROID_PROFILE: &str = "ci-android";
/// A whole run longer than this prints a warning.
pub const WARN_MINUTES: f64 = 25.0;
/// The host build's features: the planner's Z3 solver, through the CLI that exposes it.
const Z3_FEATURES: &str = "sparrow/z3";
/// Crates with target-specific code (SIMD kernels, Linux AIO syscall numbers, the QNN FFI and its
/// test double's ABI), whose tests also run for aarch64 under qemu.
pub const AARCH64_TEST_CRATES: &[&str] = &["kernels-neon", "ufs-io", "npu-qnn-sys", "npu-qnn"];

/// Steps and their durations, printed when the run ends (failed or not).
struct Timings {
    start: Instant,
    steps: Vec<(String, f64)>,
}

impl Timings {
    fn new() -> Self {
        Timings {
            start: Instant::now(),
            steps: Vec::new(),
        }
    }

    /// Runs `f` as the step `name`, recording its minutes.
    fn step<T>(&mut self, name: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        eprintln!("xtask: ci step `{name}`");
        let t = Instant::now();
        let r = f();
        self.steps
            .push((name.to_string(), t.elapsed().as_secs_f64() / 60.0));
        r.with_context(|| format!("ci step `{name}`"))
    }

    /// `--record DIR`: the whole run's minutes as the result `ci-minutes` for `cargo xtask bench-report`.
    fn record(&self, dir: &Path) -> Result<()> {
        let total = self.start.elapsed().as_secs_f64() / 60.0;
        let steps: Vec<String> = self
            .steps
            .iter()
            .map(|(name, m)| format!("{name} {m:.1}"))
            .collect();
        let m = crate::bench_report::Measurement {
            id: "ci-minutes".into(),
            group: "CI".into(),
            measures: "minutes of `cargo xtask ci` (what `.ci/run` runs)".into(),
            model: "the test suite (fixtures, SmolLM2-135M, Qwen2.5-Coder-0.5B)".into(),
            synthetic: false,
            value: Some((total * 10.0).round() / 10.0),
            unit: " min".into(),
            target: Some(crate::bench_report::Target {
                at_least: None,
                at_most: Some(20.0),
            }),
            date: crate::bench_report::today(),
            machine: crate::bench_report::this_machine(),
            command: "cargo xtask ci --record docs/benchmarks/results (on a clean clone)".into(),
            source: "recorded by `cargo xtask ci --record`".into(),
            history: "benchmarks/ci.md".into(),
            note: Some(format!("minutes per step: {}", steps.join(", "))),
            plot: None,
        };
        crate::bench_report::record_value(dir, m).map(drop)
    }

    fn report(&self, passed: bool) {
        let total = self.start.elapsed().as_secs_f64() / 60.0;
        eprintln!("xtask: ci minutes per step");
        for (name, m) in &self.steps {
            eprintln!("xtask:   {m:6.2}  {name}");
        }
        eprintln!(
            "xtask:   {total:6.2}  total ({})",
            if passed { "passed" } else { "FAILED" }
        );
        if total > WARN_MINUTES {
            let bar = "!".repeat(78);
            eprintln!("{bar}\nxtask: WARNING: this ci run took {total:.1} minutes, over the {WARN_MINUTES} it should stay under.\nxtask: WARNING: find the step that grew (above) before it pushes CI past its 90-minute limit.\n{bar}");
        }
    }
}

/// `cargo xtask ci [--quick [--base REV]]`.
pub fn main(args: &[String]) -> Result<()> {
    let mut quick = false;
    let mut base = None;
    let mut record = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--quick" => quick = true,
            "--base" => base = Some(it.next().context("--base needs a git revision")?.clone()),
            "--record" => {
                record = Some(PathBuf::from(it.next().context("--record needs a folder")?))
            }
            "-h" | "--help" => {
                eprintln!("usage: cargo xtask ci [--record DIR] | ci --quick [--base REV]");
                return Ok(());
            }
            _ => bail!("ci: unknown option `{a}` (try --help)"),
        }
    }
    if base.is_some() && !quick {
        bail!("ci: --base goes with --quick");
    }
    if record.is_some() && quick {
        bail!("ci: --record measures the whole run, not --quick");
    }
    let mut t = Timings::new();
    let r = if quick {
        quick_run(&mut t, base.as_deref())
    } else {
        full(&mut t)
    };
    t.report(r.is_ok());
    r?;
    if let Some(dir) = record {
        t.record(&dir)?;
    }
    eprintln!("xtask: ci passed");
    Ok(())
}

fn full(t: &mut Timings) -> Result<()> {
    t.step("setup (rustup targets, apt)", crate::setup)?;
    // The aarch64 and Android builds share nothing with the host's: they run beside it, in a target
    // folder of their own (cargo locks a target folder while it builds), and fill the cores that the
    // host build's serial stretches (links, the last large crates, the tests' downloads) leave idle.
    let cross = Cross::start()?;
    let host = host_steps(t);
    if host.is_err() {
        cross.stop();
        return host;
    }
    let steps = t.step("aarch64 and Android steps (waiting for them)", || {
        cross.join()
    })?;
    for (name, minutes) in steps {
        t.steps
            .push((format!("  beside the host steps: {name}"), minutes));
    }
    Ok(())
}

/// The host's steps: formatting, the Z3 library, clippy, the tests.
fn host_steps(t: &mut Timings) -> Result<()> {
    t.step("fmt", fmt_check)?;
    let z3 = t.step("z3 library", || crate::z3::install(&root()))?;
    t.step("clippy (host, every target, z3)", || {
        clippy(Some(&z3), &["--workspace"])
    })?;
    t.step("rustdoc (host, private items)", || rustdoc(&z3))?;
    t.step("host tests (z3)", || {
        host_tests(Some(&z3), &["--workspace"])
    })?;
    t.step("doc tests", || doc_tests(&z3))
}

/// CI's aarch64 and Android builds, on a thread of their own; their output goes to [`Cross::LOG`].
struct Cross {
    handle: std::thread::JoinHandle<Result<Vec<(String, f64)>>>,
    /// The running step's process, 0 between steps.
    pid: std::sync::Arc<std::sync::atomic::AtomicU32>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Cross {
    /// The log of the cross steps, under the workspace root.
    const LOG: &'static str = "target/ci-logs/cross.log";
    /// Their target folder, under the workspace root.
    const TARGET_DIR: &'static str = "target/cross";

    fn start() -> Result<Self> {
        use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
        use std::sync::Arc;
        let log = root().join(Self::LOG);
        std::fs::create_dir_all(log.parent().context("a log folder")?)?;
        let file = std::fs::File::create(&log).with_context(|| format!("{}", log.display()))?;
        eprintln!(
            "xtask: the aarch64 and Android steps run beside the host steps; their log: {}",
            log.display()
        );
        let pid = Arc::new(AtomicU32::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s) = (pid.clone(), stop.clone());
        let handle = std::thread::spawn(move || -> Result<Vec<(String, f64)>> {
            let mut done = Vec::new();
            for (name, mut cmd) in cross_steps()? {
                if s.load(Ordering::SeqCst) {
                    bail!("stopped");
                }
                let t = Instant::now();
                let mut out = file.try_clone()?;
                use std::io::Write;
                writeln!(out, "xtask: ci step `{name}`: {cmd:?}")?;
                cmd.env("CARGO_TARGET_DIR", root().join(Self::TARGET_DIR))
                    .stdin(std::process::Stdio::null())
                    .stdout(out.try_clone()?)
                    .stderr(out);
                let mut child = cmd.spawn().with_context(|| format!("starting `{name}`"))?;
                p.store(child.id(), Ordering::SeqCst);
                let status = child.wait()?;
                p.store(0, Ordering::SeqCst);
                if !status.success() {
                    bail!("`{name}` failed ({status})");
                }
                done.push((name, t.elapsed().as_secs_f64() / 60.0));
            }
            Ok(done)
        });
        Ok(Cross { handle, pid, stop })
    }

    /// Waits for the steps; on a failure, prints the end of their log.
    fn join(self) -> Result<Vec<(String, f64)>> {
        let r = self
            .handle
            .join()
            .map_err(|_| anyhow::anyhow!("the aarch64 and Android thread panicked"))?;
        if r.is_err() {
            let log = std::fs::read_to_string(root().join(Self::LOG)).unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            eprintln!("xtask: the end of {}:", Self::LOG);
            for l in &lines[lines.len().saturating_sub(80)..] {
                eprintln!("{l}");
            }
        }
        r
    }

    /// Ends the running step and skips the rest (the host steps failed).
    fn stop(self) {
        use std::sync::atomic::Ordering;
        self.stop.store(true, Ordering::SeqCst);
        let pid = self.pid.load(Ordering::SeqCst);
        if pid != 0 {
            // cargo forwards the signal to the compilers it started.
            let _ = Command::new("kill").arg(pid.to_string()).status();
        }
        let _ = self.handle.join();
    }
}

/// Clippy and rustdoc of the aarch64-only code, the aarch64 tests under qemu (in [`CROSS_PROFILE`]),
/// the static Android binary benched under qemu and the Android check (in [`ANDROID_PROFILE`]):
/// each a command.
fn cross_steps() -> Result<Vec<(String, Command)>> {
    let mut deploy = Command::new(std::env::current_exe().context("the xtask binary")?);
    deploy
        .args(["ci-deploy-fixture", ANDROID_PROFILE])
        .current_dir(root());
    Ok(vec![
        (
            "clippy (aarch64 kernels)".to_string(),
            aarch64_clippy(CROSS_PROFILE),
        ),
        (
            "rustdoc (aarch64 kernels-neon, private items)".to_string(),
            aarch64_rustdoc(CROSS_PROFILE),
        ),
        (
            "aarch64 tests under qemu".to_string(),
            aarch64_tests(CROSS_PROFILE),
        ),
        (
            "static Android binary, deploy --emulate".to_string(),
            deploy,
        ),
        (
            "check for aarch64-linux-android".to_string(),
            android_check(ANDROID_PROFILE),
        ),
    ])
}

/// `cargo fmt --check` over the workspace.
pub fn fmt_check() -> Result<()> {
    run(cargo().args(["fmt", "--all", "--", "--check"]))
}

/// `cargo clippy -D warnings` on every target of `packages` in the ci profile, with the Z3 feature when
/// `z3` (the library's folder) is given.
pub fn clippy(z3: Option<&Path>, packages: &[&str]) -> Result<()> {
    let mut c = cargo();
    c.args(["clippy", "--profile", PROFILE, "--all-targets"])
        .args(packages);
    if let Some(lib) = z3 {
        c.args(["--features", Z3_FEATURES]);
        crate::z3::env(&mut c, lib);
    }
    c.args(["--", "-D", "warnings"]);
    run(&mut c)
}

/// `cargo doc` of every workspace crate with its private items in the ci profile and clippy's
/// features (so that it reuses clippy's checked dependencies: seconds), rustdoc's warnings as
/// errors: a broken or ambiguous link, or public documentation naming a private item.
pub fn rustdoc(z3: &Path) -> Result<()> {
    let mut c = cargo();
    c.args(["doc", "--profile", PROFILE, "--workspace", "--no-deps"])
        .args(["--document-private-items", "--features", Z3_FEATURES])
        .env("RUSTDOCFLAGS", "-D warnings");
    crate::z3::env(&mut c, z3);
    run(&mut c)
}

fn have_nextest() -> bool {
    cargo()
        .args(["nextest", "--version"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The host tests of `packages` (`--tests`: the libraries' and binaries' unit tests and the
/// integration tests; the doc tests run apart), with the Z3 feature when `z3` (the library's folder)
/// is given. Examples are not built here (clippy has checked them; building them for `cargo test`
/// took a minute of CI's two cores).
fn host_tests(z3: Option<&Path>, packages: &[&str]) -> Result<()> {
    let mut c = cargo();
    if have_nextest() {
        c.args([
            "nextest",
            "run",
            "--cargo-profile",
            PROFILE,
            "--no-fail-fast",
        ]);
    } else {
        c.args(["test", "--profile", PROFILE, "--no-fail-fast"]);
    }
    c.args(packages).arg("--tests");
    if let Some(lib) = z3 {
        c.args(["--features", Z3_FEATURES]);
        crate::z3::env(&mut c, lib);
    }
    run(&mut c)
}

/// The doc tests (nextest does not run them); the libraries are those the host tests built.
fn doc_tests(z3: &Path) -> Result<()> {
    let mut c = cargo();
    c.args(["test", "--profile", PROFILE, "--workspace", "--doc"])
        .args(["--features", Z3_FEATURES]);
    crate::z3::env(&mut c, z3);
    run(&mut c)
}

/// `cargo xtask test-aarch64`: the tests of [`AARCH64_TEST_CRATES`] for `aarch64-unknown-linux-gnu`
/// under qemu.
pub fn test_aarch64(profile: &str) -> Result<()> {
    run(&mut aarch64_tests(profile))
}

fn aarch64_tests(profile: &str) -> Command {
    let mut c = cargo();
    c.args([
        "test",
        "--profile",
        profile,
        "--target",
        "aarch64-unknown-linux-gnu",
    ]);
    for k in AARCH64_TEST_CRATES {
        c.args(["-p", k]);
    }
    // Tests that re-run their own binary in a child process (atomic_out::testing) start it through
    // the same emulator as cargo's runner (.cargo/config.toml); there may be no binfmt handler.
    c.env(
        "SPARROW_TEST_RUNNER",
        "qemu-aarch64 -L /usr/aarch64-linux-gnu",
    );
    // Property tests are slow under emulation; fewer cases still cover every path.
    c.env(
        "PROPTEST_CASES",
        std::env::var("PROPTEST_CASES").unwrap_or_else(|_| "64".into()),
    );
    c
}

/// `cargo xtask check-android`: `cargo check` of the library crates for `aarch64-linux-android` (no
/// NDK: nothing is linked).
pub fn check_android() -> Result<()> {
    run(&mut android_check(ANDROID_PROFILE))
}

/// The crates with `target_arch`/`target_os` cfgs (`kernels-neon`'s NEON kernels, the others'
/// branches for targets other than x86_64 or for Android): code the host's clippy never sees.
const AARCH64_LINT_CRATES: &[&str] = &[
    "kernels-neon",
    "ufs-io",
    "offload",
    "engine",
    "model-format",
    "model-tokenizer",
];

/// `cargo clippy -D warnings` of [`AARCH64_LINT_CRATES`] (every target) for
/// `aarch64-unknown-linux-gnu`.
fn aarch64_clippy(profile: &str) -> Command {
    let mut c = cargo();
    c.args([
        "clippy",
        "--profile",
        profile,
        "--target",
        "aarch64-unknown-linux-gnu",
        "--all-targets",
    ]);
    for k in AARCH64_LINT_CRATES {
        c.args(["-p", k]);
    }
    c.args(["--", "-D", "warnings"]);
    c
}

/// `cargo doc` of `kernels-neon` (its NEON kernels) for `aarch64-unknown-linux-gnu` with its private
/// items, rustdoc's warnings (broken intra-doc links) as errors.
fn aarch64_rustdoc(profile: &str) -> Command {
    let mut c = cargo();
    c.args([
        "doc",
        "--profile",
        profile,
        "--target",
        "aarch64-unknown-linux-gnu",
        "-p",
        "kernels-neon",
        "--no-deps",
        "--document-private-items",
    ]);
    c.env("RUSTDOCFLAGS", "-D warnings");
    c
}

fn android_check(profile: &str) -> Command {
    let mut c = cargo();
    c.args([
        "check",
        "--profile",
        profile,
        "--target",
        "aarch64-linux-android",
    ]);
    for k in crate::ANDROID_CRATES {
        c.args(["-p", k]);
    }
    c
}

/// `cargo xtask ci-deploy-fixture PROFILE` (CI's own step): the static binary built in `PROFILE`
/// benches a fixture model under qemu for a few tokens (`deploy --emulate`), and the result pulled back
/// must hold positive speeds.
pub fn deploy_emulated_fixture(profile: &str) -> Result<()> {
    let args: Vec<String> = [
        "--emulate",
        "--profile",
        profile,
        "--model",
        "fixtures/tiny-llama-silu-q4_0.gguf",
        "--",
        "-p",
        "8",
        "-n",
        "4",
        "-r",
        "1",
        "--threads",
        "2",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut o = android::DeployOptions::parse(&args)?;
    o.model = root().join(&o.model);
    let v = android::deploy(&o)?;
    if !(v["pp_tok_s"].as_f64() > Some(0.0) && v["tg_tok_s"].as_f64() > Some(0.0)) {
        bail!("deploy --emulate: no positive speeds in {v}");
    }
    Ok(())
}

/// `--quick`: fmt, then clippy and the host tests of the changed crates.
fn quick_run(t: &mut Timings, base: Option<&str>) -> Result<()> {
    let files = t.step("changed files (git)", || changed_files(base))?;
    let packages = t.step("crates touched (cargo metadata)", || {
        packages_touched(&files)
    })?;
    match &packages {
        Touched::Nothing => eprintln!("xtask: ci --quick: no crate changed"),
        Touched::All => {
            eprintln!("xtask: ci --quick: the whole workspace (a change outside every crate)")
        }
        Touched::Some(p) => eprintln!("xtask: ci --quick: {}", p.join(", ")),
    }
    t.step("fmt", fmt_check)?;
    let args: Vec<String> = match &packages {
        Touched::Nothing => return Ok(()),
        Touched::All => vec!["--workspace".into()],
        Touched::Some(p) => p.iter().flat_map(|k| ["-p".into(), k.clone()]).collect(),
    };
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    // The Z3 feature only when its library is already installed (the quick loop downloads nothing).
    let lib = root().join("target").join("z3").join("lib");
    let z3 = lib.join("libz3.so").is_file().then_some(lib);
    let z3_applies = match &packages {
        Touched::All => true,
        Touched::Some(p) => p.iter().any(|k| k == "sparrow"),
        Touched::Nothing => false,
    };
    let z3 = z3.filter(|_| z3_applies);
    t.step("clippy (changed crates)", || clippy(z3.as_deref(), &args))?;
    t.step("host tests (changed crates)", || {
        host_tests(z3.as_deref(), &args)
    })
}

/// Paths (relative to the root) changed since `base`, or in the work tree (untracked files too), or
/// else by the last commit.
fn changed_files(base: Option<&str>) -> Result<Vec<String>> {
    let git = |args: &[&str]| -> Result<Vec<String>> {
        let o = Command::new("git")
            .args(args)
            .current_dir(root())
            .output()
            .context("running git")?;
        if !o.status.success() {
            bail!(
                "git {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&o.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect())
    };
    let mut files = match base {
        Some(rev) => git(&["diff", "--name-only", rev])?,
        None => git(&["diff", "--name-only", "HEAD"])?,
    };
    files.extend(git(&["ls-files", "--others", "--exclude-standard"])?);
    if files.is_empty() && base.is_none() {
        files = git(&["diff", "--name-only", "HEAD~1", "HEAD"])?;
    }
    files.sort();
    files.dedup();
    Ok(files)
}

/// Which crates a set of changed files touches.
#[derive(Debug, PartialEq, Eq)]
pub enum Touched {
    /// Documentation only.
    Nothing,
    /// Something every crate builds from.
    All,
    /// These packages.
    Some(Vec<String>),
}

/// Maps changed files to packages by their manifest folders (`cargo metadata`).
fn packages_touched(files: &[String]) -> Result<Touched> {
    let o = cargo()
        .args(["metadata", "--no-deps", "--format-version", "1"])
        .output()
        .context("running cargo metadata")?;
    if !o.status.success() {
        bail!(
            "cargo metadata: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }
    let v: serde_json::Value = serde_json::from_slice(&o.stdout)?;
    let root = root();
    let mut dirs = Vec::new();
    for p in v["packages"].as_array().context("metadata: no packages")? {
        let name = p["name"].as_str().context("a package name")?;
        let manifest = PathBuf::from(p["manifest_path"].as_str().context("a manifest path")?);
        let dir = manifest.parent().context("a manifest folder")?;
        let rel = dir.strip_prefix(&root).unwrap_or(dir);
        dirs.push((rel.to_string_lossy().into_owned(), name.to_string()));
    }
    Ok(classify(files, &dirs))
}

/// `files` against the packages' folders (`(folder relative to the root, name)`).
pub fn classify(files: &[String], dirs: &[(String, String)]) -> Touched {
    let mut touched = Vec::new();
    for f in files {
        let owner = dirs
            .iter()
            .filter(|(d, _)| !d.is_empty() && Path::new(f).starts_with(d))
            .max_by_key(|(d, _)| d.len());
        match owner {
            Some((_, name)) => touched.push(name.clone()),
            None if is_doc(f) => {}
            None => return Touched::All,
        }
    }
    touched.sort();
    touched.dedup();
    if touched.is_empty() {
        Touched::Nothing
    } else {
        Touched::Some(touched)
    }
}

/// Files outside the crates that no build reads: the docs and the fuzz crate (its own workspace).
fn is_doc(f: &str) -> bool {
    let p = Path::new(f);
    (p.extension().is_some_and(|e| e == "md") && !p.starts_with("fixtures"))
        || p.starts_with("docs")
        || p.starts_with("fuzz")
        || f == ".gitignore"
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dirs() -> Vec<(String, String)> {
        [
            ("crates/engine", "engine"),
            ("crates/engine-extra", "engine-extra"),
            ("crates/server", "server"),
            ("xtask", "xtask"),
        ]
        .iter()
        .map(|(d, n)| (d.to_string(), n.to_string()))
        .collect()
    }

    fn files(f: &[&str]) -> Vec<String> {
        f.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn changed_files_map_to_their_crates() {
        assert_eq!(
            classify(
                &files(&[
                    "crates/server/src/lib.rs",
                    "crates/engine-extra/src/a.rs",
                    "crates/server/tests/http.rs",
                    "README.md"
                ]),
                &dirs()
            ),
            Touched::Some(vec!["engine-extra".into(), "server".into()])
        );
        assert_eq!(
            classify(&files(&["xtask/src/ci.rs"]), &dirs()),
            Touched::Some(vec!["xtask".into()])
        );
    }

    #[test]
    fn docs_touch_nothing_and_workspace_files_touch_all() {
        assert_eq!(
            classify(&files(&["docs/BENCHMARKS.md", "README.md"]), &dirs()),
            Touched::Nothing
        );
        assert_eq!(classify(&[], &dirs()), Touched::Nothing);
        for f in [
            "Cargo.toml",
            "Cargo.lock",
            ".cargo/config.toml",
            "fixtures/tiny.gguf",
        ] {
            assert_eq!(
                classify(&files(&["crates/server/src/lib.rs", f]), &dirs()),
                Touched::All,
                "{f}"
            );
        }
    }
}
