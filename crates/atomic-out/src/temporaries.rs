//! Names of temporaries (`.NAME.sparrow-tmp-PID-SEQ` next to `NAME`), listing them, and removing those
//! whose writer has died.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use crate::error::{AtomicError, Result};

/// What follows `.NAME` in a temporary's name, before the pid.
const MARK: &str = ".sparrow-tmp-";

/// The folder and file name a destination path stands for (`x` is `./x`).
pub(crate) fn split(dest: &Path) -> Result<(PathBuf, OsString)> {
    let name = dest
        .file_name()
        .ok_or_else(|| AtomicError::NotAFileName {
            path: dest.to_path_buf(),
        })?
        .to_owned();
    let dir = match dest.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    Ok((dir, name))
}

/// The temporary's file name for destination file `name`, writer `pid`, sequence number `seq`.
pub(crate) fn temporary_name(name: &OsStr, pid: u32, seq: u32) -> OsString {
    let mut t = OsString::from(".");
    t.push(name);
    t.push(format!("{MARK}{pid}-{seq}"));
    t
}

/// The pid in `entry` if it is the name of a temporary for destination file `name`.
fn pid_of(entry: &OsStr, name: &OsStr) -> Option<u32> {
    let rest = entry
        .as_encoded_bytes()
        .strip_prefix(b".")?
        .strip_prefix(name.as_encoded_bytes())?
        .strip_prefix(MARK.as_bytes())?;
    let rest = std::str::from_utf8(rest).ok()?;
    let (pid, seq) = rest.split_once('-').unwrap_or((rest, "0"));
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(pid) || !digits(seq) {
        return None;
    }
    pid.parse().ok()
}

/// The temporaries (of any process) for `dest` that exist now, with their writers' pids, sorted by name.
fn list(dest: &Path) -> Result<Vec<(PathBuf, u32)>> {
    let (dir, name) = split(dest)?;
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(AtomicError::io("listing folder", &dir)(e)),
    };
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry.map_err(AtomicError::io("listing folder", &dir))?;
        if let Some(pid) = pid_of(&entry.file_name(), &name) {
            found.push((entry.path(), pid));
        }
    }
    found.sort();
    Ok(found)
}

/// The temporaries for `dest` that exist now, written by any process (live or dead), sorted by name.
/// A folder that does not exist has none.
pub fn temporaries(dest: impl AsRef<Path>) -> Result<Vec<PathBuf>> {
    Ok(list(dest.as_ref())?.into_iter().map(|(p, _)| p).collect())
}

/// Removes the temporaries for `dest` whose writer process is no longer alive (an interrupted earlier
/// run) and returns their paths. Temporaries of live processes, this one included, are kept: they may
/// be being written. Nothing else in the folder is touched.
pub fn remove_stale_temporaries(dest: impl AsRef<Path>) -> Result<Vec<PathBuf>> {
    let mut removed = Vec::new();
    for (path, pid) in list(dest.as_ref())? {
        if pid_alive(pid) {
            continue;
        }
        match std::fs::remove_file(&path) {
            Ok(()) => removed.push(path),
            // Another process cleaned it up first.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(AtomicError::io("removing stale temporary", &path)(e)),
        }
    }
    Ok(removed)
}

#[cfg(unix)]
use crate::sys::pid_alive;

/// Whether process `pid` exists. Without `kill(2)` every writer counts as alive (nothing is removed).
#[cfg(not(unix))]
fn pid_alive(_pid: u32) -> bool {
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_strangers_do_not_match() {
        let n = OsStr::new("m.gguf");
        assert_eq!(temporary_name(n, 42, 7), ".m.gguf.sparrow-tmp-42-7");
        assert_eq!(pid_of(&temporary_name(n, 42, 7), n), Some(42));
        assert_eq!(pid_of(OsStr::new(".m.gguf.sparrow-tmp-9"), n), Some(9));
        for other in [
            "m.gguf",
            ".m.gguf.sparrow-tmp-",
            ".m.gguf.sparrow-tmp-x",
            ".m.gguf.sparrow-tmp-1-",
            ".m.gguf.sparrow-tmp-1-2-3",
            ".m.gguf.x.sparrow-tmp-1-2",
            ".n.gguf.sparrow-tmp-1-2",
            "m.gguf.tmp-1",
        ] {
            assert_eq!(pid_of(OsStr::new(other), n), None, "{other}");
        }
    }

    #[test]
    fn this_process_is_alive_and_an_impossible_pid_is_not() {
        assert!(pid_alive(std::process::id()));
        assert!(!pid_alive(2_000_000_000));
        assert!(!pid_alive(0));
    }

    #[test]
    fn a_plain_name_lives_in_the_current_folder() {
        let (dir, name) = split(Path::new("x")).unwrap();
        assert_eq!(
            (dir.as_path(), name.as_os_str()),
            (Path::new("."), OsStr::new("x"))
        );
        assert!(split(Path::new("/")).is_err());
        assert!(split(Path::new("a/..")).is_err());
    }
}
