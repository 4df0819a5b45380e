//! A test double of a QNN backend library (layer 2): a `cdylib` exporting `QnnInterface_getProviders`
//! with the ABI of `libQnnHtp.so`, whose provider table computes with plain CPU f32 math, so that
//! everything above the vendor library (`npu-qnn-sys`'s loader and layouts, `npu-qnn`'s wrapper and
//! graphs) is tested on any machine, loaded exactly as the real library is: by path, through
//! `npu-qnn-sys`'s run-time loader.
//!
//! # What it implements
//! `logCreate`/`logSetLogLevel`/`logFree`, `backendCreate`/`backendGetApiVersion`/`backendGetBuildId`/
//! `backendFree`, `deviceCreate`/`deviceFree`, `contextCreate`/`contextFree`, `graphCreate`,
//! `tensorCreateGraphTensor`, `graphAddNode`, `graphFinalize`, `graphExecute`; every other table slot
//! is null (the header allows it). Ops of the `qti.aisw` package: `FullyConnected` (weights
//! `[out, in]`, optional bias), `ElementWiseMultiply`, `ElementWiseAdd` (equal shapes, no
//! broadcasting), `Sigmoid`, `Relu`; any other op type or package → `QNN_GRAPH_ERROR_INVALID_OP_CONFIG`
//! at `graphAddNode`. Graph inputs, outputs and intermediates are f32; static tensors are f32 or
//! fixed point (8-bit, or 4-bit packed two a byte, low nibble first) with per-tensor
//! (`SCALE_OFFSET`) or per-axis (`AXIS_SCALE_OFFSET`, `BW_AXIS_SCALE_OFFSET`) encodings, dequantized
//! as the header defines: `float = (q + offset) * scale`. Shapes, dependency order (a NATIVE input
//! must be written by an earlier node), unique names and the execute-time buffer sizes are checked
//! with the header's error codes. It reports core API 2.10.
//!
//! # Fault injection
//! `QNN_DOUBLE_FAIL=<qnn function>[,...]` makes those calls return `QNN_COMMON_ERROR_GENERAL`;
//! `QNN_DOUBLE_API_MAJOR=<n>` makes the provider report core API major `n`. Both are read at every
//! call. Since tests run in parallel threads of one process, the same settings exist per thread
//! ([`Control::set_fail`], [`Control::set_api_major`], through the exported `qnn_double_set_fail` and
//! `qnn_double_set_api_major`), and win over the environment on that thread. [`Control`] also
//! counts the calling thread's live objects and frees refused for order (a backend freed before its
//! context, ...), which the double refuses and counts, being stricter than the headers.
//!
//! # How tests find it
//! `npu-qnn` has this crate as a dev-dependency; cargo builds every crate type of a dependency, so the
//! cdylib lands in `target/[<triple>/]<profile>/deps/` next to the test binaries, on the host and
//! under `--target aarch64-unknown-linux-gnu` alike. [`library_path`] finds it from
//! `std::env::current_exe()`.
//!
//! # Example
//! ```no_run
//! let path = qnn_double::library_path().expect("the double is built next to the tests");
//! let control = qnn_double::Control::open(&path)?;
//! control.set_fail(Some("graphFinalize"));
//! // ... npu_qnn::Qnn::load(Some(&path)) ... finalize now fails on this thread.
//! control.set_fail(None);
//! assert_eq!(control.live_objects(), 0);
//! # Ok::<(), npu_qnn_sys::LoadError>(())
//! ```
//!
//! # Invariants
//! - Handles are registry keys, never addresses: a stale handle is an error code, not a wild read.
//! - No `unsafe` without a `// SAFETY:` comment; no panics across the C ABI on any input the
//!   checks can see (sizes, ids, versions are checked before use).

mod compute;
mod control;
mod exports;
mod faults;
mod graph;
mod registry;
mod tensors;

pub use control::{library_file_name, library_path, Control};
pub use exports::QnnInterface_getProviders;
pub use faults::{API_MAJOR_ENV, FAIL_ENV};
