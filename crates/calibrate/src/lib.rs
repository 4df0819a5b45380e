//! Device calibration for Sparrow's planner: `sparrow calibrate` measures this machine in about a
//! minute ([`calibrate`]) into a [`planner::DeviceProfile`]: the kernels' weight throughput per
//! format and thread count (`kernels`), prompt tiles' rates (`prompt`), DRAM read bandwidth, flash
//! random and sequential reads through `ufs-io` (`measure`), the fixed cost of a parallel kernel
//! call, sparse selection's serial cost per neuron (`select_cost`) and, when asked, an
//! accelerator's rate (`accel`). Usable alone: it needs the kernels, the planner's profile types,
//! `ufs-io` and the accelerator backends of `offload`, not the engine.
//!
//! Invariant: timings come from the measured loops here, never from tests; the flash scratch file
//! lives in the folder given (the device the models are read from) and is removed afterwards.

mod accel;
mod error;
mod kernels;
mod llc;
mod measure;
mod prompt;
mod select_cost;

pub use accel::measure_accel;
pub use error::{CalibrateError, Result};
pub use llc::last_level_cache_bytes;
pub use measure::{calibrate, device_fingerprint, CalibrateOptions};
