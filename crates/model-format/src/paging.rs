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
}

/// Gives `advice` for the pages that `bytes` (a slice of a read-only file mapping, such as a tensor's
/// data) lies on. Failures are ignored, and it does nothing off Unix.
pub fn advise(bytes: &[u8], advice: Paging) {
    #[cfg(unix)]
    {
        if bytes.is_empty() {
            return;
        }
        let page = 4096usize;
        let start = bytes.as_ptr() as usize & !(page - 1);
        let end = bytes.as_ptr() as usize + bytes.len();
        let run = |a: libc::c_int| {
            // SAFETY: [start, end) covers only pages that `bytes` lies on (start rounded down to its
            // page; mappings are page aligned, so these pages belong to the same mapping). The advice
            // given only schedules or drops the page cache behind them: a later access faults the same
            // file bytes back in, so no live reference ever sees different contents.
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, a) }
        };
        match advice {
            Paging::Random => {
                run(libc::MADV_RANDOM);
            }
            Paging::Normal => {
                run(libc::MADV_NORMAL);
            }
            Paging::WillNeed => {
                run(libc::MADV_WILLNEED);
            }
            Paging::Release => {
                #[cfg(any(target_os = "linux", target_os = "android"))]
                if run(libc::MADV_PAGEOUT) == 0 {
                    return;
                }
                run(libc::MADV_DONTNEED);
            }
        }
    }
    #[cfg(not(unix))]
    let _ = (bytes, advice);
}
