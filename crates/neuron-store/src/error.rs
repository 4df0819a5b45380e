//! The crate's one error type.

use std::path::PathBuf;

/// Everything that can go wrong with a neuron store. Errors about a file name it.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The file is not a valid store: bad magic, version, checksum of the index, lengths that disagree.
    #[error("{path}: not a valid neuron store: {what}")]
    Corrupt {
        /// The store file.
        path: PathBuf,
        /// What is wrong.
        what: String,
    },
    /// A unit's bytes (read from flash) do not match the checksum recorded at conversion.
    #[error("{path}: layer {layer}, unit {unit} (bytes {offset}..{end}) fails its checksum: the file is damaged")]
    Checksum {
        /// The store file.
        path: PathBuf,
        /// Layer of the unit.
        layer: usize,
        /// Unit within the layer.
        unit: usize,
        /// First byte of the unit in the file.
        offset: u64,
        /// One past its last byte.
        end: u64,
    },
    /// An expert's blob (read from flash) does not match the checksum recorded at conversion.
    #[error("{path}: layer {layer}, expert {expert} (bytes {offset}..{end}) fails its checksum: the file is damaged")]
    ExpertChecksum {
        /// The expert store file.
        path: PathBuf,
        /// Layer of the expert.
        layer: usize,
        /// The expert.
        expert: usize,
        /// First byte of its blob in the file.
        offset: u64,
        /// One past its last byte.
        end: u64,
    },
    /// What the writer was given does not make a store (wrong lengths, not a permutation, …).
    #[error("invalid store input: {0}")]
    Invalid(String),
    /// Writing, syncing or renaming the store failed (disk full, permissions).
    #[error("writing {path}: {source}")]
    Write {
        /// The file being written.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// Reading through `ufs-io` failed (the error names the file and offset).
    #[error(transparent)]
    Read(#[from] ufs_io::IoError),
}

/// `Result` with [`StoreError`].
pub type Result<T, E = StoreError> = std::result::Result<T, E>;
