//! Runs one chat-template render in a child process with bounded memory and time.
//!
//! minijinja's fuel bounds the instructions a template executes, not the size of the values it
//! builds: `{% set ns.s = ns.s ~ ns.s %}` in a loop reaches 2^k bytes in O(k) instructions, and
//! string concatenation has no size hook. So on Linux and Android the render runs in a `fork`ed
//! child whose address space may grow by at most [`RENDER_MAX_MEMORY`] (`RLIMIT_AS`, set from the
//! parent's current size) and which is killed after [`RENDER_TIMEOUT`]; the text (or the error)
//! comes back through a pipe. A child that runs out of memory aborts on its failed allocation and
//! the parent reports that, never the parent itself. Elsewhere the render runs in-process (fuel and
//! the output limit still apply).
//!
//! The child only renders (pure computation and allocation: glibc and musl keep `malloc` usable
//! after `fork`), writes to the pipe and leaves with `_exit`, running no destructor or `atexit`
//! handler of the parent's state.

use std::time::Duration;

use crate::TokenizerError;

/// Memory one render may add to the process's address space.
pub const RENDER_MAX_MEMORY: usize = 256 << 20;

/// Wall-clock time one render may take.
pub const RENDER_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs `render` under the bounds above (in a child process where supported).
pub(crate) fn bounded(
    render: impl FnOnce() -> Result<String, TokenizerError>,
) -> Result<String, TokenizerError> {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        child::run(render)
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    {
        render()
    }
}

#[cfg(any(target_os = "linux", target_os = "android"))]
mod child {
    use std::io::Read;
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::time::Instant;

    use super::{RENDER_MAX_MEMORY, RENDER_TIMEOUT};
    use crate::TokenizerError;

    /// Tags of the one message the child writes: the rendered text or an error's message.
    const TAG_OK: u8 = 0;
    const TAG_ERR: u8 = 1;

    fn err(what: impl Into<String>) -> TokenizerError {
        TokenizerError::Render(what.into())
    }

    /// The process's current address-space size in bytes (`/proc/self/statm`, first field).
    fn address_space() -> Option<u64> {
        let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
        let pages: u64 = statm.split_whitespace().next()?.parse().ok()?;
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        Some(pages.saturating_mul(u64::try_from(page).ok().filter(|&p| p > 0)?))
    }

