//! The crate's one error type.

use std::path::PathBuf;

/// Everything that can go wrong in this crate. File errors name the file and what is wrong with it.
#[derive(Debug, thiserror::Error)]
pub enum PredictorError {
    /// Reading, writing or renaming a file failed.
    #[error("{}: {what}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What was being done (e.g. "reading", "renaming temporary file").
        what: &'static str,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A file is corrupt, truncated or not one of ours.
    #[error("{}: {what}", path.display())]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong (e.g. "checksum mismatch", "truncated: ...").
        what: String,
    },
    /// A file has a format version this build does not read.
    #[error("{}: unsupported {kind} format version {found} (this build reads version {expected})", path.display())]
    Version {
        /// The file.
        path: PathBuf,
        /// Which kind of file ("profile" or "predictor").
        kind: &'static str,
        /// Version found in the file.
        found: u32,
        /// Version this build reads and writes.
        expected: u32,
    },
    /// A caller passed arguments of the wrong shape or out of range.
    #[error("invalid argument: {0}")]
    Input(String),
    /// A kernel rejected a matrix or vector (shape mismatch; indicates a bug or a bad file).
    #[error("kernel: {0}")]
    Kernel(#[from] kernels_neon::KernelError),
}

/// A matrix the kernels would reject (same message as the kernels' error).
impl From<tensor_types::LayoutError> for PredictorError {
    fn from(e: tensor_types::LayoutError) -> Self {
        PredictorError::Kernel(e.into())
    }
}

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, PredictorError>;

pub(crate) fn input_err<T>(msg: impl Into<String>) -> Result<T> {
    Err(PredictorError::Input(msg.into()))
}
