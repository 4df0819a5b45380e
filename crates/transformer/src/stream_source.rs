//! `StreamSource`: a model file opened for direct reads of its output projection, which the
//! `stream` module reads chunk by chunk when the output is left on flash. A leaf: the model holds
//! one while streamed.

use std::path::Path;
use std::sync::Mutex;

use ufs_io::{AlignedBuf, IoFile, OpenOptions};

/// The model file opened for direct reads of the output projection, whose data start at `offset`.
pub(crate) struct StreamSource {
    pub(crate) file: IoFile,
    pub(crate) offset: u64,
    /// The two chunk buffers, kept from step to step (allocating 4 MiB twice a step left freed
    /// buffers in the heap, counted as resident).
    buffers: Mutex<Vec<AlignedBuf>>,
}

impl StreamSource {
    /// Opens `path` for direct reads; `None` where the filesystem refuses direct I/O (then the
    /// mapping serves, as before) or the file cannot be opened.
    pub(crate) fn open(path: &Path, offset: u64) -> Option<StreamSource> {
        let opts = OpenOptions {
            direct: true,
            drop_cache: false,
        };
        let file = IoFile::open(path, opts).ok()?;
        file.is_direct().then_some(StreamSource {
            file,
            offset,
            buffers: Mutex::new(Vec::new()),
        })
    }

    /// Two buffers of at least `len` bytes: those of the last step, or new ones.
    pub(crate) fn take_buffers(&self, len: usize) -> ufs_io::Result<[AlignedBuf; 2]> {
        let mut kept = std::mem::take(&mut *self.buffers.lock().unwrap_or_else(|e| e.into_inner()));
        kept.retain(|b| b.len() >= len);
        let mut take = || kept.pop().map_or_else(|| AlignedBuf::new(len), Ok);
        Ok([take()?, take()?])
    }

    /// Keeps `bufs` for the next step.
    pub(crate) fn keep_buffers(&self, bufs: Vec<AlignedBuf>) {
        *self.buffers.lock().unwrap_or_else(|e| e.into_inner()) = bufs;
    }
}
