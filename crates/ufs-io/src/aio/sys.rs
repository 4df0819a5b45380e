//! The raw Linux AIO ABI: the kernel's `struct iocb` and `struct io_event`, and one thin wrapper per
//! system call (`io_setup`, `io_submit`, `io_getevents`, `io_destroy`), nothing else.
//!
//! Each wrapper makes exactly one system call (`io_getevents` repeats it on `EINTR`) and turns a negative
//! return into the OS error. Only [`io_submit`] is `unsafe`: it lends the kernel memory that Rust cannot
//! see being written later. The others write only into memory they borrow for the call, so misuse of
//! them (a wrong context) is an error or a leak, never unsoundness. On targets without Linux AIO
//! every call fails with [`io::ErrorKind::Unsupported`] (so no context can ever exist there).
//!
//! The safe owner of a context is [`super::Aio`].

use std::io;

/// `IOCB_CMD_PREAD`: a positional read into `aio_buf`.
pub const IOCB_CMD_PREAD: u16 = 0;

/// `struct iocb` of `<linux/aio_abi.h>` for little-endian 64-bit targets (64 bytes; the same on
/// x86_64 and aarch64).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Iocb {
    /// Caller's key, returned in [`IoEvent::data`].
    pub aio_data: u64,
    /// Kernel's key (set by the kernel).
    pub aio_key: u32,
    /// `RWF_*` flags (0).
    pub aio_rw_flags: u32,
    /// `IOCB_CMD_*`.
    pub aio_lio_opcode: u16,
    /// Request priority (0).
    pub aio_reqprio: i16,
    /// File descriptor.
    pub aio_fildes: u32,
    /// Address of the destination buffer.
    pub aio_buf: u64,
    /// Bytes to read.
    pub aio_nbytes: u64,
    /// File offset.
    pub aio_offset: i64,
    /// Reserved (0).
    pub aio_reserved2: u64,
    /// `IOCB_FLAG_*` (0).
    pub aio_flags: u32,
    /// eventfd to signal (unused).
    pub aio_resfd: u32,
}

/// `struct io_event` (32 bytes): one finished request.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IoEvent {
    /// The request's [`Iocb::aio_data`].
    pub data: u64,
    /// Address of the request's iocb.
    pub obj: u64,
    /// Bytes transferred, or `-errno`.
    pub res: i64,
    /// Secondary result (0).
    pub res2: i64,
}

const _: () = assert!(std::mem::size_of::<Iocb>() == 64);
const _: () = assert!(std::mem::size_of::<IoEvent>() == 32);

#[cfg(any(target_os = "linux", target_os = "android"))]
fn check(rc: libc::c_long) -> io::Result<usize> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc as usize)
    }
}

/// `io_setup(nr, &ctx)`: a new context for up to `nr` requests in flight.
///
/// Contract: the returned context belongs to the caller, who must end it with [`io_destroy`] (the
/// kernel would otherwise keep it, and the reads it holds, until the process exits).
#[cfg(any(target_os = "linux", target_os = "android"))]
pub fn io_setup(nr: u32) -> io::Result<u64> {
    let mut ctx: u64 = 0;
    // SAFETY: io_setup writes one aio_context_t (u64) through the pointer, which points at `ctx`, a
    // live u64 initialised to 0 as the call requires.
    check(unsafe { libc::syscall(libc::SYS_io_setup, nr as libc::c_long, &mut ctx as *mut u64) })?;
    Ok(ctx)
}

/// `io_submit(ctx, n, iocbpp)`: queues the requests and returns how many of the first ones the kernel
/// took (an error means none).
///
/// # Safety
/// `ctx` is a context from [`io_setup`] not yet destroyed. Every pointer in `iocbs` points at a live
/// [`Iocb`] (read during the call only). For every request taken, its buffer
/// `aio_buf..aio_buf + aio_nbytes` must stay allocated, writable and unaccessed by anything else, and
/// its descriptor `aio_fildes` open, until [`io_getevents`] has returned its event (or the context
/// has been destroyed with [`io_destroy`], which waits for it).
#[cfg(any(target_os = "linux", target_os = "android"))]
pub unsafe fn io_submit(ctx: u64, iocbs: &mut [*mut Iocb]) -> io::Result<usize> {
    // SAFETY: per this function's contract; `iocbs` is a live array of `iocbs.len()` pointers.
    check(unsafe {
        libc::syscall(
            libc::SYS_io_submit,
            ctx as libc::c_ulong,
            iocbs.len() as libc::c_long,
            iocbs.as_mut_ptr(),
        )
    })
}

/// `io_getevents(ctx, min, out.len(), out, NULL)`: blocks until at least `min` (at most `out.len()`)
/// requests have finished and returns how many events it wrote to the front of `out`; retried on
/// `EINTR`.
///
/// Contract: an event returned here hands the request's buffer and descriptor back to the caller; the
/// kernel does not touch them again.
#[cfg(any(target_os = "linux", target_os = "android"))]
pub fn io_getevents(ctx: u64, min: usize, out: &mut [IoEvent]) -> io::Result<usize> {
    loop {
        // SAFETY: the kernel writes at most `out.len()` io_events into `out`, a live, writable array of
        // that many; a null timeout means wait without limit.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_io_getevents,
                ctx as libc::c_ulong,
                min.min(out.len()) as libc::c_long,
                out.len() as libc::c_long,
                out.as_mut_ptr(),
                std::ptr::null_mut::<libc::timespec>(),
            )
        };
        match check(rc) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            r => return r,
        }
    }
}

/// `io_destroy(ctx)`: ends the context; the kernel cancels what it can and waits for the rest of its
/// requests before returning. The result is ignored (there is nothing to do about a failure).
///
/// Contract: `ctx` is not used after this call.
#[cfg(any(target_os = "linux", target_os = "android"))]
pub fn io_destroy(ctx: u64) {
    // SAFETY: io_destroy takes the context by value and touches no user memory.
    unsafe { libc::syscall(libc::SYS_io_destroy, ctx as libc::c_ulong) };
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn unsupported() -> io::Error {
    io::Error::from(io::ErrorKind::Unsupported)
}

/// No kernel AIO on this target: always fails.
#[cfg(not(any(target_os = "linux", target_os = "android")))]
pub fn io_setup(_nr: u32) -> io::Result<u64> {
    Err(unsupported())
}

/// No kernel AIO on this target: always fails (no context can exist).
///
/// # Safety
/// None needed here; `unsafe` only to match the Linux signature.
#[cfg(not(any(target_os = "linux", target_os = "android")))]
pub unsafe fn io_submit(_ctx: u64, _iocbs: &mut [*mut Iocb]) -> io::Result<usize> {
    Err(unsupported())
}

/// No kernel AIO on this target: always fails (no context can exist).
#[cfg(not(any(target_os = "linux", target_os = "android")))]
pub fn io_getevents(_ctx: u64, _min: usize, _out: &mut [IoEvent]) -> io::Result<usize> {
    Err(unsupported())
}

/// No kernel AIO on this target: nothing to end.
#[cfg(not(any(target_os = "linux", target_os = "android")))]
pub fn io_destroy(_ctx: u64) {}
