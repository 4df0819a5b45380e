//! A GGUF v3 writer for tests, fixtures and synthetic models; large files are
//! streamed (see [`GgufWriter::stream`]).

use std::io::Write;
use std::path::{Path, PathBuf};

use atomic_out::{AtomicError, AtomicFile};

use crate::gguf::{GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGUF_MAX_DIMS};
use crate::meta::type_id;
use crate::{DType, FormatError, MetaValue};

/// The key holding the data alignment.
const ALIGNMENT_KEY: &str = "general.alignment";

/// Writes a GGUF v3 file (for tests, fixtures and synthetic models).
///
/// Tensor data is written aligned to `alignment` (default 32), in the order the
/// tensors were added. [`write`](Self::write) writes to a temporary in the
/// same folder (`atomic_out::AtomicFile`), syncs it and renames it over
/// `path`, so readers never see a half-written file and a failed write leaves
/// any earlier file at `path` untouched.
///
/// Models too large to hold in memory are streamed: declare their tensors with
/// [`declare_tensor`](Self::declare_tensor) (name, type and shape, no data),
/// then [`stream`](Self::stream) writes the header and returns a
/// [`GgufStream`] that takes the data of each tensor in order, in chunks.
///
/// Errors from [`tensor`](Self::tensor), which has no file yet, name the path
/// `<GgufWriter>`.
#[derive(Debug, Clone)]
pub struct GgufWriter {
    alignment: u64,
    metadata: Vec<(String, MetaValue)>,
    tensors: Vec<PendingTensor>,
}

#[derive(Debug, Clone)]
struct PendingTensor {
    name: String,
    /// [`DType::ggml_id`] of the tensor's type.
    ggml_id: u32,
    shape: Vec<usize>,
    /// Bytes of data the type and shape require.
    len: u64,
    /// `None` for a tensor declared for streaming.
    data: Option<Vec<u8>>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        Self::new()
    }
}

fn writer_path() -> PathBuf {
    PathBuf::from("<GgufWriter>")
}

impl GgufWriter {
    /// An empty writer with alignment 32.
    pub fn new() -> Self {
        GgufWriter {
            alignment: GGUF_DEFAULT_ALIGNMENT,
            metadata: Vec::new(),
            tensors: Vec::new(),
        }
    }

    /// Sets the data alignment (a power of two; checked by
    /// [`write`](Self::write)). When it is not 32, `general.alignment` is
    /// also written, as a `u32`.
    pub fn alignment(&mut self, a: u64) -> &mut Self {
        self.alignment = a;
        self.metadata.retain(|(k, _)| k != ALIGNMENT_KEY);
        if a != GGUF_DEFAULT_ALIGNMENT {
            let v = u32::try_from(a)
                .map(MetaValue::U32)
                .unwrap_or(MetaValue::U64(a));
            self.metadata.push((ALIGNMENT_KEY.to_owned(), v));
        }
        self
    }

