//! The size of the CPU's last-level cache, from sysfs (what the kernels' rates are measured
//! against: the dense product again over twice the cache).

/// Bytes of the largest cache level of CPU 0 (`/sys/devices/system/cpu/cpu0/cache/index*/`: the
/// highest `level` whose `type` holds data; `None` where sysfs does not say, as on some phones).
pub fn last_level_cache_bytes() -> Option<u64> {
    let dir = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache").ok()?;
    let mut best: Option<(u32, u64)> = None;
    for e in dir.flatten() {
        if !e.file_name().to_string_lossy().starts_with("index") {
            continue;
        }
        let read = |f: &str| std::fs::read_to_string(e.path().join(f)).ok();
        if read("type").is_some_and(|t| t.trim() == "Instruction") {
            continue;
        }
        let (Some(level), Some(size)) = (
            read("level").and_then(|l| l.trim().parse::<u32>().ok()),
            read("size").and_then(|s| parse_cache_size(&s)),
        ) else {
            continue;
        };
        if best.is_none_or(|(l, _)| level > l) {
            best = Some((level, size));
        }
    }
    best.map(|(_, size)| size)
}

/// A sysfs cache size (`"266240K"`, `"8M"`, `"512"`) in bytes.
fn parse_cache_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (digits, unit) = match s.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => s.split_at(i),
        None => (s, ""),
    };
    let n: u64 = digits.parse().ok()?;
    let scale = match unit {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(scale).filter(|&b| b > 0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn cache_sizes_read_as_sysfs_writes_them() {
        use super::parse_cache_size as p;
        assert_eq!(p("266240K\n"), Some(266240 << 10));
        assert_eq!(p("8M"), Some(8 << 20));
        assert_eq!(p("512"), Some(512));
        assert_eq!(p("0K"), None);
        assert_eq!(p("12 KB"), None);
        assert_eq!(p(""), None);
    }
}
