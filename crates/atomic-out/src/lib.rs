//! `atomic-out`: output files that cannot destroy inputs or leave half-written files under a real name.
//!
//! Every file Sparrow writes (profile, predictor, calibration, plan, resident file, store, bundle parts)
//! goes through [`AtomicFile`]: it is written under a temporary name in the destination's folder
//! (`.NAME.sparrow-tmp-PID-SEQ`, recognisably ours and carrying the writer's pid), and
//! [`AtomicFile::commit`] fsyncs it, renames it over the destination and fsyncs the folder. A writer
//! that fails, panics or is dropped removes its temporary; one that is killed leaves it behind, and the
//! next [`AtomicFile::create`] for that destination (or [`remove_stale_temporaries`]) removes it once
//! its pid is dead. Before any work, [`refuse_same_file`] refuses an output that is the same file as an
//! input ([`same_file`]: same device and inode, or the same canonical path).
//!
//! Inputs have their one safe read here too, as the lowest layer every reader depends on:
//! [`read_bounded`] refuses anything but a regular file (opened without blocking, so a FIFO cannot
//! hang it; `/dev/zero` is not read until memory runs out) and a file larger than its kind's limit.
//!
//! # Example
//!
//! ```
//! use std::io::Write;
//! use atomic_out::{refuse_same_file, AtomicFile, AtomicError};
//!
//! let dir = std::env::temp_dir().join(format!("atomic-out-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir).unwrap();
//! let (input, output) = (dir.join("model.gguf"), dir.join("model.profile"));
//! std::fs::write(&input, b"weights").unwrap();
//!
//! // `-o model.gguf` would be refused; a different name is fine.
//! assert!(matches!(refuse_same_file(&[&input], &[&input]), Err(AtomicError::SameFile { .. })));
//! refuse_same_file(&[&output], &[&input])?;
//!
//! let mut f = AtomicFile::create(&output)?;
//! f.write_all(b"profile").unwrap();
//! assert!(!output.exists()); // nothing under the real name until commit
//! f.commit()?;
//! assert_eq!(std::fs::read(&output).unwrap(), b"profile");
//! # std::fs::remove_dir_all(&dir).unwrap();
//! # Ok::<(), AtomicError>(())
//! ```
//!
//! # Invariants
//!
//! * **The destination holds the old file or the whole new one**, never a part: the only operation on
//!   its name is one `rename(2)`, after the data is synced.
//! * **Temporaries stay in the destination's folder** (same filesystem, so the rename is atomic) and are
//!   created with `O_EXCL`: an existing file is never opened for writing.
//! * **Only dead writers' temporaries are removed**, and only those for the destination at hand; a
//!   live process's (this one's included) are left alone.
//! * No workspace dependencies (layer 0); `libc` only for `kill(pid, 0)` and `EINVAL`.

mod error;
mod file;
mod input;
mod same;
#[cfg(unix)]
mod sys;
mod temporaries;

#[cfg(feature = "testing")]
pub mod testing;

pub use error::{AtomicError, Result};
pub use file::{write_atomic, AtomicFile};
pub use input::{read_bounded, read_bounded_text, require_regular};
pub use same::{refuse_same_file, same_file};
pub use temporaries::{remove_stale_temporaries, temporaries};
