//! The `sparrow` binary as a user runs it: `run --json` fields, streaming output, perplexity, bench,
//! and clear errors for bad input. Without `--model` it fetches the default model (the README's path).

use std::process::{Command, Output};

fn sparrow(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sparrow"))
        .args(args)
        .output()
        .expect("sparrow runs")
}

fn ok_json(args: &[&str]) -> serde_json::Value {
    let out = sparrow(args);
    assert!(
        out.status.success(),
        "sparrow {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        stdout.lines().count(),
        1,
        "--json prints exactly one line: {stdout}"
    );
    serde_json::from_str(&stdout).expect("stdout is one JSON object")
}

#[test]
fn run_json_has_documented_fields_and_reference_tokens() {
    let v = ok_json(&[
        "run",
        "-p",
        "The capital of France is",
        "-n",
        "8",
        "--exact",
        "--threads",
        "2",
        "--json",
    ]);
    for field in [
        "model",
        "precision",
        "threads",
        "prompt_ids",
        "generated_ids",
        "text",
        "stop_reason",
        "load_s",
        "prefill_tokens",
        "prefill_s",
        "prefill_tok_s",
        "decode_tokens",
        "decode_s",
        "decode_tok_s",
        "peak_rss_bytes",
    ] {
        assert!(
            v.get(field).is_some(),
            "field `{field}` is missing from {v}"
        );
    }
    let ids: Vec<u64> = v["prompt_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect();
    assert_eq!(ids, [504, 3575, 282, 4649, 314]);
    let gen: Vec<u64> = v["generated_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect();
    // The reference's greedy continuation starts " Paris.\n\nThe answer is".
    assert_eq!(gen, [7042, 30, 198, 198, 504, 2988, 314, 42]);
    assert!(
        v["text"].as_str().unwrap().starts_with(" Paris."),
        "{}",
        v["text"]
    );
    assert_eq!(v["stop_reason"], "length");
    assert_eq!(v["precision"], "exact");
    assert_eq!(v["threads"], 2);
    assert_eq!(
        v["decode_tokens"], 7,
        "the first token comes from the prefill"
    );
    assert!(v["decode_tok_s"].as_f64().unwrap() > 0.0 && v["peak_rss_bytes"].as_u64().unwrap() > 0);
}

#[test]
fn run_streams_text_and_figures() {
    let out = sparrow(&[
        "run",
        "-p",
        "Once upon a time",
        "-n",
        "6",
        "--stop",
        "NEVER-APPEARS",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        stdout.starts_with("Once upon a time") && stdout.len() > "Once upon a time".len(),
        "{stdout:?}"
    );
    let stderr = String::from_utf8(out.stderr).unwrap();
    for figure in ["load", "prefill", "decode", "tok/s", "peak RSS"] {
        assert!(stderr.contains(figure), "stderr lacks `{figure}`: {stderr}");
    }
}

#[test]
fn chat_uses_the_model_template_and_stops_at_im_end() {
    let v = ok_json(&["run", "--chat", "-p", "What is 2+2?", "-n", "32", "--json"]);
    let ids: Vec<u64> = v["prompt_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect();
    assert_eq!(ids[0], 1, "the ChatML template opens with <|im_start|>");
    assert_eq!(
        ids[ids.len() - 3..],
        [520, 9531, 198],
        "ends with `assistant\\n` (generation prompt)"
    );
    assert_eq!(v["stop_reason"], "eos");
    assert!(v["text"].as_str().unwrap().contains('4'), "{}", v["text"]);
}

/// `--chat` on Qwen2.5-Coder renders the template its GGUF gives (Qwen2's ChatML, with its default
/// system prompt when the conversation has none) and stops at `<|im_end|>`.
#[test]
fn chat_renders_qwens_own_template_with_its_system_prompt() {
    let m = engine::fetch::known_model("qwen2.5-coder-0.5b").expect("a known model");
    let path = engine::fetch::ensure_model(m, |line| eprintln!("test setup: {line}"))
        .expect("qwen2.5-coder-0.5b can be fetched");
    let v = ok_json(&[
        "run",
        "--model",
        path.to_str().unwrap(),
        "--chat",
        "-p",
        "What is 2+2?",
        "-n",
        "32",
        "--threads",
        "2",
        "--json",
    ]);
    let file = engine::ModelFile::open(&path).unwrap();
    let tok = engine::load_tokenizer(&file).unwrap();
    let want = tok
        .encode(
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n\
             <|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
            false,
        )
        .unwrap();
    let ids: Vec<u32> = v["prompt_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect();
    assert_eq!(ids, want, "prompt {:?}", tok.decode(&ids, false));
    assert_eq!(v["stop_reason"], "eos", "{v}");
    assert!(v["text"].as_str().unwrap().contains('4'), "{}", v["text"]);
}

/// `run --best-of N`: N sampled sequences decoded as one batch, ranked by mean log-probability; each
/// is the text a plain run with its seed samples.
#[test]
fn best_of_ranks_candidates_that_plain_runs_with_their_seeds_reproduce() {
    let common = [
        "-p",
        "Once upon a time",
        "-n",
        "6",
        "--temp",
        "0.8",
        "--json",
    ];
    let mut args = vec!["run", "--best-of", "3", "--seed", "1"];
    args.extend(common);
    let v = ok_json(&args);
    assert_eq!(v["best_of"], 3, "{v}");
    let cands = v["candidates"].as_array().unwrap();
    assert_eq!(cands.len(), 3, "{v}");
    let mut seeds: Vec<u64> = cands.iter().map(|c| c["seed"].as_u64().unwrap()).collect();
    let lp: Vec<f64> = cands
        .iter()
        .map(|c| c["mean_logprob"].as_f64().unwrap())
        .collect();
    assert!(lp.windows(2).all(|w| w[0] >= w[1]), "not ranked: {lp:?}");
    for c in cands {
        let seed = c["seed"].as_u64().unwrap().to_string();
        let mut args = vec!["run", "--seed", &seed];
        args.extend(common);
        assert_eq!(
            ok_json(&args)["generated_ids"],
            c["generated_ids"],
            "seed {seed}"
        );
    }
    seeds.sort_unstable();
    seeds.dedup();
    assert_eq!(seeds.len(), 3, "one seed per candidate");
}

/// `run --lookup N`: greedy text of a plain run, with the speculation's counts; `bench --lookup`
/// compares the two on the built-in prompts; a bad prompt file is named with its line.
#[test]
fn lookup_keeps_the_greedy_text_and_reports_its_counts() {
    let common = [
        "-p",
        "def add(a, b):\n    return a + b\n\ndef add3(a, b, c):\n    return a + b + c\n\ndef add4(a, b, c, d):\n",
        "-n",
        "24",
        "--threads",
        "2",
        "--json",
    ];
    let mut args = vec!["run"];
    args.extend(common);
    let plain = ok_json(&args);
    args.extend(["--lookup", "6"]);
    let spec = ok_json(&args);
    assert_eq!(spec["generated_ids"], plain["generated_ids"], "{spec}");
    assert_eq!(spec["lookup"], 6);
    assert!(plain["speculation"].is_null());
    let s = &spec["speculation"];
    assert!(s["drafted"].as_u64().unwrap() > 0, "{s}");
    assert!(s["accepted"].as_u64().unwrap() <= s["drafted"].as_u64().unwrap());
    assert!(s["tokens_per_step"].as_f64().unwrap() >= 1.0, "{s}");
    let b = ok_json(&[
        "bench",
        "--lookup",
        "4",
        "-n",
        "6",
        "-r",
        "1",
        "--threads",
        "2",
        "--json",
    ]);
    assert_eq!(b["lookup"]["differing"], 0, "{b}");
    assert_eq!(b["lookup"]["prompts"], 8, "{b}");
    assert!(b["ratio_mean"].as_f64().unwrap() > 0.0, "{b}");
    let dir = std::env::temp_dir().join(format!("sparrow-lookup-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("prompts.jsonl");
    std::fs::write(&bad, "{\"prompt\": \"ok\"}\n\n{\"text\": 1}\n").unwrap();
    let out = sparrow(&["bench", "--lookup", "2", "--prompts", bad.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("prompts.jsonl line 3: no string field \"prompt\""),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn sampling_with_a_seed_is_repeatable() {
    let args = [
        "run",
        "-p",
        "Once upon a time",
        "-n",
        "12",
        "--temp",
        "0.9",
        "--seed",
        "42",
        "--json",
    ];
    let (a, b) = (ok_json(&args), ok_json(&args));
    assert_eq!(a["generated_ids"], b["generated_ids"]);
    let mut other = args;
    other[8] = "43";
    let c = ok_json(&other);
    assert_ne!(
        a["generated_ids"], c["generated_ids"],
        "another seed gives another text"
    );
}

#[test]
fn perplexity_json_on_a_short_file() {
    let file = std::env::temp_dir().join(format!("sparrow-cli-ppl-{}.txt", std::process::id()));
    std::fs::write(
        &file,
        "The quick brown fox jumps over the lazy dog. ".repeat(40),
    )
    .unwrap();
    let v = ok_json(&[
        "perplexity",
        "--file",
        file.to_str().unwrap(),
        "--window",
        "64",
        "--windows",
        "2",
        "--json",
    ]);
    let ppl = v["ppl"].as_f64().unwrap();
    // A repeated sentence is easy after the first pass: far below the ~30 of WikiText.
    assert!(ppl > 1.0 && ppl < 10.0, "ppl {ppl}");
    assert_eq!(v["window_nll"].as_array().unwrap().len(), 2);
    std::fs::remove_file(&file).unwrap();
}

#[test]
fn bench_json_reports_speeds() {
    let v = ok_json(&["bench", "-p", "16", "-n", "4", "-r", "1", "--json"]);
    assert!(
        v["pp_tok_s"].as_f64().unwrap() > 0.0 && v["tg_tok_s"].as_f64().unwrap() > 0.0,
        "{v}"
    );
}

#[test]
fn bad_input_gives_clear_errors() {
    let out = sparrow(&["run", "--model", "/nonexistent/model.gguf", "-p", "hi"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("/nonexistent/model.gguf"),
        "names the file: {err}"
    );

    let junk = std::env::temp_dir().join(format!("sparrow-cli-junk-{}.gguf", std::process::id()));
    std::fs::write(&junk, b"this is not a model at all, just text").unwrap();
    let out = sparrow(&["run", "--model", junk.to_str().unwrap(), "-p", "hi"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(junk.to_str().unwrap()) && err.to_lowercase().contains("magic"),
        "{err}"
    );
    std::fs::remove_file(&junk).unwrap();

    let out = sparrow(&["perplexity", "--file", "/nonexistent/text.txt"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/text.txt"));

    let out = sparrow(&["run"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("-p"),
        "asks for a prompt"
    );
}

#[test]
fn convert_then_run_over_the_neuron_store() {
    let dir = std::env::temp_dir().join(format!("sparrow-cli-convert-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let profile = dir.join("m.sparrow-profile");
    let resident = dir.join("m.resident.gguf");
    let (p, r) = (profile.to_str().unwrap(), resident.to_str().unwrap());
    // The built-in calibration text (no --corpus).
    let out = sparrow(&[
        "profile",
        "--window",
        "64",
        "--windows",
        "2",
        "--calib-windows",
        "1",
        "--sparsity",
        "0.3",
        "-o",
        p,
    ]);
    assert!(
        out.status.success(),
        "profile: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = sparrow(&["convert", "--profile", p, "-o", r, "--verify"]);
    assert!(
        out.status.success(),
        "convert: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("every page verified")
            && text.contains("7 neuron(s) of 1116 bytes (down columns Q5_0) per 2-page unit"),
        "{text}"
    );
    // The parts the resident file names, each under this convert's new name.
    let parts = engine::bundle::BundleParts::read(&resident)
        .unwrap()
        .unwrap();
    assert!(
        parts.recorded && parts.all().iter().all(|p| p.exists()),
        "{parts:?}"
    );
    assert!(parts.store.to_str().unwrap().ends_with(".neurons"));

    let v = ok_json(&[
        "run",
        "-m",
        r,
        "-p",
        "The capital of France is",
        "-n",
        "8",
        "--ffn-resident",
        "0.5",
        "--ctx",
        "256",
        "--json",
    ]);
    assert_eq!(v["generated_ids"].as_array().unwrap().len(), 8, "{v}");

    let out = sparrow(&["run", "-m", r, "-p", "hi", "--memory-budget", "1M"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("leaves nothing for the FFN"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    budget_sizes_the_context(r);

    // The bundle's manifest: written by convert, checked (sizes) at load, fully by `sparrow verify`.
    let err = |o: &std::process::Output| String::from_utf8_lossy(&o.stderr).into_owned();
    let stdout = |o: &std::process::Output| String::from_utf8_lossy(&o.stdout).into_owned();
    let manifest = parts.manifest.clone();
    assert!(text.contains("manifest") && manifest.exists(), "{text}");
    let out = sparrow(&["verify", r]);
    assert!(out.status.success(), "verify: {}", err(&out));
    let lines = stdout(&out);
    assert_eq!(
        lines.lines().filter(|l| l.starts_with("ok ")).count(),
        3,
        "{lines}"
    );
    // A part changed in place (same size): loading passes the cheap check, verify names it.
    let prof = parts.profile.clone();
    let good = std::fs::read(&prof).unwrap();
    let mut flipped = good.clone();
    flipped[good.len() / 2] ^= 1;
    std::fs::write(&prof, &flipped).unwrap();
    let out = sparrow(&["verify", r]);
    assert_eq!(out.status.code(), Some(1), "{}", err(&out));
    assert!(
        stdout(&out).contains("BAD     profile") && err(&out).contains("1 of 3 parts"),
        "{}{}",
        stdout(&out),
        err(&out)
    );
    std::fs::write(&prof, &good).unwrap();
    // A part of another size: the load is refused, naming the part and the manifest.
    let store = parts.store.clone();
    let store_name = store.file_name().unwrap().to_str().unwrap();
    let len = std::fs::metadata(&store).unwrap().len();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&store)
        .unwrap();
    f.set_len(len + 4096).unwrap();
    let out = sparrow(&["run", "-m", r, "-p", "hi", "-n", "1"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        err(&out).contains(store_name) && err(&out).contains("store part does not match"),
        "{}",
        err(&out)
    );
    f.set_len(len).unwrap();
    // The manifest the resident file names is gone: the bundle is incomplete (an older layout
    // without a manifest loads with a warning: engine/tests/it/manifest.rs).
    let kept = std::fs::read(&manifest).unwrap();
    std::fs::remove_file(&manifest).unwrap();
    let out = sparrow(&["run", "-m", r, "-p", "hi", "-n", "1"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        err(&out).contains(manifest.to_str().unwrap()) && err(&out).contains("incomplete"),
        "{}",
        err(&out)
    );
    let out = sparrow(&["verify", r]);
    assert_eq!(out.status.code(), Some(1));
    assert!(err(&out).contains("missing"), "{}", err(&out));
    std::fs::write(&manifest, kept).unwrap();

    std::fs::remove_file(&store).unwrap();
    let out = sparrow(&["run", "-m", r, "-p", "hi"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(store_name),
        "names the missing store: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn models_lists_the_known_models() {
    let out = sparrow(&["models", "--json"]);
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["smollm2-135m", "qwen2.5-coder-0.5b", "gemma3-270m"]);
    for m in v.as_array().unwrap() {
        assert!(m["bytes"].as_u64().unwrap() > 0 && m["licence"].is_string());
        assert!(m["cached"].is_boolean());
    }
    let table = sparrow(&["models"]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        text.contains("smollm2-135m") && text.contains("(default)"),
        "{text}"
    );
}

#[test]
fn convert_profiles_a_model_that_has_no_profile_first() {
    let dir = std::env::temp_dir().join(format!("sparrow-cli-one-step-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let model = dir.join("m.gguf");
    std::fs::copy(
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../fixtures/tiny-llama-silu-q4_0.gguf"
        ),
        &model,
    )
    .unwrap();
    let m = model.to_str().unwrap();
    let out = sparrow(&["convert", "-m", m]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "convert: {err}");
    assert!(err.contains("profiling the model first"), "{err}");
    let resident = dir.join("m.resident.gguf");
    assert!(dir.join("m.gguf.sparrow-profile").exists());
    let parts = engine::bundle::BundleParts::read(&resident)
        .unwrap()
        .unwrap();
    for part in parts.all() {
        assert!(part.exists(), "{} missing", part.display());
    }
    // The bundle runs with nothing else given.
    let out = sparrow(&[
        "run",
        "-m",
        resident.to_str().unwrap(),
        "-n",
        "3",
        "-p",
        "ab",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A second conversion finds the profile and does not profile again.
    let out = sparrow(&[
        "convert",
        "-m",
        m,
        "-o",
        dir.join("again.gguf").to_str().unwrap(),
    ]);
    assert!(out.status.success());
    assert!(!String::from_utf8_lossy(&out.stderr).contains("profiling the model first"));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Without `--ctx`, a budget too small for the default context's KV cache (4096 tokens, reserved
/// whole) runs at a shorter context and says which; with `--ctx 4096` the same budget refuses,
/// naming the context. The budget is what the resident file and the process take at 4096 tokens
/// (as the refusal of a 1 MiB budget reports it) less half that context's KV cache.
fn budget_sizes_the_context(resident: &str) {
    let err = |o: &Output| String::from_utf8_lossy(&o.stderr).into_owned();
    let base = [
        "run",
        "-m",
        resident,
        "-p",
        "hi",
        "-n",
        "2",
        "--cache-type",
        "f16",
    ];
    let with = |extra: &[&str]| sparrow(&[&base[..], extra].concat());
    let out = with(&["--ctx", "4096", "--memory-budget", "1M"]);
    assert!(!out.status.success(), "{}", err(&out));
    let e = err(&out);
    let taken: f64 = e
        .split(" take ")
        .nth(1)
        .and_then(|t| t.split(" MiB").next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("the refusal names what stays resident: {e}"));
    let file = engine::ModelFile::open(resident).unwrap();
    let cfg = engine::Model::load(&file).unwrap().config.clone();
    let kv = cfg.kv_cache_bytes(4096, engine::KvFormat::F16) as f64;
    let budget = format!("{:.0}K", (taken * 1048576.0 - kv / 2.0) / 1024.0);

    let out = with(&["--memory-budget", &budget]);
    let e = err(&out);
    assert!(out.status.success(), "{e}");
    let ctx: usize = e
        .split("sparrow: context ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("says the context it chose: {e}"));
    assert!((256..4096).contains(&ctx), "{ctx}: {e}");
    assert!(
        e.contains(&format!("context {ctx} tokens, sized to --memory-budget")),
        "{e}"
    );

    let out = with(&["--memory-budget", &budget, "--ctx", "4096"]);
    let e = err(&out);
    assert!(!out.status.success(), "{e}");
    assert!(
        e.contains("leaves nothing for the FFN") && e.contains("--ctx 4096"),
        "{e}"
    );
}

/// `run --draft MODEL`: the default model drafting for itself keeps the greedy text and every drafted
/// token; `--self-draft` on a model in memory is refused with a reason.
#[test]
fn a_draft_model_and_self_draft_through_the_cli() {
    let model = engine::fetch::ensure_default_model(|_| {}).unwrap();
    let model = model.to_str().unwrap();
    let mut args = vec![
        "run",
        "-p",
        "def add(a, b):\n",
        "-n",
        "16",
        "--threads",
        "2",
        "--json",
        "--ignore-eos",
    ];
    let plain = ok_json(&args);
    args.extend(["--draft", model, "--draft-max", "3"]);
    let spec = ok_json(&args);
    assert_eq!(spec["generated_ids"], plain["generated_ids"], "{spec}");
    assert_eq!(spec["drafting"], "draft");
    let s = &spec["speculation"];
    assert!(s["drafted"].as_u64().unwrap() > 0, "{s}");
    assert_eq!(s["accepted"], s["drafted"], "{s}");
    for args in [
        &["run", "-p", "hi", "-n", "2", "--self-draft"][..],
        &["serve", "--port", "0", "--self-draft", "2"],
    ] {
        let out = sparrow(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(
            err.contains("--self-draft") && err.contains("in memory"),
            "{args:?}: {err}"
        );
    }
}

/// `perplexity` runs prompts only, so it makes none of the repacked Q4_0 copies of one-token decode
/// (which `run` makes for a dense Q4_0 model in memory on the x86 paths, and says so on stderr).
#[test]
fn perplexity_makes_no_decode_copies() {
    let model = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../fixtures/tiny-llama-silu-q4_0.gguf"
    );
    let text = std::env::temp_dir().join(format!("sparrow-cli-ppl-q40-{}.txt", std::process::id()));
    std::fs::write(
        &text,
        "one two three four five six seven eight. ".repeat(20),
    )
    .unwrap();
    let out = sparrow(&[
        "perplexity",
        "-m",
        model,
        "-f",
        text.to_str().unwrap(),
        "--window",
        "16",
        "--windows",
        "1",
    ]);
    std::fs::remove_file(&text).unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("repacked"), "perplexity repacked: {err}");
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2")
        && std::is_x86_feature_detected!("fma")
        && std::env::var_os("SPARROW_KERNELS").is_none()
        && std::env::var_os("SPARROW_Q40X8").is_none()
    {
        let out = sparrow(&["run", "-m", model, "-p", "hi", "-n", "1"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("repacked eight rows"),
            "run made no copies: {err}"
        );
        // Where the copies and the file would not fit in the memory left, none is made, and the
        // note says so (`SPARROW_MEMORY_ROOM` stands for a small machine).
        let out = Command::new(env!("CARGO_BIN_EXE_sparrow"))
            .args(["run", "-m", model, "-p", "hi", "-n", "1"])
            .env("SPARROW_MEMORY_ROOM", "64K")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{err}");
        assert!(
            err.contains("not repacked for decode") && !err.contains("repacked eight rows"),
            "copies made with no memory left: {err}"
        );
    }
}
