//! `neuron-store`: the neuron-bundle store of PowerInfer-2 (§4.4): a model's FFN weights laid out per
//! neuron, so that what one neuron needs (its gate row, up row and down column) is one read.
//!
//! A store is one file. Each layer's neurons are written in a caller-chosen order, hot neurons first,
//! so a layer's hot set is one sequential read. Bundles smaller than a page are packed, several to a
//! 4 KiB *unit*, in that order (neighbours in the order share a page: the caller orders by activation
//! frequency, so a page holds neurons of similar firing rate). A bundle larger than a page gets a unit
//! of its own spanning several pages, gate row first, so that the gate part can be read alone
//! (two-phase loading). Writing goes to a temporary name, renamed when complete; reading goes through
//! [`ufs_io::IoEngine`] (direct I/O, one I/O thread) and every unit read can be checked against its CRC.
//!
//! The module [`expert`] holds the other unit of offload, a Mixture-of-Experts model's routed
//! experts: one expert of one layer (gate, up and down rows in the model's own formats) is one
//! contiguous, page-aligned blob, listed in a checksummed index ([`expert::ExpertStore`]).
//!
//! # Example
//!
//! ```no_run
//! use tensor_types::WeightFormat;
//! use neuron_store::{Formats, LayerInput, NeuronStore, StoreWriter};
//! use ufs_io::{IoConfig, IoEngine, OpenOptions};
//!
//! let (d, ff) = (64, 96);
//! let f = Formats { gate: WeightFormat::Q8_0, up: WeightFormat::Q8_0, down: WeightFormat::Q8_0 };
//! let row = WeightFormat::Q8_0.row_bytes(d).unwrap();
//! let m = vec![0u8; ff * row];
//! let mut w = StoreWriter::create("model.neurons", 1, d, ff, f)?;
//! w.add_layer(LayerInput { gate: &m, up: &m, down_t: &m, order: (0..ff as u32).collect(), hot_neurons: 8, down_norms: vec![1.0; ff] })?;
//! w.finish()?;
//!
//! let io = IoEngine::new(IoConfig::default())?;
//! let store = NeuronStore::open(&io, "model.neurons", OpenOptions::default())?;
//! let (unit, slot) = store.index().unit_of(0, 42);
//! let bytes = store.read_unit(&io, 0, unit)?; // checked against its CRC
//! let gate_row = &bytes[store.index().layout.gate_range()][slot * row..(slot + 1) * row];
//! # let _ = gate_row;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # File layout (version 2, little-endian)
//!
//! | bytes | field |
//! |---|---|
//! | 0..8 | magic `SPRWNSTO` |
//! | 8..12 | version (2; version 1 lacked the first-page checksums and is refused: convert again) |
//! | 12..16 | CRC-32 of the index |
//! | 16..24 | index length in bytes |
//! | 24..32 | offset of the first unit (a multiple of 4096) |
//! | 32..40 | file length |
//! | 40..44 | CRC-32 of bytes 0..40 |
//! | 44..48 | zero |
//! | 48.. | index, then zeros up to the first unit |
//!
//! Index: `n_layers, d_model, d_ff` (u32 each); format codes of gate, up and down rows (u32; GGML type
//! ids, `I4Hybrid` is 1000 + outliers per row); neurons per unit `k` (u32). Then per layer: offset of
//! its first unit (u64), hot units (u32), unit count (u32), `order` (`d_ff` × u32: the neuron at each
//! position), down-column norms by neuron id (`d_ff` × f32), CRC-32 of each unit (u32 each), CRC-32 of
//! each unit's first page (u32 each; the same as the unit's for one-page units), which lets two-phase
//! loading check a gate page read alone.
//!
//! Data: layer after layer, each `units × unit_bytes` long. Unit `u` holds positions `u·k .. u·k+k`:
//! first their `k` gate rows, then `k` up rows, then `k` down rows (the down matrix transposed, one row
//! per neuron), then zeros to the unit's end. A unit is `ceil(k · bundle / 4096)` pages (at most
//! [`MAX_UNIT_PAGES`] unless `k = 1`): the writer's [`Packing`] picks `k` — as many as fit one page
//! (the default; one bundle over several pages when it is larger than a page), one, or as many as
//! fill several pages to [`FULL_FILL`].
//!
//! # Invariants
//!
//! * **Only complete stores carry the final name.** The writer writes a temporary in the same folder
//!   (`atomic_out::AtomicFile`: `.NAME.sparrow-tmp-PID-SEQ`) with a zeroed header, fills the header and
//!   index last, syncs, renames and syncs the folder; a dropped or failed writer removes the temporary
//!   file and leaves an earlier store at that path byte-identical.
//! * **Opening validates everything but the unit bytes**: magic, version, header and index checksums,
//!   shapes and formats, that every layer and unit lies where the index says, that every order is a
//!   permutation, and the file length. Errors name the file and what is wrong, never panic.
//! * **Unit bytes are checked as they are read** ([`NeuronStore::verify_unit`]): a damaged page is an
//!   error naming the layer, unit and byte range, never wrong numbers.
//! * **All reads go through `ufs-io`** (this crate writes files but never reads one itself), at offsets
//!   and lengths that are multiples of 4096.

mod error;
pub mod expert;
mod layout;
mod open;
mod store;
mod writer;

pub use error::{Result, StoreError};
pub use layout::{
    format_code, format_from_code, BundleLayout, Formats, LayerIndex, Packing, StoreIndex,
    FULL_FILL, HEADER_LEN, MAGIC, MAX_UNIT_PAGES, PAGE, VERSION,
};
pub use store::NeuronStore;
pub use writer::{LayerInput, StoreWriter};
