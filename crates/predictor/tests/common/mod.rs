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

/// Environment variables that make a copy of this test binary the child of [`run_in_child`].
const CHILD_DEST: &str = "SPARROW_TEST_FSIZE_CHILD_DEST";
const CHILD_LIMIT: &str = "SPARROW_TEST_FSIZE_CHILD_LIMIT";

/// In a child started by [`run_in_child`]: lowers the file-size limit (`RLIMIT_FSIZE`) so that writing
/// past it fails with EFBIG, as a full disk would, runs `write` on the destination, reports its result
/// and exits. Anywhere else: does nothing. Call it first in the test, before anything touches a file.
pub fn child_writes(write: impl FnOnce(&Path) -> Result<(), String>) {
    let (Some(dest), Some(limit)) = (std::env::var_os(CHILD_DEST), std::env::var_os(CHILD_LIMIT))
    else {
        return;
    };
    let limit: u64 = limit.to_str().unwrap().parse().unwrap();
    let lim = libc::rlimit {
        rlim_cur: limit as libc::rlim_t,
        rlim_max: limit as libc::rlim_t,
    };
    // SAFETY: ignoring SIGXFSZ (so an oversized write returns EFBIG instead of killing us) and
    // lowering our own file-size limit touch no memory of ours; `lim` outlives the call.
    let ok = unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN) != libc::SIG_ERR
            && libc::setrlimit(libc::RLIMIT_FSIZE, &lim) == 0
    };
    assert!(ok, "setting the file-size limit");
    let r = write(Path::new(&dest));
    println!("CHILD-RESULT {}", r.err().unwrap_or_else(|| "ok".into()));
    std::process::exit(0);
}

/// Runs test `test` of this binary again in a child process, where its [`child_writes`] writes `dest`
/// under a file-size limit of `limit` bytes. Returns what that write returned (`Err` with its
/// message), or `None` when no child can be started (an emulated target without binfmt).
pub fn run_in_child(test: &str, dest: &Path, limit: u64) -> Option<Result<(), String>> {
    let out = std::process::Command::new(std::env::current_exe().ok()?)
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_DEST, dest)
        .env(CHILD_LIMIT, limit.to_string())
        .output();
    let out = match out {
        Ok(o) => o,
        Err(e) => {
            eprintln!("skipped: cannot start a child test binary: {e}");
            return None;
        }
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .split_once("CHILD-RESULT ")
        .and_then(|(_, rest)| rest.lines().next())
        .unwrap_or_else(|| {
            panic!(
                "child gave no result: {}\n{stdout}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )
        });
    Some(if line == "ok" {
        Ok(())
    } else {
        Err(line.to_string())
    })
}
