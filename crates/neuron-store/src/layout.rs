//! The on-disk layout: header, index, bundle units. See the crate docs for the byte-level description.

use std::path::Path;

use tensor_types::WeightFormat;

use crate::error::{Result, StoreError};

/// File magic, first 8 bytes.
pub const MAGIC: &[u8; 8] = b"SPRWNSTO";
/// Format version this crate reads and writes.
pub const VERSION: u32 = 2;
/// Page size: every unit, layer and the data section start on a multiple of it.
pub const PAGE: usize = 4096;
/// Bytes of the fixed header at offset 0 (the index follows it).
pub const HEADER_LEN: usize = 48;

/// Weight formats of the three parts of a bundle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Formats {
    /// Gate rows (`d_model` wide).
    pub gate: WeightFormat,
    /// Up rows (`d_model` wide).
    pub up: WeightFormat,
    /// Down columns, stored as rows (`d_model` wide): the down matrix transposed.
    pub down: WeightFormat,
}

/// Code of [`WeightFormat::I4Hybrid`] with no outliers; `k` outliers are `HYBRID_CODE + k`.
const HYBRID_CODE: u32 = 1000;

/// Stable numeric code of a weight format in the file: the ggml type id ([`WeightFormat::ggml_id`]);
/// `I4Hybrid` is `1000 + k`.
pub fn format_code(f: WeightFormat) -> u32 {
    // Only I4Hybrid has no ggml id.
    f.ggml_id()
        .unwrap_or_else(|| HYBRID_CODE + tensor_types::hybrid::outliers_per_row(f) as u32)
}

/// The format of a [`format_code`], if it is one.
pub fn format_from_code(c: u32) -> Option<WeightFormat> {
    match c.checked_sub(HYBRID_CODE) {
        Some(k) => Some(WeightFormat::I4Hybrid {
            outliers_per_row: u16::try_from(k).ok()?,
        }),
        None => WeightFormat::from_ggml_id(c),
    }
}

/// How neurons are packed into units: `neurons` bundles (gate row, up row, down row) per unit of
/// `pages` pages. Inside a unit the parts are grouped: `neurons` gate rows, then `neurons` up rows,
/// then `neurons` down rows, then zeros up to the page boundary, so each part is a small row-major
/// matrix and the gate rows come first (two-phase loading reads them alone when a unit spans pages).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BundleLayout {
    /// Bytes of one gate row.
    pub gate_row: usize,
    /// Bytes of one up row.
    pub up_row: usize,
    /// Bytes of one down row.
    pub down_row: usize,
    /// Neurons per unit.
    pub neurons: usize,
    /// Pages per unit.
    pub pages: usize,
}

/// How [`BundleLayout::for_packing`] fills units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Packing {
    /// One bundle per unit (the "no packing" layout of the ablation).
    None,
    /// As many bundles as fit one page (one bundle over several pages when it is larger than a page):
    /// a unit is never more than one page of bundles, so reading one neuron reads no more than a page
    /// beyond it.
    #[default]
    Page,
    /// Units of several pages, as few as reach [`FULL_FILL`] (at most [`MAX_UNIT_PAGES`]): the file is
    /// no larger than its bundles, at the price of reading more neighbours with each neuron.
    Full,
}

/// The fill [`Packing::Full`] stops at.
pub const FULL_FILL: f64 = 0.95;
/// The largest unit, in pages, that a store may declare ([`Packing::Full`] picks no larger).
pub const MAX_UNIT_PAGES: usize = 16;

impl BundleLayout {
    /// The layout for rows `d_model` wide in `formats`: as many bundles as fit in one page when a bundle
    /// is at most a page (SmolLM2 Q4_1: 3 per page), otherwise one bundle over as many pages as it needs.
    pub fn new(d_model: usize, formats: Formats) -> Result<Self> {
        Self::with_neurons(d_model, formats, usize::MAX)
    }

    /// [`BundleLayout::new`] with at most `max_neurons` bundles per unit (1 gives one bundle per unit:
    /// the "no packing" layout of the ablation).
    pub fn with_neurons(d_model: usize, formats: Formats, max_neurons: usize) -> Result<Self> {
        let one = Self::with_unit(d_model, formats, 1)?;
        let bundle = one.bundle_bytes();
        if bundle > PAGE {
            return Ok(one);
        }
        Self::with_unit(d_model, formats, (PAGE / bundle).min(max_neurons.max(1)))
    }

