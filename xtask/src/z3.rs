//! `cargo xtask z3`: the Z3 library the planner's `z3` feature links against.
//!
//! Debian's `libz3-dev` (4.8.12) is older than the 4.13 that the `z3` crate needs, so the library comes
//! from the PyPI wheel `z3-solver` (pinned below), which ships a current `libz3.so`: downloaded with
//! `pip download --no-deps`, its `z3/lib/libz3.so*` unzipped to `target/z3/lib/`. Builds then use
//! `Z3_LIBRARY_PATH_OVERRIDE` (where z3-sys links from), `Z3_SYS_Z3_VERSION` (the wheel's version, so
//! z3-sys does not guess from a system Z3) and `LD_LIBRARY_PATH` (where the tests load it from).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

/// The wheel's version (its libz3 is Z3 4.15.4).
const WHEEL: &str = "z3-solver==4.15.4.0";
/// The Z3 version inside it.
const Z3_VERSION: &str = "4.15.4";

/// Installs the library under `root/target/z3/lib` when missing; returns that folder.
pub fn install(root: &Path) -> Result<PathBuf> {
    let lib = root.join("target").join("z3").join("lib");
    if lib.join("libz3.so").is_file() {
        return Ok(lib);
    }
    let download = root.join("target").join("z3").join("wheel");
    std::fs::create_dir_all(&download)?;
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    crate::run(
        Command::new(&python)
            .args(["-m", "pip", "download", "--no-deps", "--quiet", "-d"])
            .arg(&download)
            .arg(WHEEL),
    )
    .context("downloading the z3-solver wheel from PyPI (needs python3 with pip)")?;
    let wheel = std::fs::read_dir(&download)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .context("pip left no wheel")?;
    let staging = root.join("target").join("z3").join("lib.partial");
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(&staging)?;
    let script = "import sys, zipfile, os; z = zipfile.ZipFile(sys.argv[1]); \
        names = [n for n in z.namelist() if n.startswith('z3/lib/libz3.so')]; \
        assert names, 'no libz3.so in the wheel'; \
        [open(os.path.join(sys.argv[2], os.path.basename(n)), 'wb').write(z.read(n)) for n in names]";
    crate::run(
        Command::new(&python)
            .args(["-c", script])
            .arg(&wheel)
            .arg(&staging),
    )?;
    if !staging.join("libz3.so").is_file() {
        bail!("{}: no libz3.so inside", wheel.display());
    }
    let _ = std::fs::remove_dir_all(&lib);
    std::fs::rename(&staging, &lib)?;
    Ok(lib)
}

/// Sets the variables a build and run against the library at `lib` need.
pub fn env(cmd: &mut Command, lib: &Path) {
    cmd.env("Z3_LIBRARY_PATH_OVERRIDE", lib)
        .env("Z3_SYS_Z3_VERSION", Z3_VERSION);
    let ld = match std::env::var_os("LD_LIBRARY_PATH") {
        Some(old) if !old.is_empty() => {
            let mut p = lib.as_os_str().to_os_string();
            p.push(":");
            p.push(old);
            p
        }
        _ => lib.as_os_str().to_os_string(),
    };
    cmd.env("LD_LIBRARY_PATH", ld);
}

/// `cargo xtask z3`: installs the library and prints the variables to export.
pub fn main(root: &Path) -> Result<()> {
    let lib = install(root)?;
    println!("export Z3_LIBRARY_PATH_OVERRIDE={}", lib.display());
    println!("export Z3_SYS_Z3_VERSION={Z3_VERSION}");
    println!(
        "export LD_LIBRARY_PATH={}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}",
        lib.display()
    );
    Ok(())
}
