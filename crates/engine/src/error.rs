//! The engine's error type.

use std::path::PathBuf;

/// Everything that can go wrong in the engine. Each variant says which file or which step failed.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// Loading the model or its forward pass failed (the `transformer` crate's error).
    #[error(transparent)]
    Model(#[from] transformer::ModelError),
    /// A sparse, offloaded or accelerated FFN failed, or its set-up (the `offload` crate's error).
    #[error(transparent)]
    Offload(#[from] offload::OffloadError),
    /// Converting a model, a bundle's manifest or parts, or an output guard failed (the
    /// `model-bundle` crate's error).
    #[error(transparent)]
    BundleFormat(#[from] model_bundle::BundleError),
    /// The model file could not be read or parsed.
    #[error(transparent)]
    Format(#[from] model_format::FormatError),
    /// The tokenizer or chat template failed.
    #[error(transparent)]
    Tokenizer(#[from] model_tokenizer::TokenizerError),
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
    /// A plan or device profile is damaged, for another model or device, or cannot be made.
    #[error(transparent)]
    Planner(#[from] planner::PlannerError),
    /// An output file could not be written, or would overwrite an input.
    #[error(transparent)]
    Output(#[from] atomic_out::AtomicError),
    /// A kernel rejected its arguments (a shape bug or a malformed weight).
    #[error("kernel error in {context}: {source}")]
    Kernel {
        /// What the engine was doing.
        context: String,
        /// The kernel's error.
        source: kernels_neon::KernelError,
    },
    /// The model file is readable but does not describe a model this engine can run.
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
    /// A request the engine cannot serve (context full, empty prompt, bad option).
    #[error("{0}")]
    Request(String),
    /// Fetching a named model failed.
    #[error(transparent)]
    Fetch(#[from] model_fetch::FetchError),
    /// The accelerator library failed: missing, of another API version, or an error at a step
    /// (the detail names it). The engine stays on the CPU.
    #[error("accelerator {library}: {detail}")]
    Accelerator {
        /// The library (or the name it was looked up by).
        library: PathBuf,
        /// What went wrong.
        detail: String,
    },
    /// An accelerator backend failed, or none of the name asked for is in this build.
    #[error(transparent)]
    Accel(#[from] accel::AccelError),
    /// An I/O error on a file other than the model (a corpus, the cache folder).
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

/// Shorthand for results in this crate.
pub type Result<T, E = EngineError> = std::result::Result<T, E>;
