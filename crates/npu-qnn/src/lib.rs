//! Safe wrapper (layer 2) over the raw QNN bindings of `npu-qnn-sys`: load a QNN backend library,
//! create backend, device, context, build a graph of built-in ops over f32 activations and f32 or
//! INT8 weights (static, or f32 given to each execution), finalize it and execute it on slices. No `unsafe` leaks out of this crate.
//!
//! # Example
//! ```no_run
//! use npu_qnn::{Backend, Context, FfnActivation, FfnGraph, FfnWeights, Qnn};
//! let qnn = Qnn::load(None)?; // libQnnHtp.so, else libQnnCpu.so
//! let backend = Backend::new(&qnn)?;
//! let ctx = Context::new(&backend, None)?;
//! let (d_model, d_ff) = (4, 8);
//! let (gate, up, down) = (vec![0.1f32; d_ff * d_model], vec![0.2f32; d_ff * d_model], vec![0.3f32; d_model * d_ff]);
//! let mut ffn = FfnGraph::build(&ctx, 2, d_model, d_ff, FfnWeights::F32(&gate),
//!     FfnWeights::F32(&up), FfnWeights::F32(&down), FfnActivation::Silu)?;
//! let x = vec![1.0f32; 2 * d_model];
//! let mut y = vec![0.0f32; 2 * d_model];
//! ffn.execute(&x, &mut y)?;
//! # Ok::<(), npu_qnn::QnnError>(())
//! ```
//!
//! # Objects and their order
//! [`Qnn`] (the library) → [`Backend`] → optional [`Device`] → [`Context`] → [`Graph`] / [`FfnGraph`].
//! Each object holds an `Arc` of its parent, so whatever order the caller drops them in, QNN frees
//! them in the right one (contexts with their graphs, then devices, then the backend, then the
//! library is unloaded), and no function pointer or handle outlives the library. Public objects are
//! `Send` but not `Sync`: one thread at a time calls QNN through each.
//!
//! # Errors
//! One enum, [`QnnError`]: loading (`Load` with the path, `MissingSymbol`, `NoProvider`, `Version`
//! when the library's core API is not 2.x with x ≥ 10), QNN calls (`Call` with the QNN function and
//! its error code, `Unsupported` for a null table slot), and shape or length errors caught before
//! QNN sees them.
//!
//! # Quantized weights on QNN HTP
//! What the QNN headers and HTP documentation expect, and how this crate follows it:
//! - Fixed-point values decode as `float = (q + offset) * scale` (`QnnTypes.h`): QNN's `offset` is
//!   the *negative* of the usual zero point. Symmetric weights have offset 0.
//! - Weights are quantized per output channel with `QNN_QUANTIZATION_ENCODING_AXIS_SCALE_OFFSET`:
//!   one scale-offset pair per index of the `axis` dimension; for a `FullyConnected` weight `[out,
//!   in]` that is axis 0, one pair per output row. [`Graph::static_i8_per_row`] writes INT8
//!   (`QNN_DATATYPE_SFIXED_POINT_8`) that way.
//! - 4-bit weights use `QNN_QUANTIZATION_ENCODING_BW_AXIS_SCALE_OFFSET` (bit width 4, per-axis scales,
//!   offsets or null for symmetric) with `QNN_DATATYPE_SFIXED_POINT_4` (packed two a byte, the first
//!   value in the low nibble) or 4-bit values in an 8-bit container. The bindings and the test
//!   double support it; this crate does not build such tensors yet.
//! - On HTP, activations are usually 16-bit fixed point (`UFIXED_POINT_16`, scale and offset
//!   calibrated offline) with INT8/INT4 weights; float graphs run there in FP16 on chips that support
//!   it. The graphs here keep f32 activations: they are checked against the double (f32 math), and
//!   how HTP accepts f32 activations with INT8 weights is for the first on-device run (issue 16) to
//!   establish.
//!
//! # Invariants
//! - The library outlives every object made from it (`Arc` inside); QNN objects are freed in
//!   `Drop`, children before parents.
//! - Buffers passed to `execute` must have exactly their tensor's element count, checked before QNN
//!   reads or writes them.
//! - Static data is kept by the graph until `finalize` returns.
//! - Tested (tests/) through the QNN test double `crates/qnn-double`, loaded by path like the real
//!   library; the real `libQnnHtp.so` is not exercised here.

mod backend;
mod error;
mod ffn;
mod graph;
mod library;

pub use backend::{Backend, Context, Device};
pub use error::{ApiVersion, QnnError};
pub use ffn::{FfnActivation, FfnGraph, FfnWeights};
pub use graph::{Graph, Tensor};
pub use library::{Qnn, WANTED_API};
