//! The CLI as someone outside the repository runs it (issue 17, CLI hygiene): every command works from
//! a temporary directory with its defaults (the built-in texts, no `../shared/data`), `train-predictor
//! --profile` needs no `--sparse`, each subcommand's `--help` lists only the options it uses, and
//! `bench --plot` writes a well-formed SVG with the expected series.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A fresh directory outside the repository, the working directory of every command here.
fn outside(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("sparrow-anywhere-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn sparrow_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sparrow"))
        .args(args)
        .current_dir(dir)
        .output()
        .expect("sparrow runs")
}

fn ok(dir: &Path, args: &[&str]) -> String {
    let out = sparrow_in(dir, args);
    assert!(
        out.status.success(),
        "sparrow {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn ok_json(dir: &Path, args: &[&str]) -> serde_json::Value {
    let stdout = ok(dir, args);
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{args:?}: {e}: {stdout}"))
}

/// The long flags `--help` lists for `sub` (the first flag of each option line).
fn flags(sub: &str) -> Vec<String> {
    let help = ok(&std::env::temp_dir(), &[sub, "--help"]);
    help.lines()
        .map(str::trim_start)
        .filter(|l| l.starts_with('-'))
        .filter_map(|l| {
            l.split([' ', ','])
                .find(|w| w.starts_with("--"))
                .map(|w| w.split(['=', '<']).next().unwrap().to_string())
        })
        .collect()
}

#[test]
fn each_subcommand_lists_only_the_options_it_uses() {
    let has = |sub: &str, want: &[&str], not: &[&str]| {
        let f = flags(sub);
        for w in want {
            assert!(
                f.iter().any(|x| x == w),
                "`sparrow {sub} --help` lacks {w}: {f:?}"
            );
        }
        for n in not {
            assert!(
                !f.iter().any(|x| x == n),
                "`sparrow {sub} --help` lists {n}: {f:?}"
            );
        }
    };
    let sparse_and_offload = [
        "--sparse",
        "--predictor",
        "--no-predictor",
        "--memory-budget",
        "--ffn-resident",
        "--hot-share",
        "--io-depth",
        "--io-core",
        "--no-direct",
        "--two-phase",
        "--io-sync",
    ];
    has(
        "run",
        &[
            "--model",
            "--threads",
            "--ctx",
            "--requant",
            "--temp",
            "--sparse",
            "--memory-budget",
        ],
        &["--corpus", "--plot"],
    );
    has(
        "perplexity",
        &["--file", "--sparse", "--memory-budget"],
        &["--temp", "--corpus"],
    );
    has(
        "bench",
        &["--plot", "--budgets", "--offload", "--sparse"],
        &["--temp", "--corpus"],
    );
    has(
        "profile",
        &["--model", "--threads", "--corpus", "--sparsity", "--out"],
        &[&sparse_and_offload[..], &["--profile", "--temp"]].concat(),
    );
    has(
        "train-predictor",
        &["--model", "--profile", "--corpus", "--recall", "--out"],
        &[&sparse_and_offload[..], &["--temp", "--sparsity"]].concat(),
    );
    has(
        "convert",
        &["--model", "--profile", "--predictor", "--out"],
        &[&sparse_and_offload[..1], &sparse_and_offload[2..]].concat(),
    );
    has("models", &["--json"], &["--model", "--threads"]);
}

#[test]
fn defaults_work_outside_the_repository() {
    let d = outside("defaults");
    let p = d.join("m.sparrow-profile");
    let pred = d.join("m.sparrow-predictor");
    let (ps, preds) = (p.to_str().unwrap(), pred.to_str().unwrap());

    // perplexity without --file scores the built-in evaluation text.
    let v = ok_json(
        &d,
        &["perplexity", "--window", "64", "--windows", "2", "--json"],
    );
    assert!(v["file"].as_str().unwrap().contains("built-in"), "{v}");
    let ppl = v["ppl"].as_f64().unwrap();
    assert!(ppl.is_finite() && ppl > 1.0, "{v}");

    // profile without --corpus calibrates on the built-in calibration text.
    let v = ok_json(
        &d,
        &[
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
            ps,
            "--json",
        ],
    );
    assert!(v["tokens"].as_u64().unwrap() >= 128, "{v}");
    assert!(p.is_file());

    // train-predictor takes --profile without --sparse.
    let v = ok_json(
        &d,
        &[
            "train-predictor",
            "--profile",
            ps,
            "--window",
            "64",
            "--windows",
            "4",
            "-o",
            preds,
            "--json",
        ],
    );
    assert!(!v["layers"].as_array().unwrap().is_empty(), "{v}");
    assert!(pred.is_file());

    // Sparse bench takes its tokens from the built-in evaluation text, and plots.
    let svg = d.join("bench.svg");
    let v = ok_json(
        &d,
        &[
            "bench",
            "--sparse",
            "--profile",
            ps,
            "--predictor",
            preds,
            "-p",
            "16",
            "-n",
            "6",
            "-r",
            "1",
            "--json",
            "--plot",
            svg.to_str().unwrap(),
        ],
    );
    assert!(v["text"].as_str().unwrap().contains("built-in"), "{v}");
    assert!(v["sparse"]["tg_tok_s"].as_f64().unwrap() > 0.0, "{v}");
    let texts = svg_texts(&svg);
    for want in [
        "Per-token decode latency",
        "dense (6 steps)",
        "sparse (6 steps)",
        "decode tok/s",
    ] {
        assert!(texts.iter().any(|t| t == want), "no `{want}` in {texts:?}");
    }
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn bench_sweeps_memory_budgets_of_a_resident_model() {
    let d = outside("budgets");
    let p = d.join("m.sparrow-profile");
    let resident = d.join("m.resident.gguf");
    let ps = p.to_str().unwrap();
    ok(
        &d,
        &[
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
            ps,
        ],
    );
    ok(
        &d,
        &["convert", "--profile", ps, "-o", resident.to_str().unwrap()],
    );
    let svg = d.join("sweep.svg");
    let v = ok_json(
        &d,
        &[
            "bench",
            "-m",
            resident.to_str().unwrap(),
            "--budgets",
            "30%,100%",
            "-p",
            "8",
            "-n",
            "4",
            "-r",
            "1",
            "--ctx",
            "256",
            "--json",
            "--plot",
            svg.to_str().unwrap(),
        ],
    );
    let sweep = v["budget_sweep"].as_array().unwrap();
    assert_eq!(sweep.len(), 2, "{v}");
    assert_eq!(
        (sweep[0]["budget"].as_str(), sweep[1]["budget"].as_str()),
        (Some("30%"), Some("100%"))
    );
    let (small, all) = (
        sweep[0]["cache_resident_mib"].as_f64().unwrap(),
        sweep[1]["cache_resident_mib"].as_f64().unwrap(),
    );
    assert!(
        small > 0.0 && small < all,
        "a smaller budget caches less: {v}"
    );
    let texts = svg_texts(&svg);
    for want in [
        "Decode speed against memory budget",
        "budget 30% (4 steps)",
        "budget 100% (4 steps)",
        "FFN cache (MiB)",
    ] {
        assert!(texts.iter().any(|t| t == want), "no `{want}` in {texts:?}");
    }
    // A dense model has no budgets to sweep.
    let out = sparrow_in(
        &d,
        &["bench", "--budgets", "50%", "-p", "8", "-n", "2", "-r", "1"],
    );
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    // The load's notes (the repacked copies of its Q4_1 matrices) come first; the error is one
    // line, the last.
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("error: ") && last.contains("not a resident file"),
        "{err}"
    );
    std::fs::remove_dir_all(&d).unwrap();
}

/// The texts of a well-formed SVG file (it must parse as XML with an `svg` root).
fn svg_texts(path: &Path) -> Vec<String> {
    let s = std::fs::read_to_string(path).unwrap();
    let doc = roxmltree::Document::parse(&s).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    doc.descendants()
        .filter(|n| n.has_tag_name("text"))
        .filter_map(|n| n.text().map(|t| t.trim().to_string()))
        .collect()
}

#[test]
fn bench_sweeps_sparsities_with_perplexity_and_plots_the_trade_off() {
    let d = outside("sparsities");
    let model =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tiny-llama-silu-q4_0.gguf");
    let svg = d.join("tradeoff.svg");
    let v = ok_json(
        &d,
        &[
            "bench",
            "-m",
            model.to_str().unwrap(),
            "--sparsities",
            "0.3,0.8",
            "--ppl-windows",
            "1",
            "-p",
            "0",
            "-n",
            "4",
            "-r",
            "1",
            "--json",
            "--plot",
            svg.to_str().unwrap(),
        ],
    );
    let rows = v["sparsity_sweep"].as_array().unwrap();
    assert_eq!(rows.len(), 3, "dense and two sparsities: {v}");
    let sparsity: Vec<f64> = rows
        .iter()
        .map(|r| r["sparsity"].as_f64().unwrap())
        .collect();
    assert_eq!(sparsity[0], 0.0);
    assert!((sparsity[1] - 0.3).abs() < 1e-6 && (sparsity[2] - 0.8).abs() < 1e-6);
    assert!(rows.iter().all(|r| r["ppl"].as_f64().unwrap() > 1.0), "{v}");
    // Sparser means fewer down rows computed, and a perplexity of its own.
    let down = |r: &serde_json::Value| r["sparse_stats"]["down_frac"].as_f64().unwrap();
    assert!(down(&rows[2]) < down(&rows[1]), "{v}");
    assert_ne!(rows[0]["ppl"], rows[2]["ppl"], "{v}");
    let texts = svg_texts(&svg);
    for want in [
        "Sparsity / perplexity / decode speed",
        "dense (4 steps)",
        "sparsity 0.8 (4 steps)",
    ] {
        assert!(texts.iter().any(|t| t == want), "no `{want}` in {texts:?}");
    }
    std::fs::remove_dir_all(&d).unwrap();
}
