//! A Mixture-of-Experts model through the CLI (the tiny qwen3moe fixture, `cargo xtask fixtures`):
//! `sparrow convert` writes a bundle of experts, `sparrow run` over it under a budget that forces
//! misses prints what the in-memory model prints (under a process budget without `--ctx`, at a context
//! sized to the budget), and `sparrow bench --json` reports the expert
//! counters (hit rate, reads, bytes per token against the optimal cache's bound).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn sparrow(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sparrow"))
        .args(args)
        .output()
        .expect("sparrow runs")
}

fn ok(args: &[&str]) -> String {
    let out = sparrow(args);
    assert!(
        out.status.success(),
        "sparrow {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(name)
}

struct Gone(PathBuf);
impl Drop for Gone {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.0).ok();
    }
}

/// Converts the fixture into `dir`; returns the resident file's path.
fn convert(dir: &Path) -> String {
    let corpus = dir.join("corpus.txt");
    std::fs::write(
        &corpus,
        "Calibration text, not the evaluation text: each router is counted here, token by token. "
            .repeat(8),
    )
    .unwrap();
    let model = fixture("tiny-qwen3moe-q8_0.gguf");
    let resident = dir.join("m.resident.gguf");
    let r = resident.to_str().unwrap().to_string();
    let said = ok(&[
        "convert",
        "-m",
        model.to_str().unwrap(),
        "--corpus",
        corpus.to_str().unwrap(),
        "-o",
        &r,
    ]);
    assert!(said.contains("16 experts in 2 layers"), "{said}");
    r
}

#[test]
fn a_bundle_of_experts_runs_as_the_model_and_bench_reports_its_experts() {
    let dir = std::env::temp_dir().join(format!("sparrow-cli-moe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let _gone = Gone(dir.clone());
    let resident = convert(&dir);
    let model = fixture("tiny-qwen3moe-q8_0.gguf");

    // Greedy, exact: the bundle at 30% of its experts prints the in-memory model's text.
    let run = |m: &str, extra: &[&str]| {
        let mut a = vec!["run", "-m", m, "-p", "To be or not", "-n", "12", "-t", "1"];
        a.extend(["--exact"]);
        a.extend(extra);
        ok(&a)
    };
    let memory = run(model.to_str().unwrap(), &[]);
    assert_eq!(run(&resident, &["--ffn-resident", "0.3"]), memory);
    // Under a process budget without --ctx the context is sized to it, and said.
    let mut a = vec!["run", "-m", &resident, "-p", "To be or not", "-n", "12"];
    a.extend(["-t", "1", "--exact", "--memory-budget", "1G"]);
    let out = sparrow(&a);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("sized to --memory-budget 1024.0 MiB"), "{err}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), memory);

    // The counters of 16 decoded tokens: 2 layers x 2 experts a token looked up.
    let bench = |share: &str| -> serde_json::Value {
        let out = ok(&[
            "bench",
            "-m",
            &resident,
            "--ffn-resident",
            share,
            "-p",
            "16",
            "-n",
            "16",
            "-r",
            "1",
            "-t",
            "1",
            "--json",
        ]);
        let v: serde_json::Value = serde_json::from_str(&out).expect("one JSON object");
        v["experts"].clone()
    };
    let x = bench("0.3");
    let num = |k: &str| x[k].as_f64().unwrap_or_else(|| panic!("no `{k}` in {x}"));
    assert_eq!(num("tokens"), 16.0, "{x}");
    assert_eq!(num("lookups"), 64.0, "{x}");
    assert!(num("hits") < num("lookups"), "a 30% cache misses: {x}");
    assert_eq!(num("hit_rate"), num("hits") / num("lookups"), "{x}");
    assert!(num("reads") > 0.0 && num("mib_read_per_token") > 0.0, "{x}");
    assert!(
        num("mib_read_per_token") >= num("min_mib_read_per_token"),
        "no cache reads less than the optimal one: {x}"
    );
    // The whole FFN cached: every lookup a hit, nothing read.
    let x = bench("1");
    assert_eq!(x["hit_rate"].as_f64(), Some(1.0), "{x}");
    assert_eq!(x["reads"].as_u64(), Some(0), "{x}");
}
