//! A bounded fuzz round over every parser of untrusted files (issue 19, "Fuzzing that runs"): the GGUF
//! reader (through the engine's model loading), HF `config.json` + safetensors, `tokenizer.json`,
//! chat templates, profile and predictor files, neuron stores and bundle manifests. Each case must
//! return `Ok` or `Err`: a panic, or a case slower than two seconds, is a finding and fails the test.
//!
//! Stable Rust, so CI always runs it. Environment: `SPARROW_FUZZ_CASES` (per target, default 1500),
//! `SPARROW_FUZZ_TIME` (seconds per target, default 5), `SPARROW_FUZZ_SEED` (default fixed: CI
//! rounds are reproducible), `SPARROW_FUZZ_TARGETS` (comma-separated names; default all).
//! `cargo xtask fuzz` runs longer rounds. Crashes found become the regression tests below.

use crate::fuzz;

use std::path::{Path, PathBuf};

use fuzz::runner::{run_target, Case, Limits};
use fuzz::targets;

fn work() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("fuzz-{}", std::process::id()))
}

/// With `SPARROW_FUZZ_EXPORT=DIR` set, the round only writes each target's seeds as a libFuzzer corpus,
/// `DIR/<target>/seed-N` (`cargo xtask fuzz --libfuzzer`): one file as it is, several joined by NUL bytes.
fn export_seeds(dir: &Path) {
    for t in targets::all() {
        let d = dir.join(t.name);
        std::fs::create_dir_all(&d).unwrap();
        for (i, case) in t.seeds.iter().enumerate() {
            let parts: Vec<&[u8]> = case.iter().map(|(_, b)| b.as_slice()).collect();
            std::fs::write(d.join(format!("seed-{i}")), parts.join(&0u8)).unwrap();
        }
    }
}

#[test]
fn fuzz_round() {
    if let Some(dir) = std::env::var_os("SPARROW_FUZZ_EXPORT").filter(|v| !v.is_empty()) {
        return export_seeds(Path::new(&dir));
    }
    let limits = Limits::from_env();
    let only: Option<Vec<String>> = std::env::var("SPARROW_FUZZ_TARGETS")
        .ok()
        .filter(|v| !v.is_empty())
        .map(|v| v.split(',').map(str::to_owned).collect());
    let work = work();
    println!(
        "fuzz round: seed {:#x}, at most {} cases or {:.1} s per target",
        limits.seed,
        limits.cases,
        limits.time.as_secs_f64()
    );
    println!(
        "{:<14} {:>9} {:>9} {:>9} {:>8} {:>9} {:>10} {:>8}",
        "target", "execs", "ok", "err", "secs", "execs/s", "slowest", "findings"
    );
    let mut findings = Vec::new();
    let mut ran = 0;
    for t in targets::all() {
        if only
            .as_ref()
            .is_some_and(|o| !o.iter().any(|n| n == t.name))
        {
            continue;
        }
        ran += 1;
        let r = run_target(&t, limits, &work);
        println!(
            "{:<14} {:>9} {:>9} {:>9} {:>8.2} {:>9.0} {:>10.1?} {:>8}",
            t.name,
            r.execs,
            r.ok,
            r.err,
            r.secs,
            r.execs as f64 / r.secs.max(1e-9),
            r.slowest,
            r.findings.len()
        );
        for f in r.findings {
            findings.push(format!(
                "{}: {} (case saved in {})",
                t.name,
                f.what,
                f.saved.display()
            ));
        }
    }
    assert!(ran > 0, "SPARROW_FUZZ_TARGETS names no target");
    for f in &findings {
        println!("FINDING {f}");
    }
    if findings.is_empty() {
        std::fs::remove_dir_all(&work).ok();
    }
    assert!(
        findings.is_empty(),
        "{} findings:\n{}",
        findings.len(),
        findings.join("\n")
    );
}

/// Runs `target` on one case (a regression: it must not panic).
#[allow(dead_code)]
fn replay(target: &str, case: Case) -> Result<(), String> {
    let t = targets::all()
        .into_iter()
        .find(|t| t.name == target)
        .expect("target");
    let dir = work().join("replay").join(target);
    fuzz::runner::write_case(&dir, &case);
    let r = (t.run)(&dir);
    std::fs::remove_dir_all(&dir).ok();
    r
}

#[test]
fn the_mutator_is_deterministic_and_changes_its_input() {
    use fuzz::mutator::{mutate, Rng};
    let seed: Vec<u8> = (0..200u8).collect();
    let run = || {
        let mut rng = Rng::new(42);
        (0..100)
            .map(|_| {
                let mut d = seed.clone();
                mutate(&mut d, &mut rng, &[b"{{"]);
                d
            })
            .collect::<Vec<_>>()
    };
    let a = run();
    assert_eq!(a, run());
    assert!(a.iter().filter(|d| **d != seed).count() > 90);
}

/// Regression: a syntax error inside the `decoder` object of `tokenizer.json` panicked in
/// `tokenizers` (found by this round's first run; fixed in `Tokenizer::from_tokenizer_json`).
#[test]
fn tokenizer_decoder_syntax_error_is_an_error() {
    let t = targets::all()
        .into_iter()
        .find(|t| t.name == "tokenizer")
        .unwrap();
    let mut case = t.seeds[0].clone();
    let json = String::from_utf8(case[0].1.clone()).unwrap();
    assert!(json.contains(r#""add_prefix_space":true"#));
    case[0].1 = json
        .replacen(
            r#""add_prefix_space":true"#,
            r#""add_prefix_space":trUe"#,
            1,
        )
        .into_bytes();
    assert!(replay("tokenizer", case).is_err());
}
