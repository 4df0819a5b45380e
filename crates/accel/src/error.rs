//! The accelerator crate's error type.

use std::path::PathBuf;

/// What can go wrong in a backend or in choosing one. Each variant names the backend (or its
/// library) and the step.
#[derive(Debug, thiserror::Error)]
pub enum AccelError {
    /// A kernel rejected its arguments (a shape bug or a malformed weight).
    #[error("kernel error in {context}: {source}")]
    Kernel {
        /// What the backend was doing.
        context: String,
        /// The kernel's error.
        source: kernels_neon::KernelError,
    },
    /// A call the backend cannot serve (a block it does not have, shapes that do not agree, a
    /// model it cannot run).
    #[error("{0}")]
    Request(String),
    /// The backend's library failed: missing, of another API version, or an error at a step (the
    /// detail names it).
    #[error("accelerator {library}: {detail}")]
    Library {
        /// The library (or the name it was looked up by).
        library: PathBuf,
        /// What went wrong.
        detail: String,
    },
    /// No backend of that name in this build (`known`: the names there are).
    #[error("accelerator `{name}`: {why} (backends in this build: {known})")]
    Unknown {
        /// The name asked for.
        name: String,
        /// Why there is none (not built in, or never heard of).
        why: String,
        /// The registered names, comma-separated.
        known: String,
    },
}

/// Shorthand for results in this crate.
pub type Result<T, E = AccelError> = std::result::Result<T, E>;

/// Wraps a kernel error with what the backend was doing.
pub fn kernel<E: Into<kernels_neon::KernelError>>(
    context: impl Into<String>,
) -> impl FnOnce(E) -> AccelError {
    let context = context.into();
    move |source| AccelError::Kernel {
        context,
        source: source.into(),
    }
}
