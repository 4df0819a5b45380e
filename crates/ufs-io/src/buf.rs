//! [`AlignedBuf`]: heap memory aligned for direct I/O.

use std::alloc::{self, Layout};
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

use crate::{IoError, Result, ALIGN};

/// A heap buffer whose start is aligned to [`ALIGN`] (4096) bytes and whose length is a multiple of
/// [`ALIGN`], as `O_DIRECT` reads require. Derefs to `[u8]`. Every byte of its allocation is
/// initialised (zeroed, or copied in, at allocation; for [`AlignedBuf::uninit`], by the read that
/// fills it before any byte is read), so its length may move within the allocation
/// ([`AlignedBuf::set_len`]) and one buffer serve reads of different lengths.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    /// Bytes allocated (`len <= cap`).
    cap: usize,
    /// Mapped from the kernel ([`MAP_MIN`] bytes or more, on Unix) rather than the global allocator.
    mapped: bool,
}

/// Buffers of this many bytes or more are mapped from the kernel and given back to it when dropped,
/// not taken from the global allocator: reads of whole experts (megabytes each) come and go by the
/// hundred, and glibc's allocator, which takes large blocks from its heaps once one was freed,
/// kept the freed ones (on a Qwen3-30B-A3B-width bundle at a 25% cap the process grew from 506 MiB
/// to the cgroup's 755 MiB limit; 679 MiB were budgeted).
pub const MAP_MIN: usize = 1 << 20;

/// Mapped buffers kept for reuse after being dropped, at most this many bytes in all; past it a
/// dropped buffer is unmapped. Mapping a fresh buffer costs its pages' faults and zeroing, which
/// on a prompt's hundreds of expert reads was slower than the reads' own copies (time to first
/// token 3.5 s against 1.8 s); a few buffers kept serve the next reads of about the same size.
pub const POOL_MAX: usize = 32 << 20;

/// The mapped buffers kept: (address, bytes mapped).
#[cfg(unix)]
static POOL: std::sync::Mutex<Vec<(usize, usize)>> = std::sync::Mutex::new(Vec::new());

/// A kept mapping of at least `len` bytes and at most a quarter more, taken out of the pool.
#[cfg(unix)]
fn pool_take(len: usize) -> Option<(NonNull<u8>, usize)> {
    let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
    let i = (0..pool.len())
        .filter(|&i| pool[i].1 >= len && pool[i].1 <= len + len / 4)
        .min_by_key(|&i| pool[i].1)?;
    let (addr, cap) = pool.swap_remove(i);
    NonNull::new(addr as *mut u8).map(|p| (p, cap))
}

/// Keeps the mapping `(ptr, cap)` for reuse if the pool has room; returns whether it did.
#[cfg(unix)]
fn pool_keep(ptr: NonNull<u8>, cap: usize) -> bool {
    let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
    if pool.iter().map(|&(_, c)| c).sum::<usize>() + cap > POOL_MAX {
        return false;
    }
    pool.push((ptr.as_ptr() as usize, cap));
    true
}

/// Bytes the pool holds now.
#[cfg(all(unix, test))]
fn pool_bytes() -> usize {
    POOL.lock().unwrap().iter().map(|&(_, c)| c).sum()
}

