//! Kernel asynchronous reads (Linux AIO) for the I/O thread, behind a safe API.
//!
//! With `O_DIRECT`, Linux AIO hands each read to the block layer at once, so one thread can keep
//! several reads in the device's queue (PowerInfer-2's engines read cold neurons with AIO too). The raw
//! system calls live in [`sys`]; [`Aio`] is the safe owner of a context that the I/O thread keeps.
//! Where the kernel (or a seccomp policy) refuses `io_setup`, or on another OS, [`Aio::new`] fails and
//! the engine reads with `pread`, one at a time.
//!
//! # Ownership
//!
//! [`Aio::submit`] takes each [`AioRead`] by value: its [`AlignedBuf`] (the destination), the
//! [`IoFile`] whose descriptor the kernel reads (an `Arc`, so the file stays open) and a caller's tag.
//! It keeps every read the kernel took in an in-flight table whose slot number is the iocb's
//! `aio_data`, and returns the reads the kernel did not take, untouched. [`Aio::wait`] gives each
//! finished read back whole, with its result ([`AioDone`]). So while the kernel may write into a buffer,
//! no caller holds it: it cannot be read, moved out or freed. No `unsafe` is needed above this module.
//!
//! # Invariants
//!
//! * A slot of the table is filled exactly while its read is in the kernel (taken by `io_submit`, its
//!   event not yet returned by `io_getevents`); [`Aio::outstanding`] counts the filled slots.
//! * The table has `capacity` slots from the start and never reallocates; an [`AlignedBuf`]'s heap
//!   memory does not move with the struct anyway.
//! * **Drop with reads outstanding is sound.** `Drop` first reaps every outstanding read (their buffers
//!   are freed only after the kernel reported them), then destroys the context. The context is the
//!   first field, declared before the table, so even if dropping unwinds it is destroyed (`io_destroy`
//!   waits for the context's reads on current kernels) before the table and its buffers are freed.
//! * **If reaping fails, buffers are leaked, never freed.** `io_getevents` cannot fail on a valid
//!   context; if it does, the kernel may still write into the outstanding buffers, so `Drop` and
//!   [`Aio::abandon`] forget them (and their files) instead of freeing them.

mod sys;
#[cfg(test)]
mod tests;

use std::io;
use std::sync::Arc;

use crate::{AlignedBuf, IoFile};

/// One read for [`Aio::submit`]: `buf.len()` bytes at `offset` of `file` into `buf`, with the caller's
/// `tag`. Given back whole by [`Aio::wait`] (or by `submit`, if the kernel did not take it).
pub(crate) struct AioRead<T> {
    /// The file (kept open while the kernel reads it).
    pub file: Arc<IoFile>,
    /// File offset (a multiple of 4096 for `O_DIRECT`).
    pub offset: u64,
    /// Destination; its whole length is read.
    pub buf: AlignedBuf,
    /// Caller's value, handed back with the read.
    pub tag: T,
}

/// A finished read: the read given back, and the bytes read (fewer than asked at the end of the file)
/// or the OS error.
pub(crate) struct AioDone<T> {
    /// The read as submitted, `buf` now holding the bytes.
    pub read: AioRead<T>,
    /// Bytes read, or the error the kernel reported.
    pub result: io::Result<usize>,
}

/// An AIO context from `io_setup`, destroyed when dropped.
struct Context(u64);

impl Drop for Context {
    fn drop(&mut self) {
        sys::io_destroy(self.0);
    }
}

/// A Linux AIO context of a fixed capacity with its in-flight table, owned by the I/O thread.
pub(crate) struct Aio<T> {
    /// First field: dropped before `flying` (see the module's invariants).
    ctx: Context,
    /// The in-flight table: slot `i` holds the read whose iocb carries `aio_data == i`.
    flying: Vec<Option<AioRead<T>>>,
    /// Empty slots.
    free: Vec<usize>,
    outstanding: usize,
    iocbs: Vec<sys::Iocb>,
    events: Vec<sys::IoEvent>,
}

impl<T> Aio<T> {
    /// A context for up to `capacity` (clamped to 1..=65536) reads in flight.
    pub fn new(capacity: usize) -> io::Result<Self> {
        let capacity = capacity.clamp(1, 1 << 16);
        let ctx = Context(sys::io_setup(capacity as u32)?);
        Ok(Self {
            ctx,
            flying: (0..capacity).map(|_| None).collect(),
            free: (0..capacity).rev().collect(),
            outstanding: 0,
            iocbs: Vec::with_capacity(capacity),
            events: vec![sys::IoEvent::default(); capacity],
        })
    }

