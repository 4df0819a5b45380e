//! The system calls of this crate, thin and safe (the house rule: FFI only in `-sys` crates or `sys`
//! modules).

/// Whether process `pid` exists (in this pid namespace). Unknown answers count as alive.
#[cfg(unix)]
pub(crate) fn pid_alive(pid: u32) -> bool {
    let Ok(p) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if p <= 0 {
        return false; // never a writer's pid; kill() would address a process group
    }
    // SAFETY: signal 0 sends nothing: kill() only checks that the process exists and may be signalled;
    // it reads no memory of ours.
    let r = unsafe { libc::kill(p, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// Lowers this process's file-size limit (`RLIMIT_FSIZE`) to `limit` bytes and ignores `SIGXFSZ`, so
/// that a write past the limit fails with EFBIG as on a full disk. Whether both took.
#[cfg(all(unix, feature = "testing"))]
pub(crate) fn limit_file_size(limit: u64) -> bool {
    let lim = libc::rlimit {
        rlim_cur: limit as libc::rlim_t,
        rlim_max: limit as libc::rlim_t,
    };
    // SAFETY: ignoring SIGXFSZ (so an oversized write returns EFBIG instead of killing us) and
    // lowering our own file-size limit touch no memory of ours; `lim` outlives the call.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN) != libc::SIG_ERR
            && libc::setrlimit(libc::RLIMIT_FSIZE, &lim) == 0
    }
}

/// Makes a FIFO at `path` (tests of inputs that are not regular files).
#[cfg(all(unix, test))]
pub(crate) fn mkfifo(path: &std::path::Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: `c` is a valid NUL-terminated path that outlives the call.
    unsafe { libc::mkfifo(c.as_ptr(), 0o600) == 0 }
}
