//! The one output guard (issue 49): every output flag of every command (`src/path_flags.rs`, which a
//! unit test checks against the clap definitions) pointed at a model, at each part of a bundle the
//! command reads, or at a bundle's part it does not read, is refused before any work with a one-line
//! error, and no file in the folder changes (`sparrow plan -o b.neurons` replaced a bundle's store
//! with a plan; `sparrow bench --plot m.gguf` replaced the model with an SVG, exit 0).

#[path = "../../src/path_flags.rs"]
#[allow(dead_code)]
mod path_flags;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn sparrow(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sparrow"))
        .args(args)
        .output()
        .expect("sparrow runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(name)
}

/// Every file in `dir` with its bytes.
fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap_or_default(),
            )
        })
        .collect()
}

#[test]
fn every_output_flag_refuses_models_and_bundle_parts() {
    let dir = std::env::temp_dir().join(format!("sparrow-guard-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let model = dir.join("m.gguf");
    std::fs::copy(fixture("tiny-llama-silu-q4_0.gguf"), &model).unwrap();
    let m = model.to_str().unwrap();
    let bundle = dir.join("b.gguf");
    let b = bundle.to_str().unwrap();
    let out = sparrow(&[
        "profile",
        "-m",
        m,
        "--window",
        "16",
        "--windows",
        "2",
        "--calib-windows",
        "1",
        "--sparsity",
        "0.3",
    ]);
    assert!(out.status.success(), "profile: {}", stderr(&out));
    let out = sparrow(&["convert", "-m", m, "-o", b]);
    assert!(out.status.success(), "convert: {}", stderr(&out));
    let parts = engine::bundle::BundleParts::read(&bundle).unwrap().unwrap();
    let device = dir.join("dev.sparrow-device");
    std::fs::write(&device, b"not read before the guard").unwrap();
    let profile = parts.profile.to_str().unwrap().to_string();
    let scratch =
        std::env::temp_dir().join(format!("sparrow-guard-scratch-{}", std::process::id()));
    let scratch = scratch.to_str().unwrap().to_string();
    let d = device.to_str().unwrap().to_string();
    // Each command reading the bundle (convert reads the plain model: it cannot take a resident file).
    let base = |sub: &str| -> Vec<String> {
        let v: Vec<&str> = match sub {
            "bench" => vec!["bench", "-m", b, "-p", "4", "-n", "2", "-r", "1"],
            "calibrate" => vec!["calibrate", "--quick", "--dir", &scratch],
            "convert" => vec!["convert", "-m", m],
            "plan" => vec!["plan", "-m", b, "--device", &d],
            "profile" => vec!["profile", "-m", b],
            "train-predictor" => vec!["train-predictor", "-m", b, "--profile", &profile],
            other => panic!("no arguments for `sparrow {other}`: add them here"),
        };
        v.into_iter().map(String::from).collect()
    };
    let mut targets: Vec<PathBuf> = parts.all();
    targets.push(model.clone());
    targets.push(PathBuf::from(format!("{}/./{}", dir.display(), "b.gguf")));
    let before = snapshot(&dir);
    let mut runs = 0;
    for &(sub, flag) in path_flags::OUTPUT_FLAGS {
        for target in &targets {
            // Converting over an earlier bundle's resident file is what convert -o is for.
            if sub == "convert" && target.file_name() == bundle.file_name() {
                continue;
            }
            let mut args = base(sub);
            if sub == "convert" && target == &model {
                // Its input profile too.
                let mut more = args.clone();
                more.extend(["-o".into(), format!("{}.sparrow-profile", model.display())]);
                let more: Vec<&str> = more.iter().map(String::as_str).collect();
                let err = stderr(&sparrow(&more));
                assert!(
                    err.starts_with("error: refusing to write"),
                    "{more:?}: {err}"
                );
            }
            args.push(format!("--{flag}"));
            args.push(target.to_str().unwrap().to_string());
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let out = sparrow(&args);
            let err = stderr(&out);
            assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
            assert!(
                err.starts_with("error: refusing to write"),
                "{args:?}: {err}"
            );
            assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
            let now = snapshot(&dir);
            assert_eq!(
                now.keys().collect::<Vec<_>>(),
                before.keys().collect::<Vec<_>>(),
                "{args:?} left a file"
            );
            assert!(now == before, "{args:?} changed a file");
            runs += 1;
        }
    }
    assert!(runs >= 30, "{runs}");
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `profile` and `train-predictor` need the model's own FFN: given a resident file they stop with one
/// line naming it and saying what to run (they used to end in "kernel error in transposed ffn down
/// ... got 0", naming no file). A bundle whose profile is gone says how to make it whole.
#[test]
fn a_resident_file_is_refused_by_profile_and_train_naming_it() {
    let dir = std::env::temp_dir().join(format!("sparrow-resident-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let model = dir.join("m.gguf");
    std::fs::copy(fixture("tiny-llama-silu-q4_0.gguf"), &model).unwrap();
    let (m, b) = (model.to_str().unwrap(), dir.join("b.gguf"));
    let b = b.to_str().unwrap();
    let out = sparrow(&["convert", "-m", m, "-o", b]);
    assert!(out.status.success(), "convert: {}", stderr(&out));
    let parts = engine::bundle::BundleParts::read(Path::new(b))
        .unwrap()
        .unwrap();
    std::fs::remove_file(&parts.profile).unwrap();
    let before = snapshot(&dir);
    let out = sparrow(&["run", "-m", b, "-p", "hi", "-n", "1"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(parts.profile.to_str().unwrap()) && err.contains("sparrow convert"),
        "{err}"
    );
    for args in [
        vec!["profile", "-m", b],
        vec!["train-predictor", "-m", b, "--profile", m],
    ] {
        let out = sparrow(&args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.starts_with(&format!("error: {b}: a resident file"))
                && err.contains("original model")
                && err.trim_end().lines().count() == 1,
            "{args:?}: {err}"
        );
    }
    assert!(snapshot(&dir) == before, "a file changed");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Every file Sparrow reads is refused by name, at once, when it is not a regular file: a FIFO given
/// as `perplexity -f`, `profile --corpus`, `--profile`, `--predictor`, `--plan`, `--device` or as a
/// bundle's profile used to hang, and `/dev/zero` was read until memory ran out.
#[test]
fn inputs_that_are_not_regular_files_are_refused_by_name() {
    let dir = std::env::temp_dir().join(format!("sparrow-inputs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let model = dir.join("m.gguf");
    std::fs::copy(fixture("tiny-llama-silu-q4_0.gguf"), &model).unwrap();
    let (m, b) = (model.to_str().unwrap(), dir.join("b.gguf"));
    let b = b.to_str().unwrap();
    let out = sparrow(&["convert", "-m", m, "-o", b]);
    assert!(out.status.success(), "convert: {}", stderr(&out));
    let fifo = dir.join("fifo");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let f = fifo.to_str().unwrap();
    let mut cases: Vec<Vec<&str>> = Vec::new();
    for input in [f, "/dev/zero"] {
        cases.extend([
            vec!["perplexity", "-m", m, "-f", input],
            vec!["profile", "-m", m, "--corpus", input, "-o", "/dev/null/x"],
            vec![
                "run",
                "-m",
                m,
                "-p",
                "hi",
                "-n",
                "1",
                "--sparse",
                "--profile",
                input,
            ],
            vec![
                "run",
                "-m",
                b,
                "-p",
                "hi",
                "-n",
                "1",
                "--sparse",
                "--predictor",
                input,
            ],
            vec!["plan", "-m", m, "--device", input, "-o", "/dev/null/x"],
            vec!["run", "-m", m, "-p", "hi", "-n", "1", "--plan", input],
            vec![
                "bench", "-m", m, "-p", "4", "-n", "2", "-r", "1", "--text", input,
            ],
        ]);
    }
    for args in &cases {
        let input = args
            .iter()
            .find(|a| **a == f || **a == "/dev/zero")
            .unwrap();
        let start = std::time::Instant::now();
        let out = sparrow(args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.contains(input) && err.contains("not a regular file"),
            "{args:?}: {err}"
        );
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
        assert!(start.elapsed().as_secs() < 10, "{args:?} took too long");
    }
    // The bundle's own profile replaced by a FIFO.
    let parts = engine::bundle::BundleParts::read(Path::new(b))
        .unwrap()
        .unwrap();
    std::fs::remove_file(&parts.profile).unwrap();
    assert!(Command::new("mkfifo")
        .arg(&parts.profile)
        .status()
        .unwrap()
        .success());
    let start = std::time::Instant::now();
    let out = sparrow(&["run", "-m", b, "-p", "hi", "-n", "1"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(parts.profile.to_str().unwrap()) && err.contains("not a regular file"),
        "{err}"
    );
    assert!(start.elapsed().as_secs() < 10);
    std::fs::remove_dir_all(&dir).unwrap();
}
