//! `engine::calibrate` on a quick run: one progress message per point its progress bar counts.

use engine::calibrate::{calibrate, CalibrateOptions};

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
    std::fs::remove_dir_all(&dir).ok();
}