    /// The layout `packing` asks for.
    pub fn for_packing(d_model: usize, formats: Formats, packing: Packing) -> Result<Self> {
        match packing {
            Packing::None => Self::with_unit(d_model, formats, 1),
            Packing::Page => Self::new(d_model, formats),
            Packing::Full => {
                let bundle = Self::with_unit(d_model, formats, 1)?.bundle_bytes();
                let mut best = Self::new(d_model, formats)?;
                for pages in 1..=MAX_UNIT_PAGES {
                    let k = pages * PAGE / bundle;
                    if k == 0 {
                        continue;
                    }
                    let l = Self::with_unit(d_model, formats, k)?;
                    if l.fill() >= FULL_FILL {
                        return Ok(l);
                    }
                    if l.fill() > best.fill() + 1e-12 {
                        best = l;
                    }
                }
                Ok(best)
            }
        }
    }

    /// `neurons` bundles per unit, in as few pages as hold them (at most [`MAX_UNIT_PAGES`]). Every
    /// layout is one of these, so a store's index need only name `neurons`.
    pub fn with_unit(d_model: usize, formats: Formats, neurons: usize) -> Result<Self> {
        let row = |f: WeightFormat, what: &str| {
            f.row_bytes(d_model).filter(|&b| b > 0).ok_or_else(|| {
                StoreError::Invalid(format!(
                    "{what} rows of {d_model} columns do not fit format {f:?}"
                ))
            })
        };
        let (gate_row, up_row, down_row) = (
            row(formats.gate, "gate")?,
            row(formats.up, "up")?,
            row(formats.down, "down")?,
        );
        let bundle = gate_row + up_row + down_row;
        let pages = neurons
            .checked_mul(bundle)
            .map(|b| b.div_ceil(PAGE))
            .filter(|&p| neurons > 0 && (p <= MAX_UNIT_PAGES || neurons == 1))
            .ok_or_else(|| {
                StoreError::Invalid(format!(
                    "{neurons} bundles of {bundle} bytes per unit: units hold 1 to {MAX_UNIT_PAGES} pages"
                ))
            })?;
        Ok(BundleLayout {
            gate_row,
            up_row,
            down_row,
            neurons,
            pages,
        })
    }

    /// Share of a unit's bytes that are bundles (the rest is padding).
    pub fn fill(&self) -> f64 {
        (self.neurons * self.bundle_bytes()) as f64 / self.unit_bytes() as f64
    }

    /// Bytes of one bundle (gate + up + down of one neuron).
    pub fn bundle_bytes(&self) -> usize {
        self.gate_row + self.up_row + self.down_row
    }

    /// Bytes of one unit on disk (a multiple of [`PAGE`]).
    pub fn unit_bytes(&self) -> usize {
        self.pages * PAGE
    }

    /// Byte range of the gate rows inside a unit.
    pub fn gate_range(&self) -> std::ops::Range<usize> {
        0..self.neurons * self.gate_row
    }

    /// Byte range of the up rows inside a unit.
    pub fn up_range(&self) -> std::ops::Range<usize> {
        let s = self.neurons * self.gate_row;
        s..s + self.neurons * self.up_row
    }

    /// Byte range of the down rows inside a unit.
    pub fn down_range(&self) -> std::ops::Range<usize> {
        let s = self.neurons * (self.gate_row + self.up_row);
        s..s + self.neurons * self.down_row
    }

    /// Whether all gate rows of a unit lie in its first page (so two-phase loading can read them alone).
    pub fn gate_in_first_page(&self) -> bool {
        self.gate_range().end <= PAGE
    }

    /// Units needed for `d_ff` neurons.
    pub fn units(&self, d_ff: usize) -> usize {
        d_ff.div_ceil(self.neurons)
    }
}

/// Index of one layer: where its units are and which neuron sits where.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerIndex {
    /// First byte of the layer's first unit (a multiple of [`PAGE`]).
    pub offset: u64,
    /// Units at the front of the layer that hold its hot neurons (read sequentially at start-up).
    pub hot_units: usize,
    /// `order[p]` is the neuron at position `p`: unit `p / neurons`, slot `p % neurons`. Hot first.
    pub order: Vec<u32>,
    /// `position[n]`: where neuron `n` sits (the inverse of `order`).
    pub position: Vec<u32>,
    /// Euclidean norm of each neuron's down column (by neuron id; for the neuron score).
    pub down_norms: Vec<f32>,
    /// CRC-32 of each unit's bytes (the whole unit, padding included).
    pub unit_crc: Vec<u32>,
    /// CRC-32 of each unit's first page alone (two-phase loading checks the gate page it read by
    /// itself; equal to `unit_crc` for one-page units).
    pub head_crc: Vec<u32>,
}

