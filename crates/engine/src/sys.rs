//! Process figures (resident memory now and at its peak) and handing freed heap back to the system.

fn status_kb(key: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(key))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Peak resident set size of this process in bytes (`VmHWM` on Linux/Android; `None` elsewhere).
pub fn peak_rss_bytes() -> Option<u64> {
    status_kb("VmHWM:")
}

/// Resident set size of this process now, in bytes (`VmRSS`; `None` where unknown).
pub fn rss_bytes() -> Option<u64> {
    status_kb("VmRSS:")
}

/// Returns the heap's free pages to the system, so that resident memory follows a neuron cache that
/// shrank (its units are small allocations inside the heap, which `free` keeps for reuse). glibc's
/// `malloc_trim(0)` (it `madvise`s the free pages of every arena); a no-op elsewhere (musl's
/// allocator returns freed memory by itself).
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks glibc's own arenas under their locks; it takes no pointer and is
    // safe to call from any thread at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    #[cfg(target_os = "linux")]
    fn peak_rss_is_positive_on_linux() {
        let rss = super::peak_rss_bytes().expect("VmHWM is readable on Linux");
        assert!(rss > 100_000, "a test process uses more than 100 kB: {rss}");
        // Not compared with the peak read above: other test threads allocate in between.
        let now = super::rss_bytes().expect("VmRSS is readable on Linux");
        assert!(
            now > 100_000,
            "a test process holds more than 100 kB: {now}"
        );
    }
}
