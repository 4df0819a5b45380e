//! The system calls of xtask, thin wrappers (the house rule: FFI only in `-sys` crates or `sys`
//! modules).

use anyhow::{Context, Result};

/// Waits for child `pid`; returns its wait status, peak RSS in bytes and the bytes it read from the
/// disk (`ru_inblock`).
pub fn wait_with_rusage(pid: u32) -> Result<(libc::c_int, u64, u64)> {
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value of this plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: `pid` is our unreaped child; `status` and `usage` are valid for wait4 to fill.
        let r = unsafe { libc::wait4(pid as libc::pid_t, &mut status, 0, &mut usage) };
        if r == pid as libc::pid_t {
            return Ok((
                status,
                usage.ru_maxrss.max(0) as u64 * 1024,
                usage.ru_inblock.max(0) as u64 * 512,
            ));
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e).context("waiting for the benchmark");
        }
    }
}
