//! Opening an expert store and reading its blobs through `ufs-io`.

use std::path::{Path, PathBuf};

use ufs_io::{AlignedBuf, FileId, IoEngine, OpenOptions, ReadRequest};

use super::{ExpertIndex, EXPERT_HEADER_LEN, EXPERT_STORE};
use crate::error::{Result, StoreError};
use crate::open::open_checked;

/// An opened, validated expert store: its index in memory, blobs read on demand through an
/// [`IoEngine`].
#[derive(Debug)]
pub struct ExpertStore {
    path: PathBuf,
    file: FileId,
    index: ExpertIndex,
}

impl ExpertStore {
    /// Opens `path` on `io`, reads header and index through the I/O thread and validates them.
    pub fn open(io: &IoEngine, path: impl AsRef<Path>, opts: OpenOptions) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let o = open_checked(io, &path, opts, &EXPERT_STORE, EXPERT_HEADER_LEN, true)?;
        let index = ExpertIndex::decode(&o.index, o.len, &path)?;
        let file = o.file;
        Ok(ExpertStore { path, file, index })
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
    pub fn index(&self) -> &ExpertIndex {
        &self.index
    }

    fn check(&self, layer: usize, expert: usize) -> Result<()> {
        if expert < self.index.experts(layer) {
            return Ok(());
        }
        Err(StoreError::Invalid(format!(
            "{}: layer {layer} has no expert {expert} ({} experts)",
            self.path.display(),
            self.index.experts(layer)
        )))
    }

    /// The one read of expert `expert` of `layer`, tagged `tag`.
    pub fn request(&self, layer: usize, expert: usize, tag: u64) -> Result<ReadRequest> {
        self.check(layer, expert)?;
        Ok(ReadRequest {
            file: self.file,
            offset: self.index.layers[layer].offsets[expert],
            len: self.index.blob_bytes(layer),
            tag,
        })
    }

    /// Checks `bytes` (one blob as read) against the expert's recorded checksum.
    pub fn verify(&self, layer: usize, expert: usize, bytes: &[u8]) -> Result<()> {
        self.check(layer, expert)?;
        let l = &self.index.layers[layer];
        if bytes.len() == l.layout.blob_bytes && crc32fast::hash(bytes) == l.crc[expert] {
            return Ok(());
        }
        let offset = l.offsets[expert];
        Err(StoreError::ExpertChecksum {
            path: self.path.clone(),
            layer,
            expert,
            offset,
            end: offset + l.layout.blob_bytes as u64,
        })
    }

    /// Reads one expert's blob and verifies it (blocking).
    pub fn read_expert(&self, io: &IoEngine, layer: usize, expert: usize) -> Result<AlignedBuf> {
        let r = self.request(layer, expert, 0)?;
        let buf = io.read_at(self.file, r.offset, r.len)?;
        self.verify(layer, expert, &buf)?;
        Ok(buf)
    }

    /// Reads and verifies every blob (`sparrow convert --verify`).
    pub fn verify_all(&self, io: &IoEngine) -> Result<()> {
        for l in 0..self.index.layers.len() {
            for e in 0..self.index.experts(l) {
                self.read_expert(io, l, e)?;
            }
        }
        Ok(())
    }
}
