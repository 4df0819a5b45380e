//! The fetcher's error type.

use std::path::PathBuf;

/// What can go wrong fetching a named model; each variant names the step or the file.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// A step of the fetch failed (Python or pip missing, a download, a size or SHA-256 check).
    #[error("fetching a model: {0}")]
    Fetch(String),
    /// An I/O error in the cache folder.
    #[error("{path}: {source}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

/// Shorthand for results in this crate.
pub type Result<T, E = FetchError> = std::result::Result<T, E>;
