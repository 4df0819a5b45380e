//! The container shared by both file formats: header, payload, checksum, atomic writes, and a bounds-checked
//! little-endian reader.
//!
//! ```text
//! offset  size  field
//! 0       8     magic ("SPRWPROF" profile, "SPRWPRED" predictor set)
//! 8       4     format version, u32 LE (currently 1 for both)
//! 12      4     reserved, u32 LE, must be 0
//! 16      8     payload length N, u64 LE
//! 24      N     payload (format-specific, little-endian)
//! 24+N    8     FNV-1a 64 checksum, u64 LE, over bytes [0, 24+N) (header and payload)
//! ```
//!
//! The file must be exactly `32 + N` bytes long. Files are written through `atomic_out::AtomicFile`
//! (a temporary `.NAME.sparrow-tmp-PID-SEQ` in the same folder, fsynced, renamed over `path`, folder
//! fsynced), so an interrupted write never leaves a file that passes these checks, nor touches the old one.

use std::path::Path;

use crate::error::{PredictorError, Result};

pub(crate) const HEADER_LEN: usize = 24;

/// FNV-1a, 64 bits, fed in pieces (the checksum of profile and predictor files; also what model
/// fingerprints are made of).
#[derive(Debug, Clone, Copy)]
pub struct Fnv1a64(u64);

