//! `model-format`: memory-mapped readers for model files.
//!
//! * [`GgufFile`] reads GGUF v3 files (as llama.cpp writes them; v2 is also
//!   accepted): metadata, tensor descriptions and zero-copy tensor data.
//! * [`HfDir`] reads a Hugging Face model directory: `config.json` plus
//!   `model.safetensors`, or `model.safetensors.index.json` and its shards.
//! * [`GgufWriter`] writes GGUF v3 files (tests, fixtures, synthetic models):
//!   small ones from memory, large ones streamed tensor by tensor through a
//!   [`GgufStream`].
//!
//! Both readers hand out [`TensorView`]s whose `shape` is row-major,
//! outermost first (a GGUF tensor with `ne = [576, 1536]` has shape
//! `[1536, 576]`: 1536 rows of 576 columns). Their [`DType`] is the format
//! table of the `tensor-types` crate. Dequantization lives elsewhere. A 3-D
//! Mixture-of-Experts tensor (`[experts, rows, cols]`) gives each expert's
//! matrix, a contiguous range of whole rows, with [`TensorView::outer_slice`].
//!
//! # Example
//!
//! ```no_run
//! use model_format::{DType, GgufFile};
//!
//! let f = GgufFile::open("SmolLM2-135M-Instruct.Q4_1.gguf")?;
//! let arch = f.get("general.architecture").and_then(|v| v.as_str());
//! let emb = f.tensor("token_embd.weight").expect("no embeddings");
//! assert_eq!(emb.dtype, DType::Q8_0);
//! println!("{arch:?}: {} rows of {} columns, {} bytes", emb.rows(), emb.cols(), emb.data.len());
//! # Ok::<(), model_format::FormatError>(())
//! ```
//!
//! # Invariants
//!
//! * **No panics on input data.** Every problem in a file is a
//!   [`FormatError`] that names the file and says what is wrong.
//! * **Allocations are bounded by the file size.** Declared counts (tensors,
//!   metadata entries, array lengths, string lengths) are checked against the
//!   bytes left in the file before anything is allocated for them.
//! * **Zero-copy.** Tensor data is borrowed from the memory map; after `open`
//!   succeeds, every tensor's bytes are known to lie inside its file and to be
//!   exactly as long as its type and shape require.
//! * Readers are `Send + Sync`.
//!
//! Memory-mapped files must not be modified or truncated by other processes
//! while they are open (see [`memmap2::Mmap`]).

mod anon;
mod error;
mod gguf;
mod hf;
mod meta;
mod paging;
#[cfg(unix)]
mod sys;
mod tensor;
mod writer;

use std::path::Path;

pub use anon::{AnonArena, AnonPages, AnonPiece};
pub use error::FormatError;
pub use gguf::{
    GgufFile, GGUF_DEFAULT_ALIGNMENT, GGUF_DEFERRED_ARRAY_MIN, GGUF_MAGIC, GGUF_MAX_DIMS,
    GGUF_MAX_META_ELEMENTS,
};
pub use hf::{HfConfig, HfDir, SAFETENSORS_DTYPE_NAMES, SAFETENSORS_TYPE_ID_BASE};
pub use meta::MetaValue;
pub use paging::{advise, Paging};
pub use tensor::{TensorInfo, TensorView};
/// The storage type of a tensor: the workspace's one format table, [`tensor_types::WeightFormat`]
/// (ggml type ids, names, block sizes). Files only hold the formats of [`WeightFormat::GGML`]; the
/// writer refuses [`WeightFormat::I4Hybrid`], which has no ggml type id.
pub use tensor_types::WeightFormat as DType;
pub use tensor_types::WeightFormat;
pub use writer::{GgufStream, GgufWriter};

/// Opens `path` through `atomic_out::require_regular`: anything but a regular file (after symlinks)
/// is refused, on the open file, and the open does not block (opening a FIFO waits for a writer; a
/// device or `/proc` file has no size to check against).
pub(crate) fn open_regular(path: &Path) -> Result<std::fs::File, FormatError> {
    atomic_out::require_regular(path).map_err(input_error)
}

/// The bytes of the regular file `path`, at most `limit` (`atomic_out::read_bounded`).
pub(crate) fn read_input(path: &Path, limit: u64) -> Result<Vec<u8>, FormatError> {
    atomic_out::read_bounded(path, limit).map_err(input_error)
}

/// An `atomic-out` read failure as a [`FormatError`] naming the file.
fn input_error(e: atomic_out::AtomicError) -> FormatError {
    match e {
        atomic_out::AtomicError::Io { path, source, .. } => FormatError::io(&path, source),
        other => {
            let path = other.path().to_path_buf();
            let text = other.to_string();
            let detail = text
                .strip_prefix(&format!("{}: ", path.display()))
                .unwrap_or(&text)
                .to_string();
            FormatError::Invalid { path, detail }
        }
    }
}

/// Opens and memory-maps a file read-only.
fn map_file(path: &Path) -> Result<memmap2::Mmap, FormatError> {
    let file = open_regular(path)?;
    let meta = file.metadata().map_err(|e| FormatError::io(path, e))?;
    if !meta.is_file() {
        return Err(FormatError::Invalid {
            path: path.to_path_buf(),
            detail: "not a regular file".to_owned(),
        });
    }
    // SAFETY: the map is read-only and private to this crate, which only ever
    // reads it through bounds-checked slices. Mapping a file is unsound only if
    // another process modifies or truncates it while mapped; model files are
    // treated as immutable while open, as documented at the crate root.
    let mmap = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| FormatError::io(path, e))?;
    Ok(mmap)
}

#[cfg(test)]
mod send_sync {
    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn readers_are_send_sync() {
        assert_send_sync::<crate::GgufFile>();
        assert_send_sync::<crate::HfDir>();
        assert_send_sync::<crate::GgufWriter>();
        assert_send_sync::<crate::FormatError>();
    }
}
