//! Writing a store: to a temporary in the destination's folder (`atomic_out::AtomicFile`), renamed over
//! `path` only when complete and synced.

use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use atomic_out::{AtomicError, AtomicFile};

use crate::error::{Result, StoreError};
use crate::layout::{
    encode_header, BundleLayout, Formats, LayerIndex, Packing, StoreIndex, NEURON_STORE, PAGE,
};

/// One layer's FFN handed to [`StoreWriter::add_layer`].
pub struct LayerInput<'a> {
    /// Gate matrix, `d_ff` rows of `d_model`, row-major in `formats.gate`.
    pub gate: &'a [u8],
    /// Up matrix, `d_ff` rows of `d_model`, in `formats.up`.
    pub up: &'a [u8],
    /// Down matrix transposed: `d_ff` rows of `d_model` (row `j` is neuron `j`'s output column), in `formats.down`.
    pub down_t: &'a [u8],
    /// Neuron ids in storage order, hot first (a permutation of `0..d_ff`). Neighbours in this order
    /// share a unit, so it is also the packing.
    pub order: Vec<u32>,
    /// How many neurons at the front of `order` are hot (rounded up to whole units).
    pub hot_neurons: usize,
    /// Norm of each neuron's down column, by neuron id.
    pub down_norms: Vec<f32>,
}

/// Writes a store layer by layer. Nothing appears under the final name until [`StoreWriter::finish`]
/// has written, synced and renamed the file; dropping an unfinished writer (or one whose `finish`
/// failed) removes the temporary file and leaves any file already at `path` untouched.
pub struct StoreWriter {
    tmp: PathBuf,
    out: Option<BufWriter<AtomicFile>>,
    index: StoreIndex,
    n_layers: usize,
    unit: Vec<u8>,
}

impl StoreWriter {
    /// Starts a store of `n_layers` layers at `path`, with as many bundles per unit as fit a page.
    pub fn create(
        path: impl AsRef<Path>,
        n_layers: usize,
        d_model: usize,
        d_ff: usize,
        formats: Formats,
    ) -> Result<Self> {
        Self::create_with(path, n_layers, d_model, d_ff, formats, usize::MAX)
    }

    /// [`StoreWriter::create`] with at most `max_neurons` bundles per unit (1: no packing).
    pub fn create_with(
        path: impl AsRef<Path>,
        n_layers: usize,
        d_model: usize,
        d_ff: usize,
        formats: Formats,
        max_neurons: usize,
    ) -> Result<Self> {
        let layout = BundleLayout::with_neurons(d_model, formats, max_neurons)?;
        Self::create_with_layout(path, n_layers, d_model, d_ff, formats, layout)
    }

    /// [`StoreWriter::create`] with the units `packing` asks for ([`BundleLayout::for_packing`]).
    pub fn create_packed(
        path: impl AsRef<Path>,
        n_layers: usize,
        d_model: usize,
        d_ff: usize,
        formats: Formats,
        packing: Packing,
    ) -> Result<Self> {
        let layout = BundleLayout::for_packing(d_model, formats, packing)?;
        Self::create_with_layout(path, n_layers, d_model, d_ff, formats, layout)
    }

    fn create_with_layout(
        path: impl AsRef<Path>,
        n_layers: usize,
        d_model: usize,
        d_ff: usize,
        formats: Formats,
        layout: BundleLayout,
    ) -> Result<Self> {
        if n_layers == 0 || d_ff == 0 || d_model == 0 || d_ff > u32::MAX as usize {
            return Err(StoreError::Invalid(format!(
                "shape {n_layers} layers × {d_ff} neurons × {d_model} columns"
            )));
        }
        let file = AtomicFile::create(path.as_ref()).map_err(write_error)?;
        let tmp = file.temp_path().to_path_buf();
        let data = StoreIndex::data_offset(n_layers, d_ff, layout.units(d_ff));
        let mut w = StoreWriter {
            index: StoreIndex {
                d_model,
                d_ff,
                formats,
                layout,
                layers: Vec::new(),
                file_len: data,
            },
            out: Some(BufWriter::with_capacity(1 << 20, file)),
            unit: vec![0u8; layout.unit_bytes()],
            tmp,
            n_layers,
        };
        // Header and index are written last; zeros until then, so a partial file never validates.
        w.write(&vec![0u8; data as usize])?;
        Ok(w)
    }

    /// The packing in use.
    pub fn layout(&self) -> BundleLayout {
        self.index.layout
    }

    fn write(&mut self, bytes: &[u8]) -> Result<()> {
        let out = self
            .out
            .as_mut()
            .ok_or_else(|| StoreError::Invalid("writer already finished".into()))?;
        out.write_all(bytes).map_err(|source| StoreError::Write {
            path: self.tmp.clone(),
            source,
        })
    }

