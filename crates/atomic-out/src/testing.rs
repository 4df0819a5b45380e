//! Test support (feature `testing`): checking that a write failing half-way, as on a full disk, leaves
//! the destination as it was. [`run_in_child`] re-runs one test of the current test binary in a child
//! process with a file-size limit (`RLIMIT_FSIZE`), where [`child_writes`] does the write, so writes
//! past the limit fail with EFBIG.

use std::path::Path;

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
    let ok = crate::sys::limit_file_size(limit);
    assert!(ok, "setting the file-size limit");
    let r = write(Path::new(&dest));
    println!("CHILD-RESULT {}", r.err().unwrap_or_else(|| "ok".into()));
    std::process::exit(0);
}

/// Runs test `test` of this binary again in a child process, where its [`child_writes`] writes `dest`
/// (`test` is the test's full name as the harness lists it, `module::name` for a test in a module of
/// a merged `tests/it` binary: the child runs it with `--exact`)
/// under a file-size limit of `limit` bytes. Returns what that write returned (`Err` with its
/// message), or `None` when no child can be started (an emulated target without binfmt).
pub fn run_in_child(test: &str, dest: &Path, limit: u64) -> Option<Result<(), String>> {
    let exe = std::env::current_exe().ok()?;
    // Under emulation (no binfmt handler) the child must go through the same runner as the test:
    // `SPARROW_TEST_RUNNER` (e.g. `qemu-aarch64 -L /usr/aarch64-linux-gnu`, set by `cargo xtask
    // test-aarch64`) is put before it.
    let runner = std::env::var("SPARROW_TEST_RUNNER").unwrap_or_default();
    let mut words = runner.split_whitespace();
    let mut cmd = match words.next() {
        Some(program) => {
            let mut c = std::process::Command::new(program);
            c.args(words).arg(exe);
            c
        }
        None => std::process::Command::new(exe),
    };
    let out = cmd
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
