//! The expert store: a Mixture-of-Experts model's routed experts on flash, one expert of one layer
//! (its gate rows, up rows and down rows, in the model's own formats) as one contiguous, 4 KiB-aligned
//! blob, so that fetching an expert is one large read.
//!
//! # File layout (version 1, little-endian)
//!
//! | bytes | field |
//! |---|---|
//! | 0..8 | magic `SPRWXSTO` |
//! | 8..12 | version (1) |
//! | 12..16 | CRC-32 of the index |
//! | 16..24 | index length in bytes |
//! | 24..32 | offset of the first blob (a multiple of 4096) |
//! | 32..40 | file length |
//! | 40..44 | CRC-32 of bytes 0..40 |
//! | 44..48 | zero |
//! | 48.. | index, then zeros up to the first blob |
//!
//! Index: `n_layers, d_model` (u32 each). Then per layer: expert count (u32; 0 for a layer without
//! routed experts), expert width `ff` (u32), format codes of gate, up and down ([`crate::format_code`],
//! u32 each), then per expert: offset (u64), length (u64), CRC-32 of the blob (u32).
//!
//! Data: layer after layer, expert after expert, each blob `ceil(bytes / 4096)` pages: the expert's
//! `ff` gate rows of `d_model` columns, its `ff` up rows, then its `d_model` down rows of `ff` columns
//! (llama.cpp's `ffn_down_exps` slice of that expert, unchanged), then zeros to the page boundary. The
//! parts are the row ranges of llama.cpp's 3-D `ffn_{gate,up,down}_exps` tensors, byte for byte.
//!
//! # Invariants
//!
//! * Only complete stores carry the final name (written through `atomic_out::AtomicFile`, header and
//!   index last).
//! * Opening checks everything but the blob bytes: magic, version, the checksums of header and index,
//!   shapes and formats, that every blob lies where the layout puts it (contiguous, page aligned, of
//!   its layer's length) and the file length. Errors name the file and what is wrong, never panic.
//! * Blob bytes are checked as they are read ([`ExpertStore::verify`]).
//! * All reads go through `ufs-io`, at offsets and lengths that are multiples of 4096.

mod store;
mod writer;

use std::ops::Range;
use std::path::Path;

use tensor_types::WeightFormat;

use crate::error::{Result, StoreError};
use crate::layout::{format_code, format_from_code, Formats, HeaderKind, Reader, HEADER_LEN, PAGE};

pub use store::ExpertStore;
pub use writer::{ExpertLayerInput, ExpertStoreWriter};

/// File magic of an expert store.
pub const EXPERT_MAGIC: &[u8; 8] = b"SPRWXSTO";
/// Expert-store format version this crate reads and writes.
pub const EXPERT_VERSION: u32 = 1;
/// Bytes of the fixed header.
pub const EXPERT_HEADER_LEN: usize = HEADER_LEN;

/// The shape of one layer's experts: how many, how wide, in which formats. `formats.down` is the
/// format of the down rows as llama.cpp stores them (`d_model` rows of `ff` columns per expert).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpertShape {
    /// Routed experts in the layer (0: a layer without them).
    pub n_experts: usize,
    /// Width of one expert's hidden layer (`expert_feed_forward_length`).
    pub ff: usize,
    /// Formats of the gate, up and down matrices.
    pub formats: Formats,
}

/// Where the parts of one expert lie inside its blob, for a model of width `d_model`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpertLayout {
    /// Bytes of the gate matrix (`ff` rows of `d_model`).
    pub gate_bytes: usize,
    /// Bytes of the up matrix (`ff` rows of `d_model`).
    pub up_bytes: usize,
    /// Bytes of the down matrix (`d_model` rows of `ff`).
    pub down_bytes: usize,
    /// The blob's length: the three parts rounded up to whole pages.
    pub blob_bytes: usize,
}

impl ExpertLayout {
    /// The layout of a layer without experts.
    pub const EMPTY: ExpertLayout = ExpertLayout {
        gate_bytes: 0,
        up_bytes: 0,
        down_bytes: 0,
        blob_bytes: 0,
    };

