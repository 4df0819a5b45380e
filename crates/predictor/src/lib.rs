//! Activation profiles and neuron activation predictors for sparse FFN inference (PowerInfer section 5.1,
//! PowerInfer-2's offline phase).
//!
//! * [`profile`]: per-layer neuron statistics from a profiling run (activation frequency at batch sizes
//!   1/2/4/8, magnitudes, gate/up/down co-activation), accumulated by [`ProfileAccumulator`] and stored in a
//!   [`Profile`] file; [`calibrate_threshold`] picks SiLU activity thresholds.
//! * [`mlp`] (re-exported here): one small MLP per layer predicting which FFN neurons fire from the FFN
//!   input; [`train`] sizes its hidden layer to the layer's sparsity, [`PredictorSet`] stores all layers.
//!
//! # Example
//!
//! ```
//! use predictor::{train, Dataset, TrainConfig};
//!
//! // Neuron j of 4 fires iff x[j] > 0.
//! let mut data = Dataset::new(32, 4);
//! let mut s = 1u32;
//! for _ in 0..400 {
//!     let x: Vec<f32> = (0..32).map(|_| { s = s.wrapping_mul(1664525).wrapping_add(1013904223); (s >> 8) as f32 / (1 << 23) as f32 - 1.0 }).collect();
//!     data.push_mask(&x, |j| x[j] > 0.0).unwrap();
//! }
//! let cfg = TrainConfig { hidden_sizes: vec![32], epochs: 30, batch: 32, ..TrainConfig::default() };
//! let (pred, report) = train(&data, &cfg, &mut |_| {}).unwrap();
//! assert!(report.recall >= 0.9);
//! let mut active = Vec::new();
//! pred.predict(data.input(0).unwrap(), &mut active).unwrap();
//! assert!(active.iter().all(|&j| j < 4));
//! ```
//!
//! # File container
//!
//! Both files ([`Profile::save`], [`PredictorSet::save`]) share one container:
//!
//! ```text
//! offset  size  field
//! 0       8     magic: "SPRWPROF" (profile) or "SPRWPRED" (predictor set)
//! 8       4     format version, u32 LE (1 for both)
//! 12      4     reserved, u32 LE, 0
//! 16      8     payload length N, u64 LE
//! 24      N     payload (see the `profile` and `mlp` module docs, field by field)
//! 24+N    8     FNV-1a 64 checksum, u64 LE, of bytes [0, 24+N)
//! ```
//!
//! # Invariants
//!
//! * Corrupt, truncated, foreign or wrong-version files give a [`PredictorError`] naming the path and what
//!   is wrong, never a panic; lengths are checked against the payload before anything is allocated.
//! * Writes are atomic (`atomic-out`): a temporary in the same folder, fsync, rename, fsync the folder; a
//!   failed write leaves any earlier file untouched.
//! * Training is deterministic given [`TrainConfig::seed`] on one machine and kernel path, whatever the
//!   number of threads (tested).
//! * Predictor weights are stored in ggml's `Q8_0` layout and evaluated with `kernels_neon::matvec`.
//! * No `unsafe`.

#![forbid(unsafe_code)]

mod error;
mod file;
pub mod mlp;
pub mod profile;

pub use error::{PredictorError, Result};
pub use file::{Fnv1a64, MAX_PREDICTOR_BYTES, MAX_PROFILE_BYTES};
pub use mlp::{
    train, Dataset, LayerReport, Predictor, PredictorSet, Scratch, TrainConfig, TrainProgress,
};
pub use profile::{
    calibrate_threshold, ActivationKind, LayerProfile, Profile, ProfileAccumulator, ScoreKind,
};
