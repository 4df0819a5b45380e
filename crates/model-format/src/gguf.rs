//! Memory-mapped GGUF reader.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use memmap2::Mmap;

use crate::meta::type_id;
use crate::{DType, FormatError, MetaValue, TensorInfo, TensorView};

/// The GGUF magic bytes.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// Alignment of the data section when `general.alignment` is absent.
pub const GGUF_DEFAULT_ALIGNMENT: u64 = 32;
/// Most dimensions a GGUF tensor may have (ggml's `GGML_MAX_DIMS`).
pub const GGUF_MAX_DIMS: usize = 4;
/// Deepest nesting of arrays accepted in metadata (guards the stack).
const MAX_ARRAY_DEPTH: usize = 16;
/// Most array elements all metadata together may hold. Each parsed element takes a
/// [`MetaValue`] (32 bytes) however few bytes it has in the file (a `u8` takes one), so without a cap
/// a file of N bytes could make the reader allocate 32 N. Real files hold a few hundred thousand
/// (vocabulary, merges, token types: Gemma's 256k tokens); this is 16 times more.
pub const GGUF_MAX_META_ELEMENTS: u64 = 1 << 22;

/// A memory-mapped GGUF file (version 3, or 2).
///
/// Everything is validated by [`open`](Self::open): after it succeeds every
/// tensor's data lies inside the file, at an aligned offset, and is exactly as
/// long as its type and shape require. Tensor data is borrowed from the map.
pub struct GgufFile {
    path: PathBuf,
    mmap: Arc<Mmap>,
    version: u32,
    alignment: u64,
    data_start: u64,
    metadata: Vec<(String, Meta)>,
    meta_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
}

/// Top-level arrays of more scalars or strings than this are validated by [`GgufFile::open`] but parsed
/// only when asked for ([`GgufFile::get`] keeps them, [`GgufFile::get_uncached`] does not): a
/// vocabulary's 151,936 tokens, its merges and token types take about 24 MB as [`MetaValue`]s,
/// which a process that has built its tokenizer (or never needs one) need not hold.
pub const GGUF_DEFERRED_ARRAY_MIN: u64 = 1024;

/// A metadata value: parsed at open, or a large array parsed on first use.
enum Meta {
    Parsed(MetaValue),
    Deferred {
        /// Offset of the array's element type in the file.
        pos: usize,
        cell: OnceLock<MetaValue>,
    },
}

