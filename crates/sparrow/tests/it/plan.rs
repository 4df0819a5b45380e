//! `sparrow calibrate`, `sparrow plan` and `--plan` as a user runs them, on a tiny fixture model:
//! a device profile is measured and saved, a plan is made within its budget and applied, and damaged
//! or mismatched plans are one-line errors naming the file.

use planner::{AccelRate, DeviceProfile};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn sparrow(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sparrow"))
        .args(args)
        .output()
        .expect("sparrow runs")
}

fn ok(args: &[&str]) -> Output {
    let out = sparrow(args);
    assert!(
        out.status.success(),
        "sparrow {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn fixture(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(name)
        .display()
        .to_string()
}

/// A folder of this test's own (the tests run in parallel).
fn tmp(test: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("sparrow-plan-cli-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn calibrate_plan_and_apply() {
    let dir = tmp("apply");
    let device = dir.join("dev.sparrow-device");
    let (dev, d) = (device.to_str().unwrap(), dir.to_str().unwrap());
    ok(&["calibrate", "--quick", "--dir", d, "-o", dev]);
    // The scratch file is gone, the profile is there.
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(left, ["dev.sparrow-device"], "{left:?}");

    // `--formats` picks what is measured; an unknown name is a one-line error naming the choices.
    let out = ok(&[
        "calibrate",
        "--quick",
        "--dir",
        d,
        "-o",
        dev,
        "--formats",
        "q5_1,IQ4_XS",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut measured: Vec<&str> = v["kernels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["format"].as_str().unwrap())
        .collect();
    measured.dedup();
    assert_eq!(measured, ["Q5_1", "IQ4_XS"], "{v}");
    // Selection's serial cost per neuron is measured: a positive number of nanoseconds, far below a
    // microsecond.
    let select = v["select_ns"].as_f64().unwrap();
    assert!(select > 0.0 && select < 1000.0, "{v}");
    let out = sparrow(&[
        "calibrate",
        "--quick",
        "--dir",
        d,
        "-o",
        dev,
        "--formats",
        "q9_9",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("unknown weight format `q9_9`") && err.contains("q4_k"),
        "{err}"
    );
    ok(&["calibrate", "--quick", "--dir", d, "-o", dev]);

    let model = fixture("tiny-llama-silu-q4_0.gguf");
    let plan = dir.join("tiny.plan");
    let p = plan.to_str().unwrap();
    let out = ok(&[
        "plan",
        "-m",
        &model,
        "--device",
        dev,
        "--memory-budget",
        "64M",
        "--ctx",
        "64",
        "-o",
        p,
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["memory"].as_u64().unwrap() <= 64 << 20, "{v}");
    assert!(v["predicted"][0]["tok_s"].as_f64().unwrap() > 0.0);
    assert!(v["model_fingerprint"].as_u64().is_some());

    assert_eq!(v["speculation"]["measured"], false, "{v}");

    // --measure-speculation: prompt lookup's share of drafts kept, measured on the prompts given,
    // printed, and planned with (marked measured) where speculation pays.
    let prompts = dir.join("prompts.jsonl");
    std::fs::write(
        &prompts,
        "{\"prompt\": \"abc abc abc abc abc abc abc abc\"}\n{\"prompt\": \"one two one two one two\"}\n",
    )
    .unwrap();
    let measured = dir.join("measured.plan");
    let args = format!(
        "plan -m {model} --device {dev} --memory-budget 64M --ctx 512 -o {} --json --measure-speculation {} --measure-tokens 16",
        measured.display(),
        prompts.display()
    );
    let out = ok(&args.split(' ').collect::<Vec<_>>());
    let err = String::from_utf8_lossy(&out.stderr);
    let line = err
        .lines()
        .find(|l| l.contains("prompt lookup on ") && l.contains("(2 of 2 prompts fit the context)"))
        .unwrap_or_else(|| panic!("{err}"));
    let pct = line.split("): ").nth(1).and_then(|r| r.split('%').next());
    let pct: f64 = pct.unwrap().parse().unwrap();
    let m: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let spec = &m["speculation"];
    if spec["source"] != "off" {
        assert_eq!(spec["source"], "lookup", "{spec}");
        assert_eq!(spec["measured"], true, "{spec}");
        let a = spec["acceptance"].as_f64().unwrap();
        assert!((100.0 * a - pct).abs() <= 0.5, "{line} {spec}");
    }
    // The prompts are an input: never an output.
    let p_in = prompts.to_str().unwrap();
    let out = sparrow(&[
        "plan",
        "-m",
        &model,
        "--device",
        dev,
        "-o",
        p_in,
        "--measure-speculation",
        p_in,
    ]);
    assert!(!out.status.success());
    assert!(std::fs::read_to_string(&prompts)
        .unwrap()
        .starts_with("{\"prompt\""));

    // Applied: bench prints the prediction next to the measurement.
    let out = ok(&[
        "bench", "-m", &model, "--plan", p, "-p", "4", "-n", "4", "-r", "1", "--json",
    ]);
    let b: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let predicted = b["plan"]["predicted_tg_tok_s"].as_f64().unwrap();
    assert_eq!(predicted, v["predicted"][0]["tok_s"].as_f64().unwrap());
    assert!(b["plan"]["measured_over_predicted"].as_f64().unwrap() > 0.0);
    assert_eq!(
        b["threads"].as_u64().unwrap(),
        v["threads"].as_u64().unwrap()
    );

    // A plan for another model is refused by name.
    let other = fixture("tiny-qwen2-q4_1.gguf");
    let out = sparrow(&["run", "-m", &other, "--plan", p, "-p", "hi", "-n", "1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("tiny.plan") && err.contains("another model"),
        "{err}"
    );

    // The plan's speculation is used when no flag says otherwise; --no-speculation turns it off.
    let mut chosen = planner::Plan::load(&plan).unwrap();
    assert!(chosen.speculation.is_some(), "a new plan chooses");
    chosen.speculation = Some(planner::SpecChoice {
        source: planner::SpecSource::Lookup,
        max_draft: 3,
        acceptance: 0.5,
        measured: false,
        gain: 1.2,
    });
    let spec_plan = dir.join("spec.plan");
    chosen.save(&spec_plan).unwrap();
    let sp = spec_plan.to_str().unwrap();
    let run = |extra: &[&str]| -> serde_json::Value {
        let mut args = vec![
            "run",
            "-m",
            &model,
            "--plan",
            sp,
            "-p",
            "abcabcabcabc",
            "-n",
            "8",
            "--json",
            "--ignore-eos",
        ];
        args.extend(extra);
        serde_json::from_slice(&ok(&args).stdout).unwrap()
    };
    let planned = run(&[]);
    assert_eq!(planned["drafting"], "lookup", "{planned}");
    assert_eq!(planned["max_draft"], 3, "{planned}");
    let plain = run(&["--no-speculation"]);
    assert!(plain["drafting"].is_null(), "{plain}");
    assert_eq!(planned["generated_ids"], plain["generated_ids"]);
    let flag = run(&["--lookup", "2"]);
    assert_eq!(flag["max_draft"], 2, "a flag overrides the plan: {flag}");

    // A damaged plan is refused by name, as one line.
    let mut bytes = std::fs::read(&plan).unwrap();
    let n = bytes.len();
    bytes[n / 2] ^= 0x20;
    std::fs::write(&plan, &bytes).unwrap();
    let out = sparrow(&["run", "-m", &model, "--plan", p, "-p", "hi", "-n", "1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.starts_with("error: ") && err.contains("tiny.plan"),
        "{err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");

    // No device profile: the error says what to do.
    let out = sparrow(&[
        "plan",
        "-m",
        &model,
        "--device",
        &format!("{d}/none"),
        "-o",
        p,
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("sparrow calibrate"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_budget_below_what_the_model_needs_is_a_named_error() {
    let dir = tmp("small");
    let device = dir.join("dev.sparrow-device");
    let dev = device.to_str().unwrap();
    ok(&[
        "calibrate",
        "--quick",
        "--dir",
        dir.to_str().unwrap(),
        "-o",
        dev,
    ]);
    let model = fixture("tiny-llama-silu-q4_0.gguf");
    let out = sparrow(&[
        "plan",
        "-m",
        &model,
        "--device",
        dev,
        "--memory-budget",
        "1M",
        "-o",
        dir.join("x.plan").to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("no plan fits"), "{err}");
    assert!(!dir.join("x.plan").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Profiles `model` into `out` (a quick profile of a tiny fixture).
fn profile_fixture(model: &str, out: &str) {
    ok(&[
        "profile",
        "-m",
        model,
        "--window",
        "16",
        "--windows",
        "2",
        "--calib-windows",
        "1",
        "--sparsity",
        "0.3",
        "-o",
        out,
    ]);
}

/// `sparrow` with the model cache folder (where the device profile lives) set to `dir`.
fn sparrow_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sparrow"))
        .env("SPARROW_MODEL_DIR", dir)
        .args(args)
        .output()
        .expect("sparrow runs")
}

#[test]
fn a_memory_budget_without_a_plan_is_planned_from_the_device_profile() {
    let dir = tmp("auto");
    let d = dir.to_str().unwrap();
    let model = fixture("tiny-llama-silu-q4_0.gguf");
    let (profile, resident) = (dir.join("t.sparrow-profile"), dir.join("t.resident.gguf"));
    let (p, r) = (profile.to_str().unwrap(), resident.to_str().unwrap());
    profile_fixture(&model, p);
    ok(&["convert", "-m", &model, "--profile", p, "-o", r]);
    let run = [
        "run",
        "-m",
        r,
        "--memory-budget",
        "64M",
        "-p",
        "hi",
        "-n",
        "2",
    ];

    // No device profile yet: the defaults run, and a note says how to get a planned configuration.
    let out = sparrow_in(&dir, &run);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("no device profile") && err.contains("sparrow calibrate"),
        "{err}"
    );
    assert!(!err.contains("planned with"), "{err}");

    // After `sparrow calibrate` (saved in the model cache folder), the same command is planned.
    let out = sparrow_in(&dir, &["calibrate", "--quick", "--dir", d]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(dir.join("device.sparrow-device").is_file());
    let out = sparrow_in(&dir, &run);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("planned with") && err.contains("device.sparrow-device"),
        "{err}"
    );
    // The plan is made at the context the budget leaves (fitted once), and its neuron cache is the
    // cache the engine takes, not one worked out again.
    assert_eq!(err.matches("sized to --memory-budget").count(), 1, "{err}");
    let mib_before = |text: &str, key: &str| -> f64 {
        let at = text
            .find(key)
            .unwrap_or_else(|| panic!("no `{key}` in {text}"));
        let head = text[..at].trim_end().trim_end_matches("MiB").trim_end();
        head.rsplit(' ').next().unwrap().parse().unwrap()
    };
    let planned = &err[err.find("neuron cache: ").expect("the plan is described") + 14..];
    let planned: f64 = planned.split(' ').next().unwrap().parse().unwrap();
    assert_eq!(mib_before(&err, "MiB FFN cache"), planned, "{err}");
    assert!(err.contains("the neuron cache is the plan's"), "{err}");
    // An explicit flag still wins over the plan: the run uses the thread count given.
    let mut run1 = run.to_vec();
    run1.extend(["--threads", "1", "--json"]);
    let out = sparrow_in(&dir, &run1);
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["threads"].as_u64(), Some(1), "{v}");

    // A damaged device profile (the user asked for a budget, not a plan): a warning naming it, and the
    // run goes on with the defaults.
    std::fs::write(dir.join("device.sparrow-device"), b"garbage\n").unwrap();
    let out = sparrow_in(&dir, &run);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("warning: no plan") && err.contains("device.sparrow-device"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// A folder of a test's own with the tiny SiLU fixture's profile in it, and the paths of its
/// device profile and plan.
struct Setup {
    dir: PathBuf,
    model: String,
    profile: String,
    device: String,
    plan: String,
}

impl Setup {
    fn new(test: &str) -> Setup {
        let dir = tmp(test);
        let path = |name: &str| dir.join(name).to_str().unwrap().to_string();
        let s = Setup {
            model: fixture("tiny-llama-silu-q4_0.gguf"),
            profile: path("t.sparrow-profile"),
            device: path("dev.sparrow-device"),
            plan: path("p.plan"),
            dir,
        };
        profile_fixture(&s.model, &s.profile);
        s
    }
}

/// A plan that keeps some layers dense and makes the others sparse is applied layer by layer, and
/// its dense batch sizes too (the run says so); an explicit `--sparse` makes every layer and batch
/// sparse.
#[test]
fn a_partly_sparse_plan_keeps_its_dense_layers_dense() {
    let dir = tmp("mixed");
    // The model with its profile beside it (where a run looks for it).
    let model = dir.join("t.gguf");
    std::fs::copy(fixture("tiny-llama-silu-q4_0.gguf"), &model).unwrap();
    let (d, model) = (dir.to_str().unwrap(), model.to_str().unwrap());
    profile_fixture(model, &format!("{model}.sparrow-profile"));
    let (dev, p) = (format!("{d}/dev.sparrow-device"), format!("{d}/p.plan"));
    ok(&["calibrate", "--quick", "--dir", d, "-o", &dev]);
    ok(&[
        "plan", "-m", model, "--device", &dev, "--sparse", "--ctx", "64", "-o", &p,
    ]);
    let mut plan = planner::Plan::load(&p).unwrap();
    let n = plan.sparse.len();
    assert!(n >= 2);
    plan.sparse = (0..n).map(|l| l % 2 == 1).collect();
    // Batch size 2 as batch size 1, 4 and 8 dense.
    for q in &mut plan.predicted[1..] {
        q.sparse = q.batch < 4;
    }
    plan.save(&p).unwrap();
    let run = ["run", "-m", model, "--plan", &p, "-p", "hi", "-n", "2"];
    let out = ok(&run);
    let err = String::from_utf8_lossy(&out.stderr);
    let want = format!("{} of {n} layers dense, as planned", n - n / 2);
    assert!(err.contains("sparse FFN") && err.contains(&want), "{err}");
    assert!(
        err.contains("decode steps of 4 sequences or more dense"),
        "{err}"
    );
    let out = ok(&[&run[..], &["--sparse"]].concat());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("sparse FFN") && !err.contains("dense, as planned"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `sparrow plan --sparse --accel cpu` plans hybrid decode's split per batch size, and a run with
/// that plan takes it (an explicit `--accel-hot` still wins).
#[test]
fn hybrid_decode_takes_the_planned_split() {
    let s = Setup::new("hybrid");
    let (dir, d, model) = (&s.dir, s.dir.to_str().unwrap(), s.model.as_str());
    let (pr, dev, p) = (s.profile.as_str(), s.device.as_str(), s.plan.as_str());
    ok(&["calibrate", "--quick", "--dir", d, "-o", dev]);
    // Whether the measured CPU stand-in pays on a model this small depends on this machine's noise
    // (one CI run planned no neuron there): give the device a stand-in measured far faster than its
    // kernels, so that the plan puts neurons on it whatever the calibration measured.
    let mut device = DeviceProfile::load(dev).unwrap();
    device.accelerators.push(AccelRate {
        name: "cpu".into(),
        parallel: false,
        bps: 1e15,
        macs_per_s: 0.0,
        batch_cost: 0.0,
        call_ns: 0.0,
    });
    device.save(dev).unwrap();
    let out = ok(&[
        "plan",
        "-m",
        model,
        "--device",
        dev,
        "--sparse",
        "--profile",
        pr,
        "--accel",
        "cpu",
        "--ctx",
        "64",
        "-o",
        p,
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let h = &v["hybrid"];
    assert_eq!(h["accelerator"], "cpu", "{v}");
    let counts = h["counts"].as_array().unwrap();
    assert_eq!(counts.len(), v["sparse"].as_array().unwrap().len(), "{v}");
    assert!(
        counts.iter().all(|c| {
            let c: Vec<u64> = c
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap())
                .collect();
            c.len() == 4 && c.windows(2).all(|w| w[0] <= w[1])
        }),
        "{v}"
    );
    assert!(counts.iter().any(|c| c[0].as_u64() > Some(0)), "{v}");
    let hybrid = [
        "-m",
        model,
        "--sparse",
        "--profile",
        pr,
        "--accel",
        "cpu",
        "--plan",
        p,
    ];
    let run: Vec<&str> = [&["run"][..], &hybrid, &["-p", "hi", "-n", "2"]].concat();
    let out = ok(&run);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("hybrid decode") && err.contains("planned"),
        "{err}"
    );
    // bench prints the split's own prediction next to hybrid decode's measurement.
    let bench = [
        &["bench"][..],
        &hybrid,
        &["-p", "4", "-n", "4", "-r", "1", "--json"],
    ]
    .concat();
    let out = ok(&bench);
    let b: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let predicted = b["plan"]["predicted_hybrid_tg_tok_s"].as_f64();
    assert!(predicted.is_some_and(|x| x > 0.0), "{b}");
    let mut own = run.clone();
    own.extend(["--accel-hot", "0.5"]);
    let out = ok(&own);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("hottest 50%") && err.contains("from the profile"),
        "{err}"
    );
    // Neither a plan nor --accel-hot: the split is planned from the device profile in the model
    // cache folder; without one there, the profile's 10% share.
    let cache = dir.join("models");
    std::fs::create_dir_all(&cache).unwrap();
    let bare = [
        "run",
        "-m",
        model,
        "--sparse",
        "--profile",
        pr,
        "--accel",
        "cpu",
        "-p",
        "hi",
        "-n",
        "2",
    ];
    let in_cache = |args: &[&str]| {
        let out = sparrow_in(&cache, args);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{err}");
        err
    };
    let err = in_cache(&bare);
    assert!(
        err.contains("hottest 10%") && err.contains("from the profile"),
        "{err}"
    );
    std::fs::copy(dev, cache.join("device.sparrow-device")).unwrap();
    let err = in_cache(&bare);
    let want = format!(
        "planned for {}",
        cache.join("device.sparrow-device").display()
    );
    assert!(
        err.contains("hybrid decode") && err.contains(&want),
        "{err}"
    );
    std::fs::remove_dir_all(dir).ok();
}

/// `sparrow calibrate --accel qnn:LIBRARY` measures the accelerator (here the QNN test double,
/// loaded by path as libQnnHtp.so would be) into the device profile; `sparrow plan --sparse --accel
/// qnn` then plans hybrid decode's split for it, and a run over QNN takes that plan. A library that
/// does not load ends calibration with a one-line error naming it, the saved profile untouched.
#[test]
fn calibrate_measures_an_accelerator_that_plan_splits_for() {
    let s = Setup::new("qnn");
    let (dir, d, model) = (&s.dir, s.dir.to_str().unwrap(), s.model.as_str());
    let (pr, dev, p) = (s.profile.as_str(), s.device.as_str(), s.plan.as_str());
    let double = qnn_double::library_path().expect("cargo builds the QNN double for the tests");
    let qnn = format!("qnn-f32:{}", double.display());
    let out = ok(&[
        "calibrate",
        "--quick",
        "--dir",
        d,
        "-o",
        dev,
        "--accel",
        &qnn,
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let a = &v["accelerators"][0];
    assert_eq!(a["name"], "qnn", "{v}");
    assert_eq!(a["parallel"], true, "{a}");
    assert!(a["macs_per_s"].as_f64().unwrap() > 1e6, "{a}");
    assert!(a["call_ns"].as_f64().unwrap() >= 0.0, "{a}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("qnn accelerator:"), "{err}");

    let out = ok(&[
        "plan",
        "-m",
        model,
        "--device",
        dev,
        "--sparse",
        "--profile",
        pr,
        "--accel",
        &qnn,
        "--ctx",
        "64",
        "-o",
        p,
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let h = &v["hybrid"];
    assert_eq!(h["accelerator"], "qnn", "{v}");
    let counts: Vec<Vec<u64>> = serde_json::from_value(h["counts"].clone()).unwrap();
    assert_eq!(counts.len(), v["sparse"].as_array().unwrap().len(), "{v}");
    assert!(h["decode_ns"].as_u64().unwrap() > 0, "{h}");
    let out = ok(&[
        "run",
        "-m",
        model,
        "--sparse",
        "--profile",
        pr,
        "--accel",
        &qnn,
        "--plan",
        p,
        "-p",
        "hi",
        "-n",
        "2",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    let wanted = if counts.iter().all(|c| c[3] == 0) {
        "puts no neuron on the accelerator"
    } else {
        "planned"
    };
    assert!(err.contains(wanted), "{counts:?}: {err}");

    // A library that does not load: the error names it, the profile saved above stays.
    let saved = std::fs::read(dev).unwrap();
    let out = sparrow(&[
        "calibrate",
        "--quick",
        "--dir",
        d,
        "-o",
        dev,
        "--accel",
        "qnn:/nonexistent/libQnnHtp.so",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with("error: ") && err.trim_end().lines().count() == 1,
        "{err}"
    );
    assert!(err.contains("/nonexistent/libQnnHtp.so"), "{err}");
    assert_eq!(std::fs::read(dev).unwrap(), saved);
    std::fs::remove_dir_all(dir).ok();
}

/// Over a resident file, `sparrow plan --accel cpu` splits hybrid decode within the neuron cache
/// (one count per layer, every batch size alike), and a run with that plan takes it: the blocks'
/// neurons on the accelerator, or decode sparse on the CPU where the plan puts none there.
#[test]
fn hybrid_decode_over_a_store_takes_the_split_planned_within_its_cache() {
    let dir = tmp("store-split");
    let (d, dev, p) = (
        dir.to_str().unwrap(),
        dir.join("dev.sparrow-device"),
        dir.join("p.plan"),
    );
    let (dev, p) = (dev.to_str().unwrap(), p.to_str().unwrap());
    let model = dir.join("m.gguf");
    std::fs::copy(fixture("tiny-llama-silu-q4_0.gguf"), &model).unwrap();
    ok(&["convert", "-m", model.to_str().unwrap()]);
    let resident = dir.join("m.resident.gguf");
    let r = resident.to_str().unwrap();
    ok(&["calibrate", "--quick", "--dir", d, "-o", dev]);
    // A stand-in measured far faster than the kernels, so that with the FFN cached the plan puts
    // neurons on it whatever the calibration measured; then one that costs a second a call. The
    // block takes its bytes from the neuron cache, so the neurons it pushes out are read from
    // flash: flash is made fast too, or a busy machine's `--quick` flash rates (100 KB/s seen)
    // make those reads cost more than the block saves.
    let with_standin = |bps: f64, call_ns: f64| {
        let mut device = DeviceProfile::load(dev).unwrap();
        for r in device
            .flash_random
            .iter_mut()
            .chain(device.flash_random_busy.iter_mut())
        {
            r.bps = 1e15;
        }
        device.flash_seq_bps = 1e15;
        device.accelerators.retain(|a| a.name != "cpu");
        device.accelerators.push(AccelRate {
            name: "cpu".into(),
            parallel: false,
            bps,
            macs_per_s: 0.0,
            batch_cost: 0.0,
            call_ns,
        });
        device.save(dev).unwrap();
        let out = ok(&[
            "plan",
            "-m",
            r,
            "--device",
            dev,
            "--accel",
            "cpu",
            "--memory-budget",
            "1G",
            "--ctx",
            "64",
            "-o",
            p,
            "--json",
        ]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let counts: Vec<[u64; 4]> = serde_json::from_value(v["hybrid"]["counts"].clone())
            .unwrap_or_else(|e| panic!("{e}: {v}"));
        assert!(!counts.is_empty(), "{v}");
        assert!(counts.iter().all(|c| c.iter().all(|&k| k == c[0])), "{v}");
        let run = [
            "run", "-m", r, "--accel", "cpu", "--plan", p, "-p", "one two", "-n", "2",
        ];
        let out = ok(&run);
        (counts, String::from_utf8_lossy(&out.stderr).into_owned(), v)
    };
    let (counts, err, v) = with_standin(1e15, 0.0);
    assert!(
        counts.iter().any(|c| c[0] > 0),
        "{counts:?}\nplan: {v}\ndevice: {:?}",
        DeviceProfile::load(dev).unwrap()
    );
    assert!(
        err.contains("hybrid decode: the hottest") && err.contains("(planned;"),
        "{err}"
    );
    let (counts, err, _) = with_standin(1e6, 1e9);
    assert!(counts.iter().all(|c| c[0] == 0), "{counts:?}");
    assert!(
        err.contains("decode sparse on the CPU (planned: no neuron on the accelerator)"),
        "{err}"
    );
    std::fs::remove_dir_all(dir).ok();
}
