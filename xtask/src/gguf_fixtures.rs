//! The second half of `cargo xtask fixtures`: dequantization fixtures made by an independent
//! implementation, the PyPI `gguf` package (llama.cpp's `gguf-py`, whose `gguf.quants.dequantize` covers
//! every ggml type).
//!
//! A virtual environment under `target/gguf-venv` gets `gguf==0.19.0` and numpy from PyPI (once), then
//! `crates/kernels-neon/tests/data/gen_quants.py` writes `crates/kernels-neon/tests/data/<format>.bin`
//! (random blocks and their values, checked by that crate's `tests/it/gguf_fixture.rs` on every kernel path)
//! and `fixtures/quants-gguf-python.gguf` (one tensor per format and its values, written by
//! `gguf.GGUFWriter`, checked by `crates/engine/tests/it/gguf_python.rs`). Both are seeded, so a rerun with
//! the same package versions rewrites the same bytes. `PYTHON` names the interpreter (default `python3`).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

/// The `gguf` package version the committed fixtures were made with.
const GGUF_VERSION: &str = "0.19.0";

fn run(c: &mut Command) -> Result<()> {
    eprintln!("xtask: {c:?}");
    let status = c.status().with_context(|| format!("running {c:?}"))?;
    if !status.success() {
        bail!("{c:?} failed with {status}");
    }
    Ok(())
}

/// Writes the fixtures (see the module docs) and returns their paths.
pub fn write(root: &Path) -> Result<Vec<PathBuf>> {
    let venv = root.join("target").join("gguf-venv");
    let py = venv.join("bin").join("python");
    let marker = venv.join(format!("gguf-{GGUF_VERSION}"));
    if !marker.exists() {
        let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
        run(Command::new(python).args(["-m", "venv"]).arg(&venv))?;
        run(Command::new(&py)
            .args(["-m", "pip", "install", "--quiet"])
            .arg(format!("gguf=={GGUF_VERSION}"))
            .arg("numpy"))?;
        std::fs::write(&marker, b"")?;
    }
    let data = root.join("crates/kernels-neon/tests/data");
    let gguf = root.join("fixtures/quants-gguf-python.gguf");
    run(Command::new(&py)
        .arg(data.join("gen_quants.py"))
        .arg(&data)
        .arg(&gguf))?;
    let mut out: Vec<PathBuf> = std::fs::read_dir(&data)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "bin"))
        .collect();
    out.sort();
    out.push(gguf);
    Ok(out)
}
