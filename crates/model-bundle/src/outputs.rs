//! Files the engine's commands write: never over one of their inputs or a part of a bundle they
//! touch, never over a file of another kind, and only ever whole (through `atomic-out`: a temporary
//! in the destination folder, fsynced, renamed into place, the folder fsynced).
//!
//! [`guard`] is the one check every command of the CLI runs on its outputs before any work.

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::bundle_parts::BundleParts;
use crate::error::{BundleError, Result};

/// What a command writes, for [`guard`]: an existing file that is recognisably of another kind is
/// never written over (`bench --plot m.gguf` once replaced the model with an SVG).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputKind {
    /// A GGUF file (a resident file).
    Gguf,
    /// An activation profile.
    Profile,
    /// Predictors.
    Predictor,
    /// A plan (`sparrow plan`).
    Plan,
    /// A device profile (`sparrow calibrate`).
    Device,
    /// Anything else Sparrow writes (an SVG plot, JSON): it may replace only a file that is none of
    /// Sparrow's kinds.
    Other,
}

/// The kinds of file [`guard`] recognises by their first bytes, with their names in messages.
const KINDS: [(&[u8], Option<OutputKind>, &str); 8] = [
    (b"GGUF", Some(OutputKind::Gguf), "a GGUF model"),
    (b"SPRWNSTO", None, "a neuron store"),
    (
        b"SPRWPROF",
        Some(OutputKind::Profile),
        "an activation profile",
    ),
    (b"SPRWPRED", Some(OutputKind::Predictor), "a predictor file"),
    (b"sparrow-manifest ", None, "a bundle manifest"),
    (b"sparrow-plan ", Some(OutputKind::Plan), "a plan"),
    (
        b"sparrow-device ",
        Some(OutputKind::Device),
        "a device profile",
    ),
    (b"PK\x03\x04", None, "a zip archive"),
];

/// The kind of the existing regular file at `path` by its first bytes: `(kind, name)`, `None` when
/// it is none of [`KINDS`] (or cannot be read).
fn kind_of(path: &Path) -> Option<(Option<OutputKind>, &'static str)> {
    let mut head = [0u8; 32];
    let n = std::fs::File::open(path)
        .and_then(|f| {
            let mut n = 0;
            let mut f = f.take(head.len() as u64);
            loop {
                match f.read(&mut head[n..]) {
                    Ok(0) => break Ok(n),
                    Ok(k) => n += k,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => break Err(e),
                }
            }
        })
        .ok()?;
    KINDS
        .iter()
        .find(|(magic, _, _)| head[..n].starts_with(magic))
        .map(|&(_, k, name)| (k, name))
}

/// Every file that comes with `input`: itself and, for a resident file, every part of its bundle.
/// (An ordinary model's sidecars are inputs only of the commands that read them, which name them
/// among their inputs: `sparrow profile` rewrites the model's profile.)
fn with_bundle(input: &Path) -> Vec<PathBuf> {
    let mut all = vec![input.to_path_buf()];
    if let Ok(Some(parts)) = BundleParts::read(input) {
        all.extend(parts.all());
    }
    all
}

/// The one output check of every command, run before any work: refuses an output that is the same
/// file as an input, as a part of the bundle of an input resident file (the file, store, manifest,
/// profile, predictors), or as another output; an existing output that is not a regular file; and
/// an existing output that is recognisably a file of another kind than the one written (a model, a
/// store, a manifest, a plan ...). Inputs that do not exist are skipped (the command names them
/// itself).
pub fn guard<I: AsRef<Path>>(outputs: &[(&Path, OutputKind)], inputs: &[I]) -> Result<()> {
    let mut read: Vec<PathBuf> = Vec::new();
    for i in inputs {
        read.extend(with_bundle(i.as_ref()));
    }
    let paths: Vec<&Path> = outputs.iter().map(|(p, _)| *p).collect();
    refuse_overwrite(&paths, &read)?;
    for &(out, kind) in outputs {
        let Ok(meta) = std::fs::metadata(out) else {
            continue;
        };
        let refuse = |detail: String| {
            BundleError::Request(format!("refusing to write {}: {detail}", out.display()))
        };
        if !meta.is_file() {
            return Err(refuse("it exists and is not a regular file".into()));
        }
        if let Some((found, name)) = kind_of(out) {
            if found != Some(kind) {
                return Err(refuse(format!(
                    "it is {name}, which this output would replace (give another path)"
                )));
            }
        }
    }
    Ok(())
}

/// Refuses, before any work starts, an output that is the same file as an input (same device and
/// inode, or the same canonical path) or as another output. [`guard`] is the full check.
pub fn refuse_overwrite<O: AsRef<Path>, I: AsRef<Path>>(outputs: &[O], inputs: &[I]) -> Result<()> {
    Ok(atomic_out::refuse_same_file(outputs, inputs)?)
}

/// Copies `from` (a regular file of at most `limit` bytes) to `to` atomically: `to` holds either its
/// old bytes or all of `from`'s.
pub fn copy_file(from: &Path, to: &Path, limit: u64) -> Result<()> {
    let bytes = atomic_out::read_bounded(from, limit)?;
    Ok(atomic_out::write_atomic(to, &bytes)?)
}
