//! The crate's one error type.

use std::path::PathBuf;

/// What can go wrong reading, writing or solving.
#[derive(Debug, thiserror::Error)]
pub enum PlannerError {
    /// A file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A profile or plan file is damaged or of another kind or version.
    #[error("{}: {what}", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong, in words.
        what: String,
    },
    /// A plan made for another model or device.
    #[error("{}: {what}", path.display())]
    Mismatch {
        /// The plan file.
        path: PathBuf,
        /// What does not match.
        what: String,
    },
    /// Writing a file failed (nothing was replaced).
    #[error(transparent)]
    Write(#[from] atomic_out::AtomicError),
    /// Inputs that cannot be planned (empty tables, zero rates, ...).
    #[error("planner input: {0}")]
    Input(String),
    /// No configuration satisfies the constraints.
    #[error("no plan fits: {0}")]
    Infeasible(String),
    /// The Z3 solver failed or gave no model.
    #[error("z3: {0}")]
    Solver(String),
}

/// The crate's result type.
pub type Result<T> = std::result::Result<T, PlannerError>;
