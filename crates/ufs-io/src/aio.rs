//! Kernel asynchronous reads (Linux AIO: `io_setup`, `io_submit`, `io_getevents`) for the I/O thread.
//!
//! With `O_DIRECT`, Linux AIO hands each read to the block layer at once, so one thread can keep
//! several reads in the device's queue (PowerInfer-2's engines read cold neurons with AIO too). The raw
//! system calls live in [`sys`]; [`Aio`] is the safe wrapper the I/O thread owns. Where the kernel (or a
//! seccomp policy) refuses `io_setup`, [`Aio::new`] fails and the engine reads with `pread`, one at a time.
//!
//! Invariant: a buffer handed to [`Aio::submit`] is owned by the caller's in-flight table until its
//! event comes back from [`Aio::wait`]; [`Aio`]'s `Drop` waits for every submitted read before it
//! destroys the context, so no read can land in freed memory.

use std::io;

/// Raw Linux AIO ABI (the kernel's `struct iocb` / `struct io_event`, identical on x86_64 and aarch64).
#[cfg(any(target_os = "linux", target_os = "android"))]
mod sys {
    use std::io;

    /// `IOCB_CMD_PREAD`.
    pub const IOCB_CMD_PREAD: u16 = 0;

    /// `struct iocb` of `<linux/aio_abi.h>` for little-endian 64-bit targets (64 bytes).
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    pub struct Iocb {
        pub aio_data: u64,
        pub aio_key: u32,
        pub aio_rw_flags: u32,
        pub aio_lio_opcode: u16,
        pub aio_reqprio: i16,
        pub aio_fildes: u32,
        pub aio_buf: u64,
        pub aio_nbytes: u64,
        pub aio_offset: i64,
        pub aio_reserved2: u64,
        pub aio_flags: u32,
        pub aio_resfd: u32,
    }

    /// `struct io_event` (32 bytes).
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    pub struct IoEvent {
        pub data: u64,
        pub obj: u64,
        pub res: i64,
        pub res2: i64,
    }

    const _: () = assert!(std::mem::size_of::<Iocb>() == 64);
    const _: () = assert!(std::mem::size_of::<IoEvent>() == 32);

