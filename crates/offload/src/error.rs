//! The offload's error type.

use std::path::PathBuf;

/// Everything that can go wrong in a sparse, offloaded or accelerated FFN step or in setting one up.
/// Each variant says which file or which step failed.
#[derive(Debug, thiserror::Error)]
pub enum OffloadError {
    /// The model side failed (the `transformer` crate's error).
    #[error(transparent)]
    Model(#[from] transformer::ModelError),
    /// The neuron store (offloaded FFN weights) is invalid, damaged or unreadable.
    #[error(transparent)]
    Store(#[from] neuron_store::StoreError),
    /// A flash read of offloaded weights failed (the error names the file and offset).
    #[error(transparent)]
    Flash(#[from] ufs_io::IoError),
    /// The neuron cache refused a layout (budget too small for what must be resident).
    #[error("neuron cache: {0}")]
    Cache(#[from] neuron_cache::CacheError),
    /// A profile or predictor file, or predictor training, failed.
    #[error(transparent)]
    Predictor(#[from] predictor::PredictorError),
    /// An accelerator backend failed, or none of the name asked for is in this build.
    #[error(transparent)]
    Accel(#[from] accel::AccelError),
    /// A kernel rejected its arguments (a shape bug or a malformed weight).
    #[error("kernel error in {context}: {source}")]
    Kernel {
        /// What the offload was doing.
        context: String,
        /// The kernel's error.
        source: kernels_neon::KernelError,
    },
    /// The model file is readable but cannot be run this way (an MoE model asked for a mode built
    /// on neuron rows, a store of another model).
    #[error("{path}: {detail}")]
    BadModel {
        /// The model file or directory.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// A request the offload cannot serve (a budget too small, a bad option).
    #[error("{0}")]
    Request(String),
    /// An I/O error on a file other than the model (the store's size).
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

/// Shorthand for results in this crate.
pub type Result<T, E = OffloadError> = std::result::Result<T, E>;

/// Maps a kernel's error to [`OffloadError::Kernel`] with `context`.
pub(crate) fn kernel<E: Into<kernels_neon::KernelError>>(
    context: impl Into<String>,
) -> impl FnOnce(E) -> OffloadError {
    let context = context.into();
    move |source| OffloadError::Kernel {
        context,
        source: source.into(),
    }
}

/// An offload error raised inside an FFN executor (whose methods return the model's error): the
/// model's own error unwrapped, any other boxed ([`transformer::ModelError::Ffn`]).
impl From<OffloadError> for transformer::ModelError {
    fn from(e: OffloadError) -> Self {
        match e {
            OffloadError::Model(m) => m,
            e => transformer::ModelError::ffn(e),
        }
    }
}
