//! Helpers shared by the predictor crate's file tests (profile and predictor files share one container:
//! 24-byte header, payload, FNV-1a 64 checksum of everything before it).
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// A scratch path under `target/tmp` (cargo's scratch space for integration tests), not the system temp dir.
pub fn tmp(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("predictor-tests-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// FNV-1a 64, written here from the definition (independent of the crate's own).
pub fn fnv(d: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for &x in d {
        h ^= x as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

/// Appends a valid checksum to header + payload bytes: a file that passes the container checks.
pub fn seal(mut header_and_payload: Vec<u8>) -> Vec<u8> {
    let h = fnv(&header_and_payload);
    header_and_payload.extend_from_slice(&h.to_le_bytes());
    header_and_payload
}

/// `good` with bit `bit` of byte `pos % len` flipped, and `good` cut to `cut % len` bytes: both must
/// fail to load.
pub fn corruptions(good: &[u8], pos: usize, bit: u8, cut: usize) -> [Vec<u8>; 2] {
    let mut flipped = good.to_vec();
    flipped[pos % good.len()] ^= 1 << bit;
    [flipped, good[..cut % good.len()].to_vec()]
}