    /// Sets a metadata value. Keys keep the order of their first setting;
    /// setting a key again replaces its value. Setting `general.alignment`
    /// to an integer also sets the data alignment.
    pub fn metadata(&mut self, key: &str, value: MetaValue) -> &mut Self {
        if key == ALIGNMENT_KEY {
            if let Some(a) = value.as_u64() {
                self.alignment = a;
            }
        }
        match self.metadata.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = value,
            None => self.metadata.push((key.to_owned(), value)),
        }
        self
    }

    /// Adds a tensor. `shape` is row-major, outermost first; `data` must be
    /// exactly as long as `dtype` and `shape` require, and the last dimension
    /// must be a whole number of blocks.
    pub fn tensor(
        &mut self,
        name: &str,
        dtype: DType,
        shape: &[usize],
        data: Vec<u8>,
    ) -> Result<&mut Self, FormatError> {
        self.add(name, dtype, shape, Some(data))
    }

    /// Declares a tensor whose data a [`GgufStream`] will take (see
    /// [`stream`](Self::stream)): the same checks as [`tensor`](Self::tensor),
    /// without the data. [`write`](Self::write) refuses a writer that holds
    /// declared tensors.
    pub fn declare_tensor(
        &mut self,
        name: &str,
        dtype: DType,
        shape: &[usize],
    ) -> Result<&mut Self, FormatError> {
        self.add(name, dtype, shape, None)
    }

    fn add(
        &mut self,
        name: &str,
        dtype: DType,
        shape: &[usize],
        data: Option<Vec<u8>>,
    ) -> Result<&mut Self, FormatError> {
        let mismatch = |detail: String| FormatError::ShapeMismatch {
            path: writer_path(),
            tensor: name.to_owned(),
            detail,
        };
        if shape.is_empty() || shape.len() > GGUF_MAX_DIMS {
            return Err(mismatch(format!(
                "shape {shape:?} has {} dimensions (GGUF allows 1..={GGUF_MAX_DIMS})",
                shape.len()
            )));
        }
        let Some(ggml_id) = dtype.ggml_id() else {
            return Err(FormatError::Invalid {
                path: writer_path(),
                detail: format!("tensor '{name}': type {dtype} has no ggml type id"),
            });
        };
        let expected = crate::tensor::tensor_bytes(dtype, shape).map_err(mismatch)?;
        if let Some(data) = &data {
            if data.len() != expected {
                return Err(mismatch(format!(
                    "{} bytes of data given, {dtype} {shape:?} needs {expected}",
                    data.len()
                )));
            }
        }
        if self.tensors.iter().any(|t| t.name == name) {
            return Err(FormatError::Invalid {
                path: writer_path(),
                detail: format!("duplicate tensor name '{name}'"),
            });
        }
        self.tensors.push(PendingTensor {
            name: name.to_owned(),
            ggml_id,
            shape: shape.to_vec(),
            len: expected as u64,
            data,
        });
        Ok(self)
    }

    /// Writes the file: to a temporary in `path`'s folder first, then synced
    /// and renamed to `path`.
    /// Every tensor must have its data (none may be only declared).
    pub fn write(&self, path: impl AsRef<Path>) -> Result<(), FormatError> {
        let path = path.as_ref();
        if let Some(t) = self.tensors.iter().find(|t| t.data.is_none()) {
            return Err(FormatError::Invalid {
                path: path.to_path_buf(),
                detail: format!(
                    "tensor '{}' was declared without data: write it with stream()",
                    t.name
                ),
            });
        }
        self.stream(path)?.finish()
    }

    /// As [`write`](Self::write), but the complete, synced file is left under its temporary name and
    /// returned: nothing is at `path` until the caller commits it (`AtomicFile::commit`), and dropping
    /// it removes it. For a file that must be renamed into place after others (a bundle's resident
    /// file, the last step of a convert).
    pub fn write_pending(&self, path: impl AsRef<Path>) -> Result<AtomicFile, FormatError> {
        let path = path.as_ref();
        if let Some(t) = self.tensors.iter().find(|t| t.data.is_none()) {
            return Err(FormatError::Invalid {
                path: path.to_path_buf(),
                detail: format!(
                    "tensor '{}' was declared without data: write it with stream()",
                    t.name
                ),
            });
        }
        self.stream(path)?.finish_pending()
    }

    /// Starts writing the file: creates a temporary in `path`'s folder
    /// (`.NAME.sparrow-tmp-PID-SEQ`, see `atomic_out`), writes the header
    /// and returns the stream that takes the tensor data, in the order the
    /// tensors were added. Tensors added with their data
    /// ([`tensor`](Self::tensor)) are written by the stream itself when their
    /// turn comes; the data of declared ones
    /// ([`declare_tensor`](Self::declare_tensor)) is given to
    /// [`GgufStream::write_data`]. [`GgufStream::finish`] syncs the file and
    /// renames it to `path`; a stream dropped before that (or failing) removes
    /// the temporary file and leaves any earlier file at `path` untouched.
    pub fn stream(&self, path: impl AsRef<Path>) -> Result<GgufStream<'_>, FormatError> {
        let path = path.as_ref();
        let a = self.alignment;
        if !a.is_power_of_two() || a > 1 << 30 {
            return Err(FormatError::Invalid {
                path: path.to_path_buf(),
                detail: format!("alignment {a} is not a power of two"),
            });
        }
        let header = self.header(path)?;
        let file = AtomicFile::create(path).map_err(atomic_error)?;
        let tmp = file.temp_path().to_path_buf();
        let mut s = GgufStream {
            path: path.to_path_buf(),
            tmp,
            out: Some(std::io::BufWriter::with_capacity(1 << 20, file)),
            alignment: a,
            tensors: &self.tensors,
            next: 0,
            filled: 0,
            pos: 0,
        };
        s.put(&header)?;
        s.pad()?;
        s.write_given()?;
        Ok(s)
    }

    fn header(&self, path: &Path) -> Result<Vec<u8>, FormatError> {
        let mut h = Vec::new();
        h.extend_from_slice(&GGUF_MAGIC);
        h.extend_from_slice(&3u32.to_le_bytes());
        h.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        h.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            put_string(&mut h, key);
            h.extend_from_slice(&value.gguf_type_id().to_le_bytes());
            put_value(&mut h, value).map_err(|detail| FormatError::Invalid {
                path: path.to_path_buf(),
                detail: format!("metadata '{key}': {detail}"),
            })?;
        }
        let mut offset = 0u64;
        for t in &self.tensors {
            put_string(&mut h, &t.name);
            h.extend_from_slice(&(t.shape.len() as u32).to_le_bytes());
            for &d in t.shape.iter().rev() {
                h.extend_from_slice(&(d as u64).to_le_bytes());
            }
            h.extend_from_slice(&t.ggml_id.to_le_bytes());
            h.extend_from_slice(&offset.to_le_bytes());
            offset = align_up(offset + t.len, self.alignment);
        }
        Ok(h)
    }
}

