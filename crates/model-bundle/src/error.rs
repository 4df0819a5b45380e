//! The bundle's error type.

use std::path::PathBuf;

/// Everything that can go wrong converting a model into a bundle, reading a bundle's manifest or
/// parts, or guarding an output. Each variant says which file or which step failed.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    /// The model side failed (the `transformer` crate's error).
    #[error(transparent)]
    Model(#[from] transformer::ModelError),
    /// The offload side failed (the `offload` crate's error).
    #[error(transparent)]
    Offload(#[from] offload::OffloadError),
    /// A model file could not be read, parsed or written.
    #[error(transparent)]
    Format(#[from] model_format::FormatError),
    /// The neuron store or expert store could not be written, or is invalid.
    #[error(transparent)]
    Store(#[from] neuron_store::StoreError),
    /// A flash read or write failed (the error names the file and offset).
    #[error(transparent)]
    Flash(#[from] ufs_io::IoError),
    /// A profile or predictor file failed.
    #[error(transparent)]
    Predictor(#[from] predictor::PredictorError),
    /// An output file could not be written, or would overwrite an input.
    #[error(transparent)]
    Output(#[from] atomic_out::AtomicError),
    /// The model file is readable but cannot be converted.
    #[error("{path}: {detail}")]
    BadModel {
        /// The model file or directory.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// A bundle's manifest is damaged, or a part of the bundle does not match it (`path` names the
    /// manifest or the part).
    #[error("{path}: {detail}")]
    Bundle {
        /// The manifest or the part concerned.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// A tensor the conversion needs is absent.
    #[error("{path}: missing tensor `{name}`")]
    MissingTensor {
        /// The model file or directory.
        path: PathBuf,
        /// The tensor's name.
        name: String,
    },
    /// A request that cannot be served (a bad option, an output over an input).
    #[error("{0}")]
    Request(String),
    /// An I/O error on a file other than the model.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

/// Shorthand for results in this crate.
pub type Result<T, E = BundleError> = std::result::Result<T, E>;
