//! Paging advice for weights in a file mapping: how the kernel should page a tensor's bytes in and
//! out. Advice changes speed and residency, never contents: a page handed back is read again from the
//! file when touched.

/// What [`advise`] tells the kernel about a slice of a mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Paging {
    /// Accessed at random: no read-ahead around a fault (`MADV_RANDOM`).
    Random,
    /// The default read-ahead (`MADV_NORMAL`).
    Normal,
    /// Needed soon: start reading it now (`MADV_WILLNEED`).
    WillNeed,
    /// Not needed for a while: drop it from memory (`MADV_PAGEOUT`, or `MADV_DONTNEED` where the kernel
    /// lacks it).
    Release,
    /// Out of this process's memory (its resident set) but left in the page cache: a later access
    /// faults the page back in without reading the file (`MADV_DONTNEED`).
    Drop,
}

/// Gives `advice` for the pages that `bytes` (a slice of a read-only file mapping, such as a tensor's
/// data) lies on. Failures are ignored, and it does nothing off Unix.
pub fn advise(bytes: &[u8], advice: Paging) {
    #[cfg(unix)]
    crate::sys::advise(bytes, advice);
    #[cfg(not(unix))]
    let _ = (bytes, advice);
}
