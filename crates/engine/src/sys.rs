//! Process figures (resident memory now and at its peak, the memory still available to it), handing freed heap back to the system
//! (`offload`'s, re-exported), and the size of the CPU's last-level cache (`calibrate`'s, re-exported).

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

/// Resident set size of this process now, in bytes, less the pages mapped from `file` (`VmRSS`
/// minus the `Rss` of `file`'s mappings in `/proc/self/smaps`): what the process holds besides a
/// model file that a memory budget counts on its own, so that its touched pages are not counted
/// twice. `None` where unknown.
pub fn rss_besides(file: &std::path::Path) -> Option<u64> {
    let total = rss_bytes()?;
    let file = std::fs::canonicalize(file).ok()?;
    // Read line by line: a process's smaps runs to hundreds of KiB, which read whole would stay
    // in the heap and count in the next measurement.
    let smaps = std::fs::File::open("/proc/self/smaps").ok()?;
    Some(total.saturating_sub(mapped_rss(std::io::BufReader::new(smaps), &file)))
}

/// Sum of the `Rss:` lines of the mappings of `file` in an smaps text.
fn mapped_rss(smaps: impl std::io::BufRead, file: &std::path::Path) -> u64 {
    let mut ours = false;
    let mut bytes = 0;
    for line in smaps.lines().map_while(std::result::Result::ok) {
        let mut parts = line.split_whitespace();
        let first = parts.next().unwrap_or("");
        if first.contains('-') && !first.ends_with(':') {
            // A mapping's header: range, perms, offset, dev, inode, then the path (which may hold
            // spaces).
            let path = line
                .splitn(6, char::is_whitespace)
                .nth(5)
                .map(str::trim_start);
            ours = path.is_some_and(|p| std::path::Path::new(p) == file);
        } else if ours && first == "Rss:" {
            let kb: u64 = parts.next().and_then(|v| v.parse().ok()).unwrap_or(0);
            bytes += kb * 1024;
        }
    }
    bytes
}

/// Bytes this process may still take: the system's `MemAvailable` (`/proc/meminfo`), or less where
/// its memory cgroup allows less (v2 `memory.max` less `memory.current`, v1 `memory.limit_in_bytes`
/// less `memory.usage_in_bytes`); `SPARROW_MEMORY_ROOM` (a size, as `--memory-budget` takes)
/// overrides both. `None` where unknown (no `/proc`).
pub fn memory_room() -> Option<u64> {
    if let Ok(v) = std::env::var("SPARROW_MEMORY_ROOM") {
        return offload::budget::parse_size(&v).ok();
    }
    let system = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| meminfo_available(&t));
    let group = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|t| cgroup_files(&t))
        .and_then(|[max, current]| {
            let read = |f: &std::path::Path| std::fs::read_to_string(f).ok();
            cgroup_room(&read(&max)?, &read(&current)?)
        });
    match (system, group) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// `MemAvailable` of a `/proc/meminfo` text, in bytes.
fn meminfo_available(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Room left under a cgroup's `memory.max` (`max`: no limit, `None`) given its `memory.current`.
fn cgroup_room(max: &str, current: &str) -> Option<u64> {
    let max: u64 = max.trim().parse().ok()?;
    let current: u64 = current.trim().parse().ok()?;
    Some(max.saturating_sub(current))
}

/// The limit and usage files of this process's memory cgroup, from its `/proc/self/cgroup` text:
/// the v1 memory controller's (`N:memory:/PATH`) where it has one, else the v2 group's (`0::/PATH`).
fn cgroup_files(text: &str) -> Option<[std::path::PathBuf; 2]> {
    let root = std::path::Path::new("/sys/fs/cgroup");
    let v1 = text.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        controllers
            .split(',')
            .any(|c| c == "memory")
            .then_some(path)
    });
    if let Some(rel) = v1 {
        let dir = root.join("memory").join(rel.trim_start_matches('/'));
        return Some(["memory.limit_in_bytes", "memory.usage_in_bytes"].map(|f| dir.join(f)));
    }
    let rel = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    let dir = root.join(rel.trim_start_matches('/'));
    Some(["memory.max", "memory.current"].map(|f| dir.join(f)))
}