    pub(super) fn run(
        render: impl FnOnce() -> Result<String, TokenizerError>,
    ) -> Result<String, TokenizerError> {
        let limit = address_space().map(|size| size.saturating_add(RENDER_MAX_MEMORY as u64));
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: `fds` is a valid array of two ints for pipe2 to fill.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(err(format!(
                "cannot create a pipe for the render: {}",
                std::io::Error::last_os_error()
            )));
        }
        // SAFETY: pipe2 succeeded, so both descriptors are open and owned by nobody else.
        let (read_end, write_end) =
            unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // SAFETY: fork has no preconditions; the child below only renders, writes to its pipe and
        // calls `_exit` (see the module docs on why that is sound after fork).
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(err(format!(
                "cannot start the render process: {}",
                std::io::Error::last_os_error()
            )));
        }
        if pid == 0 {
            drop(read_end);
            child_main(render, limit, write_end);
        }
        drop(write_end);
        let mut pipe = std::fs::File::from(read_end);
        let (bytes, timed_out) = read_until_eof(&mut pipe, pid);
        let status = reap(pid, timed_out);
        if timed_out {
            return Err(err(format!(
                "the template ran past {} s",
                RENDER_TIMEOUT.as_secs()
            )));
        }
        decode(bytes, status)
    }

    /// The child: bound its address space, render, send the result, leave.
    fn child_main(
        render: impl FnOnce() -> Result<String, TokenizerError>,
        limit: Option<u64>,
        pipe: OwnedFd,
    ) -> ! {
        if let Some(limit) = limit {
            let mut current = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            // SAFETY: `current` is a valid rlimit for getrlimit to fill; setrlimit reads a valid one.
            unsafe {
                if libc::getrlimit(libc::RLIMIT_AS, &mut current) == 0 {
                    let cur = (limit as libc::rlim_t).min(current.rlim_cur);
                    let bounded = libc::rlimit {
                        rlim_cur: cur,
                        rlim_max: current.rlim_max,
                    };
                    libc::setrlimit(libc::RLIMIT_AS, &bounded);
                }
            }
        }
        // Messages of a failed allocation or a panic in here would reach the user's terminal: the
        // parent reports the outcome instead.
        // SAFETY: open and dup2 on valid arguments; fd 2 is replaced in this child only.
        unsafe {
            let null = libc::open(c"/dev/null".as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if null >= 0 {
                libc::dup2(null, 2);
            }
        }
        // A panic must not unwind out of here into the parent's code running in this child.
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(render));
        let message = match outcome {
            Ok(Ok(text)) => [&[TAG_OK][..], text.as_bytes()].concat(),
            Ok(Err(TokenizerError::Render(what))) => [&[TAG_ERR][..], what.as_bytes()].concat(),
            Ok(Err(other)) => [&[TAG_ERR][..], other.to_string().as_bytes()].concat(),
            // SAFETY: as below.
            Err(_) => unsafe { libc::_exit(2) },
        };
        let mut pipe = std::fs::File::from(pipe);
        let code = match std::io::Write::write_all(&mut pipe, &message) {
            Ok(()) => 0,
            Err(_) => 1,
        };
        // SAFETY: `_exit` ends the child at once; nothing of the parent's state is touched.
        unsafe { libc::_exit(code) }
    }

    /// Reads the child's message until end of file or the deadline (then kills the child).
    fn read_until_eof(pipe: &mut std::fs::File, pid: libc::pid_t) -> (Vec<u8>, bool) {
        use std::os::fd::AsRawFd;
        let deadline = Instant::now() + RENDER_TIMEOUT;
        let mut bytes = Vec::new();
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                // SAFETY: `pid` is our child, not yet reaped, so the pid cannot have been reused.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                return (bytes, true);
            }
            let mut poll = libc::pollfd {
                fd: pipe.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = left.as_millis().clamp(1, i32::MAX as u128) as libc::c_int;
            // SAFETY: `poll` is one valid pollfd.
            let ready = unsafe { libc::poll(&mut poll, 1, ms) };
            if ready < 0 {
                if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return (bytes, false);
            }
            if ready == 0 {
                continue;
            }
            match pipe.read(&mut buf) {
                Ok(0) => return (bytes, false),
                Ok(n) => bytes.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return (bytes, false),
            }
        }
    }

    /// Waits for the child (killing it first if it overran) and returns its wait status.
    fn reap(pid: libc::pid_t, timed_out: bool) -> libc::c_int {
        let mut status = 0;
        loop {
            // SAFETY: `pid` is our child; `status` is a valid int for waitpid to fill.
            let r = unsafe { libc::waitpid(pid, &mut status, 0) };
            if r == pid {
                return status;
            }
            if r < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                // Reaped elsewhere (a SIGCHLD handler set to ignore): judge by the message alone.
                return if timed_out { libc::SIGKILL } else { 0 };
            }
        }
    }

    /// The render's outcome from the child's message and exit status.
    fn decode(bytes: Vec<u8>, status: libc::c_int) -> Result<String, TokenizerError> {
        let exited_ok = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
        match bytes.split_first() {
            Some((&TAG_OK, text)) if exited_ok => String::from_utf8(text.to_vec())
                .map_err(|_| err("the template's output is not UTF-8")),
            Some((&TAG_ERR, what)) if exited_ok => Err(err(String::from_utf8_lossy(what))),
            _ if libc::WIFSIGNALED(status) => {
                let signal = libc::WTERMSIG(status);
                Err(err(if signal == libc::SIGABRT || signal == libc::SIGSEGV {
                    format!(
                        "the template needed more than {} MiB of memory (render process ended by signal {signal})",
                        RENDER_MAX_MEMORY >> 20
                    )
                } else {
                    format!("the render process was ended by signal {signal}")
                }))
            }
            _ => Err(err("the render process ended without a result")),
        }
    }
}
