//! `calibrate::calibrate` on a quick run: one progress message per point its progress bar counts, and
//! the cache-dependent rates where the machine's cache calls for them, the one-unit rates always.

use calibrate::{calibrate, CalibrateOptions};

#[test]
fn progress_messages_match_the_counted_steps() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("calibrate-steps-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let o = CalibrateOptions::quick(&dir);
    let mut messages = Vec::new();
    let profile = calibrate(&o, |m| messages.push(m.to_string())).unwrap();
    assert_eq!(messages.len() as u64, o.steps(), "{messages:#?}");
    assert!(profile.select_ns > 0.0, "{profile:?}");
    // Flash read idle and beside busy cores, at every size and depth.
    let points = o.read_sizes.len() * o.queue_depths.len();
    assert_eq!(profile.flash_random.len(), points);
    assert_eq!(profile.flash_random_busy.len(), points);
    // The last-level cache as sysfs gives it; past a cache larger than the 48 MiB matrices, each
    // format's dense rate measured again over twice the cache.
    let llc = calibrate::last_level_cache_bytes();
    assert_eq!(profile.llc_bytes, llc.unwrap_or(0));
    let past = llc.is_some_and(|c| 2 * c > 48 << 20);
    for k in &profile.kernels {
        assert_eq!(k.dram_dense_bps > 0.0, past, "{k:?}");
        // Offloaded decode's one-unit calls, measured for every format and thread count.
        assert!(k.unit_rows_bps > 0.0 && k.unit_axpy_bps > 0.0, "{k:?}");
    }
    std::fs::remove_dir_all(&dir).ok();
}