    /// Reads submitted and not yet returned by [`Aio::wait`].
    pub fn outstanding(&self) -> usize {
        self.outstanding
    }

    /// Room for more reads.
    pub fn room(&self) -> usize {
        self.free.len()
    }

    /// Hands the reads (at most [`Aio::room`] of them, in order) to the kernel and returns the ones it
    /// did not take, in order, for the caller to serve another way: the first ones are taken, and an
    /// error of `io_submit` means none (more) were.
    pub fn submit(&mut self, reads: Vec<AioRead<T>>) -> Vec<AioRead<T>> {
        let n = reads.len().min(self.room());
        let mut reads = reads.into_iter();
        let mut slots = Vec::with_capacity(n);
        self.iocbs.clear();
        for mut r in reads.by_ref().take(n) {
            let slot = self.free.pop().expect("n is at most the room");
            self.iocbs.push(sys::Iocb {
                aio_data: slot as u64,
                aio_lio_opcode: sys::IOCB_CMD_PREAD,
                aio_fildes: r.file.raw_fd() as u32,
                aio_buf: r.buf.as_mut_ptr() as u64,
                aio_nbytes: r.buf.len() as u64,
                aio_offset: r.offset as i64,
                ..Default::default()
            });
            // The struct moves into the table; the heap memory `aio_buf` points at does not.
            self.flying[slot] = Some(r);
            slots.push(slot);
        }
        let mut ptrs: Vec<*mut sys::Iocb> = self.iocbs.iter_mut().map(|c| c as *mut _).collect();
        let mut taken = 0;
        while taken < n {
            // SAFETY: the iocbs live in `self.iocbs` for the call. The buffer and the file of each one
            // belong to the read in its slot of `self.flying`, which only `wait` (once the kernel has
            // returned the slot), `abandon` or `Drop` (both leak it unless reaped) takes out, and `ctx`
            // lives as long as `self`; the reads not taken are removed from the table below.
            match unsafe { sys::io_submit(self.ctx.0, &mut ptrs[taken..n]) } {
                Ok(0) => break,
                Ok(k) => taken += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
        self.outstanding += taken;
        let mut rest: Vec<AioRead<T>> = slots[taken..]
            .iter()
            .map(|&slot| {
                self.free.push(slot);
                self.flying[slot].take().expect("slot just filled")
            })
            .collect();
        rest.extend(reads);
        rest
    }

    /// Waits for at least `min` (clamped to 1..=outstanding) reads to finish and gives each back with
    /// its result. Nothing outstanding: returns at once with none. On an error no read is returned and
    /// the outstanding ones stay the kernel's (see [`Aio::abandon`]).
    pub fn wait(&mut self, min: usize) -> io::Result<Vec<AioDone<T>>> {
        if self.outstanding == 0 {
            return Ok(Vec::new());
        }
        let n = sys::io_getevents(
            self.ctx.0,
            min.clamp(1, self.outstanding),
            &mut self.events[..self.outstanding],
        )?;
        self.outstanding -= n;
        let (flying, free) = (&mut self.flying, &mut self.free);
        Ok(self.events[..n]
            .iter()
            .map(|e| {
                let slot = e.data as usize;
                let read = flying
                    .get_mut(slot)
                    .and_then(Option::take)
                    .expect("the kernel returns the slots it was given");
                free.push(slot);
                let result = if e.res < 0 {
                    Err(io::Error::from_raw_os_error((-e.res) as i32))
                } else {
                    Ok(e.res as usize)
                };
                AioDone { read, result }
            })
            .collect())
    }

    /// Gives up on the outstanding reads after a failed [`Aio::wait`] and ends the context: the kernel
    /// may still write into their buffers, so the buffers and their files are leaked (never freed),
    /// and only their tags come back, in slot order, for the caller to serve another way.
    pub fn abandon(mut self) -> Vec<T> {
        self.leak_outstanding()
    }

    /// Empties the table, leaking the buffer and the file of every read in it, and returns their tags.
    fn leak_outstanding(&mut self) -> Vec<T> {
        self.outstanding = 0;
        self.flying
            .iter_mut()
            .filter_map(Option::take)
            .map(|r| {
                std::mem::forget(r.buf);
                std::mem::forget(r.file);
                r.tag
            })
            .collect()
    }
}

impl<T> Drop for Aio<T> {
    fn drop(&mut self) {
        while self.outstanding > 0 {
            if self.wait(self.outstanding).is_err() {
                self.leak_outstanding();
            }
        }
        // Then `ctx` is dropped (io_destroy), then the table, now empty.
    }
}
