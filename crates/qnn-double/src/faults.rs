//! Fault injection: which QNN call fails, and which core API major version the provider reports.
//!
//! Two sources, read at every call: a per-thread setting (exported `qnn_double_set_fail` /
//! `qnn_double_set_api_major`, reached from Rust through [`crate::Control`]), which tests running in
//! parallel threads cannot see of each other; else the process-wide environment variables
//! `QNN_DOUBLE_FAIL=<step>` (a QNN function name, e.g. `graphFinalize`; several separated by commas)
//! and `QNN_DOUBLE_API_MAJOR=<n>`.

use std::cell::RefCell;

/// Environment variable naming the QNN functions that fail (comma-separated).
pub const FAIL_ENV: &str = "QNN_DOUBLE_FAIL";
/// Environment variable overriding the reported core API major version.
pub const API_MAJOR_ENV: &str = "QNN_DOUBLE_API_MAJOR";

thread_local! {
    static FAIL: RefCell<Option<String>> = const { RefCell::new(None) };
    static API_MAJOR: RefCell<Option<u32>> = const { RefCell::new(None) };
}

/// Sets (or with `None` clears) this thread's failing steps.
pub(crate) fn set_fail(steps: Option<String>) {
    FAIL.with(|f| *f.borrow_mut() = steps);
}

/// Sets (or with `None` clears) this thread's reported API major version.
pub(crate) fn set_api_major(major: Option<u32>) {
    API_MAJOR.with(|m| *m.borrow_mut() = major);
}

/// Whether QNN function `step` must fail now.
pub(crate) fn fails(step: &str) -> bool {
    let listed = |s: &str| s.split(',').any(|x| x.trim() == step);
    match FAIL.with(|f| f.borrow().clone()) {
        Some(s) => listed(&s),
        None => std::env::var(FAIL_ENV).is_ok_and(|s| listed(&s)),
    }
}

/// The core API major version to report, if overridden.
pub(crate) fn api_major() -> Option<u32> {
    API_MAJOR
        .with(|m| *m.borrow())
        .or_else(|| std::env::var(API_MAJOR_ENV).ok()?.trim().parse().ok())
}