/// The whole index: shapes, formats, layout and one [`LayerIndex`] per layer.
#[derive(Debug, Clone, PartialEq)]
pub struct StoreIndex {
    /// Model width (columns of every stored row).
    pub d_model: usize,
    /// Neurons per layer.
    pub d_ff: usize,
    /// Formats of gate, up and down rows.
    pub formats: Formats,
    /// How bundles are packed into units.
    pub layout: BundleLayout,
    /// Per layer.
    pub layers: Vec<LayerIndex>,
    /// Total file length in bytes.
    pub file_len: u64,
}

impl StoreIndex {
    /// Unit and slot of `neuron` in `layer`.
    pub fn unit_of(&self, layer: usize, neuron: u32) -> (usize, usize) {
        let p = self.layers[layer].position[neuron as usize] as usize;
        (p / self.layout.neurons, p % self.layout.neurons)
    }

    /// The neurons of a unit, by slot (the last unit of a layer may hold fewer).
    pub fn neurons_of(&self, layer: usize, unit: usize) -> &[u32] {
        let order = &self.layers[layer].order;
        let k = self.layout.neurons;
        &order[(unit * k).min(order.len())..((unit + 1) * k).min(order.len())]
    }

    /// File offset of a unit.
    pub fn unit_offset(&self, layer: usize, unit: usize) -> u64 {
        self.layers[layer].offset + (unit * self.layout.unit_bytes()) as u64
    }

    /// Units per layer.
    pub fn units_per_layer(&self) -> usize {
        self.layout.units(self.d_ff)
    }

    /// Bytes of one layer's units.
    pub fn layer_bytes(&self) -> usize {
        self.units_per_layer() * self.layout.unit_bytes()
    }

    /// Bytes of all units (the FFN on disk, padding included).
    pub fn ffn_bytes(&self) -> usize {
        self.layer_bytes() * self.layers.len()
    }

    /// Length of the encoded index for these shapes.
    pub(crate) fn encoded_len(n_layers: usize, d_ff: usize, units: usize) -> usize {
        24 + 4 + n_layers * (16 + 4 * d_ff * 2 + 8 * units)
    }

    /// First byte of the data section (after header and index, page aligned).
    pub(crate) fn data_offset(n_layers: usize, d_ff: usize, units: usize) -> u64 {
        (HEADER_LEN + Self::encoded_len(n_layers, d_ff, units)).next_multiple_of(PAGE) as u64
    }

