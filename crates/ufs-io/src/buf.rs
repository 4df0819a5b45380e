//! [`AlignedBuf`]: heap memory aligned for direct I/O.

use std::alloc::{self, Layout};
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

use crate::{IoError, Result, ALIGN};

/// A zero-initialised heap buffer whose start is aligned to [`ALIGN`] (4096) bytes and whose length is a
/// multiple of [`ALIGN`], as `O_DIRECT` reads require. Derefs to `[u8]`.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively (like Box<[u8]>); no interior mutability.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared references only give out `&[u8]`.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes; `len` must be a multiple of 4096 (0 is allowed).
    pub fn new(len: usize) -> Result<Self> {
        if len % ALIGN != 0 {
            return Err(IoError::BufLen { len });
        }
        if len == 0 {
            // A dangling but aligned pointer: never dereferenced for a non-empty slice, never freed.
            let ptr = NonNull::new(ALIGN as *mut u8).expect("ALIGN is non-zero");
            return Ok(Self { ptr, len });
        }
        let layout = Layout::from_size_align(len, ALIGN).map_err(|_| IoError::BufLen { len })?;
        // SAFETY: layout has non-zero size (len > 0 checked above).
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or(IoError::BufLen { len })?;
        Ok(Self { ptr, len })
    }

    /// A buffer holding a copy of `bytes` (whose length must be a multiple of 4096).
    pub fn copy_from(bytes: &[u8]) -> Result<Self> {
        let mut b = Self::new(bytes.len())?;
        b.copy_from_slice(bytes);
        Ok(b)
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for len initialised (zeroed at allocation) bytes owned by self, or dangling
        // and aligned with len == 0.
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
        if self.len > 0 {
            let layout = Layout::from_size_align(self.len, ALIGN).expect("checked at allocation");
            // SAFETY: ptr was allocated by alloc_zeroed with exactly this layout and is freed once.
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
        for len in [0, 4096, 3 * 4096] {
            let mut b = AlignedBuf::new(len).unwrap();
            assert_eq!(b.as_ptr() as usize % ALIGN, 0);
            assert_eq!(b.len(), len);
            assert!(b.iter().all(|&x| x == 0));
            b.iter_mut().enumerate().for_each(|(i, x)| *x = i as u8);
            let c = b.clone();
            assert_eq!(b, c);
        }
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
