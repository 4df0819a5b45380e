//! A model's bundle on disk: what `sparrow convert` writes and what loading a bundle checks.
//!
//! * [`convert()`] (`convert.rs`) writes a model plus its activation profile as a *resident file*
//!   (a GGUF without the FFN tensors, naming its store) and a *neuron store* (`neuron-store`: gate
//!   row, up row and down column of each neuron together, hot neurons first, packed into 4 KiB units
//!   by activation frequency); [`convert_moe`] (`experts_convert.rs`) writes an MoE model's resident
//!   file without its routed experts, an expert store and a routing profile. [`verify`] reads a
//!   store back.
//! * `generation.rs`: the new names a convert writes its parts under beside an existing bundle, the
//!   steps at which it can fail ([`ConvertStep`]) and removing the parts it replaced.
//! * [`manifest`]: the size and hash of every part, the source model's fingerprint; [`bundle_parts`]:
//!   the names of a model's sidecars and of a bundle's parts.
//! * [`outputs`]: the one output guard of the CLI's commands (never over an input or a part of a
//!   bundle they touch, never over a file of another kind).
//!
//! Invariants: a convert is one transaction: every new part is written under a new name, the
//! manifest last but one, and the resident file is renamed into place last, so a crash or a full
//! disk leaves the previous bundle usable; outputs are only ever whole (`atomic-out`). It knows how
//! a bundle is laid out, not how it runs: the offloaded executors are the `offload` crate's, and
//! setting sparse decode up from a bundle is the engine's (`bundle.rs`).

pub mod bundle_parts;
mod convert;
pub mod error;
mod experts_convert;
mod generation;
pub mod manifest;
mod neuron_experts;
pub mod outputs;

pub use convert::{
    auto_down_format, auto_packing, convert, store_path_for, verify, ConvertOptions, ConvertReport,
};
pub use error::{BundleError, Result};
pub use experts_convert::{convert_moe, convert_moe_with, MoeConvertReport};
pub use generation::ConvertStep;
pub use neuron_experts::ReluExperts;