    /// The index's bytes (little-endian; layout in the crate docs).
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(Self::encoded_len(
            self.layers.len(),
            self.d_ff,
            self.units_per_layer(),
        ));
        for v in [self.layers.len(), self.d_model, self.d_ff] {
            b.extend_from_slice(&(v as u32).to_le_bytes());
        }
        for f in [self.formats.gate, self.formats.up, self.formats.down] {
            b.extend_from_slice(&format_code(f).to_le_bytes());
        }
        b.extend_from_slice(&(self.layout.neurons as u32).to_le_bytes());
        for l in &self.layers {
            b.extend_from_slice(&l.offset.to_le_bytes());
            b.extend_from_slice(&(l.hot_units as u32).to_le_bytes());
            b.extend_from_slice(&(l.unit_crc.len() as u32).to_le_bytes());
            l.order
                .iter()
                .for_each(|v| b.extend_from_slice(&v.to_le_bytes()));
            l.down_norms
                .iter()
                .for_each(|v| b.extend_from_slice(&v.to_le_bytes()));
            l.unit_crc
                .iter()
                .for_each(|v| b.extend_from_slice(&v.to_le_bytes()));
            l.head_crc
                .iter()
                .for_each(|v| b.extend_from_slice(&v.to_le_bytes()));
        }
        b
    }

    /// Parses and validates an index read from `path` (for error messages) of a file `file_len` long.
    pub fn decode(bytes: &[u8], file_len: u64, path: &Path) -> Result<Self> {
        let bad = |what: String| StoreError::Corrupt {
            path: path.to_path_buf(),
            what,
        };
        let mut r = Reader { b: bytes, at: 0 };
        let u32_ = |r: &mut Reader<'_>, what: &str| {
            r.u32()
                .ok_or_else(|| bad(format!("index ends inside {what}")))
        };
        let n_layers = u32_(&mut r, "the layer count")? as usize;
        let d_model = u32_(&mut r, "d_model")? as usize;
        let d_ff = u32_(&mut r, "d_ff")? as usize;
        if n_layers == 0 || d_model == 0 || d_ff == 0 {
            return Err(bad(format!(
                "empty shape: {n_layers} layers, d_model {d_model}, d_ff {d_ff}"
            )));
        }
        let fmt = |r: &mut Reader<'_>, what: &str| -> Result<WeightFormat> {
            let c = u32_(r, what)?;
            format_from_code(c).ok_or_else(|| bad(format!("unknown {what} format code {c}")))
        };
        let formats = Formats {
            gate: fmt(&mut r, "gate")?,
            up: fmt(&mut r, "up")?,
            down: fmt(&mut r, "down")?,
        };
        let k = u32_(&mut r, "neurons per unit")? as usize;
        let layout =
            BundleLayout::with_unit(d_model, formats, k).map_err(|e| bad(e.to_string()))?;
        let units = layout.units(d_ff);
        if bytes.len() != Self::encoded_len(n_layers, d_ff, units) {
            return Err(bad(format!(
                "index is {} bytes, but {n_layers} layers of {d_ff} neurons need {}",
                bytes.len(),
                Self::encoded_len(n_layers, d_ff, units)
            )));
        }
        let data = Self::data_offset(n_layers, d_ff, units);
        let layer_bytes = (units * layout.unit_bytes()) as u64;
        let mut layers = Vec::with_capacity(n_layers);
        for li in 0..n_layers {
            let offset = r
                .u64()
                .ok_or_else(|| bad(format!("index ends in layer {li}")))?;
            let hot_units = u32_(&mut r, "hot units")? as usize;
            let n_units = u32_(&mut r, "unit count")? as usize;
            let expect = data + li as u64 * layer_bytes;
            if offset != expect {
                return Err(bad(format!(
                    "layer {li} starts at byte {offset}, expected {expect}"
                )));
            }
            if n_units != units || hot_units > units {
                return Err(bad(format!(
                    "layer {li} has {n_units} units ({hot_units} hot), expected {units}"
                )));
            }
            let order: Vec<u32> = (0..d_ff).map(|_| r.u32().unwrap_or(u32::MAX)).collect();
            let mut position = vec![u32::MAX; d_ff];
            for (p, &n) in order.iter().enumerate() {
                match position.get_mut(n as usize) {
                    Some(slot) if *slot == u32::MAX => *slot = p as u32,
                    _ => {
                        return Err(bad(format!(
                            "layer {li}: neuron order is not a permutation (entry {p} is {n})"
                        )))
                    }
                }
            }
            let down_norms: Vec<f32> = (0..d_ff)
                .map(|_| f32::from_bits(r.u32().unwrap_or(0)))
                .collect();
            if let Some(j) = down_norms.iter().position(|v| !v.is_finite() || *v < 0.0) {
                return Err(bad(format!(
                    "layer {li}: down norm of neuron {j} is {}",
                    down_norms[j]
                )));
            }
            let unit_crc: Vec<u32> = (0..units).map(|_| r.u32().unwrap_or(0)).collect();
            let head_crc: Vec<u32> = (0..units).map(|_| r.u32().unwrap_or(0)).collect();
            if layout.pages == 1 && head_crc != unit_crc {
                return Err(bad(format!(
                    "layer {li}: first-page checksums differ from the unit checksums of one-page units"
                )));
            }
            layers.push(LayerIndex {
                offset,
                hot_units,
                order,
                position,
                down_norms,
                unit_crc,
                head_crc,
            });
        }
        let file_expect = data + n_layers as u64 * layer_bytes;
        if file_len != file_expect {
            return Err(bad(format!(
                "file is {file_len} bytes, the index describes {file_expect} (truncated or padded)"
            )));
        }
        Ok(StoreIndex {
            d_model,
            d_ff,
            formats,
            layout,
            layers,
            file_len,
        })
    }
}

/// What tells one kind of store file from another in the fixed header every store kind shares (the
/// neuron store, `crate::expert`'s expert store): magic, version and the words its errors use.
pub(crate) struct HeaderKind {
    /// First 8 bytes.
    pub magic: &'static [u8; 8],
    /// The version this crate reads and writes.
    pub version: u32,
    /// What the file is, in the bad-magic error ("sparrow neuron store").
    pub name: &'static str,
    /// What its version is called in the version error ("format version").
    pub version_label: &'static str,
}

/// The neuron store's header kind.
pub(crate) const NEURON_STORE: HeaderKind = HeaderKind {
    magic: MAGIC,
    version: VERSION,
    name: "sparrow neuron store",
    version_label: "format version",
};

