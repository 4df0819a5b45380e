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
    use std::os::fd::OwnedFd;
    use std::time::Instant;

    use super::{RENDER_MAX_MEMORY, RENDER_TIMEOUT};
    use crate::sys::{self, Ended, Pid};
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
        Some(pages.saturating_mul(sys::page_size()?))
    }

    pub(super) fn run(
        render: impl FnOnce() -> Result<String, TokenizerError>,
    ) -> Result<String, TokenizerError> {
        let limit = address_space().map(|size| size.saturating_add(RENDER_MAX_MEMORY as u64));
        let (read_end, write_end) =
            sys::pipe().map_err(|e| err(format!("cannot create a pipe for the render: {e}")))?;
        // SAFETY: the child below only renders, writes to its pipe and leaves with `exit_now`
        // (see the module docs on why that is sound after fork).
        let pid = match unsafe { sys::fork() } {
            Err(e) => return Err(err(format!("cannot start the render process: {e}"))),
            Ok(None) => {
                drop(read_end);
                child_main(render, limit, write_end);
            }
            Ok(Some(pid)) => pid,
        };
        drop(write_end);
        let mut pipe = std::fs::File::from(read_end);
        let (bytes, timed_out) = read_until_eof(&mut pipe, pid);
        let ended = sys::wait_child(pid);
        if timed_out {
            return Err(err(format!(
                "the template ran past {} s",
                RENDER_TIMEOUT.as_secs()
            )));
        }
        decode(bytes, ended)
    }

    /// The child: bound its address space, render, send the result, leave.
    fn child_main(
        render: impl FnOnce() -> Result<String, TokenizerError>,
        limit: Option<u64>,
        pipe: OwnedFd,
    ) -> ! {
        if let Some(limit) = limit {
            sys::limit_address_space(limit);
        }
        // Messages of a failed allocation or a panic in here would reach the user's terminal: the
        // parent reports the outcome instead.
        sys::silence_stderr();
        // A panic must not unwind out of here into the parent's code running in this child.
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(render));
        let message = match outcome {
            Ok(Ok(text)) => [&[TAG_OK][..], text.as_bytes()].concat(),
            Ok(Err(TokenizerError::Render(what))) => [&[TAG_ERR][..], what.as_bytes()].concat(),
            Ok(Err(other)) => [&[TAG_ERR][..], other.to_string().as_bytes()].concat(),
            Err(_) => sys::exit_now(2),
        };
        let mut pipe = std::fs::File::from(pipe);
        let code = match std::io::Write::write_all(&mut pipe, &message) {
            Ok(()) => 0,
            Err(_) => 1,
        };
        sys::exit_now(code)
    }

    /// Reads the child's message until end of file or the deadline (then kills the child).
    fn read_until_eof(pipe: &mut std::fs::File, pid: Pid) -> (Vec<u8>, bool) {
        let deadline = Instant::now() + RENDER_TIMEOUT;
        let mut bytes = Vec::new();
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                sys::kill_child(pid);
                return (bytes, true);
            }
            match sys::wait_readable(pipe, left) {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => return (bytes, false),
                Ok(false) => continue,
                Ok(true) => {}
            }
            match pipe.read(&mut buf) {
                Ok(0) => return (bytes, false),
                Ok(n) => bytes.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return (bytes, false),
            }
        }
    }

    /// The render's outcome from the child's message and how it ended (reaped elsewhere: judged by
    /// the message alone).
    fn decode(bytes: Vec<u8>, ended: Ended) -> Result<String, TokenizerError> {
        let exited_ok = matches!(ended, Ended::Exited(0) | Ended::Unknown);
        match bytes.split_first() {
            Some((&TAG_OK, text)) if exited_ok => String::from_utf8(text.to_vec())
                .map_err(|_| err("the template's output is not UTF-8")),
            Some((&TAG_ERR, what)) if exited_ok => Err(err(String::from_utf8_lossy(what))),
            _ => match ended {
                Ended::Signaled(signal) => {
                    Err(err(if signal == sys::SIGABRT || signal == sys::SIGSEGV {
                        format!(
                            "the template needed more than {} MiB of memory (render process ended by signal {signal})",
                            RENDER_MAX_MEMORY >> 20
                        )
                    } else {
                        format!("the render process was ended by signal {signal}")
                    }))
                }
                _ => Err(err("the render process ended without a result")),
            },
        }
    }
}
