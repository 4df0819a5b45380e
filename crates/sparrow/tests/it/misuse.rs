//! Misuse from the command line (issue "Reliability"): every flag value outside its range is a usage
//! error naming the flag (exit 2, no panic), an error is one `error: ...` line without a backtrace even
//! with `RUST_BACKTRACE` set, and flags that a model makes moot are capped or ignored with a warning.

use std::process::{Command, Output};

fn sparrow(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sparrow"))
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("sparrow runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn assert_no_panic(err: &str) {
    for bad in [
        "panicked",
        "Stack backtrace",
        "RUST_BACKTRACE",
        "stack backtrace",
    ] {
        assert!(!err.contains(bad), "`{bad}` in: {err}");
    }
}

#[test]
fn out_of_range_values_are_usage_errors() {
    for (flag, value) in [
        ("--temp", "nan"),
        ("--temp", "-1"),
        ("--top-p", "1.5"),
        ("--min-p", "-0.5"),
        ("--repeat-penalty", "0"),
        ("--ffn-resident", "nan"),
        ("--ffn-resident", "-0.5"),
        ("--hot-share", "2"),
        ("--io-depth", "0"),
        ("--memory-budget", "99999999999999999999G"),
        ("--memory-budget", "nanM"),
        ("--threads", "5000"),
        ("--ctx", "-1"),
        ("--stop", ""),
    ] {
        let arg = format!("{flag}={value}");
        let out = sparrow(&["run", "-p", "hi", "-n", "1", &arg]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{flag} {value}: {err}");
        assert!(err.contains(flag), "{flag} {value} names the flag: {err}");
        assert_no_panic(&err);
    }
}

#[test]
fn errors_are_one_line_without_backtrace() {
    let out = sparrow(&["run", "--model", "/nonexistent/model.gguf", "-p", "hi"]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.starts_with("error: "), "{err}");
    assert!(err.contains("/nonexistent/model.gguf"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert_no_panic(&err);
}

#[test]
fn moot_flags_are_capped_or_ignored_with_a_warning() {
    let out = sparrow(&[
        "run",
        "-p",
        "The capital of France is",
        "-n",
        "2",
        "--threads",
        "999",
        "--ctx",
        "1000000",
        "--memory-budget",
        "100M",
    ]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("--threads 999 is more than"), "{err}");
    assert!(err.contains("past the model's training context"), "{err}");
    assert!(err.contains("--memory-budget applies to"), "{err}");
}

#[test]
fn non_regular_model_files_are_refused_by_name() {
    let dir = std::env::temp_dir().join(format!("sparrow-misuse-fifo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let fifo = dir.join("model.gguf");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    for model in [fifo.to_str().unwrap(), "/dev/zero"] {
        let start = std::time::Instant::now();
        let out = sparrow(&["run", "--model", model, "-p", "hi", "-n", "1"]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{model}: {err}");
        assert!(
            err.contains(model) && err.contains("not a regular file"),
            "{model}: {err}"
        );
        assert!(start.elapsed().as_secs() < 10, "{model} took too long");
    }
    // A /proc file stats as regular but cannot be mapped: still one clean line naming it.
    let out = sparrow(&["run", "--model", "/proc/self/environ", "-p", "hi"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.starts_with("error: /proc/self/environ"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert_no_panic(&err);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A file's size and a cheap digest of its bytes.
fn digest(p: &std::path::Path) -> (u64, u64) {
    let b = std::fs::read(p).unwrap();
    let mut h = 0xcbf29ce484222325u64;
    for x in &b {
        h = (h ^ u64::from(*x)).wrapping_mul(0x100000001b3);
    }
    (b.len() as u64, h)
}

#[test]
fn outputs_never_overwrite_inputs() {
    let dir = std::env::temp_dir().join(format!("sparrow-misuse-outputs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let model = dir.join("m.gguf");
    let cached = engine::fetch::ensure_default_model(|l| eprintln!("test setup: {l}")).unwrap();
    std::fs::copy(&cached, &model).unwrap();
    let m = model.to_str().unwrap();
    // A corpus file of its own (outside `dir`): an input that `-o` must not replace.
    let corpus =
        std::env::temp_dir().join(format!("sparrow-misuse-corpus-{}.txt", std::process::id()));
    std::fs::write(&corpus, include_str!("../../data/calibration.txt")).unwrap();
    let c = corpus.to_str().unwrap();
    let profile = dir.join("m.gguf.sparrow-profile");
    let out = sparrow(&[
        "profile",
        "-m",
        m,
        "--corpus",
        c,
        "--window",
        "64",
        "--windows",
        "2",
        "--calib-windows",
        "1",
        "--sparsity",
        "0.3",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let before = (digest(&model), digest(&profile));

    let same = format!("{}/./m.gguf", dir.display());
    for args in [
        vec!["convert", "-m", m, "-o", m],
        vec!["convert", "-m", m, "-o", &same],
        vec!["profile", "-m", m, "--corpus", c, "-o", &same],
        vec!["profile", "-m", m, "--corpus", c, "-o", c],
        vec!["train-predictor", "-m", m, "--corpus", c, "-o", m],
        vec![
            "train-predictor",
            "-m",
            m,
            "--corpus",
            c,
            "-o",
            profile.to_str().unwrap(),
        ],
    ] {
        let out = sparrow(&args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.starts_with("error: refusing to write"),
            "{args:?}: {err}"
        );
        assert_no_panic(&err);
        assert_eq!(
            (digest(&model), digest(&profile)),
            before,
            "{args:?} changed an input"
        );
    }
    // Nothing but the model and its profile in the folder: no output, no temporary.
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["m.gguf", "m.gguf.sparrow-profile"]);
    assert_eq!(
        std::fs::read_to_string(&corpus).unwrap(),
        include_str!("../../data/calibration.txt")
    );
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::remove_file(&corpus).unwrap();
}

/// A full disk while `profile` or `train-predictor` writes its output (EFBIG under a file-size limit,
/// with SIGXFSZ ignored as a shell's `trap` leaves it, so the write fails as on a full disk): a one-line
/// error naming the output, the earlier output byte-identical, no temporary left.
#[test]
fn a_full_disk_during_profile_or_train_predictor_keeps_the_earlier_output() {
    let dir = std::env::temp_dir().join(format!("sparrow-misuse-full-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let model = dir.join("m.gguf");
    let cached = engine::fetch::ensure_default_model(|l| eprintln!("test setup: {l}")).unwrap();
    std::fs::copy(&cached, &model).unwrap();
    let m = model.to_str().unwrap();
    let corpus = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/data/wikitext-2/valid.txt");
    let c = corpus.to_str().unwrap();
    let profile_args = [
        "profile",
        "-m",
        m,
        "--corpus",
        c,
        "--window",
        "64",
        "--windows",
        "2",
        "--calib-windows",
        "1",
        "--sparsity",
        "0.3",
    ];
    let train_args = [
        "train-predictor",
        "-m",
        m,
        "--corpus",
        c,
        "--window",
        "64",
        "--windows",
        "2",
        "--epochs",
        "1",
    ];
    for args in [&profile_args[..], &train_args[..]] {
        let out = sparrow(args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    }
    let outputs = [
        dir.join("m.gguf.sparrow-profile"),
        dir.join("m.gguf.sparrow-predictor"),
    ];
    let before: Vec<_> = outputs.iter().map(|p| digest(p)).collect();
    assert!(
        before.iter().all(|d| d.0 > 8192),
        "outputs larger than the limit: {before:?}"
    );
    for (args, out_file) in [
        (&profile_args[..], &outputs[0]),
        (&train_args[..], &outputs[1]),
    ] {
        let out = Command::new("bash")
            .arg("-c")
            .arg("trap '' XFSZ; ulimit -f 8; exec \"$0\" \"$@\"")
            .arg(env!("CARGO_BIN_EXE_sparrow"))
            .args(args)
            .output()
            .unwrap();
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        // The error names the output (today through its temporary `.NAME.sparrow-tmp-PID-SEQ`).
        let name = out_file.file_name().unwrap().to_str().unwrap();
        assert!(
            err.starts_with("error:") && err.contains(name) && err.contains("File too large"),
            "{args:?}: {err}"
        );
        assert_no_panic(&err);
        let after: Vec<_> = outputs.iter().map(|p| digest(p)).collect();
        assert_eq!(after, before, "{args:?} changed an earlier output");
    }
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "m.gguf",
            "m.gguf.sparrow-predictor",
            "m.gguf.sparrow-profile"
        ]
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
