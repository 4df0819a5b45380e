//! Whether two paths name the same file, and refusing outputs that would overwrite inputs.

use std::path::{Path, PathBuf};

use crate::error::{AtomicError, Result};

/// Whether `a` and `b` are the same file: the same device and inode (through hard links and symlinks),
/// or the same canonical path. A path that does not exist yet compares by its canonical folder and
/// name, so `./new` and `new` are the same file before either is written.
pub fn same_file(a: impl AsRef<Path>, b: impl AsRef<Path>) -> bool {
    let (a, b) = (a.as_ref(), b.as_ref());
    if let (Ok(ma), Ok(mb)) = (std::fs::metadata(a), std::fs::metadata(b)) {
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt;
            if (ma.dev(), ma.ino()) == (mb.dev(), mb.ino()) {
                return true;
            }
        }
        #[cfg(not(unix))]
        let _ = (ma, mb);
    }
    match (canonical(a), canonical(b)) {
        (Some(x), Some(y)) => x == y,
        _ => false,
    }
}

/// The canonical path of `p`, or, where `p` does not exist, its folder's canonical path joined with
/// its name (recursively, for folders that do not exist either). `None` when no such form exists
/// (a name ending in `..` under a folder that does not exist).
fn canonical(p: &Path) -> Option<PathBuf> {
    if let Ok(c) = std::fs::canonicalize(p) {
        return Some(c);
    }
    let name = p.file_name()?;
    let dir = match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    Some(canonical(dir)?.join(name))
}

/// Refuses, before any work starts, outputs that are the same file as an input
/// ([`AtomicError::SameFile`]) or as an earlier output ([`AtomicError::SameOutput`]). Errors name the
/// paths as given.
pub fn refuse_same_file<O: AsRef<Path>, I: AsRef<Path>>(outputs: &[O], inputs: &[I]) -> Result<()> {
    for (k, output) in outputs.iter().enumerate() {
        let output = output.as_ref();
        if let Some(input) = inputs.iter().find(|i| same_file(output, i)) {
            return Err(AtomicError::SameFile {
                output: output.to_path_buf(),
                input: input.as_ref().to_path_buf(),
            });
        }
        if let Some(first) = outputs[..k].iter().find(|o| same_file(output, o)) {
            return Err(AtomicError::SameOutput {
                first: first.as_ref().to_path_buf(),
                second: output.to_path_buf(),
            });
        }
    }
    Ok(())
}
