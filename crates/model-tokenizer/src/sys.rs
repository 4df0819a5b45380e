//! The system calls of the render sandbox (`sandbox.rs`), thin wrappers (the house rule: FFI only in
//! `-sys` crates or `sys` modules). Linux and Android only.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

pub(crate) use libc::pid_t as Pid;

/// The size of a memory page.
pub(crate) fn page_size() -> Option<u64> {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(page).ok().filter(|&p| p > 0)
}

/// A pipe, both ends close-on-exec: (read end, write end).
pub(crate) fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` is a valid array of two ints for pipe2 to fill.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded, so both descriptors are open and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// `fork`: `None` in the child, the child's pid in the parent.
///
/// # Safety
/// The child of a multi-threaded process may only do what is sound after `fork`: the caller's child
/// path must compute, allocate, write to its pipe and leave with [`exit_now`], touching no lock
/// another thread of the parent may have held.
pub(crate) unsafe fn fork() -> io::Result<Option<Pid>> {
    // SAFETY: fork has no preconditions of its own; the caller keeps the contract above.
    match unsafe { libc::fork() } {
        p if p < 0 => Err(io::Error::last_os_error()),
        0 => Ok(None),
        p => Ok(Some(p)),
    }
}

/// Lowers this process's address-space limit (`RLIMIT_AS`) to `limit` bytes (never raising it).
/// Failures are ignored.
pub(crate) fn limit_address_space(limit: u64) {
    let mut current = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `current` is a valid rlimit for getrlimit to fill; setrlimit reads a valid one.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_AS, &mut current) == 0 {
            let bounded = libc::rlimit {
                rlim_cur: (limit as libc::rlim_t).min(current.rlim_cur),
                rlim_max: current.rlim_max,
            };
            libc::setrlimit(libc::RLIMIT_AS, &bounded);
        }
    }
}

/// Points this process's standard error at `/dev/null`. Failures are ignored.
pub(crate) fn silence_stderr() {
    // SAFETY: open and dup2 on valid arguments; fd 2 is replaced in this process only.
    unsafe {
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if null >= 0 {
            libc::dup2(null, 2);
        }
    }
}

/// Ends this process at once with `code`, running no destructor or `atexit` handler.
pub(crate) fn exit_now(code: i32) -> ! {
    // SAFETY: `_exit` ends the process at once; nothing of its state is touched.
    unsafe { libc::_exit(code) }
}

/// Kills child `pid` (`SIGKILL`). The caller has not reaped it yet, so the pid is not reused.
pub(crate) fn kill_child(pid: Pid) {
    // SAFETY: kill reads no memory of ours; `pid` is a child not yet reaped (the caller's word).
    unsafe { libc::kill(pid, libc::SIGKILL) };
}

/// Waits up to `timeout` for `fd` to be readable (or at its end): `Ok(false)` on timeout.
pub(crate) fn wait_readable(fd: &impl AsRawFd, timeout: Duration) -> io::Result<bool> {
    let mut poll = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as libc::c_int;
    // SAFETY: `poll` is one valid pollfd.
    match unsafe { libc::poll(&mut poll, 1, ms) } {
        r if r < 0 => Err(io::Error::last_os_error()),
        r => Ok(r > 0),
    }
}

/// How a child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// It exited with this code.
    Exited(i32),
    /// A signal ended it.
    Signaled(i32),
    /// Reaped elsewhere (a `SIGCHLD` handler set to ignore): unknown.
    Unknown,
}

/// `SIGABRT` and `SIGSEGV`, for judging an [`Ended::Signaled`].
pub(crate) const SIGABRT: i32 = libc::SIGABRT;
/// See [`SIGABRT`].
pub(crate) const SIGSEGV: i32 = libc::SIGSEGV;

/// Waits for child `pid` to end.
pub(crate) fn wait_child(pid: Pid) -> Ended {
    let mut status = 0;
    loop {
        // SAFETY: `pid` is our child; `status` is a valid int for waitpid to fill.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            return if libc::WIFEXITED(status) {
                Ended::Exited(libc::WEXITSTATUS(status))
            } else if libc::WIFSIGNALED(status) {
                Ended::Signaled(libc::WTERMSIG(status))
            } else {
                Ended::Unknown
            };
        }
        if r < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            return Ended::Unknown;
        }
    }
}
