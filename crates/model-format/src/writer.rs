//! A small GGUF v3 writer for tests, fixtures and synthetic models.

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::gguf::{GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGUF_MAX_DIMS};
use crate::meta::type_id;
use crate::{DType, FormatError, MetaValue};

/// The key holding the data alignment.
const ALIGNMENT_KEY: &str = "general.alignment";

/// Writes a GGUF v3 file (for tests, fixtures and synthetic models).
///
/// Tensor data is written aligned to `alignment` (default 32), in the order the
/// tensors were added. [`write`](Self::write) writes to `path` + `".tmp"`,
/// then renames, so readers never see a half-written file.
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
    dtype: DType,
    shape: Vec<usize>,
    data: Vec<u8>,
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
        let expected = crate::tensor::tensor_bytes(dtype, shape).map_err(mismatch)?;
        if data.len() != expected {
            return Err(mismatch(format!(
                "{} bytes of data given, {dtype} {shape:?} needs {expected}",
                data.len()
            )));
        }
        if self.tensors.iter().any(|t| t.name == name) {
            return Err(FormatError::Invalid {
                path: writer_path(),
                detail: format!("duplicate tensor name '{name}'"),
            });
        }
        self.tensors.push(PendingTensor {
            name: name.to_owned(),
            dtype,
            shape: shape.to_vec(),
            data,
        });
        Ok(self)
    }

    /// Writes the file: to `path` + `".tmp"` first, then renamed to `path`.
    pub fn write(&self, path: impl AsRef<Path>) -> Result<(), FormatError> {
        let path = path.as_ref();
        let a = self.alignment;
        if !a.is_power_of_two() || a > 1 << 30 {
            return Err(FormatError::Invalid {
                path: path.to_path_buf(),
                detail: format!("alignment {a} is not a power of two"),
            });
        }
        let header = self.header(path)?;
        let mut tmp: OsString = path.as_os_str().to_owned();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        let result = write_file(&tmp, &header, a, &self.tensors)
            .and_then(|()| std::fs::rename(&tmp, path).map_err(|e| FormatError::io(path, e)));
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result
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
            h.extend_from_slice(&t.dtype.ggml_id().to_le_bytes());
            h.extend_from_slice(&offset.to_le_bytes());
            offset = align_up(offset + t.data.len() as u64, self.alignment);
        }
        Ok(h)
    }
}

fn align_up(x: u64, a: u64) -> u64 {
    x.div_ceil(a) * a
}

fn write_file(
    tmp: &Path,
    header: &[u8],
    alignment: u64,
    tensors: &[PendingTensor],
) -> Result<(), FormatError> {
    let io = |e| FormatError::io(tmp, e);
    let file = std::fs::File::create(tmp).map_err(io)?;
    let mut w = std::io::BufWriter::new(file);
    let zeros = vec![0u8; alignment as usize];
    let mut pos = 0u64;
    let mut put = |w: &mut std::io::BufWriter<std::fs::File>, bytes: &[u8]| {
        pos += bytes.len() as u64;
        w.write_all(bytes)
    };
    put(&mut w, header).map_err(io)?;
    let pad = |pos: u64| (align_up(pos, alignment) - pos) as usize;
    let p = pad(header.len() as u64);
    put(&mut w, &zeros[..p]).map_err(io)?;
    let data_start = header.len() as u64 + p as u64;
    let mut rel = 0u64;
    for t in tensors {
        put(&mut w, &t.data).map_err(io)?;
        rel += t.data.len() as u64;
        let p = pad(rel);
        // No padding after the last tensor is needed, but llama.cpp pads too.
        put(&mut w, &zeros[..p]).map_err(io)?;
        rel += p as u64;
    }
    debug_assert_eq!(data_start + rel, pos);
    w.flush().map_err(io)?;
    w.get_ref().sync_all().map_err(io)?;
    Ok(())
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
            // An empty array is written with element type u8.
            let elem = items.first().map_or(type_id::U8, MetaValue::gguf_type_id);
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