    /// The layout of `shape`'s experts in a model `d_model` wide; an error when rows do not fit their
    /// formats' blocks.
    pub fn new(d_model: usize, shape: &ExpertShape) -> Result<Self> {
        let bytes = |f: WeightFormat, rows: usize, cols: usize, what: &str| {
            f.row_bytes(cols)
                .filter(|&b| b > 0)
                .and_then(|b| b.checked_mul(rows))
                .ok_or_else(|| {
                    StoreError::Invalid(format!(
                        "expert {what}: {rows} rows of {cols} columns do not fit format {f:?}"
                    ))
                })
        };
        let f = shape.formats;
        let gate_bytes = bytes(f.gate, shape.ff, d_model, "gate")?;
        let up_bytes = bytes(f.up, shape.ff, d_model, "up")?;
        let down_bytes = bytes(f.down, d_model, shape.ff, "down")?;
        let blob_bytes = gate_bytes
            .checked_add(up_bytes)
            .and_then(|s| s.checked_add(down_bytes))
            .and_then(|s| s.checked_next_multiple_of(PAGE))
            .filter(|&b| b > 0 && b <= 1 << 40)
            .ok_or_else(|| StoreError::Invalid(format!("expert of {shape:?} is too large")))?;
        Ok(ExpertLayout {
            gate_bytes,
            up_bytes,
            down_bytes,
            blob_bytes,
        })
    }

    /// The gate matrix's bytes in a blob.
    pub fn gate_range(&self) -> Range<usize> {
        0..self.gate_bytes
    }

    /// The up matrix's bytes in a blob.
    pub fn up_range(&self) -> Range<usize> {
        self.gate_bytes..self.gate_bytes + self.up_bytes
    }

    /// The down matrix's bytes in a blob.
    pub fn down_range(&self) -> Range<usize> {
        let s = self.gate_bytes + self.up_bytes;
        s..s + self.down_bytes
    }
}

/// One layer of the index.
#[derive(Debug, Clone, PartialEq)]
pub struct ExpertLayerIndex {
    /// The layer's expert shape.
    pub shape: ExpertShape,
    /// Its blob layout (meaningless when `shape.n_experts` is 0).
    pub layout: ExpertLayout,
    /// File offset of each expert's blob.
    pub offsets: Vec<u64>,
    /// CRC-32 of each expert's blob (all `layout.blob_bytes` of it, padding included).
    pub crc: Vec<u32>,
}

/// The index of an expert store.
#[derive(Debug, Clone, PartialEq)]
pub struct ExpertIndex {
    /// Model width.
    pub d_model: usize,
    /// Layers, in model order.
    pub layers: Vec<ExpertLayerIndex>,
    /// File length.
    pub file_len: u64,
}

impl ExpertIndex {
    /// Bytes of one blob of `layer` (0 for a layer without experts or out of range).
    pub fn blob_bytes(&self, layer: usize) -> usize {
        self.layers.get(layer).map_or(0, |l| {
            if l.shape.n_experts == 0 {
                0
            } else {
                l.layout.blob_bytes
            }
        })
    }

    /// Experts of `layer` (0 when out of range).
    pub fn experts(&self, layer: usize) -> usize {
        self.layers.get(layer).map_or(0, |l| l.shape.n_experts)
    }

    /// Bytes of all blobs together.
    pub fn data_bytes(&self) -> u64 {
        (0..self.layers.len())
            .map(|l| self.experts(l) as u64 * self.blob_bytes(l) as u64)
            .sum()
    }

    /// Length of the encoded index for these layer shapes.
    pub(crate) fn encoded_len(shapes: &[ExpertShape]) -> usize {
        8 + shapes.iter().map(|s| 20 + 20 * s.n_experts).sum::<usize>()
    }

    /// First byte of the data (after header and index, page aligned).
    pub(crate) fn data_offset(shapes: &[ExpertShape]) -> u64 {
        (EXPERT_HEADER_LEN + Self::encoded_len(shapes)).next_multiple_of(PAGE) as u64
    }