impl GgufFile {
    /// Maps and parses a GGUF file, validating its header and every tensor.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, FormatError> {
        let path = path.as_ref().to_path_buf();
        let mmap = crate::map_file(&path)?;
        let parsed = parse(&path, &mmap)?;
        Ok(GgufFile {
            path,
            mmap: Arc::new(mmap),
            version: parsed.version,
            alignment: parsed.alignment,
            data_start: parsed.data_start,
            metadata: parsed.metadata,
            meta_index: parsed.meta_index,
            tensors: parsed.tensors,
            tensor_index: parsed.tensor_index,
        })
    }

    /// The path the file was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The GGUF version (3, or 2).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The data alignment: `general.alignment`, or 32.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Where the tensor data begins: the bytes before it are the header (metadata and tensor
    /// descriptions), padded to the alignment.
    pub fn data_offset(&self) -> u64 {
        self.data_start
    }

    /// Hands the header's pages back to the kernel ([`Paging::Release`](crate::Paging)): once
    /// the metadata a process needs is parsed (a vocabulary read for a tokenizer), they need not
    /// stay resident. A later [`get`](Self::get) of a large array reads them again.
    pub fn release_header(&self) {
        let end =
            usize::try_from(self.data_start).map_or(self.mmap.len(), |e| e.min(self.mmap.len()));
        crate::advise(&self.mmap[..end], crate::Paging::Release);
    }

    /// All metadata key/value pairs, in file order (large arrays are parsed and kept, as by
    /// [`get`](Self::get)).
    pub fn metadata(&self) -> impl Iterator<Item = (&str, &MetaValue)> + '_ {
        self.metadata
            .iter()
            .map(|(k, m)| (k.as_str(), self.resolve(k, m)))
    }

    /// The metadata value for `key`. A large array ([`GGUF_DEFERRED_ARRAY_MIN`]) is parsed on
    /// the first call and then held as long as the file; [`get_uncached`](Self::get_uncached)
    /// reads it without holding it.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.meta_index
            .get(key)
            .map(|&i| self.resolve(key, &self.metadata[i].1))
    }

    /// The metadata value for `key`, a large array parsed afresh (and dropped with the result)
    /// unless [`get`](Self::get) has parsed it already: for values read once, such as the
    /// vocabulary a tokenizer is built from.
    pub fn get_uncached(&self, key: &str) -> Option<Cow<'_, MetaValue>> {
        let &i = self.meta_index.get(key)?;
        Some(match &self.metadata[i].1 {
            Meta::Parsed(v) => Cow::Borrowed(v),
            Meta::Deferred { pos, cell } => match cell.get() {
                Some(v) => Cow::Borrowed(v),
                None => Cow::Owned(self.parse_deferred(key, *pos)),
            },
        })
    }

    /// The element count of the array under `key` (`None` when it is missing or no array),
    /// without parsing its elements.
    pub fn array_len(&self, key: &str) -> Option<u64> {
        let &i = self.meta_index.get(key)?;
        match &self.metadata[i].1 {
            Meta::Parsed(MetaValue::Array(items)) => Some(items.len() as u64),
            Meta::Parsed(_) => None,
            // Validated at open: the count follows the element type.
            Meta::Deferred { pos, .. } => {
                let b = self.mmap.get(pos + 4..pos + 12)?;
                Some(u64::from_le_bytes(b.try_into().ok()?))
            }
        }
    }

    fn resolve<'a>(&'a self, key: &str, m: &'a Meta) -> &'a MetaValue {
        match m {
            Meta::Parsed(v) => v,
            Meta::Deferred { pos, cell } => cell.get_or_init(|| self.parse_deferred(key, *pos)),
        }
    }

    /// Parses the deferred array at `pos`, which `open` validated.
    fn parse_deferred(&self, key: &str, pos: usize) -> MetaValue {
        let mut r = Reader {
            path: &self.path,
            buf: &self.mmap,
            pos,
            elements_left: GGUF_MAX_META_ELEMENTS,
            keep: true,
        };
        // The same bytes passed the same checks when the file was opened; a map whose file
        // changed underneath is beyond what a reader can guard against.
        r.value(type_id::ARRAY, 0, &|| format!("metadata '{key}'"))
            .unwrap_or_else(|e| panic!("{e} (the file changed after it was opened)"))
    }

    /// Descriptions of all tensors, in file order (offsets are absolute).
    pub fn tensor_infos(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor called `name`.
    pub fn tensor(&self, name: &str) -> Option<TensorView<'_>> {
        let &i = self.tensor_index.get(name)?;
        self.view(&self.tensors[i])
    }

    /// All tensors, in file order.
    pub fn tensors(&self) -> impl Iterator<Item = TensorView<'_>> {
        self.tensors.iter().filter_map(|t| self.view(t))
    }

    /// Size of the file in bytes.
    pub fn file_bytes(&self) -> u64 {
        self.mmap.len() as u64
    }

    fn view<'a>(&'a self, t: &'a TensorInfo) -> Option<TensorView<'a>> {
        // Bounds were validated in `open`; `get` keeps this panic-free anyway.
        let start = usize::try_from(t.offset).ok()?;
        let end = start.checked_add(usize::try_from(t.n_bytes).ok()?)?;
        Some(TensorView {
            name: &t.name,
            dtype: t.dtype,
            shape: &t.shape,
            data: self.mmap.get(start..end)?,
        })
    }
}

impl std::fmt::Debug for GgufFile {
    /// Concise: metadata (e.g. a vocabulary) can be huge.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("alignment", &self.alignment)
            .field("file_bytes", &self.mmap.len())
            .field("metadata_entries", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

struct Parsed {
    version: u32,
    alignment: u64,
    data_start: u64,
    metadata: Vec<(String, Meta)>,
    meta_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
}

/// A bounds-checked little-endian reader over the file bytes.
struct Reader<'a> {
    path: &'a Path,
    buf: &'a [u8],
    pos: usize,
    /// Array elements metadata may still hold ([`GGUF_MAX_META_ELEMENTS`] in all).
    elements_left: u64,
    /// Whether arrays keep their elements (`false`: each is checked, then dropped, and the
    /// array comes back empty).
    keep: bool,
}

impl<'a> Reader<'a> {
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn truncated(&self, what: &dyn Fn() -> String, need: u64) -> FormatError {
        FormatError::Truncated {
            path: self.path.to_path_buf(),
            what: format!(
                "{} at offset {} needs {} bytes, only {} left in the {}-byte file",
                what(),
                self.pos,
                need,
                self.remaining(),
                self.buf.len()
            ),
        }
    }

    fn invalid(&self, detail: String) -> FormatError {
        FormatError::Invalid {
            path: self.path.to_path_buf(),
            detail,
        }
    }