/// Encodes the fixed header of a `kind` file.
pub(crate) fn encode_header(
    kind: &HeaderKind,
    index_bytes: &[u8],
    data_offset: u64,
    file_len: u64,
) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..8].copy_from_slice(kind.magic);
    h[8..12].copy_from_slice(&kind.version.to_le_bytes());
    h[12..16].copy_from_slice(&crc32fast::hash(index_bytes).to_le_bytes());
    h[16..24].copy_from_slice(&(index_bytes.len() as u64).to_le_bytes());
    h[24..32].copy_from_slice(&data_offset.to_le_bytes());
    h[32..40].copy_from_slice(&file_len.to_le_bytes());
    let crc = crc32fast::hash(&h[..40]);
    h[40..44].copy_from_slice(&crc.to_le_bytes());
    h
}

/// The fields of a header that passed its own checks: index length and CRC, data offset, file length.
pub(crate) struct Header {
    pub index_len: usize,
    pub index_crc: u32,
    pub data_offset: u64,
    pub file_len: u64,
}

/// Checks the fixed header of a `kind` file (magic, version, its own CRC, the reserved zeros).
pub(crate) fn decode_header(kind: &HeaderKind, h: &[u8], path: &Path) -> Result<Header> {
    let bad = |what: String| StoreError::Corrupt {
        path: path.to_path_buf(),
        what,
    };
    if h.len() < HEADER_LEN {
        return Err(bad(format!(
            "file is {} bytes, shorter than the {HEADER_LEN}-byte header",
            h.len()
        )));
    }
    if &h[..8] != kind.magic {
        return Err(bad(format!(
            "bad magic {:?} (expected {:?}): not a {}",
            String::from_utf8_lossy(&h[..8]),
            String::from_utf8_lossy(kind.magic),
            kind.name
        )));
    }
    let word = |i: usize| u32::from_le_bytes(h[i..i + 4].try_into().expect("4 bytes"));
    let quad = |i: usize| u64::from_le_bytes(h[i..i + 8].try_into().expect("8 bytes"));
    let version = word(8);
    if version != kind.version {
        return Err(bad(format!(
            "{} {version}, this build reads version {}: convert the model again",
            kind.version_label, kind.version
        )));
    }
    if crc32fast::hash(&h[..40]) != word(40) {
        return Err(bad("header checksum mismatch (damaged header)".into()));
    }
    // Bytes 44..48 are reserved zeros, outside the header's CRC: any other value is damage.
    if h[44..HEADER_LEN].iter().any(|&b| b != 0) {
        return Err(bad(
            "reserved header bytes 44..48 are not zero (damaged header)".into(),
        ));
    }
    let index_len = usize::try_from(quad(16)).map_err(|_| bad("index length overflows".into()))?;
    Ok(Header {
        index_len,
        index_crc: word(12),
        data_offset: quad(24),
        file_len: quad(32),
    })
}

pub(crate) struct Reader<'a> {
    pub(crate) b: &'a [u8],
    pub(crate) at: usize,
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let s = self.b.get(self.at..self.at + N)?;
        self.at += N;
        s.try_into().ok()
    }
    pub(crate) fn u32(&mut self) -> Option<u32> {
        self.take::<4>().map(u32::from_le_bytes)
    }
    pub(crate) fn u64(&mut self) -> Option<u64> {
        self.take::<8>().map(u64::from_le_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_codes_are_stable() {
        use WeightFormat::*;
        // Codes written by earlier builds: the ggml ids, and 1000 + k for I4Hybrid.
        let hy = |k| I4Hybrid {
            outliers_per_row: k,
        };
        let codes = [
            (F32, 0),
            (F16, 1),
            (Q4_0, 2),
            (Q4_1, 3),
            (Q5_0, 6),
            (Q5_1, 7),
            (Q8_0, 8),
            (Q2_K, 10),
            (Q3_K, 11),
            (Q4_K, 12),
            (Q5_K, 13),
            (Q6_K, 14),
            (IQ4_NL, 20),
            (IQ4_XS, 23),
            (BF16, 30),
            (hy(0), 1000),
            (hy(6), 1006),
            (hy(u16::MAX), 1000 + 65535),
        ];
        for (f, c) in codes {
            assert_eq!(format_code(f), c, "{f}");
            assert_eq!(format_from_code(c), Some(f), "{c}");
        }
        for c in [4, 5, 31, 999, 1000 + 65536, u32::MAX] {
            assert_eq!(format_from_code(c), None, "{c}");
        }
    }
}
