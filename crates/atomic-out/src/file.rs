//! [`AtomicFile`]: a file written under a temporary name and renamed into place by
//! [`AtomicFile::commit`].

use std::fs::File;
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::error::{AtomicError, Result};
use crate::temporaries::{remove_stale_temporaries, split, temporary_name};

/// Sequence numbers that keep two temporaries of this process for one destination apart.
static SEQ: AtomicU32 = AtomicU32::new(0);

/// An output file being written. It lives under a temporary name in the destination's folder
/// (`.NAME.sparrow-tmp-PID-SEQ`) until [`commit`](Self::commit) syncs it, renames it over the
/// destination and syncs the folder; dropped uncommitted (an error, a panic, an early return) it is
/// removed and the destination is untouched.
///
/// Writes go straight to the file (wrap it in a `BufWriter` for small writes); [`file`](Self::file)
/// gives the `File` for positioned writes (`FileExt::write_at`) and `set_len`.
#[derive(Debug)]
pub struct AtomicFile {
    file: File,
    /// As given, for [`AtomicFile::dest`] and errors.
    dest: PathBuf,
    /// The folder and name the temporary is renamed to (`x` is `./x`; a trailing `/` is dropped).
    target: PathBuf,
    dir: PathBuf,
    tmp: PathBuf,
    committed: bool,
}

impl AtomicFile {
    /// Creates the temporary for `dest` (readable and writable, empty). Temporaries for `dest` left by
    /// dead processes are removed first (best effort). `dest` itself is neither opened nor checked: it
    /// may or may not exist.
    pub fn create(dest: impl AsRef<Path>) -> Result<Self> {
        let dest = dest.as_ref();
        let (dir, name) = split(dest)?;
        // A failure here (an unreadable folder) shows again, with its cause, when creating the temporary.
        let _ = remove_stale_temporaries(dest);
        let pid = std::process::id();
        let mut tries = 0;
        loop {
            let tmp = dir.join(temporary_name(
                &name,
                pid,
                SEQ.fetch_add(1, Ordering::Relaxed),
            ));
            match File::options()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&tmp)
            {
                Ok(file) => {
                    return Ok(AtomicFile {
                        file,
                        dest: dest.to_path_buf(),
                        target: dir.join(&name),
                        dir,
                        tmp,
                        committed: false,
                    })
                }
                // Left by an earlier process that had this pid: take the next number.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && tries < 1000 => {
                    tries += 1
                }
                Err(e) => return Err(AtomicError::io("creating temporary file", &tmp)(e)),
            }
        }
    }

    /// The destination, as given to [`create`](Self::create).
    pub fn dest(&self) -> &Path {
        &self.dest
    }

    /// Where the data is until [`commit`](Self::commit).
    pub fn temp_path(&self) -> &Path {
        &self.tmp
    }

    /// The temporary file, for positioned writes, `set_len` or `metadata`.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// The temporary file, mutably.
    pub fn file_mut(&mut self) -> &mut File {
        &mut self.file
    }

    /// Makes the data durable under the destination's name: syncs the file, renames it over the
    /// destination (atomically replacing any file there) and syncs the folder so the rename survives a
    /// crash. On an error before the rename the temporary is removed and the destination is untouched.
    pub fn commit(mut self) -> Result<()> {
        self.file
            .sync_all()
            .map_err(AtomicError::io("syncing temporary file", &self.tmp))?;
        std::fs::rename(&self.tmp, &self.target)
            .map_err(AtomicError::io("renaming temporary file to", &self.dest))?;
        self.committed = true;
        sync_dir(&self.dir)
    }
}

/// Syncs a folder's entries (a rename in it) to disk. Filesystems that cannot sync a folder (EINVAL)
/// are taken as done.
fn sync_dir(dir: &Path) -> Result<()> {
    #[cfg(unix)]
    {
        let d = File::open(dir).map_err(AtomicError::io("opening folder", dir))?;
        match d.sync_all() {
            Err(e) if e.raw_os_error() != Some(libc::EINVAL) => {
                Err(AtomicError::io("syncing folder", dir)(e))
            }
            _ => Ok(()),
        }
    }
    #[cfg(not(unix))]
    {
        let _ = dir;
        Ok(())
    }
}

impl Write for AtomicFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.file.write(buf)
    }

    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        self.file.write_all(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

impl Seek for AtomicFile {
    fn seek(&mut self, pos: SeekFrom) -> std::io::Result<u64> {
        self.file.seek(pos)
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// Writes `bytes` to `dest` through an [`AtomicFile`]: all of them or, on any error, nothing.
pub fn write_atomic(dest: impl AsRef<Path>, bytes: &[u8]) -> Result<()> {
    let mut f = AtomicFile::create(dest)?;
    f.write_all(bytes)
        .map_err(AtomicError::io("writing temporary file", &f.tmp))?;
    f.commit()
}