    fn bytes(&mut self, n: usize, what: &dyn Fn() -> String) -> Result<&'a [u8], FormatError> {
        if n > self.remaining() {
            return Err(self.truncated(what, n as u64));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N], FormatError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.bytes(N, what)?);
        Ok(a)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, FormatError> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, FormatError> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// Checks that `count` items of at least `min_size` bytes each can still
    /// fit in the file, so that no allocation exceeds what the file can back.
    fn check_count(
        &self,
        count: u64,
        min_size: u64,
        what: &dyn Fn() -> String,
    ) -> Result<usize, FormatError> {
        let need = count.checked_mul(min_size);
        match need {
            Some(need) if need <= self.remaining() as u64 => Ok(count as usize),
            _ => Err(FormatError::Truncated {
                path: self.path.to_path_buf(),
                what: format!(
                    "{} declares {count} items of at least {min_size} bytes at offset {}, \
                     but only {} bytes are left in the {}-byte file",
                    what(),
                    self.pos,
                    self.remaining(),
                    self.buf.len()
                ),
            }),
        }
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String, FormatError> {
        let start = self.pos;
        let len = self.u64(&|| format!("length of {}", what()))?;
        if len > self.remaining() as u64 {
            return Err(self.truncated(&|| format!("{} (string of {len} bytes)", what()), len));
        }
        let bytes = self.bytes(len as usize, what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(e) => Err(self.invalid(format!(
                "{} at offset {start} is not valid UTF-8: {e}",
                what()
            ))),
        }
    }

    /// Minimum encoded size of one value of GGUF type `ty`.
    fn min_size(ty: u32) -> u64 {
        match ty {
            type_id::U8 | type_id::I8 | type_id::BOOL => 1,
            type_id::U16 | type_id::I16 => 2,
            type_id::U32 | type_id::I32 | type_id::F32 => 4,
            type_id::U64 | type_id::I64 | type_id::F64 | type_id::STRING => 8,
            type_id::ARRAY => 12,
            _ => 1,
        }
    }

    fn value(
        &mut self,
        ty: u32,
        depth: usize,
        what: &dyn Fn() -> String,
    ) -> Result<MetaValue, FormatError> {
        Ok(match ty {
            type_id::U8 => MetaValue::U8(u8::from_le_bytes(self.array(what)?)),
            type_id::I8 => MetaValue::I8(i8::from_le_bytes(self.array(what)?)),
            type_id::U16 => MetaValue::U16(u16::from_le_bytes(self.array(what)?)),
            type_id::I16 => MetaValue::I16(i16::from_le_bytes(self.array(what)?)),
            type_id::U32 => MetaValue::U32(u32::from_le_bytes(self.array(what)?)),
            type_id::I32 => MetaValue::I32(i32::from_le_bytes(self.array(what)?)),
            type_id::U64 => MetaValue::U64(u64::from_le_bytes(self.array(what)?)),
            type_id::I64 => MetaValue::I64(i64::from_le_bytes(self.array(what)?)),
            type_id::F32 => MetaValue::F32(f32::from_le_bytes(self.array(what)?)),
            type_id::F64 => MetaValue::F64(f64::from_le_bytes(self.array(what)?)),
            type_id::BOOL => {
                let pos = self.pos;
                match self.array::<1>(what)?[0] {
                    0 => MetaValue::Bool(false),
                    1 => MetaValue::Bool(true),
                    b => {
                        return Err(self.invalid(format!(
                            "{} at offset {pos}: bool byte is {b}, not 0 or 1",
                            what()
                        )))
                    }
                }
            }
            type_id::STRING => MetaValue::String(self.string(what)?),
            type_id::ARRAY => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(self.invalid(format!(
                        "{}: arrays nested deeper than {MAX_ARRAY_DEPTH} levels",
                        what()
                    )));
                }
                let pos = self.pos;
                let elem_ty = self.u32(&|| format!("element type of {}", what()))?;
                if elem_ty > type_id::F64 {
                    return Err(self.invalid(format!(
                        "{} at offset {pos}: unknown array element type {elem_ty}",
                        what()
                    )));
                }
                let count = self.u64(&|| format!("element count of {}", what()))?;
                let n = self.check_count(count, Self::min_size(elem_ty), &|| {
                    format!("array {}", what())
                })?;
                self.elements_left = match self.elements_left.checked_sub(count) {
                    Some(left) => left,
                    None => {
                        return Err(self.invalid(format!(
                            "{} at offset {pos}: its {count} elements take the metadata past \
                             {GGUF_MAX_META_ELEMENTS} array elements in all",
                            what()
                        )))
                    }
                };
                let mut items = Vec::with_capacity(if self.keep { n } else { 0 });
                for i in 0..n {
                    let item = self.value(elem_ty, depth + 1, &|| format!("{}[{i}]", what()))?;
                    if self.keep {
                        items.push(item);
                    }
                }
                MetaValue::Array(items)
            }
            other => {
                return Err(self.invalid(format!("{}: unknown metadata value type {other}", what())))
            }
        })
    }
}

