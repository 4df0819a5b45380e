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
    /// The model file is readable but does not describe a model this engine can run.
    #[error("{path}: {detail}")]
    BadModel {
        /// The model file or directory.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// A request the engine cannot serve (context full, empty prompt, bad option).
    #[error("{0}")]
    Request(String),
    /// Fetching a named model failed.
    #[error(transparent)]
    Fetch(#[from] model_fetch::FetchError),
    /// An accelerator backend failed, or none of the name asked for is in this build.
    #[error(transparent)]
    Accel(#[from] accel::AccelError),
}

/// Shorthand for results in this crate.
pub type Result<T, E = EngineError> = std::result::Result<T, E>;
