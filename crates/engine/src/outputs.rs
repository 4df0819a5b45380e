//! Files the engine's commands write: never over one of their inputs, and only ever whole (through
//! `atomic-out`: a temporary in the destination folder, fsynced, renamed into place, the folder
//! fsynced).

use std::path::Path;

use crate::error::Result;

/// Refuses, before any work starts, an output that is the same file as an input (same device and
/// inode, or the same canonical path) or as another output.
pub fn refuse_overwrite<O: AsRef<Path>, I: AsRef<Path>>(outputs: &[O], inputs: &[I]) -> Result<()> {
    Ok(atomic_out::refuse_same_file(outputs, inputs)?)
}

/// Copies `from` to `to` atomically: `to` holds either its old bytes or all of `from`'s.
pub fn copy_file(from: &Path, to: &Path) -> Result<()> {
    let bytes = std::fs::read(from).map_err(|source| crate::EngineError::Io {
        path: from.to_path_buf(),
        source,
    })?;
    Ok(atomic_out::write_atomic(to, &bytes)?)
}
