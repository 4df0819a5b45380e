//! `--accel` on a resident file (`sparrow convert`), as a user runs it: prompt steps stream each
//! layer's FFN from flash onto the accelerator (here QNN through the test double, loaded by path as
//! libQnnHtp.so would be), and decode is hybrid, each layer's hottest units on the accelerator in
//! memory the neuron cache gives up (`--accel-hot 0`: decode sparse on the CPU); a library that
//! does not load, lacks QNN's entry point, speaks another API version or fails a set-up call is a
//! warning naming it and the CPU's answer; a QNN call failing mid-run is a warning after the
//! answer, which the CPU finished.

use std::path::PathBuf;
use std::process::{Command, Output};

fn sparrow(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sparrow"))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("sparrow runs")
}

/// The tiny SiLU fixture converted (profiled first) in this test's own folder.
fn bundle() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sparrow-accel-cli-{}", std::process::id()));
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
    let out = sparrow(&["convert", "-m", model.to_str().unwrap()], &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    dir.join("m.resident.gguf")
}

#[test]
fn prompt_steps_of_a_resident_file_run_on_the_accelerator() {
    let resident = bundle();
    let double = qnn_double::library_path().expect("cargo builds the QNN double for the tests");
    let qnn = format!("qnn-f32:{}", double.display());
    let r = resident.to_str().unwrap();
    let run = ["run", "-m", r, "-p", "one two three four five", "-n", "3"];
    let with = |accel: &str, env: &[(&str, &str)]| {
        let args: Vec<&str> = [&run[..], &["--accel", accel]].concat();
        let out = sparrow(&args, env);
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(out.status.success(), "{args:?}: {err}");
        err
    };
    let err = with(&qnn, &[]);
    assert!(err.contains("prompt steps on the qnn accelerator"), "{err}");
    assert!(
        err.contains("hybrid decode: the hottest") && err.contains("on the qnn accelerator ("),
        "{err}"
    );
    assert!(!err.contains("warning"), "{err}");
    let err = with("cpu", &[]);
    assert!(err.contains("prompt steps on the cpu accelerator"), "{err}");
    assert!(err.contains("on the cpu accelerator ("), "{err}");
    // No share for decode: prompt steps alone on the accelerator.
    let args: Vec<&str> = [&run[..], &["--accel", "cpu", "--accel-hot", "0"]].concat();
    let out = sparrow(&args, &[]);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("decode sparse on the CPU") && !err.contains("hybrid decode"),
        "{err}"
    );
    // A library that does not load: a warning naming it, the CPU.
    let err = with("qnn:/nonexistent/libQnnHtp.so", &[]);
    assert!(
        err.contains("warning") && err.contains("/nonexistent/libQnnHtp.so"),
        "{err}"
    );
    assert!(err.contains("the FFN on the CPU"), "{err}");
    assert!(!err.contains("hybrid decode"), "{err}");
    // A library that loads but cannot be used (no QNN entry point, another API version, a set-up
    // call failing): a warning naming what is wrong, and the CPU's answer.
    let cpu = sparrow(&run, &[]);
    assert!(cpu.status.success());
    let setup_failures = [
        (
            "qnn:libm.so.6".to_string(),
            None,
            "QnnInterface_getProviders",
        ),
        (
            qnn.clone(),
            Some((qnn_double::API_MAJOR_ENV, "3")),
            "core API 3",
        ),
        (
            qnn.clone(),
            Some((qnn_double::FAIL_ENV, "backendCreate")),
            "backendCreate",
        ),
        (
            qnn.clone(),
            Some((qnn_double::FAIL_ENV, "contextCreate")),
            "contextCreate",
        ),
    ];
    for (accel, env, named) in setup_failures {
        let args: Vec<&str> = [&run[..], &["--accel", &accel]].concat();
        let out = sparrow(&args, env.as_slice());
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(out.status.success(), "{accel} {env:?}: {err}");
        assert!(
            err.contains("warning") && err.contains(named),
            "{accel} {env:?}: {err}"
        );
        assert!(err.contains("the FFN on the CPU"), "{accel} {env:?}: {err}");
        assert_eq!(
            out.stdout, cpu.stdout,
            "{accel} {env:?}: not the CPU's answer"
        );
    }
    // Every graph execution fails: the answer all the same, then a warning naming the step.
    let err = with(&qnn, &[(qnn_double::FAIL_ENV, "graphExecute")]);
    assert!(
        err.contains("warning: the accelerator failed") && err.contains("graphExecute"),
        "{err}"
    );
    std::fs::remove_dir_all(resident.parent().unwrap()).ok();
}