    fn check(rc: libc::c_long) -> io::Result<usize> {
        if rc < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(rc as usize)
        }
    }

    /// `io_setup(nr, &ctx)`.
    pub fn io_setup(nr: u32) -> io::Result<u64> {
        let mut ctx: u64 = 0;
        // SAFETY: io_setup writes one aio_context_t (u64) through the pointer, which points at `ctx`,
        // a live u64 initialised to 0 as the call requires.
        check(unsafe {
            libc::syscall(libc::SYS_io_setup, nr as libc::c_long, &mut ctx as *mut u64)
        })?;
        Ok(ctx)
    }

    /// `io_destroy(ctx)`.
    pub fn io_destroy(ctx: u64) {
        // SAFETY: io_destroy takes the context by value and touches no user memory; it waits for the
        // context's outstanding reads (callers have reaped them all anyway). Its result is ignored.
        unsafe { libc::syscall(libc::SYS_io_destroy, ctx as libc::c_ulong) };
    }

    /// `io_submit(ctx, n, iocbpp)`: how many of the first iocbs were queued.
    ///
    /// # Safety
    /// Every pointer in `iocbs` points at a live `Iocb` (read during the call only) whose buffer
    /// `aio_buf..aio_buf + aio_nbytes` stays valid, writable and otherwise unused until its event has
    /// been reaped by `io_getevents`, and whose file descriptor stays open until then.
    pub unsafe fn io_submit(ctx: u64, iocbs: &mut [*mut Iocb]) -> io::Result<usize> {
        // SAFETY: per the contract above; `iocbs` is a live array of `len` pointers.
        check(unsafe {
            libc::syscall(
                libc::SYS_io_submit,
                ctx as libc::c_ulong,
                iocbs.len() as libc::c_long,
                iocbs.as_mut_ptr(),
            )
        })
    }

    /// `io_getevents(ctx, min, out.len(), out, NULL)`: blocks until `min` events, returns how many were
    /// written to `out`.
    pub fn io_getevents(ctx: u64, min: usize, out: &mut [IoEvent]) -> io::Result<usize> {
        loop {
            // SAFETY: the kernel writes at most `out.len()` io_events into `out`, a live, writable array
            // of that many; a null timeout means wait without limit.
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
}

/// One read for [`Aio::submit`]: `len` bytes at `offset` of `fd` into `buf`, reported with `data`.
pub(crate) struct AioRead {
    /// Raw descriptor of an open file.
    pub fd: i32,
    /// Destination (4096-aligned for `O_DIRECT`).
    pub buf: *mut u8,
    /// Bytes to read.
    pub len: usize,
    /// File offset.
    pub offset: u64,
    /// Caller's key, returned by [`Aio::wait`].
    pub data: u64,
}

/// A Linux AIO context of a fixed capacity, owned by the I/O thread.
#[cfg(any(target_os = "linux", target_os = "android"))]
pub(crate) struct Aio {
    ctx: u64,
    capacity: usize,
    outstanding: usize,
    iocbs: Vec<sys::Iocb>,
    events: Vec<sys::IoEvent>,
}

#[cfg(any(target_os = "linux", target_os = "android"))]
impl Aio {
    /// A context for up to `capacity` reads in flight.
    pub fn new(capacity: usize) -> io::Result<Self> {
        let capacity = capacity.clamp(1, 1 << 16);
        let ctx = sys::io_setup(capacity as u32)?;
        Ok(Self {
            ctx,
            capacity,
            outstanding: 0,
            iocbs: Vec::with_capacity(capacity),
            events: vec![sys::IoEvent::default(); capacity],
        })
    }

    /// Reads submitted and not yet returned by [`Aio::wait`].
    pub fn outstanding(&self) -> usize {
        self.outstanding
    }

    /// Forgets the outstanding reads after a failed [`Aio::wait`] (their buffers must then never be
    /// freed: the caller leaks them); `Drop` still destroys the context, which waits for them.
    pub fn abandon(&mut self) {
        self.outstanding = 0;
    }

    /// Room for more reads.
    pub fn room(&self) -> usize {
        self.capacity - self.outstanding
    }

    /// Queues the reads (at most [`Aio::room`]) and returns how many the kernel took, in order; the rest
    /// are the caller's to serve another way. An error means none of them was taken.
    ///
    /// # Safety
    /// For every read taken, `buf..buf + len` must stay valid, writable and unused by anyone else, and
    /// `fd` open, until [`Aio::wait`] has returned its `data`.
    pub unsafe fn submit(&mut self, reads: &[AioRead]) -> io::Result<usize> {
        let n = reads.len().min(self.room());
        self.iocbs.clear();
        self.iocbs.extend(reads[..n].iter().map(|r| sys::Iocb {
            aio_data: r.data,
            aio_lio_opcode: sys::IOCB_CMD_PREAD,
            aio_fildes: r.fd as u32,
            aio_buf: r.buf as u64,
            aio_nbytes: r.len as u64,
            aio_offset: r.offset as i64,
            ..Default::default()
        }));
        let mut ptrs: Vec<*mut sys::Iocb> = self.iocbs.iter_mut().map(|c| c as *mut _).collect();
        let mut taken = 0;
        while taken < n {
            // SAFETY: the iocbs are live in `self.iocbs` for the call; their buffers and descriptors
            // are valid until reaped per this function's contract.
            match unsafe { sys::io_submit(self.ctx, &mut ptrs[taken..n]) } {
                Ok(0) => break,
                Ok(k) => taken += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) if taken > 0 => break,
                Err(e) => return Err(e),
            }
        }
        self.outstanding += taken;
        Ok(taken)
    }

    /// Waits for at least `min` (at most the outstanding count) reads to finish and returns each as
    /// `(data, result)`: the bytes read (fewer than asked at the end of the file) or the OS error.
    pub fn wait(&mut self, min: usize) -> io::Result<Vec<(u64, io::Result<usize>)>> {
        if self.outstanding == 0 {
            return Ok(Vec::new());
        }
        let n = sys::io_getevents(
            self.ctx,
            min.clamp(1, self.outstanding),
            &mut self.events[..self.outstanding],
        )?;
        self.outstanding -= n;
        Ok(self.events[..n]
            .iter()
            .map(|e| {
                let r = if e.res < 0 {
                    Err(io::Error::from_raw_os_error((-e.res) as i32))
                } else {
                    Ok(e.res as usize)
                };
                (e.data, r)
            })
            .collect())
    }
}

#[cfg(any(target_os = "linux", target_os = "android"))]
impl Drop for Aio {
    fn drop(&mut self) {
        while self.outstanding > 0 {
            if self.wait(self.outstanding).is_err() {
                break;
            }
        }
        sys::io_destroy(self.ctx);
    }
}

/// Elsewhere there is no kernel AIO: [`Aio::new`] always fails and the engine uses `pread`.
#[cfg(not(any(target_os = "linux", target_os = "android")))]
pub(crate) struct Aio(());

#[cfg(not(any(target_os = "linux", target_os = "android")))]
impl Aio {
    pub fn new(_capacity: usize) -> io::Result<Self> {
        Err(io::Error::from(io::ErrorKind::Unsupported))
    }
    pub fn outstanding(&self) -> usize {
        0
    }
    pub fn abandon(&mut self) {}
    pub fn room(&self) -> usize {
        0
    }
    pub unsafe fn submit(&mut self, _reads: &[AioRead]) -> io::Result<usize> {
        Ok(0)
    }
    pub fn wait(&mut self, _min: usize) -> io::Result<Vec<(u64, io::Result<usize>)>> {
        Ok(Vec::new())
    }
}
