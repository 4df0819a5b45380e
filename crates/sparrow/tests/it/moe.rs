//! A Mixture-of-Experts model through the CLI (the tiny qwen3moe fixture, `cargo xtask fixtures`):
//! `sparrow convert` writes a bundle of experts, `sparrow run` over it under a budget that forces
//! misses prints what the in-memory model prints (under a process budget without `--ctx`, at a context
//! sized to the budget), and `sparrow bench --json` reports the expert
//! counters (hit rate, reads, bytes per token against the optimal cache's bound); `sparrow plan` plans
//! the bundle's per-layer expert caches, which `--plan` and `--memory-budget` then apply.

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
    let bench_with = |share: &str, extra: &[&str]| -> serde_json::Value {
        let mut a = vec!["bench", "-m", &resident, "--ffn-resident", share];
        a.extend(["-p", "16", "-n", "16", "-r", "1", "-t", "1", "--json"]);
        a.extend(extra);
        let out = ok(&a);
        let v: serde_json::Value = serde_json::from_str(&out).expect("one JSON object");
        v["experts"].clone()
    };
    let bench = |share: &str| bench_with(share, &[]);
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
    assert!(
        num("min_mib_read_per_token_one_pool") <= num("min_mib_read_per_token") + 1e-9,
        "one pool for all layers needs no more than any split of it: {x}"
    );
    assert!(
        num("fixed_set_mib_read_per_token") >= num("min_mib_read_per_token") - 1e-9,
        "no fixed set reads less than the optimal cache: {x}"
    );
    // Expert reads in flight: more than one by default here, at most `--io-depth`'s when given.
    let peak = |x: &serde_json::Value| x["peak_reads_in_flight"].as_u64().unwrap();
    assert!(peak(&x) > 1, "{x}");
    assert_eq!(peak(&bench_with("0.3", &["--io-depth", "1"])), 1);
    // A self-draft from the cached experts: the text is the model's (greedy), drafts are made
    // and some kept (`bench` fails when an output differs, and says so).
    assert_eq!(
        run(&resident, &["--ffn-resident", "0.3", "--self-draft", "3"]),
        memory
    );
    let spec = |extra: &[&str]| -> serde_json::Value {
        let mut a = vec!["bench", "-m", &resident, "--ffn-resident", "0.5"];
        a.extend(["-n", "24", "-r", "1", "-t", "1", "--exact", "--json"]);
        a.extend(extra);
        serde_json::from_str(&ok(&a)).expect("one JSON object")
    };
    let v = spec(&["--self-draft", "3"]);
    let s = &v["lookup"];
    assert_eq!(v["drafting"], "self-draft", "{v}");
    assert!(s["stats"]["drafted"].as_u64().unwrap() > 0, "{v}");
    assert!(s["stats"]["accepted"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(s["differing"].as_u64(), Some(0), "{v}");

    // The whole FFN cached: every lookup a hit, nothing read.
    let x = bench("1");
    assert_eq!(x["hit_rate"].as_f64(), Some(1.0), "{x}");
    assert_eq!(x["reads"].as_u64(), Some(0), "{x}");
}

/// A device profile of this machine's fingerprint (so plans made with it apply here), with rates
/// that make flash slow beside the kernels: the plan caches experts where the budget allows.
fn device_profile(path: &Path) {
    let kernel = |threads: u32| planner::KernelRate {
        format: "q8_0".into(),
        threads,
        dense_bps: 4e9,
        sparse_bps: 2e9,
        axpy_bps: 0.0,
        batch_cost: 0.0,
        dram_dense_bps: 0.0,
        unit_rows_bps: 0.0,
        unit_axpy_bps: 0.0,
    };
    let io = |read_bytes: u32, queue_depth: u32, bps: f64| planner::IoRate {
        read_bytes,
        queue_depth,
        bps,
    };
    let d = planner::DeviceProfile {
        name: "test".into(),
        fingerprint: engine::device_fingerprint().1,
        cores: 2,
        dram_bps: 10e9,
        kernels: vec![kernel(1), kernel(2)],
        flash_random: vec![io(4096, 1, 20e6), io(4096, 8, 80e6), io(65536, 8, 300e6)],
        flash_seq_bps: 1e9,
        flash_path: "/tmp".into(),
        ..Default::default()
    };
    d.save(path).unwrap();
}

#[test]
fn a_bundle_of_experts_is_planned_and_runs_its_plans_shares() {
    let dir = std::env::temp_dir().join(format!("sparrow-cli-moeplan-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let _gone = Gone(dir.clone());
    let resident = convert(&dir);
    let device = dir.join("device.sparrow-device");
    device_profile(&device);
    let dev = device.to_str().unwrap();
    // `None` where the budget is below the smallest configuration: the process measured in that
    // run was larger than in the run without a budget (any other error fails the test).
    let plan_json = |budget: Option<&str>, out: &str| -> Option<serde_json::Value> {
        let mut a = vec!["plan", "-m", &resident, "--device", dev, "--ctx", "256"];
        a.extend(["-t", "1", "-o", out, "--json"]);
        if let Some(b) = budget {
            a.extend(["--memory-budget", b]);
        }
        let o = sparrow(&a);
        let err = String::from_utf8_lossy(&o.stderr);
        if !o.status.success() && budget.is_some() && err.contains("no plan fits") {
            return None;
        }
        assert!(o.status.success(), "sparrow {a:?}: {err}");
        Some(serde_json::from_slice(&o.stdout).expect("a plan as JSON"))
    };
    // Without a budget every expert is cached; under budgets short of that, the plan gives each
    // layer its share of what is left, and predicts misses. (What the process holds is measured,
    // and varies from run to run, by more under a loaded machine: budgets are tried, 16 KiB apart
    // over 1 MiB, skipping those a run finds too small, until one leaves part of the 128 KiB of
    // experts, split unequally: layer 0's routing is the more skewed, so an equal split would not
    // be the plan's.)
    let full_path = dir.join("full.plan");
    let full = plan_json(None, full_path.to_str().unwrap()).expect("no budget, a plan");
    let all = full["ffn_cache_bytes"].as_u64().unwrap();
    assert_eq!(all, 2 * 8 * 8192, "16 experts of one 8 KiB read: {full}");
    assert_eq!(full["experts"]["hit_rate"].as_f64(), Some(1.0), "{full}");
    let plan_path = dir.join("part.plan");
    let p = plan_path.to_str().unwrap();
    let (part, shares) = (1..=64)
        .find_map(|i| {
            let budget = full["memory"].as_u64().unwrap() + 512 * 1024 - i * 16 * 1024;
            let part = plan_json(Some(&budget.to_string()), p)?;
            assert!(part["memory"].as_u64().unwrap() <= budget, "{part}");
            let shares: Vec<u64> =
                serde_json::from_value(part["experts"]["cache_bytes"].clone()).unwrap();
            let cached: u64 = shares.iter().sum();
            assert_eq!(part["ffn_cache_bytes"].as_u64(), Some(cached), "{part}");
            (cached < all && shares[0] != shares[1]).then_some((part, shares))
        })
        .expect("a budget that caches part of the experts");
    let x = &part["experts"];
    let hit = x["hit_rate"].as_f64().unwrap();
    assert!(hit > 0.0 && hit < 1.0, "{part}");
    assert!(x["read_bytes_per_token"].as_f64().unwrap() > 0.0, "{part}");
    // In words: the expert cache per layer and the predicted hit rate.
    let words = ok(&[
        "plan",
        "-m",
        &resident,
        "--device",
        dev,
        "--ctx",
        "256",
        "-t",
        "1",
        "-o",
        dir.join("w.plan").to_str().unwrap(),
    ]);
    assert!(
        words.contains("expert cache:") && words.contains("predicted hit rate"),
        "{words}"
    );

    // The model in memory: every expert resident, nothing read; only threads to plan.
    let model = fixture("tiny-qwen3moe-q8_0.gguf");
    let mem_plan = dir.join("mem.plan");
    let mut a = vec!["plan", "-m", model.to_str().unwrap(), "--device", dev];
    a.extend(["-o", mem_plan.to_str().unwrap(), "--json"]);
    let v: serde_json::Value = serde_json::from_str(&ok(&a)).unwrap();
    assert_eq!(v["experts"]["hit_rate"].as_f64(), Some(1.0), "{v}");
    assert_eq!(
        v["experts"]["read_bytes_per_token"].as_f64(),
        Some(0.0),
        "{v}"
    );
    assert!(v["io_core"].is_null(), "{v}");

    // `--plan`: the expert cache is the plan's, layer by layer, and the text the model's.
    let bench = |extra: &[&str]| -> serde_json::Value {
        let mut a = vec!["bench", "-m", &resident, "-p", "8", "-n", "8", "-r", "1"];
        a.extend(["-t", "1", "--json"]);
        a.extend(extra);
        serde_json::from_str(&ok(a.as_slice())).expect("one JSON object")
    };
    let v = bench(&["--plan", p]);
    let got: Vec<u64> = serde_json::from_value(v["experts"]["cache_shares"].clone()).unwrap();
    assert_eq!(got, shares, "{v}");
    assert_eq!(v["plan"]["expert_cache_bytes"], x["cache_bytes"], "{v}");
    let run = |m: &str, extra: &[&str]| {
        let mut a = vec!["run", "-m", m, "-p", "To be or not", "-n", "12", "-t", "1"];
        a.extend(["--exact"]);
        a.extend(extra);
        ok(&a)
    };
    assert_eq!(
        run(&resident, &["--plan", p]),
        run(model.to_str().unwrap(), &[])
    );

    // `--memory-budget` without a plan: planned on the spot from the device profile of the model
    // cache folder, and the expert cache split as that plan says. (A budget with room to spare:
    // what `run` and `bench` hold before loading is not what `plan` held.)
    let roomy = (full["memory"].as_u64().unwrap() + (1 << 20)).to_string();
    let in_cache = |args: &[&str]| {
        let mut a = args.to_vec();
        a.extend([
            "-m",
            &resident,
            "-t",
            "1",
            "--ctx",
            "256",
            "--memory-budget",
            &roomy,
        ]);
        let out = Command::new(env!("CARGO_BIN_EXE_sparrow"))
            .env("SPARROW_MODEL_DIR", &dir)
            .args(&a)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(out.status.success(), "{err}");
        (out.stdout, err)
    };
    let (_, err) = in_cache(&["run", "-p", "To be or not", "-n", "4"]);
    assert!(
        err.contains("planned with") && err.contains("the plan's share of each layer"),
        "{err}"
    );
    let (out, _) = in_cache(&["bench", "-p", "8", "-n", "8", "-r", "1", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert!(v["plan"]["expert_cache_bytes"].is_array(), "{v}");
    assert_eq!(
        v["experts"]["cache_shares"], v["plan"]["expert_cache_bytes"],
        "{v}"
    );
}