/// Handing freed heap back to the system: the neuron cache's (the `offload` crate's `sys`).
pub use offload::sys::release_free_memory;

/// Bytes of the largest data cache of CPU 0 (the `calibrate` crate's).
pub use calibrate::last_level_cache_bytes;

#[cfg(test)]
mod tests {
    #[test]
    fn memory_room_reads_meminfo_and_the_cgroup_s_limit() {
        let meminfo =
            "MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   20000000 kB\n";
        assert_eq!(super::meminfo_available(meminfo), Some(20_000_000 * 1024));
        assert_eq!(super::meminfo_available("MemTotal: 5 kB\n"), None);
        assert_eq!(super::cgroup_room("1000\n", "400\n"), Some(600));
        assert_eq!(super::cgroup_room("1000", "1400"), Some(0));
        assert_eq!(super::cgroup_room("max\n", "400\n"), None);
        let v1 = "5:devices:/\n4:memory:/jobs/a\n0::/\n";
        let [max, cur] = super::cgroup_files(v1).unwrap();
        assert_eq!(
            max.to_str(),
            Some("/sys/fs/cgroup/memory/jobs/a/memory.limit_in_bytes")
        );
        assert_eq!(
            cur.to_str(),
            Some("/sys/fs/cgroup/memory/jobs/a/memory.usage_in_bytes")
        );
        let [max, cur] = super::cgroup_files("0::/user.slice/x\n").unwrap();
        assert_eq!(max.to_str(), Some("/sys/fs/cgroup/user.slice/x/memory.max"));
        assert_eq!(
            cur.to_str(),
            Some("/sys/fs/cgroup/user.slice/x/memory.current")
        );
    }

    #[test]
    fn mapped_rss_sums_the_file_s_mappings_only() {
        let smaps = "\
5581a000-5581b000 r--p 00000000 fd:01 123   /models/m.gguf
Size:                  4 kB
Rss:                   4 kB
5581b000-5581f000 r--p 00001000 fd:01 123   /models/m.gguf
Rss:                  12 kB
7f00-7f10 rw-p 00000000 00:00 0 
Rss:                 100 kB
7f10-7f20 r--p 00000000 fd:01 124   /models/m.gguf.sparrow-profile
Rss:                   8 kB
7f20-7f30 r--p 00000000 fd:01 125   /models/with space.gguf
Rss:                  16 kB
";
        let m = |p: &str| super::mapped_rss(smaps.as_bytes(), std::path::Path::new(p));
        assert_eq!(m("/models/m.gguf"), 16 * 1024);
        assert_eq!(m("/models/with space.gguf"), 16 * 1024);
        assert_eq!(m("/models/other.gguf"), 0);
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn rss_besides_a_mapped_file_leaves_out_its_touched_pages() {
        // A GGUF file with one 8 MiB tensor, mapped by model-format (the crate that maps model
        // files) and read through.
        let path = std::env::temp_dir().join(format!("sparrow-rss-{}.gguf", std::process::id()));
        let mut w = model_format::GgufWriter::new();
        w.tensor(
            "t",
            model_format::DType::F32,
            &[2 << 20],
            vec![7u8; 8 << 20],
        )
        .unwrap();
        w.write(&path).unwrap();
        let f = model_format::GgufFile::open(&path).unwrap();
        let data = f.tensor("t").unwrap().data;
        let sum: u64 = data.iter().step_by(4096).map(|&b| u64::from(b)).sum();
        assert_eq!(sum, 7 * 2048);
        let all = super::rss_bytes().unwrap();
        let besides = super::rss_besides(&path).unwrap();
        // Other test threads allocate in between: the 8 MiB touched must be what is left out.
        assert!(all >= besides + (6 << 20), "{all} vs {besides}");
        drop(f);
        std::fs::remove_file(&path).unwrap();
    }

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
