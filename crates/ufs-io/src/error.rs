//! The crate's one error type.

use std::io;
use std::path::PathBuf;

/// Everything that can go wrong in `ufs-io`. File errors name the file, and read errors the byte range.
#[derive(Debug, thiserror::Error)]
pub enum IoError {
    /// `open(2)` (or `fstat`) failed.
    #[error("opening {path}: {source}")]
    Open {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: io::Error,
    },
    /// `pread(2)` failed (EIO and friends), real or injected by a [`crate::FaultPlan`].
    #[error("reading {path} at offset {offset} ({len} bytes): {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// First byte of the failed request.
        offset: u64,
        /// Length of the failed request.
        len: usize,
        /// What the OS said.
        source: io::Error,
    },
    /// The file ended (or the device returned less) before the request was filled.
    #[error("short read from {path} at offset {offset}: wanted {wanted} bytes, got {got}")]
    ShortRead {
        /// The file.
        path: PathBuf,
        /// First byte of the request.
        offset: u64,
        /// Requested length.
        wanted: usize,
        /// Bytes actually available.
        got: usize,
    },
    /// Offset or length is not a multiple of [`crate::ALIGN`] (or the length is zero).
    #[error("unaligned read of {path}: offset {offset}, length {len} (both must be non-zero multiples of 4096)")]
    Unaligned {
        /// The file.
        path: PathBuf,
        /// Requested offset.
        offset: u64,
        /// Requested length.
        len: usize,
    },
    /// `offset + len` overflows a 64-bit file offset.
    #[error("read of {path} at offset {offset} ({len} bytes) is beyond any file offset")]
    OutOfRange {
        /// The file.
        path: PathBuf,
        /// Requested offset.
        offset: u64,
        /// Requested length.
        len: usize,
    },
    /// An [`crate::AlignedBuf`] length that is not a multiple of [`crate::ALIGN`], or too large to allocate.
    #[error("aligned buffer of {len} bytes: length must be a multiple of 4096 and allocatable")]
    BufLen {
        /// Requested length.
        len: usize,
    },
    /// A [`crate::FileId`] that this engine did not hand out.
    #[error("unknown file id {0}")]
    UnknownFile(u32),
    /// `try_submit` found `queue_depth` requests in flight.
    #[error("I/O queue full: {depth} requests in flight")]
    QueueFull {
        /// The configured queue depth.
        depth: usize,
    },
    /// The I/O thread has exited (it only does so when the engine is dropped, or if it panicked).
    #[error("the I/O thread has stopped")]
    Stopped,
    /// The I/O thread could not be started.
    #[error("spawning the I/O thread: {0}")]
    Spawn(io::Error),
    /// A configuration value out of range.
    #[error("invalid engine configuration: {0}")]
    Config(String),
}

/// `Result` with [`IoError`].
pub type Result<T> = std::result::Result<T, IoError>;
