//! The crate's single error type.

use std::path::PathBuf;

/// Everything that can go wrong while building or using a [`crate::Tokenizer`] or
/// [`crate::ChatTemplate`]. Messages name the offending token, merge line, id or file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenizerError {
    /// The vocabulary's `tokenizer.ggml.model` is not supported.
    #[error("unsupported tokenizer model {model:?}: {reason}")]
    UnsupportedModel {
        /// The model name as given (e.g. "llama").
        model: String,
        /// Why it is rejected and what is supported instead.
        reason: String,
    },
    /// The vocabulary itself is malformed (empty, mismatched lengths, ...).
    #[error("invalid vocabulary: {0}")]
    InvalidVocab(String),
    /// One merge rule is malformed or refers to tokens that are not in the vocabulary.
    #[error("invalid merge on line {line} ({merge:?}): {reason}")]
    InvalidMerge {
        /// 1-based index of the merge in `tokenizer.ggml.merges`.
        line: usize,
        /// The merge text as given.
        merge: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A special-token id (bos, eos, ...) from the metadata lies outside the vocabulary.
    #[error("{name} token id {id} is out of range (vocabulary has {vocab_size} tokens)")]
    SpecialIdOutOfRange {
        /// Which special token ("bos", "eos", "unk", "pad", "eot").
        name: &'static str,
        /// The id found in the metadata.
        id: u32,
        /// Number of tokens in the vocabulary.
        vocab_size: usize,
    },
    /// A token id passed to decode / the stream decoder is not in the vocabulary.
    #[error("token id {id} is not in the vocabulary (size {vocab_size})")]
    UnknownId {
        /// The offending id.
        id: u32,
        /// Number of ids in the vocabulary.
        vocab_size: usize,
    },
    /// Reading a file failed.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file that could not be read.
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A JSON file (tokenizer.json, tokenizer_config.json, ...) could not be parsed.
    #[error("cannot parse {path}: {message}")]
    Json {
        /// The file that could not be parsed.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// An error reported by the `tokenizers` backend.
    #[error("tokenizer backend error while {context}: {message}")]
    Backend {
        /// What was being done (e.g. "building the BPE model").
        context: String,
        /// The backend's message.
        message: String,
    },
    /// A chat template failed to compile.
    #[error("chat template does not compile: {0}")]
    Template(String),
    /// A chat template failed while rendering (including `raise_exception` calls).
    #[error("chat template rendering failed: {0}")]
    Render(String),
}

impl TokenizerError {
    pub(crate) fn backend(context: impl Into<String>, err: impl std::fmt::Display) -> Self {
        TokenizerError::Backend {
            context: context.into(),
            message: err.to_string(),
        }
    }
}
