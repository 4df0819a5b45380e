//! The file container of device profiles and plans: one header line, then a JSON payload.
//!
//! ```text
//! sparrow-plan v1 len=1234 fnv1a64=0123456789abcdef\n
//! {"...": ...}
//! ```
//!
//! The header names the kind and version, the payload's length in bytes and its FNV-1a 64 checksum;
//! a file whose kind, version, length or checksum do not match is refused before the payload is
//! parsed. Files are written through `atomic-out` (whole or not at all).

use std::path::Path;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::{PlannerError, Result};

/// Largest payload read (a plan or device profile is a few KiB; this bounds a hostile file).
const MAX_PAYLOAD: usize = 16 << 20;

/// FNV-1a, 64 bits.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The bytes of a file of `kind` at `version` holding `value`.
pub fn encode<T: Serialize>(kind: &str, version: u32, value: &T) -> Vec<u8> {
    let payload = serde_json::to_vec_pretty(value).expect("plain data serializes");
    let mut out = format!(
        "{kind} v{version} len={} fnv1a64={:016x}\n",
        payload.len(),
        fnv1a64(&payload)
    )
    .into_bytes();
    out.extend_from_slice(&payload);
    out.push(b'\n');
    out
}

/// Writes `value` to `path` whole or not at all.
pub fn save<T: Serialize>(path: &Path, kind: &str, version: u32, value: &T) -> Result<()> {
    Ok(atomic_out::write_atomic(
        path,
        &encode(kind, version, value),
    )?)
}

/// Parses the bytes of a file of `kind` at `version`; `path` names it in errors.
pub fn decode<T: DeserializeOwned>(
    path: &Path,
    kind: &str,
    version: u32,
    bytes: &[u8],
) -> Result<T> {
    let corrupt = |what: String| PlannerError::Corrupt {
        path: path.to_path_buf(),
        what,
    };
    let nl = bytes
        .iter()
        .take(256)
        .position(|&b| b == b'\n')
        .ok_or_else(|| corrupt(format!("not a {kind} file (no header line)")))?;
    let header = std::str::from_utf8(&bytes[..nl])
        .map_err(|_| corrupt(format!("not a {kind} file (header is not text)")))?;
    let mut words = header.split(' ');
    if words.next() != Some(kind) {
        return Err(corrupt(format!("not a {kind} file")));
    }
    let v = words
        .next()
        .and_then(|w| w.strip_prefix('v'))
        .and_then(|w| w.parse::<u32>().ok())
        .ok_or_else(|| corrupt("header has no version".into()))?;
    if v != version {
        return Err(corrupt(format!(
            "{kind} version {v}, this build reads version {version}"
        )));
    }
    let len = words
        .next()
        .and_then(|w| w.strip_prefix("len="))
        .and_then(|w| w.parse::<usize>().ok())
        .ok_or_else(|| corrupt("header has no length".into()))?;
    let sum = words
        .next()
        .and_then(|w| w.strip_prefix("fnv1a64="))
        .and_then(|w| u64::from_str_radix(w, 16).ok())
        .ok_or_else(|| corrupt("header has no checksum".into()))?;
    if len > MAX_PAYLOAD {
        return Err(corrupt(format!(
            "payload of {len} bytes, more than {MAX_PAYLOAD}"
        )));
    }
    let body = &bytes[nl + 1..];
    if body.len() < len {
        return Err(corrupt(format!(
            "truncated: payload of {} bytes, header says {len}",
            body.len()
        )));
    }
    let payload = &body[..len];
    if fnv1a64(payload) != sum {
        return Err(corrupt("checksum mismatch (the file is damaged)".into()));
    }
    serde_json::from_slice(payload).map_err(|e| corrupt(format!("bad payload: {e}")))
}

/// Reads and parses the file at `path`.
pub fn load<T: DeserializeOwned>(path: &Path, kind: &str, version: u32) -> Result<T> {
    // A regular file no larger than a payload and its header line (a FIFO or `/dev/zero` is refused
    // before it is read).
    let bytes =
        atomic_out::read_bounded(path, (MAX_PAYLOAD + 1024) as u64).map_err(|e| match e {
            atomic_out::AtomicError::Io { path, source, .. } => PlannerError::Io { path, source },
            other => {
                let path = other.path().to_path_buf();
                let text = other.to_string();
                let what = text
                    .strip_prefix(&format!("{}: ", path.display()))
                    .unwrap_or(&text)
                    .to_string();
                PlannerError::Corrupt { path, what }
            }
        })?;
    decode(path, kind, version, &bytes)
}
