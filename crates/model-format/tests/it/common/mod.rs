//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A unique temporary directory, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let p = std::env::temp_dir().join(format!(
            "model-format-{tag}-{}-{}-{nanos}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    /// The names in the directory, sorted (temporaries included: they start with a dot).
    pub fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&self.0)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Hand-built GGUF bytes, for writing files the writer would refuse to write.
pub struct RawGguf {
    pub magic: [u8; 4],
    pub version: u32,
    /// Overrides the real tensor count if set.
    pub tensor_count: Option<u64>,
    /// Overrides the real kv count if set.
    pub kv_count: Option<u64>,
    /// Raw encoded kv pairs (key + type + value).
    pub kvs: Vec<Vec<u8>>,
    /// (name, ne innermost first, ggml type, relative offset)
    pub tensors: Vec<(String, Vec<u64>, u32, u64)>,
    pub alignment: u64,
    pub data: Vec<u8>,
}

impl Default for RawGguf {
    fn default() -> Self {
        RawGguf {
            magic: *b"GGUF",
            version: 3,
            tensor_count: None,
            kv_count: None,
            kvs: Vec::new(),
            tensors: Vec::new(),
            alignment: 32,
            data: Vec::new(),
        }
    }
}

pub fn gguf_string(out: &mut Vec<u8>, s: &[u8]) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s);
}

/// Encodes a u32 kv pair.
pub fn kv_u32(key: &str, v: u32) -> Vec<u8> {
    let mut b = Vec::new();
    gguf_string(&mut b, key.as_bytes());
    b.extend_from_slice(&4u32.to_le_bytes());
    b.extend_from_slice(&v.to_le_bytes());
    b
}

impl RawGguf {
    pub fn bytes(&self) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&self.magic);
        b.extend_from_slice(&self.version.to_le_bytes());
        b.extend_from_slice(
            &self
                .tensor_count
                .unwrap_or(self.tensors.len() as u64)
                .to_le_bytes(),
        );
        b.extend_from_slice(&self.kv_count.unwrap_or(self.kvs.len() as u64).to_le_bytes());
        for kv in &self.kvs {
            b.extend_from_slice(kv);
        }
        for (name, ne, ty, off) in &self.tensors {
            gguf_string(&mut b, name.as_bytes());
            b.extend_from_slice(&(ne.len() as u32).to_le_bytes());
            for d in ne {
                b.extend_from_slice(&d.to_le_bytes());
            }
            b.extend_from_slice(&ty.to_le_bytes());
            b.extend_from_slice(&off.to_le_bytes());
        }
        while b.len() as u64 % self.alignment != 0 {
            b.push(0);
        }
        b.extend_from_slice(&self.data);
        b
    }
}