// SAFETY: AlignedBuf owns its allocation exclusively (like Box<[u8]>); no interior mutability.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared references only give out `&[u8]`.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes; `len` must be a multiple of 4096 (0 is allowed).
    pub fn new(len: usize) -> Result<Self> {
        // SAFETY: `alloc_zeroed` is called with the layout `allocate` passes.
        unsafe { Self::allocate(len, true, |l| alloc::alloc_zeroed(l)) }
    }

    /// A buffer of `len` bytes (a multiple of 4096) not zeroed first, for a read that fills it
    /// through [`AlignedBuf::as_mut_ptr`] (the kernel's, for an asynchronous read): zeroing a
    /// buffer the read overwrites costs the I/O thread a pass over every byte.
    ///
    /// # Safety
    /// No byte of it may be read (through `Deref`, `DerefMut` or a copy) before every byte has
    /// been written, by that read or by [`AlignedBuf::zero_from`]; dropping it unread is fine.
    pub unsafe fn uninit(len: usize) -> Result<Self> {
        // SAFETY: `alloc` is called with the layout `allocate` passes; the caller writes every
        // byte before any is read.
        unsafe { Self::allocate(len, false, |l| alloc::alloc(l)) }
    }

    /// The buffer's start, for a writer that fills it (no slice of it is made, so this is also how
    /// an [`AlignedBuf::uninit`] buffer is handed to a read).
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Zeroes bytes `from..len` through the pointer (they may never have been written).
    pub fn zero_from(&mut self, from: usize) {
        if from < self.len {
            // SAFETY: `from..len` lies inside the allocation, which this buffer owns; writing
            // bytes initialises them and needs no slice over them.
            unsafe { std::ptr::write_bytes(self.ptr.as_ptr().add(from), 0, self.len - from) };
        }
    }

    /// A buffer holding a copy of `bytes` (whose length must be a multiple of 4096), not zeroed
    /// first.
    pub fn copy_from(bytes: &[u8]) -> Result<Self> {
        // SAFETY: `alloc` is called with the layout `allocate` passes.
        let b = unsafe { Self::allocate(bytes.len(), false, |l| alloc::alloc(l)) }?;
        if b.len > 0 {
            // SAFETY: the new allocation holds `bytes.len()` bytes and overlaps nothing; after the
            // copy every byte of it is initialised, before any slice of it is made.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), b.ptr.as_ptr(), b.len) };
        }
        Ok(b)
    }

    /// `len` bytes from `raw` (called with their layout when `len > 0`), dangling when 0; of
    /// [`MAP_MIN`] bytes or more, a kept mapping or a new one, zeroed first where `zeroed`.
    ///
    /// # Safety
    /// `raw` allocates with the global allocator for the layout it is given; where it does not
    /// zero (and `zeroed` is false), the caller initialises every byte before the buffer is read.
    unsafe fn allocate(
        len: usize,
        zeroed: bool,
        raw: impl FnOnce(Layout) -> *mut u8,
    ) -> Result<Self> {
        if len % ALIGN != 0 {
            return Err(IoError::BufLen { len });
        }
        if len == 0 {
            // A dangling but aligned pointer: never dereferenced for a non-empty slice, never freed.
            let ptr = NonNull::new(ALIGN as *mut u8).expect("ALIGN is non-zero");
            return Ok(Self {
                ptr,
                len,
                cap: 0,
                mapped: false,
            });
        }
        #[cfg(unix)]
        if len >= MAP_MIN {
            if let Some((ptr, cap)) = pool_take(len) {
                if zeroed {
                    // SAFETY: the kept mapping holds `cap >= len` bytes, owned by this buffer now.
                    unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, len) };
                }
                // Every byte of it was initialised when it was mapped (zeroed) or written since.
                return Ok(Self {
                    ptr,
                    len,
                    cap,
                    mapped: true,
                });
            }
            // Zeroed by the kernel: whole whichever way it is allocated; page-aligned (ALIGN).
            let ptr =
                NonNull::new(crate::file::sys::map_anon(len)).ok_or(IoError::BufLen { len })?;
            return Ok(Self {
                ptr,
                len,
                cap: len,
                mapped: true,
            });
        }
        let layout = Layout::from_size_align(len, ALIGN).map_err(|_| IoError::BufLen { len })?;
        let ptr = NonNull::new(raw(layout)).ok_or(IoError::BufLen { len })?;
        Ok(Self {
            ptr,
            len,
            cap: len,
            mapped: false,
        })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Bytes allocated: the most [`AlignedBuf::set_len`] may set.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Sets the length to `len` (a multiple of 4096, at most [`AlignedBuf::capacity`]); the bytes
    /// are whatever the allocation held (zeroed at allocation, or written since).
    pub fn set_len(&mut self, len: usize) -> Result<()> {
        if len % ALIGN != 0 || len > self.cap {
            return Err(IoError::BufLen { len });
        }
        self.len = len;
        Ok(())
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for cap >= len initialised bytes (zeroed or copied in at allocation)
        // owned by self, or dangling and aligned with len == 0.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and `&mut self` guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        #[cfg(unix)]
        if self.mapped {
            if !pool_keep(self.ptr, self.cap) {
                // SAFETY: ptr and cap are the mapping `allocate` made for this buffer, which owns
                // it; it is unmapped once, here, and no slice of it outlives the buffer.
                unsafe { crate::file::sys::unmap(self.ptr.as_ptr(), self.cap) };
            }
            return;
        }
        if self.cap > 0 {
            let layout = Layout::from_size_align(self.cap, ALIGN).expect("checked at allocation");
            // SAFETY: ptr was allocated by the global allocator with exactly this layout and is
            // freed once.
            unsafe { alloc::dealloc(self.ptr.as_ptr(), layout) };
        }
    }
}

impl Clone for AlignedBuf {
    fn clone(&self) -> Self {
        Self::copy_from(self).unwrap_or_else(|_| alloc::handle_alloc_error(Layout::new::<u8>()))
    }
}

impl fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AlignedBuf({} bytes)", self.len)
    }
}

