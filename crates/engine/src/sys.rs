//! Process figures: resident memory now and at its peak.

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