    /// Appends the next layer: its units in `order`, each checksummed.
    pub fn add_layer(&mut self, layer: LayerInput<'_>) -> Result<()> {
        let li = self.index.layers.len();
        if li >= self.n_layers {
            return Err(StoreError::Invalid(format!(
                "layer {li} added to a store of {} layers",
                self.n_layers
            )));
        }
        let (d_ff, l) = (self.index.d_ff, self.index.layout);
        let bad = |what: String| StoreError::Invalid(format!("layer {li}: {what}"));
        for (name, m, row) in [
            ("gate", layer.gate, l.gate_row),
            ("up", layer.up, l.up_row),
            ("down", layer.down_t, l.down_row),
        ] {
            if m.len() != d_ff * row {
                return Err(bad(format!(
                    "{name} is {} bytes, expected {d_ff} rows of {row}",
                    m.len()
                )));
            }
        }
        if layer.down_norms.len() != d_ff
            || layer.down_norms.iter().any(|v| !v.is_finite() || *v < 0.0)
        {
            return Err(bad(format!(
                "{} down norms (need {d_ff} finite, non-negative)",
                layer.down_norms.len()
            )));
        }
        let mut position = vec![u32::MAX; d_ff];
        if layer.order.len() != d_ff {
            return Err(bad(format!(
                "order lists {} neurons, expected {d_ff}",
                layer.order.len()
            )));
        }
        for (p, &n) in layer.order.iter().enumerate() {
            match position.get_mut(n as usize) {
                Some(s) if *s == u32::MAX => *s = p as u32,
                _ => {
                    return Err(bad(format!(
                        "order is not a permutation of 0..{d_ff} (entry {p} is {n})"
                    )))
                }
            }
        }
        let units = l.units(d_ff);
        let offset = self.index.file_len;
        let mut unit_crc = Vec::with_capacity(units);
        let mut head_crc = Vec::with_capacity(units);
        for u in 0..units {
            let mut buf = std::mem::take(&mut self.unit);
            buf.fill(0);
            let members = &layer.order[u * l.neurons..((u + 1) * l.neurons).min(d_ff)];
            for (slot, &n) in members.iter().enumerate() {
                let n = n as usize;
                let (g, up, dn) = (
                    l.gate_range().start,
                    l.up_range().start,
                    l.down_range().start,
                );
                buf[g + slot * l.gate_row..g + (slot + 1) * l.gate_row]
                    .copy_from_slice(&layer.gate[n * l.gate_row..(n + 1) * l.gate_row]);
                buf[up + slot * l.up_row..up + (slot + 1) * l.up_row]
                    .copy_from_slice(&layer.up[n * l.up_row..(n + 1) * l.up_row]);
                buf[dn + slot * l.down_row..dn + (slot + 1) * l.down_row]
                    .copy_from_slice(&layer.down_t[n * l.down_row..(n + 1) * l.down_row]);
            }
            unit_crc.push(crc32fast::hash(&buf));
            head_crc.push(crc32fast::hash(&buf[..PAGE.min(buf.len())]));
            let r = self.write(&buf);
            self.unit = buf;
            r?;
        }
        self.index.file_len += (units * l.unit_bytes()) as u64;
        self.index.layers.push(LayerIndex {
            offset,
            hot_units: layer.hot_neurons.min(d_ff).div_ceil(l.neurons),
            order: layer.order,
            position,
            down_norms: layer.down_norms,
            unit_crc,
            head_crc,
        });
        Ok(())
    }

    /// Writes header and index, syncs, and renames the file to its final name. Returns the index.
    pub fn finish(self) -> Result<StoreIndex> {
        if self.index.layers.len() != self.n_layers {
            return Err(StoreError::Invalid(format!(
                "finish after {} of {} layers",
                self.index.layers.len(),
                self.n_layers
            )));
        }
        let index = self.index.encode();
        let header = encode_header(
            &NEURON_STORE,
            &index,
            self.index.layers[0].offset,
            self.index.file_len,
        );
        let tmp = self.tmp.clone();
        let wr = |source| StoreError::Write {
            path: tmp.clone(),
            source,
        };
        let out = self
            .out
            .ok_or_else(|| StoreError::Invalid("writer already finished".into()))?;
        let mut file = out.into_inner().map_err(|e| wr(e.into_error()))?;
        file.seek(SeekFrom::Start(0)).map_err(wr)?;
        file.write_all(&header).map_err(wr)?;
        file.write_all(&index).map_err(wr)?;
        file.commit().map_err(write_error)?;
        Ok(self.index)
    }
}

/// An `atomic-out` failure as a [`StoreError::Write`] naming the file it concerns.
pub(crate) fn write_error(e: AtomicError) -> StoreError {
    StoreError::Write {
        path: e.path().to_path_buf(),
        source: match e {
            AtomicError::Io { source, .. } => source,
            other => other.into(),
        },
    }
}