fn align_up(x: u64, a: u64) -> u64 {
    x.div_ceil(a) * a
}

/// The data half of a GGUF file being written: see [`GgufWriter::stream`].
///
/// Takes the tensors' data in the order they were added to the writer, each
/// tensor's bytes in one or more [`write_data`](Self::write_data) calls, and
/// pads between tensors itself. Nothing is held in memory beyond a 1 MiB
/// buffer, so files far larger than memory can be written.
#[derive(Debug)]
pub struct GgufStream<'w> {
    path: PathBuf,
    tmp: PathBuf,
    /// `None` once finished (or after an error closed it).
    out: Option<std::io::BufWriter<AtomicFile>>,
    alignment: u64,
    tensors: &'w [PendingTensor],
    /// Index of the tensor whose data comes next.
    next: usize,
    /// Bytes of that tensor written so far.
    filled: u64,
    /// Bytes of the file written so far.
    pos: u64,
}

impl GgufStream<'_> {
    /// The name of the tensor whose data the next [`write_data`](Self::write_data)
    /// call continues, or `None` when every tensor is complete.
    pub fn next_tensor(&self) -> Option<&str> {
        self.tensors.get(self.next).map(|t| t.name.as_str())
    }

    /// Appends `bytes` to the data of the next tensor. A chunk may not run past
    /// the end of its tensor (call again for the next one); when a tensor is
    /// complete the stream pads to the alignment and writes the following
    /// tensors that were given their data up front.
    pub fn write_data(&mut self, bytes: &[u8]) -> Result<(), FormatError> {
        let tensors = self.tensors;
        let Some(t) = tensors.get(self.next) else {
            return Err(self.invalid(format!(
                "{} bytes of tensor data given after the last tensor was complete",
                bytes.len()
            )));
        };
        let left = t.len - self.filled;
        if bytes.len() as u64 > left {
            let detail = format!(
                "{} bytes given for tensor '{}', which needs only {left} more (of {})",
                bytes.len(),
                t.name,
                t.len
            );
            return Err(self.invalid(detail));
        }
        self.put(bytes)?;
        self.filled += bytes.len() as u64;
        if self.filled == t.len {
            self.next += 1;
            self.filled = 0;
            self.pad()?;
            self.write_given()?;
        }
        Ok(())
    }

    /// Flushes and syncs the file and renames it to its final path. Fails,
    /// removing the temporary file, if a tensor is incomplete.
    pub fn finish(self) -> Result<(), FormatError> {
        self.finish_pending()?.commit().map_err(atomic_error)
    }

    /// Flushes and syncs the file but leaves it under its temporary name, returned for the caller to
    /// commit (see [`GgufWriter::write_pending`]). Fails, removing the temporary file, if a tensor is
    /// incomplete.
    pub fn finish_pending(mut self) -> Result<AtomicFile, FormatError> {
        if let Some(t) = self.tensors.get(self.next) {
            let detail = format!(
                "finished with tensor '{}' incomplete ({} of {} bytes) and {} more after it",
                t.name,
                self.filled,
                t.len,
                self.tensors.len() - self.next - 1
            );
            return Err(self.invalid(detail));
        }
        let Some(out) = self.out.take() else {
            return Err(self.invalid("the stream was closed by an earlier error".into()));
        };
        // On an error the AtomicFile is dropped, which removes the temporary.
        let file = out
            .into_inner()
            .map_err(|e| FormatError::io(&self.tmp, e.into_error()))?;
        file.file()
            .sync_all()
            .map_err(|e| FormatError::io(&self.tmp, e))?;
        Ok(file)
    }

    /// Closes the stream (removing the temporary file) and returns an error.
    fn invalid(&mut self, detail: String) -> FormatError {
        self.close();
        FormatError::Invalid {
            path: self.path.clone(),
            detail,
        }
    }

    /// Drops the file without flushing what is buffered: the temporary is
    /// removed.
    fn close(&mut self) {
        if let Some(out) = self.out.take() {
            drop(out.into_parts());
        }
    }

    fn put(&mut self, bytes: &[u8]) -> Result<(), FormatError> {
        let Some(out) = self.out.as_mut() else {
            return Err(self.invalid("the stream was closed by an earlier error".into()));
        };
        if let Err(e) = out.write_all(bytes) {
            self.close();
            return Err(FormatError::io(&self.tmp, e));
        }
        self.pos += bytes.len() as u64;
        Ok(())
    }

    /// Zeros up to the alignment. Tensors are padded after their data, the
    /// last one too (as llama.cpp does).
    fn pad(&mut self) -> Result<(), FormatError> {
        const ZEROS: [u8; 4096] = [0; 4096];
        let mut p = align_up(self.pos, self.alignment) - self.pos;
        while p > 0 {
            let n = p.min(ZEROS.len() as u64);
            self.put(&ZEROS[..n as usize])?;
            p -= n;
        }
        Ok(())
    }

    /// Writes the tensors from `next` on that were given their data up front
    /// (and skips empty declared ones), up to the next declared tensor.
    fn write_given(&mut self) -> Result<(), FormatError> {
        let tensors = self.tensors;
        while let Some(t) = tensors.get(self.next) {
            match &t.data {
                Some(data) => self.put(data)?,
                None if t.len == 0 => {}
                None => break,
            }
            self.next += 1;
            self.pad()?;
        }
        Ok(())
    }
}