fn parse(path: &Path, buf: &[u8]) -> Result<Parsed, FormatError> {
    let mut r = Reader {
        path,
        buf,
        pos: 0,
        elements_left: GGUF_MAX_META_ELEMENTS,
        keep: true,
    };
    if buf.len() < 4 {
        return Err(r.truncated(&|| "magic".to_owned(), 4));
    }
    let magic: [u8; 4] = r.array(&|| "magic".to_owned())?;
    if magic != GGUF_MAGIC {
        return Err(FormatError::BadMagic {
            path: path.to_path_buf(),
            found: magic,
        });
    }
    let version = r.u32(&|| "version".to_owned())?;
    if version != 2 && version != 3 {
        return Err(FormatError::UnsupportedVersion {
            path: path.to_path_buf(),
            version,
        });
    }
    let tensor_count = r.u64(&|| "tensor count".to_owned())?;
    let kv_count = r.u64(&|| "metadata count".to_owned())?;

    let (metadata, meta_index) = read_metadata(&mut r, kv_count)?;
    let alignment = alignment_of(&r, &metadata, &meta_index)?;
    let (raws, tensor_index) = read_tensor_infos(&mut r, tensor_count)?;
    let data_start = (r.pos as u64).div_ceil(alignment) * alignment;
    let tensors = place_tensors(&r, raws, alignment, data_start)?;
    crate::tensor::check_no_overlap(path, &tensors)?;

    Ok(Parsed {
        version,
        alignment,
        data_start,
        metadata,
        meta_index,
        tensors,
        tensor_index,
    })
}

/// A metadata key and its value.
type MetaEntry = (String, Meta);

/// The metadata key/value pairs (large arrays deferred) and their index by key.
fn read_metadata(
    r: &mut Reader<'_>,
    kv_count: u64,
) -> Result<(Vec<MetaEntry>, HashMap<String, usize>), FormatError> {
    // Each key/value pair takes at least 8 (key length) + 4 (type) + 1 bytes.
    let n_kv = r.check_count(kv_count, 13, &|| "metadata count".to_owned())?;
    let mut metadata = Vec::with_capacity(n_kv);
    let mut meta_index = HashMap::with_capacity(n_kv);
    for i in 0..n_kv {
        let key_pos = r.pos;
        let key = r.string(&|| format!("key of metadata entry #{i}"))?;
        let ty = r.u32(&|| format!("value type of metadata '{key}'"))?;
        let value_pos = r.pos;
        // A large array of scalars or strings is checked now and parsed when asked for.
        let deferred = ty == type_id::ARRAY
            && matches!(
                (r.buf.get(value_pos..value_pos + 4), r.buf.get(value_pos + 4..value_pos + 12)),
                (Some(t), Some(c)) if u32::from_le_bytes(t.try_into().unwrap_or_default()) != type_id::ARRAY
                    && u64::from_le_bytes(c.try_into().unwrap_or_default()) > GGUF_DEFERRED_ARRAY_MIN
            );
        r.keep = !deferred;
        let value = r.value(ty, 0, &|| format!("metadata '{key}'"))?;
        r.keep = true;
        let value = if deferred {
            Meta::Deferred {
                pos: value_pos,
                cell: OnceLock::new(),
            }
        } else {
            Meta::Parsed(value)
        };
        if meta_index.insert(key.clone(), metadata.len()).is_some() {
            return Err(r.invalid(format!(
                "duplicate metadata key '{key}' at offset {key_pos}"
            )));
        }
        metadata.push((key, value));
    }

    Ok((metadata, meta_index))
}

/// `general.alignment` (a power of two up to 1 GiB), or the default.
fn alignment_of(
    r: &Reader<'_>,
    metadata: &[(String, Meta)],
    meta_index: &HashMap<String, usize>,
) -> Result<u64, FormatError> {
    Ok(match meta_index.get("general.alignment") {
        None => GGUF_DEFAULT_ALIGNMENT,
        Some(&i) => match &metadata[i].1 {
            Meta::Parsed(v) => match v.as_u64() {
                Some(a) if a.is_power_of_two() && a <= 1 << 30 => a,
                _ => {
                    return Err(r.invalid(format!("general.alignment is {v:?}, not a power of two")))
                }
            },
            Meta::Deferred { .. } => {
                return Err(
                    r.invalid("general.alignment is an array, not a power of two".to_string())
                )
            }
        },
    })
}

