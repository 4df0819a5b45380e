//! `sparrow serve` against the official `openai` Python client from PyPI (installed into a virtual
//! environment under `target/openai-venv` when missing; if pip cannot reach PyPI this test fails, it
//! does not skip): completion, chat, streaming, stop strings, n and seed, and errors (bad JSON, unknown
//! model, a prompt longer than the context, a bad parameter). The checks are in `openai_client.py`.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Command;

use support::{fixture, Server};

fn target_dir() -> PathBuf {
    // CARGO_BIN_EXE_sparrow is target/<profile>/sparrow.
    Path::new(env!("CARGO_BIN_EXE_sparrow"))
        .parent()
        .and_then(Path::parent)
        .expect("the binary is under target/<profile>/")
        .to_path_buf()
}

/// The venv's python, with `openai` installed (pip install when it is not importable yet).
fn python_with_openai() -> PathBuf {
    let venv = target_dir().join("openai-venv");
    let python = venv.join("bin/python");
    if !python.exists() {
        let host = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
        let st = Command::new(&host)
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .unwrap_or_else(|e| panic!("{host} -m venv: {e}"));
        assert!(st.success(), "creating the venv {} failed", venv.display());
    }
    let has = Command::new(&python)
        .args(["-c", "import openai"])
        .status()
        .is_ok_and(|s| s.success());
    if !has {
        let out = Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "openai",
            ])
            .output()
            .expect("pip runs");
        assert!(
            out.status.success(),
            "pip install openai failed (PyPI is needed for this test):\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    python
}

#[test]
fn official_openai_client_works_against_sparrow_serve() {
    let python = python_with_openai();
    let model = fixture("tiny-llama-silu-q4_0.gguf");
    let s = Server::start(&["-m", model.to_str().unwrap(), "--threads", "1"]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it/openai_client.py");
    let out = Command::new(&python)
        .arg(&script)
        .arg(format!("http://{}/v1", s.addr))
        .arg("tiny-llama-silu-q4_0")
        .arg("128")
        .output()
        .expect("python runs");
    assert!(
        out.status.success(),
        "openai_client.py failed:\n{}\n{}\nserver log:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        s.log.lock().unwrap()
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("all checks passed"));
}