    /// The index's bytes.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let shapes: Vec<ExpertShape> = self.layers.iter().map(|l| l.shape).collect();
        let mut b = Vec::with_capacity(Self::encoded_len(&shapes));
        for v in [self.layers.len(), self.d_model] {
            b.extend_from_slice(&(v as u32).to_le_bytes());
        }
        for l in &self.layers {
            let f = l.shape.formats;
            for v in [
                l.shape.n_experts as u32,
                l.shape.ff as u32,
                format_code(f.gate),
                format_code(f.up),
                format_code(f.down),
            ] {
                b.extend_from_slice(&v.to_le_bytes());
            }
            for (o, c) in l.offsets.iter().zip(&l.crc) {
                b.extend_from_slice(&o.to_le_bytes());
                b.extend_from_slice(&(l.layout.blob_bytes as u64).to_le_bytes());
                b.extend_from_slice(&c.to_le_bytes());
            }
        }
        b
    }

    /// Parses and validates an index read from `path` (named in errors) of a file `file_len` long.
    pub fn decode(bytes: &[u8], file_len: u64, path: &Path) -> Result<Self> {
        let bad = |what: String| StoreError::Corrupt {
            path: path.to_path_buf(),
            what,
        };
        let mut r = Reader { b: bytes, at: 0 };
        let u32_ = |r: &mut Reader<'_>, what: &str| {
            r.u32()
                .ok_or_else(|| bad(format!("expert index ends inside {what}")))
        };
        let n_layers = u32_(&mut r, "the layer count")? as usize;
        let d_model = u32_(&mut r, "d_model")? as usize;
        if n_layers == 0 || d_model == 0 {
            return Err(bad(format!(
                "empty shape: {n_layers} layers, d_model {d_model}"
            )));
        }
        let mut layers = Vec::new();
        let mut shapes = Vec::new();
        let mut next = 0u64; // offsets relative to the data start, checked below
        let mut raw: Vec<(Vec<u64>, Vec<u64>, Vec<u32>)> = Vec::new();
        for li in 0..n_layers {
            let n_experts = u32_(&mut r, "an expert count")? as usize;
            let ff = u32_(&mut r, "an expert width")? as usize;
            let mut fmt = |what: &str| -> Result<WeightFormat> {
                let c = u32_(&mut r, what)?;
                format_from_code(c)
                    .ok_or_else(|| bad(format!("layer {li}: unknown {what} format code {c}")))
            };
            let formats = Formats {
                gate: fmt("gate")?,
                up: fmt("up")?,
                down: fmt("down")?,
            };
            if n_experts.saturating_mul(20) > bytes.len().saturating_sub(r.at) {
                return Err(bad(format!(
                    "layer {li}: {n_experts} experts run past the end of the index"
                )));
            }
            let shape = ExpertShape {
                n_experts,
                ff,
                formats,
            };
            let layout = if n_experts == 0 {
                ExpertLayout::EMPTY
            } else {
                ExpertLayout::new(d_model, &shape).map_err(|e| bad(format!("layer {li}: {e}")))?
            };
            let (mut offs, mut lens, mut crcs) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..n_experts {
                offs.push(r.u64().unwrap_or(u64::MAX));
                lens.push(r.u64().unwrap_or(u64::MAX));
                crcs.push(r.u32().unwrap_or(0));
            }
            shapes.push(shape);
            layers.push(ExpertLayerIndex {
                shape,
                layout,
                offsets: Vec::new(),
                crc: Vec::new(),
            });
            raw.push((offs, lens, crcs));
        }
        if r.at != bytes.len() || bytes.len() != Self::encoded_len(&shapes) {
            return Err(bad(format!(
                "expert index is {} bytes, its layers need {}",
                bytes.len(),
                Self::encoded_len(&shapes)
            )));
        }
        let data = Self::data_offset(&shapes);
        for (li, (layer, (offs, lens, crcs))) in layers.iter_mut().zip(raw).enumerate() {
            let blob = layer.layout.blob_bytes as u64;
            for (e, (&o, &len)) in offs.iter().zip(&lens).enumerate() {
                let expect = data + next;
                if o != expect || len != blob {
                    return Err(bad(format!(
                        "layer {li}, expert {e}: blob at byte {o}, {len} bytes; expected {expect}, {blob} bytes"
                    )));
                }
                next += blob;
            }
            layer.offsets = offs;
            layer.crc = crcs;
        }
        if data + next != file_len {
            return Err(bad(format!(
                "file is {file_len} bytes, its experts end at byte {} (truncated or padded)",
                data + next
            )));
        }
        Ok(ExpertIndex {
            d_model,
            layers,
            file_len,
        })
    }
}

/// The expert store's kind of the fixed header every store file shares (`crate::layout`).
pub(crate) const EXPERT_STORE: HeaderKind = HeaderKind {
    magic: EXPERT_MAGIC,
    version: EXPERT_VERSION,
    name: "sparrow expert store",
    version_label: "expert store version",
};
