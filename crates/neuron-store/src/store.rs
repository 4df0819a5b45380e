//! Opening a store and reading its units through `ufs-io`.

use std::path::{Path, PathBuf};

use ufs_io::{AlignedBuf, FileId, IoEngine, OpenOptions, ReadRequest};

use crate::error::{Result, StoreError};
use crate::layout::{StoreIndex, HEADER_LEN, NEURON_STORE, PAGE};
use crate::open::open_checked;

/// An opened, validated store: its index in memory, its units read on demand through an [`IoEngine`].
#[derive(Debug)]
pub struct NeuronStore {
    path: PathBuf,
    file: FileId,
    index: StoreIndex,
}

impl NeuronStore {
    /// Opens `path` on `io`, reads header and index (through the I/O thread) and validates them: magic,
    /// version, checksums of header and index, shapes, offsets, permutations and the file length.
    /// Unit checksums are checked as units are read ([`NeuronStore::verify_unit`]) or all at once with
    /// [`NeuronStore::verify_all`].
    pub fn open(io: &IoEngine, path: impl AsRef<Path>, opts: OpenOptions) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let o = open_checked(io, &path, opts, &NEURON_STORE, HEADER_LEN, false)?;
        let index = StoreIndex::decode(&o.index, o.len, &path)?;
        let file = o.file;
        Ok(NeuronStore { path, file, index })
    }

    /// The store's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's id on the engine it was opened with.
    pub fn file(&self) -> FileId {
        self.file
    }

    /// The index.
    pub fn index(&self) -> &StoreIndex {
        &self.index
    }

    /// The read of one unit, tagged `tag`.
    pub fn unit_request(&self, layer: usize, unit: usize, tag: u64) -> ReadRequest {
        ReadRequest {
            file: self.file,
            offset: self.index.unit_offset(layer, unit),
            len: self.index.layout.unit_bytes(),
            tag,
        }
    }

    /// The read of a unit's first page alone (two-phase loading: the gate rows of a multi-page unit,
    /// see [`crate::BundleLayout::gate_in_first_page`]), tagged `tag`.
    pub fn head_request(&self, layer: usize, unit: usize, tag: u64) -> ReadRequest {
        ReadRequest {
            file: self.file,
            offset: self.index.unit_offset(layer, unit),
            len: PAGE,
            tag,
        }
    }

    /// The read of the rest of a unit after its first page (`None` for one-page units), tagged `tag`.
    pub fn rest_request(&self, layer: usize, unit: usize, tag: u64) -> Option<ReadRequest> {
        let len = self.index.layout.unit_bytes() - PAGE;
        (len > 0).then(|| ReadRequest {
            file: self.file,
            offset: self.index.unit_offset(layer, unit) + PAGE as u64,
            len,
            tag,
        })
    }

    /// Checks a unit's first page read alone ([`NeuronStore::head_request`]) against its checksum.
    pub fn verify_head(&self, layer: usize, unit: usize, head: &[u8]) -> Result<()> {
        let crc = self
            .index
            .layers
            .get(layer)
            .and_then(|l| l.head_crc.get(unit));
        if crc.is_some_and(|&c| head.len() == PAGE && crc32fast::hash(head) == c) {
            return Ok(());
        }
        Err(self.checksum_error(layer, unit, PAGE))
    }

    /// Checks a unit read in two parts (first page, then the rest) against the whole unit's checksum.
    pub fn verify_parts(&self, layer: usize, unit: usize, head: &[u8], rest: &[u8]) -> Result<()> {
        let ub = self.index.layout.unit_bytes();
        let crc = self
            .index
            .layers
            .get(layer)
            .and_then(|l| l.unit_crc.get(unit));
        let ok = crc.is_some_and(|&c| {
            let mut h = crc32fast::Hasher::new();
            h.update(head);
            h.update(rest);
            head.len() + rest.len() == ub && h.finalize() == c
        });
        if ok {
            return Ok(());
        }
        Err(self.checksum_error(layer, unit, ub))
    }

    fn checksum_error(&self, layer: usize, unit: usize, len: usize) -> StoreError {
        let known = self
            .index
            .layers
            .get(layer)
            .is_some_and(|l| unit < l.unit_crc.len());
        let offset = if known {
            self.index.unit_offset(layer, unit)
        } else {
            0
        };
        StoreError::Checksum {
            path: self.path.clone(),
            layer,
            unit,
            offset,
            end: offset + len as u64,
        }
    }

    /// Checks `bytes` (one unit as read) against the unit's recorded checksum.
    pub fn verify_unit(&self, layer: usize, unit: usize, bytes: &[u8]) -> Result<()> {
        let crc = self
            .index
            .layers
            .get(layer)
            .and_then(|l| l.unit_crc.get(unit));
        if crc.is_some_and(|&c| {
            bytes.len() == self.index.layout.unit_bytes() && crc32fast::hash(bytes) == c
        }) {
            return Ok(());
        }
        Err(self.checksum_error(layer, unit, self.index.layout.unit_bytes()))
    }

    /// Reads one unit and verifies it (blocking).
    pub fn read_unit(&self, io: &IoEngine, layer: usize, unit: usize) -> Result<AlignedBuf> {
        let r = self.unit_request(layer, unit, 0);
        let buf = io.read_at(self.file, r.offset, r.len)?;
        self.verify_unit(layer, unit, &buf)?;
        Ok(buf)
    }

    /// Reads units `units` of `layer` with one sequential read (the hot prefix at start-up), verifying
    /// each. The result holds the units back to back.
    pub fn read_units(
        &self,
        io: &IoEngine,
        layer: usize,
        units: std::ops::Range<usize>,
    ) -> Result<AlignedBuf> {
        let ub = self.index.layout.unit_bytes();
        if units.end > self.index.units_per_layer() || layer >= self.index.layers.len() {
            return Err(StoreError::Invalid(format!(
                "units {units:?} of layer {layer} are outside the store"
            )));
        }
        if units.is_empty() {
            return AlignedBuf::new(0).map_err(Into::into);
        }
        let buf = io.read_sequential(
            self.file,
            self.index.unit_offset(layer, units.start),
            units.len() * ub,
        )?;
        for (i, u) in units.enumerate() {
            self.verify_unit(layer, u, &buf[i * ub..(i + 1) * ub])?;
        }
        Ok(buf)
    }

    /// [`NeuronStore::read_units`] into `buf` (exactly the units' length, e.g. the buffer of a previous
    /// read), so that a stream of reads reuses its allocations. On error the buffer is dropped.
    pub fn read_units_into(
        &self,
        io: &IoEngine,
        layer: usize,
        units: std::ops::Range<usize>,
        buf: AlignedBuf,
    ) -> Result<AlignedBuf> {
        let ub = self.index.layout.unit_bytes();
        if units.end > self.index.units_per_layer()
            || layer >= self.index.layers.len()
            || buf.len() != units.len() * ub
        {
            return Err(StoreError::Invalid(format!(
                "units {units:?} of layer {layer} are outside the store or do not fill a buffer of {} bytes",
                buf.len()
            )));
        }
        if units.is_empty() {
            return Ok(buf);
        }
        let buf =
            io.read_sequential_into(self.file, self.index.unit_offset(layer, units.start), buf)?;
        for (i, u) in units.enumerate() {
            self.verify_unit(layer, u, &buf[i * ub..(i + 1) * ub])?;
        }
        Ok(buf)
    }

    /// Reads and verifies every unit of every layer (`sparrow convert --verify`).
    pub fn verify_all(&self, io: &IoEngine) -> Result<()> {
        let (units, step) = (
            self.index.units_per_layer(),
            (8 << 20) / self.index.layout.unit_bytes().max(1),
        );
        for l in 0..self.index.layers.len() {
            for s in (0..units).step_by(step.max(1)) {
                self.read_units(io, l, s..(s + step.max(1)).min(units))?;
            }
        }
        Ok(())
    }
}
