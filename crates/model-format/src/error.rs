//! The crate's single error type.

use std::path::{Path, PathBuf};

/// Everything that can go wrong while reading or writing a model file.
///
/// Every variant carries the path of the file concerned, and its `Display`
/// message starts with that path, followed by what is wrong.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FormatError {
    /// An I/O operation on `path` failed.
    #[error("{}: I/O error: {source}", path.display())]
    Io {
        /// The file concerned.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The file does not start with the expected magic bytes.
    #[error("{}: not a GGUF file: bad magic {found:02x?} (expected \"GGUF\")", path.display())]
    BadMagic {
        /// The file concerned.
        path: PathBuf,
        /// The first four bytes found.
        found: [u8; 4],
    },
    /// The file's format version is not supported.
    #[error("{}: unsupported GGUF version {version} (supported: 2, 3)", path.display())]
    UnsupportedVersion {
        /// The file concerned.
        path: PathBuf,
        /// The version found.
        version: u32,
    },
    /// The file ends before something it declares.
    #[error("{}: truncated: {what}", path.display())]
    Truncated {
        /// The file concerned.
        path: PathBuf,
        /// What could not be read.
        what: String,
    },
    /// A tensor has a data type this crate does not support.
    #[error("{}: tensor '{tensor}' has unsupported type {}", path.display(), crate::hf::describe_type_id(*type_id))]
    UnsupportedType {
        /// The file concerned.
        path: PathBuf,
        /// The tensor's name.
        tensor: String,
        /// The type id: the ggml type id for GGUF files; for safetensors files,
        /// [`SAFETENSORS_TYPE_ID_BASE`](crate::SAFETENSORS_TYPE_ID_BASE) plus
        /// the dtype's index in
        /// [`SAFETENSORS_DTYPE_NAMES`](crate::SAFETENSORS_DTYPE_NAMES).
        type_id: u32,
    },
    /// A tensor's shape does not agree with its type or its data.
    #[error("{}: tensor '{tensor}': shape mismatch: {detail}", path.display())]
    ShapeMismatch {
        /// The file concerned.
        path: PathBuf,
        /// The tensor's name.
        tensor: String,
        /// What is wrong.
        detail: String,
    },
    /// Two tensors' data ranges share bytes (a hostile file could make a write to one
    /// tensor's view alias another; no writer of GGUF or safetensors produces this).
    #[error(
        "{}: tensors '{first}' (bytes {first_start}..{first_end}) and '{second}' (bytes {second_start}..{second_end}) overlap in the data section",
        path.display()
    )]
    TensorOverlap {
        /// The file concerned.
        path: PathBuf,
        /// The tensor that starts first.
        first: String,
        /// Its absolute byte range in the file.
        first_start: u64,
        /// End (exclusive) of `first`'s range.
        first_end: u64,
        /// The tensor that starts inside `first`.
        second: String,
        /// Its absolute byte range in the file.
        second_start: u64,
        /// End (exclusive) of `second`'s range.
        second_end: u64,
    },
    /// The file is structurally invalid in some other way.
    #[error("{}: invalid: {detail}", path.display())]
    Invalid {
        /// The file concerned.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// A JSON file could not be parsed.
    #[error("{}: bad JSON: {source}", path.display())]
    Json {
        /// The file concerned.
        path: PathBuf,
        /// The underlying error.
        source: serde_json::Error,
    },
    /// A required file does not exist.
    #[error("{}: missing file", path.display())]
    MissingFile {
        /// The file that was expected.
        path: PathBuf,
    },
}

impl FormatError {
    /// The path of the file this error concerns.
    pub fn path(&self) -> &Path {
        match self {
            FormatError::Io { path, .. }
            | FormatError::BadMagic { path, .. }
            | FormatError::UnsupportedVersion { path, .. }
            | FormatError::Truncated { path, .. }
            | FormatError::UnsupportedType { path, .. }
            | FormatError::ShapeMismatch { path, .. }
            | FormatError::TensorOverlap { path, .. }
            | FormatError::Invalid { path, .. }
            | FormatError::Json { path, .. }
            | FormatError::MissingFile { path } => path,
        }
    }

    /// Builds an [`FormatError::Io`], turning "not found" into
    /// [`FormatError::MissingFile`].
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        if source.kind() == std::io::ErrorKind::NotFound {
            FormatError::MissingFile {
                path: path.to_path_buf(),
            }
        } else {
            FormatError::Io {
                path: path.to_path_buf(),
                source,
            }
        }
    }
}