impl Drop for GgufStream<'_> {
    fn drop(&mut self) {
        self.close();
    }
}

/// An `atomic-out` failure as a [`FormatError`] naming the file it concerns.
fn atomic_error(e: AtomicError) -> FormatError {
    match e {
        AtomicError::Io { path, source, .. } => FormatError::io(&path, source),
        other => FormatError::Io {
            path: other.path().to_path_buf(),
            source: other.into(),
        },
    }
}

fn put_string(h: &mut Vec<u8>, s: &str) {
    h.extend_from_slice(&(s.len() as u64).to_le_bytes());
    h.extend_from_slice(s.as_bytes());
}

fn put_value(h: &mut Vec<u8>, v: &MetaValue) -> Result<(), String> {
    match v {
        MetaValue::U8(x) => h.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I8(x) => h.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U16(x) => h.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I16(x) => h.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U32(x) => h.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I32(x) => h.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U64(x) => h.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I64(x) => h.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F32(x) => h.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F64(x) => h.extend_from_slice(&x.to_le_bytes()),
        MetaValue::Bool(x) => h.push(u8::from(*x)),
        MetaValue::String(s) => put_string(h, s),
        MetaValue::Array(items) => {
            // An empty array is written as an array of strings: llama.cpp reads the one empty array
            // our writers emit, `tokenizer.ggml.merges`, as strings and refuses any other type.
            let elem = items
                .first()
                .map_or(type_id::STRING, MetaValue::gguf_type_id);
            if let Some(bad) = items.iter().find(|x| x.gguf_type_id() != elem) {
                return Err(format!(
                    "GGUF arrays must be homogeneous: element types {elem} and {} mixed",
                    bad.gguf_type_id()
                ));
            }
            h.extend_from_slice(&elem.to_le_bytes());
            h.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for x in items {
                put_value(h, x)?;
            }
        }
    }
    Ok(())
}