/// A tensor's header entry, its offset relative to the data section.
struct Raw {
    name: String,
    shape: Vec<usize>,
    dtype: DType,
    rel_offset: u64,
    n_bytes: u64,
}

/// The tensor header entries (names unique, shapes and types known) and their index by name.
fn read_tensor_infos(
    r: &mut Reader<'_>,
    tensor_count: u64,
) -> Result<(Vec<Raw>, HashMap<String, usize>), FormatError> {
    // Each tensor info takes at least 8 (name length) + 4 + 8 + 4 + 8 bytes.
    let n_tensors = r.check_count(tensor_count, 32, &|| "tensor count".to_owned())?;
    let mut raws = Vec::with_capacity(n_tensors);
    let mut tensor_index = HashMap::with_capacity(n_tensors);
    for i in 0..n_tensors {
        let name = r.string(&|| format!("name of tensor #{i}"))?;
        let what_t = || format!("tensor '{name}'");
        let n_dims = r.u32(&|| format!("dimension count of {}", what_t()))?;
        if n_dims == 0 || n_dims as usize > GGUF_MAX_DIMS {
            return Err(r.invalid(format!(
                "{} has {n_dims} dimensions (must be 1..={GGUF_MAX_DIMS})",
                what_t()
            )));
        }
        let mut ne = Vec::with_capacity(n_dims as usize);
        for d in 0..n_dims {
            let v = r.u64(&|| format!("ne[{d}] of {}", what_t()))?;
            let v = usize::try_from(v)
                .ok()
                .filter(|&v| v <= i64::MAX as usize)
                .ok_or_else(|| FormatError::ShapeMismatch {
                    path: r.path.to_path_buf(),
                    tensor: name.clone(),
                    detail: format!("ne[{d}] = {v} is out of range"),
                })?;
            ne.push(v);
        }
        let ty = r.u32(&|| format!("type of {}", what_t()))?;
        let rel_offset = r.u64(&|| format!("offset of {}", what_t()))?;
        let dtype = DType::from_ggml_id(ty).ok_or_else(|| FormatError::UnsupportedType {
            path: r.path.to_path_buf(),
            tensor: name.clone(),
            type_id: ty,
        })?;
        let shape: Vec<usize> = ne.iter().rev().copied().collect();
        let n_bytes = crate::tensor::tensor_bytes(dtype, &shape).map_err(|detail| {
            FormatError::ShapeMismatch {
                path: r.path.to_path_buf(),
                tensor: name.clone(),
                detail: format!("{detail} (ne = {ne:?}, type {dtype})"),
            }
        })? as u64;
        if tensor_index.insert(name.clone(), i).is_some() {
            return Err(r.invalid(format!("duplicate tensor name '{name}'")));
        }
        raws.push(Raw {
            name,
            shape,
            dtype,
            rel_offset,
            n_bytes,
        });
    }

    Ok((raws, tensor_index))
}

/// The tensors at their absolute offsets, each aligned and inside the file.
fn place_tensors(
    r: &Reader<'_>,
    raws: Vec<Raw>,
    alignment: u64,
    data_start: u64,
) -> Result<Vec<TensorInfo>, FormatError> {
    let file_len = r.buf.len() as u64;
    let mut tensors = Vec::with_capacity(raws.len());
    for t in raws {
        if t.rel_offset % alignment != 0 {
            return Err(r.invalid(format!(
                "tensor '{}' has offset {} that is not a multiple of the alignment {alignment}",
                t.name, t.rel_offset
            )));
        }
        let offset = data_start.checked_add(t.rel_offset);
        let end = offset.and_then(|o| o.checked_add(t.n_bytes));
        match (offset, end) {
            (Some(offset), Some(end)) if end <= file_len => tensors.push(TensorInfo {
                name: t.name,
                dtype: t.dtype,
                shape: t.shape,
                offset,
                n_bytes: t.n_bytes,
            }),
            _ => {
                return Err(FormatError::Truncated {
                    path: r.path.to_path_buf(),
                    what: format!(
                        "data of tensor '{}' ({} bytes at data offset {}, data section at {data_start}) \
                         runs past the end of the {file_len}-byte file",
                        t.name, t.n_bytes, t.rel_offset
                    ),
                })
            }
        }
    }
    Ok(tensors)
}
