//! The system calls of this crate, thin and safe (the house rule: FFI only in `-sys` crates or `sys`
//! modules).

use crate::Paging;

/// `madvise` over the pages `bytes` lies on (see [`crate::advise`], whose contract the caller
/// keeps: `bytes` is a slice of a read-only file mapping). Failures are ignored.
pub(crate) fn advise(bytes: &[u8], advice: Paging) {
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
        Paging::Drop => {
            run(libc::MADV_DONTNEED);
        }
    }
}
