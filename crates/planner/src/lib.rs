//! The offline planner of PowerInfer-2 (§6): given what a device can do (a [`DeviceProfile`], measured
//! by `sparrow calibrate`), what a model needs (a [`ModelSummary`]: sizes, and from its activation
//! profile how often each neuron fires) and what the user allows ([`Constraints`]: a memory budget, a
//! context, a minimum speed), it picks the configuration that decodes fastest and writes it as a
//! [`Plan`] the engine applies.
//!
//! The cost model is the paper's: maximize `1 / T_decode` with
//! `T_decode = T_attn + T_pred + max(T_ffn, T_io)` and every region's memory within the budget
//! ([`tables`] states each term). Decisions: compute threads, the I/O thread's queue depth, dense or
//! sparse per layer (in memory; over a store every layer alike), how many of each layer's hottest
//! neurons stay in memory, and which tensors outside the FFN stay in memory (OATO: by time saved per
//! byte). Per further batch size (2, 4, 8) the plan also says whether batch size 1's sparse layers
//! stay sparse or every layer runs dense, with the same memory placement and threads; from those
//! steps' costs, whether and how far to speculate ([`speculation`]). Where the
//! constraints name an accelerator, the plan also splits each layer between it and the CPU per
//! batch size (`hybrid`: hybrid decode's hot neurons).
//!
//! Solvers: [`search`] (always built: exhaustive over the discrete settings, memory by benefit per
//! byte), [`brute_force`] (every combination; the reference in tests) and, with the cargo feature
//! `z3`, `solve_z3` (Z3's optimizer over the same tables: exact). The engine reads plans and never
//! links Z3.
//!
//! ```
//! use planner::{make_plan, Constraints, DeviceProfile, FfnLayer, IoRate, KernelRate, ModelSummary, Solver};
//! let device = DeviceProfile {
//!     name: "doc".into(), fingerprint: 1, cores: 2, dram_bps: 10e9, batch_cost: 0.2,
//!     kernels: vec![KernelRate { format: "q4_0".into(), threads: 1, dense_bps: 5e9, sparse_bps: 3e9, axpy_bps: 0.0, batch_cost: 0.0, dram_dense_bps: 0.0, unit_rows_bps: 0.0, unit_axpy_bps: 0.0 }],
//!     flash_random: vec![IoRate { read_bytes: 4096, queue_depth: 32, bps: 1e9 }],
//!     flash_seq_bps: 2e9, flash_path: "/tmp".into(), ..Default::default()
//! };
//! let freq = vec![vec![0.9, 0.5, 0.1, 0.0]];
//! let layer = FfnLayer::from_frequencies(3 * 4096, "q4_0", 4096, 1, &freq, 4).unwrap();
//! let model = ModelSummary {
//!     name: "doc".into(), fingerprint: 2, tensors: vec![], layers: vec![layer; 2],
//!     kv_bytes_per_position: 1024, process_bytes: 1 << 20, batch_sizes: vec![1], grid: 4, offloaded: true,
//!     ..Default::default()
//! };
//! let c = Constraints { memory_budget: Some(8 << 20), ..Constraints::default() };
//! let plan = make_plan(&device, &model, &c, Solver::Search).unwrap();
//! assert!(plan.memory <= 8 << 20);
//! println!("{}", plan.describe());
//! ```
//!
//! Invariants: a plan never exceeds its budget (property-tested); device profiles and plans are
//! versioned and checksummed, written whole or not at all, and a damaged file or a plan for another
//! model or device is a named error.

mod container;
mod device;
mod error;
mod experts;
mod hybrid;
mod hybrid_store;
mod model;
mod plan;
mod prompt;
mod solve;
pub mod speculation;
pub mod tables;
#[cfg(feature = "z3")]
mod z3solve;

pub use container::fnv1a64;
pub use device::{
    AccelRate, CallOverhead, DeviceProfile, IoRate, KernelRate, PromptRate, DEVICE_KIND,
    DEVICE_VERSION,
};
pub use error::{PlannerError, Result};
pub use experts::{ExpertParts, ExpertPlan, UnitKind};
pub use hybrid::{hybrid_layer_ns, hybrid_split, whole_matrix, HybridSplit, HYBRID_BATCHES};
pub use hybrid_store::{hybrid_split_over_store, store_layer_ns, StoreMemory};
pub use model::{
    read_ahead_bytes, step_neurons, FfnLayer, FormatMacs, ModelSummary, StepBytes, TensorInfo,
};
pub use plan::{make_plan, Plan, Predicted, Solver, PLAN_KIND, PLAN_VERSION};
pub use prompt::{prompt_cost, PromptCost};
pub use solve::{brute_force, search, Choice, Cost};
pub use speculation::{SpecChoice, SpecSource};
pub use tables::{Constraints, SpecAcceptance, Tables};
#[cfg(feature = "z3")]
pub use z3solve::solve_z3;
