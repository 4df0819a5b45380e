//! What opening either kind of store checks before its index is decoded: the file's size, the
//! fixed header, where the index ends, the index's checksum and the file's length.

use std::path::Path;

use ufs_io::{FileId, IoEngine, OpenOptions};

use crate::error::{Result, StoreError};
use crate::layout::{decode_header, HeaderKind, PAGE};

/// A store file opened on an [`IoEngine`], its header and index read (through the I/O thread)
/// and checked; the index still to decode.
pub(crate) struct Opened {
    /// The file's id on the engine.
    pub file: FileId,
    /// The file's length in bytes.
    pub len: u64,
    /// The index's bytes (their checksum matched the header's).
    pub index: Vec<u8>,
}

/// Opens `path` on `io` as a `kind` file whose fixed header is `header_len` bytes and checks it.
/// With `data_after_index`, the data must start at the first page after the index (the expert
/// store's rule); otherwise the index must only lie inside the file.
pub(crate) fn open_checked(
    io: &IoEngine,
    path: &Path,
    opts: OpenOptions,
    kind: &HeaderKind,
    header_len: usize,
    data_after_index: bool,
) -> Result<Opened> {
    let file = io.open(path, opts)?;
    let len = io.file(file)?.len();
    let bad = |what: String| StoreError::Corrupt {
        path: path.to_path_buf(),
        what,
    };
    if len < PAGE as u64 {
        return Err(bad(format!("file is {len} bytes, smaller than one page")));
    }
    let first = io.read_at(file, 0, PAGE)?;
    let h = decode_header(kind, &first, path)?;
    // Checked: a hostile index length near usize::MAX wrapped to a small `need` and the index
    // slice below panicked (found by the fuzz round).
    let need = header_len
        .checked_add(h.index_len)
        .and_then(|n| n.checked_next_multiple_of(PAGE))
        .unwrap_or(usize::MAX);
    if data_after_index && (need as u64 > len || need as u64 != h.data_offset) {
        return Err(bad(format!(
            "index of {} bytes does not end where the data starts (byte {}) inside the {len}-byte file",
            h.index_len, h.data_offset
        )));
    }
    if need as u64 > len {
        return Err(bad(format!(
            "index of {} bytes runs past the end of the {len}-byte file",
            h.index_len
        )));
    }
    let head = if need <= PAGE {
        first
    } else {
        io.read_at(file, 0, need)?
    };
    let index = &head[header_len..header_len + h.index_len];
    if crc32fast::hash(index) != h.index_crc {
        return Err(bad("index checksum mismatch (damaged index)".into()));
    }
    if h.file_len != len {
        return Err(bad(format!(
            "file is {len} bytes, the header says {} (truncated or padded)",
            h.file_len
        )));
    }
    Ok(Opened {
        file,
        len,
        index: index.to_vec(),
    })
}
