//! The crate's one error type.

use std::path::{Path, PathBuf};

/// Everything that can go wrong writing an output. Every variant names the file concerned.
#[derive(Debug, thiserror::Error)]
pub enum AtomicError {
    /// An operation on a file or folder failed (creating, writing, syncing, renaming, listing).
    #[error("{what} {}: {source}", path.display())]
    Io {
        /// The file or folder concerned.
        path: PathBuf,
        /// What was being done, e.g. "creating temporary file".
        what: &'static str,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The destination has no file name (`/`, `..`, an empty path).
    #[error("{}: not a file name to write to", path.display())]
    NotAFileName {
        /// The path given as destination.
        path: PathBuf,
    },
    /// An output is the same file as an input: writing it would destroy the input.
    #[error("refusing to write {}: it is the same file as the input {}", output.display(), input.display())]
    SameFile {
        /// The output, as given.
        output: PathBuf,
        /// The input it coincides with, as given.
        input: PathBuf,
    },
    /// An input is not a regular file (a FIFO, a device, a folder): reading it could block or never end.
    #[error("{}: not a regular file", path.display())]
    NotRegular {
        /// The input.
        path: PathBuf,
    },
    /// An input is larger than what its kind may be.
    #[error("{}: {len} bytes, more than the {limit} this kind of file may have", path.display())]
    TooLarge {
        /// The input.
        path: PathBuf,
        /// Its size (or what was read of it).
        len: u64,
        /// The limit for its kind.
        limit: u64,
    },
    /// A text input is not UTF-8.
    #[error("{}: not UTF-8 text", path.display())]
    NotText {
        /// The input.
        path: PathBuf,
    },
    /// Two outputs are the same file: the second would overwrite the first.
    #[error("refusing to write {} twice: {} is the same file", first.display(), second.display())]
    SameOutput {
        /// The first output, as given.
        first: PathBuf,
        /// The second output, as given.
        second: PathBuf,
    },
}

impl AtomicError {
    /// The file this error concerns (for [`AtomicError::SameFile`], the output).
    pub fn path(&self) -> &Path {
        match self {
            AtomicError::Io { path, .. }
            | AtomicError::NotAFileName { path }
            | AtomicError::NotRegular { path }
            | AtomicError::TooLarge { path, .. }
            | AtomicError::NotText { path } => path,
            AtomicError::SameFile { output, .. } => output,
            AtomicError::SameOutput { second, .. } => second,
        }
    }

    pub(crate) fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.to_path_buf();
        move |source| AtomicError::Io { path, what, source }
    }
}

/// Turns the error into an `std::io::Error` of the same kind (for an [`AtomicError::Io`], the kind of
/// the OS error; `InvalidInput` otherwise), whose message is this error's.
impl From<AtomicError> for std::io::Error {
    fn from(e: AtomicError) -> Self {
        let kind = match &e {
            AtomicError::Io { source, .. } => source.kind(),
            _ => std::io::ErrorKind::InvalidInput,
        };
        std::io::Error::new(kind, e)
    }
}

/// `Result` with [`AtomicError`].
pub type Result<T, E = AtomicError> = std::result::Result<T, E>;
