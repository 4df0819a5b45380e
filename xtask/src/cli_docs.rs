//! `cargo xtask cli-docs [--check]`: docs/CLI.md from the `sparrow` CLI's clap definitions, as
//! `sparrow __cli-markdown` prints them (`crates/sparrow/src/cli_markdown.rs`). `--check` fails when
//! the committed file differs instead of writing it.

use std::path::Path;
use std::process::Command;

use anyhow::{anyhow, bail, Context, Result};

pub fn run(root: &Path, args: &[String]) -> Result<()> {
    let check = match args {
        [] => false,
        [a] if a == "--check" => true,
        _ => bail!("usage: cargo xtask cli-docs [--check]"),
    };
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(root).args([
        "run",
        "-q",
        "--profile",
        "ci",
        "-p",
        "sparrow",
        "--",
        "__cli-markdown",
    ]);
    eprintln!("xtask: $ {c:?}");
    let out = c.output().context("starting cargo")?;
    if !out.status.success() {
        bail!(
            "sparrow __cli-markdown failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text = String::from_utf8(out.stdout).context("sparrow __cli-markdown: not UTF-8")?;
    let path = root.join("docs/CLI.md");
    if std::fs::read_to_string(&path).ok().as_deref() == Some(text.as_str()) {
        return Ok(());
    }
    if check {
        bail!("docs/CLI.md is out of date: run `cargo xtask cli-docs`");
    }
    atomic_out::write_atomic(&path, text.as_bytes())
        .map_err(|e| anyhow!("writing {}: {e}", path.display()))?;
    eprintln!("xtask: wrote docs/CLI.md");
    Ok(())
}
