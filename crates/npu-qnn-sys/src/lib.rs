//! Raw bindings (layer 1) for the part of the Qualcomm QNN C API ("AI Engine Direct") that Sparrow
//! uses to run FFN blocks on the Hexagon NPU, and the run-time loader of a QNN backend library.
//!
//! Nothing links against QNN at build time: [`QnnLibrary::open`] loads `libQnnHtp.so` (or any path,
//! e.g. the test double of `crates/qnn-double`) with `libloading`, and [`QnnLibrary::providers`]
//! calls its one exported symbol, `QnnInterface_getProviders`, whose provider structs
//! ([`QnnInterface_t`]) carry the function table ([`QnnInterfaceImpl`]) every other call goes
//! through. The safe wrapper is `crates/npu-qnn`; this crate only declares.
//!
//! # Which headers
//! The layouts follow the public QNN SDK headers `QnnCommon.h`, `QnnTypes.h`, `QnnInterface.h`,
//! `QnnGraph.h`, `QnnBackend.h`, `QnnLog.h` and `QnnOpDef.h` of **core API version 2.10** (QNN SDK 2.x,
//! `QNN_API_VERSION_MAJOR 2`, `QNN_API_VERSION_MINOR 10`), read from copies vendored in public
//! repositories (e.g. the ExecuTorch Qualcomm backend), and written anew here. Two later additions
//! are accounted for:
//! - core API 2.x minors after 2.10 append functions after `signalFree`; [`QnnInterfaceImpl`] binds
//!   the 48-function prefix, which is all this crate reads (the table is only ever read through a
//!   pointer into the library). Minors before 2.10 have a different prefix (2.7 lacks
//!   `backendSetConfig` and `graphCreateSubgraph`), hence [`QNN_API_VERSION_MINOR_MIN`].
//! - `Qnn_Tensor_t` is a union of `Qnn_TensorV1_t` and the larger `Qnn_TensorV2_t` in current headers
//!   (144 bytes on 64-bit targets); this crate writes version-1 tensors in a 144-byte
//!   [`Qnn_Tensor_t`]. Libraries built from headers without `Qnn_TensorV2_t` read arrays of tensors
//!   with a 120-byte stride; which core minor added version 2 is not established here, so the
//!   first run on a device must confirm the stride (unchecked without a device).
//!
//! C enums are `u32` aliases with constants, never Rust enums, so an unknown value from a library
//! is not undefined behaviour. Names keep the C spelling (`Qnn_Tensor_t`, `graphAddNode`) so that
//! they can be looked up in the headers; C's `type` field is `type_`.
//!
//! # Example
//! ```no_run
//! use npu_qnn_sys::{QnnLibrary, QNN_API_VERSION_MAJOR};
//! // SAFETY: libQnnHtp.so is the QNN HTP backend library.
//! let lib = unsafe { QnnLibrary::open(std::path::Path::new("libQnnHtp.so")) }?;
//! for p in lib.providers()? {
//!     let v = p.apiVersion.coreApiVersion;
//!     println!("backend {} core API {}.{}", p.backendId, v.major, v.minor);
//!     assert_eq!(v.major, QNN_API_VERSION_MAJOR);
//! }
//! # Ok::<(), npu_qnn_sys::LoadError>(())
//! ```
//!
//! # Invariants
//! - `#[repr(C)]` on every struct and union; `tests/layout.rs` checks sizes and offsets on 64-bit
//!   targets against the headers.
//! - Only this crate of the workspace loads libraries (`libloading`); `xtask/tests/it/layering.rs`
//!   checks it.
//! - Every pointer read from a library (provider tables, function pointers) is valid only while its
//!   [`QnnLibrary`] is alive.

#![allow(non_camel_case_types, non_snake_case)]

mod errors;
mod interface;
mod loader;
mod ops;
mod tensor;
mod types;

pub use errors::*;
pub use interface::*;
pub use loader::{LoadError, QnnLibrary, DEFAULT_LIBRARY_NAMES};
pub use ops::*;
pub use tensor::*;
pub use types::*;