impl Default for Fnv1a64 {
    fn default() -> Self {
        Fnv1a64(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv1a64 {
    /// Feeds `data`.
    pub fn update(&mut self, data: &[u8]) {
        for &b in data {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    /// The hash of everything fed so far.
    pub fn finish(self) -> u64 {
        self.0
    }
}

/// FNV-1a 64 of `data`.
pub(crate) fn fnv1a64(data: &[u8]) -> u64 {
    let mut h = Fnv1a64::default();
    h.update(data);
    h.finish()
}

/// Wraps `payload` in the container and writes it atomically to `path`.
pub(crate) fn write_atomic(
    path: &Path,
    magic: &[u8; 8],
    version: u32,
    payload: &[u8],
) -> Result<()> {
    let mut bytes = Vec::with_capacity(payload.len() + HEADER_LEN + 8);
    bytes.extend_from_slice(magic);
    bytes.extend_from_slice(&version.to_le_bytes());
    bytes.extend_from_slice(&0u32.to_le_bytes());
    bytes.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    bytes.extend_from_slice(payload);
    let sum = fnv1a64(&bytes);
    bytes.extend_from_slice(&sum.to_le_bytes());

    atomic_out::write_atomic(path, &bytes).map_err(|e| match e {
        atomic_out::AtomicError::Io { path, what, source } => {
            PredictorError::Io { path, what, source }
        }
        other => PredictorError::Io {
            path: other.path().to_path_buf(),
            what: "writing",
            source: other.into(),
        },
    })
}

/// The largest profile file read (a real one is a few MiB even for a 7B model).
pub const MAX_PROFILE_BYTES: u64 = 1 << 30;
/// The largest predictor file read (predictors are kept under a tenth of the FFN's bytes).
pub const MAX_PREDICTOR_BYTES: u64 = 4 << 30;

/// Reads `path` (a regular file no larger than its kind's limit), checks the container and returns
/// the payload.
pub(crate) fn read_checked(
    path: &Path,
    magic: &[u8; 8],
    kind: &'static str,
    version: u32,
) -> Result<Vec<u8>> {
    // A profile is a few floats per neuron; predictors at most a tenth of the FFN's bytes.
    let limit = if kind == "predictor" {
        MAX_PREDICTOR_BYTES
    } else {
        MAX_PROFILE_BYTES
    };
    let bytes = atomic_out::read_bounded(path, limit).map_err(|e| match e {
        atomic_out::AtomicError::Io { path, what, source } => {
            PredictorError::Io { path, what, source }
        }
        other => {
            let path = other.path().to_path_buf();
            let text = other.to_string();
            let what = text
                .strip_prefix(&format!("{}: ", path.display()))
                .unwrap_or(&text)
                .to_string();
            PredictorError::Format { path, what }
        }
    })?;
    let bad = |what: String| PredictorError::Format {
        path: path.to_path_buf(),
        what,
    };
    if bytes.len() < HEADER_LEN + 8 {
        return Err(bad(format!(
            "truncated: {} bytes, a {kind} file has at least {}",
            bytes.len(),
            HEADER_LEN + 8
        )));
    }
    if &bytes[..8] != magic {
        return Err(bad(format!(
            "not a {kind} file: magic {:?}, expected {:?}",
            String::from_utf8_lossy(&bytes[..8]),
            String::from_utf8_lossy(magic)
        )));
    }
    let found = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
    if found != version {
        return Err(PredictorError::Version {
            path: path.to_path_buf(),
            kind,
            found,
            expected: version,
        });
    }
    let reserved = u32::from_le_bytes([bytes[12], bytes[13], bytes[14], bytes[15]]);
    if reserved != 0 {
        return Err(bad(format!(
            "reserved header field is {reserved}, expected 0"
        )));
    }
    let mut n = [0u8; 8];
    n.copy_from_slice(&bytes[16..24]);
    let n = u64::from_le_bytes(n);
    let expected_len = (n as u128) + (HEADER_LEN as u128) + 8;
    if expected_len != bytes.len() as u128 {
        return Err(bad(format!(
            "{}: header says {n} payload bytes ({expected_len} bytes in all), file has {}",
            if (bytes.len() as u128) < expected_len {
                "truncated"
            } else {
                "trailing bytes"
            },
            bytes.len()
        )));
    }
    let body_end = bytes.len() - 8;
    let mut s = [0u8; 8];
    s.copy_from_slice(&bytes[body_end..]);
    let stored = u64::from_le_bytes(s);
    let actual = fnv1a64(&bytes[..body_end]);
    if stored != actual {
        return Err(bad(format!(
            "checksum mismatch: stored {stored:#018x}, computed {actual:#018x} (file corrupt)"
        )));
    }
    Ok(bytes[HEADER_LEN..body_end].to_vec())
}

/// Little-endian payload writer.
#[derive(Default)]
pub(crate) struct Writer(pub Vec<u8>);

impl Writer {
    pub fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    pub fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub fn f32(&mut self, v: f32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub fn f32s(&mut self, v: &[f32]) {
        for &x in v {
            self.f32(x);
        }
    }
    pub fn str(&mut self, s: &str) {
        self.u32(s.len() as u32);
        self.0.extend_from_slice(s.as_bytes());
    }
    pub fn bytes(&mut self, b: &[u8]) {
        self.0.extend_from_slice(b);
    }
}

/// Bounds-checked little-endian payload reader; every failure names the file and the field.
pub(crate) struct Reader<'a> {
    path: &'a Path,
    data: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(path: &'a Path, data: &'a [u8]) -> Self {
        Reader { path, data, pos: 0 }
    }

    pub fn err(&self, what: String) -> PredictorError {
        PredictorError::Format {
            path: self.path.to_path_buf(),
            what,
        }
    }

    pub fn take(&mut self, n: usize, field: &str) -> Result<&'a [u8]> {
        let left = self.data.len() - self.pos;
        if n > left {
            return Err(self.err(format!(
                "payload ends inside {field} at payload offset {}: needs {n} bytes, {left} left",
                self.pos
            )));
        }
        let s = &self.data[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    pub fn u8(&mut self, field: &str) -> Result<u8> {
        Ok(self.take(1, field)?[0])
    }
    pub fn u32(&mut self, field: &str) -> Result<u32> {
        let b = self.take(4, field)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    pub fn u64(&mut self, field: &str) -> Result<u64> {
        let b = self.take(8, field)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
    pub fn f32(&mut self, field: &str) -> Result<f32> {
        Ok(f32::from_bits(self.u32(field)?))
    }
    /// `n` f32 values; the length is checked against the bytes left before allocating.
    pub fn f32s(&mut self, n: usize, field: &str) -> Result<Vec<f32>> {
        let len = n
            .checked_mul(4)
            .ok_or_else(|| self.err(format!("{field}: count {n} overflows")))?;
        let b = self.take(len, field)?;
        Ok(b.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
    pub fn str(&mut self, field: &str) -> Result<String> {
        let n = self.u32(field)? as usize;
        let b = self.take(n, field)?;
        String::from_utf8(b.to_vec()).map_err(|_| self.err(format!("{field} is not UTF-8")))
    }
    pub fn finish(&self) -> Result<()> {
        if self.pos != self.data.len() {
            return Err(self.err(format!(
                "{} unexpected bytes after the last field",
                self.data.len() - self.pos
            )));
        }
        Ok(())
    }
}
