//! The calibration's error type.

/// Everything that can go wrong while measuring a device. Each variant says which step failed.
#[derive(Debug, thiserror::Error)]
pub enum CalibrateError {
    /// A measurement could not be made (a kernel refused its matrix, a thread pool, the scratch
    /// file, nothing asked for): the message names the step and, where one is involved, the file.
    #[error("{0}")]
    Measure(String),
    /// A flash read of the scratch file failed (the error names the file and offset).
    #[error(transparent)]
    Flash(#[from] ufs_io::IoError),
    /// The accelerator being measured could not be opened (the `offload` crate's error).
    #[error(transparent)]
    Offload(#[from] offload::OffloadError),
    /// The accelerator being measured failed a call.
    #[error(transparent)]
    Accel(#[from] accel::AccelError),
}

/// Shorthand for results in this crate.
pub type Result<T, E = CalibrateError> = std::result::Result<T, E>;