impl PartialEq for AlignedBuf {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}
impl Eq for AlignedBuf {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_zeroed() {
        // Heap buffers, and mapped ones (MAP_MIN and more) on either side of the threshold.
        for len in [0, 4096, 3 * 4096, MAP_MIN - 4096, MAP_MIN, MAP_MIN + 4096] {
            let mut b = AlignedBuf::new(len).unwrap();
            assert_eq!(b.as_ptr() as usize % ALIGN, 0);
            assert_eq!(b.len(), len);
            assert!(b.iter().all(|&x| x == 0));
            b.iter_mut().enumerate().for_each(|(i, x)| *x = i as u8);
            let c = b.clone();
            assert_eq!(b, c);
        }
    }

    /// A buffer not zeroed first holds what its writer put through the pointer, and zeroes from
    /// where the writer stopped.
    #[test]
    fn an_uninit_buffer_is_what_was_written_then_zeroed() {
        let len = 2 * 4096;
        // SAFETY: every byte is written below (1000 through the pointer, the rest by
        // `zero_from`) before any is read.
        let mut b = unsafe { AlignedBuf::uninit(len) }.unwrap();
        assert_eq!(b.as_mut_ptr() as usize % ALIGN, 0);
        let p = b.as_mut_ptr();
        for i in 0..1000 {
            // SAFETY: `i < 1000 <= len`, inside the allocation.
            unsafe { p.add(i).write(i as u8 | 1) };
        }
        b.zero_from(1000);
        assert!(b[..1000].iter().enumerate().all(|(i, &x)| x == i as u8 | 1));
        assert!(b[1000..].iter().all(|&x| x == 0));
        b.zero_from(len);
        assert_eq!(b.len(), len);
    }

    /// Buffers of [`MAP_MIN`] bytes or more are mapped from the kernel, zeroed and writable; dropped,
    /// they are kept for reuse up to [`POOL_MAX`] bytes and unmapped past it (their pages no longer
    /// mapped in the process), so that the process never holds more than that beyond its buffers.
    #[cfg(target_os = "linux")]
    #[test]
    fn mapped_buffers_are_reused_up_to_the_pool_and_given_back_past_it() {
        use crate::file::sys::is_mapped;
        let len = 8 << 20;
        let n = 2 * POOL_MAX / len;
        let bufs: Vec<AlignedBuf> = (0..n)
            .map(|i| {
                let mut b = AlignedBuf::new(len).unwrap();
                assert!(b.mapped && b.iter().all(|&x| x == 0));
                b.iter_mut().step_by(4096).for_each(|x| *x = i as u8 | 1);
                b
            })
            .collect();
        let starts: Vec<usize> = bufs.iter().map(|b| b.as_ptr() as usize).collect();
        drop(bufs);
        // Half kept (the pool is full), the rest unmapped.
        assert!(pool_bytes() <= POOL_MAX);
        let unmapped = starts.iter().filter(|&&a| !is_mapped(a)).count();
        assert!(unmapped >= n - POOL_MAX / len, "{unmapped} of {n} unmapped");
        // A new buffer of about the size reuses a kept one, zeroed again.
        let b = AlignedBuf::new(len - 4096).unwrap();
        assert!(starts.contains(&(b.as_ptr() as usize)));
        assert!(b.iter().all(|&x| x == 0));
        // Below the threshold: the global allocator's.
        assert!(!AlignedBuf::new(MAP_MIN - 4096).unwrap().mapped);
    }

    /// A copy is the bytes; a length moves within the allocation and keeps what was there.
    #[test]
    fn copies_and_lengths_within_the_allocation() {
        let src: Vec<u8> = (0..2 * 4096).map(|i| (i % 251) as u8).collect();
        let mut b = AlignedBuf::copy_from(&src).unwrap();
        assert_eq!(b.as_ptr() as usize % ALIGN, 0);
        assert_eq!(&b[..], &src[..]);
        assert_eq!(b.capacity(), 2 * 4096);
        b.set_len(4096).unwrap();
        assert_eq!(&b[..], &src[..4096]);
        b.set_len(2 * 4096).unwrap();
        assert_eq!(&b[..], &src[..]);
        assert!(matches!(b.set_len(3 * 4096), Err(IoError::BufLen { .. })));
        assert!(matches!(b.set_len(100), Err(IoError::BufLen { len: 100 })));
        assert_eq!(AlignedBuf::copy_from(&[]).unwrap().len(), 0);
    }

    #[test]
    fn rejects_unaligned_lengths() {
        assert!(matches!(
            AlignedBuf::new(4095),
            Err(IoError::BufLen { len: 4095 })
        ));
        assert!(matches!(
            AlignedBuf::new(usize::MAX - 4095),
            Err(IoError::BufLen { .. })
        ));
    }
}
