//! The model side's error type.

use std::path::PathBuf;

/// Everything that can go wrong loading a model or running its forward pass. Each variant says which
/// file or which step failed.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The model file could not be read or parsed.
    #[error(transparent)]
    Format(#[from] model_format::FormatError),
    /// A flash read of weights left on flash failed (the error names the file and offset).
    #[error(transparent)]
    Flash(#[from] ufs_io::IoError),
    /// A file written beside the model (a routing profile) could not be written or read.
    #[error(transparent)]
    Output(#[from] atomic_out::AtomicError),
    /// A kernel rejected its arguments (a shape bug or a malformed weight).
    #[error("kernel error in {context}: {source}")]
    Kernel {
        /// What the model was doing.
        context: String,
        /// The kernel's error.
        source: kernels_neon::KernelError,
    },
    /// The model file is readable but does not describe a model this crate can run.
    #[error("{path}: {detail}")]
    BadModel {
        /// The model file or directory.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// A tensor the architecture needs is absent.
    #[error("{path}: missing tensor `{name}`")]
    MissingTensor {
        /// The model file or directory.
        path: PathBuf,
        /// The tensor's name.
        name: String,
    },
    /// A tensor has the wrong shape for the model's configuration.
    #[error("{path}: tensor `{name}` has shape {found:?}, expected {expected:?}")]
    TensorShape {
        /// The model file or directory.
        path: PathBuf,
        /// The tensor's name.
        name: String,
        /// Its shape in the file (outermost first).
        found: Vec<usize>,
        /// The shape the configuration implies.
        expected: Vec<usize>,
    },
    /// A request the model cannot serve (context full, empty prompt, bad option).
    #[error("{0}")]
    Request(String),
    /// An FFN executor defined above this crate failed (a neuron store's read, an accelerator):
    /// its own error, boxed.
    #[error(transparent)]
    Ffn(Box<dyn std::error::Error + Send + Sync>),
}

impl ModelError {
    /// An error of an FFN executor defined above this crate, as [`FfnExecutor`](crate::FfnExecutor)'s
    /// methods return it.
    pub fn ffn(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        ModelError::Ffn(Box::new(e))
    }
}

/// Shorthand for results in this crate.
pub type Result<T, E = ModelError> = std::result::Result<T, E>;

/// Maps a kernel's error to [`ModelError::Kernel`] with `context`.
pub fn kernel<E: Into<kernels_neon::KernelError>>(
    context: impl Into<String>,
) -> impl FnOnce(E) -> ModelError {
    let context = context.into();
    move |source| ModelError::Kernel {
        context,
        source: source.into(),
    }
}
