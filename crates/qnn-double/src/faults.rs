//! Fault injection: which QNN call fails, and which core API major version the provider reports.
//!
//! Two sources, read at every call: a per-thread setting (exported `qnn_double_set_fail` /
//! `qnn_double_set_api_major`, reached from Rust through [`crate::Control`]), which tests running in
//! parallel threads cannot see of each other; else the process-wide environment variables
//! `QNN_DOUBLE_FAIL=<step>` (a QNN function name, e.g. `graphFinalize`; several separated by commas)
//! and `QNN_DOUBLE_API_MAJOR=<n>`. A call on a graph from a thread with no failing steps of its own
//! takes those of the thread that created the graph's context ([`fails_for`]): an engine may run
//! graphs on threads of its own, which a test cannot reach.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::thread::ThreadId;

/// Environment variable naming the QNN functions that fail (comma-separated).
pub const FAIL_ENV: &str = "QNN_DOUBLE_FAIL";
/// Environment variable overriding the reported core API major version.
pub const API_MAJOR_ENV: &str = "QNN_DOUBLE_API_MAJOR";

thread_local! {
    static FAIL: RefCell<Option<String>> = const { RefCell::new(None) };
    static API_MAJOR: RefCell<Option<u32>> = const { RefCell::new(None) };
}

/// Every thread's failing steps, for [`fails_for`]. A thread's own steps stay in `FAIL` too: looking
/// them up here by `std::thread::current()` on every call instead crashed `npu-qnn`'s tests, which
/// unload the library, with SIGSEGV.
fn by_thread() -> std::sync::MutexGuard<'static, HashMap<ThreadId, String>> {
    static BY_THREAD: OnceLock<Mutex<HashMap<ThreadId, String>>> = OnceLock::new();
    BY_THREAD
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// Sets (or with `None` clears) this thread's failing steps.
pub(crate) fn set_fail(steps: Option<String>) {
    let me = std::thread::current().id();
    match &steps {
        Some(s) => by_thread().insert(me, s.clone()),
        None => by_thread().remove(&me),
    };
    FAIL.with(|f| *f.borrow_mut() = steps);
}

/// Sets (or with `None` clears) this thread's reported API major version.
pub(crate) fn set_api_major(major: Option<u32>) {
    API_MAJOR.with(|m| *m.borrow_mut() = major);
}

/// Whether QNN function `step` must fail now.
pub(crate) fn fails(step: &str) -> bool {
    fails_for(step, None)
}

/// Whether QNN function `step` must fail now on an object whose context thread `owner` created:
/// this thread's setting, else `owner`'s, else the environment's.
pub(crate) fn fails_for(step: &str, owner: Option<ThreadId>) -> bool {
    let listed = |s: &str| s.split(',').any(|x| x.trim() == step);
    let owners = || owner.and_then(|o| by_thread().get(&o).cloned());
    match FAIL.with(|f| f.borrow().clone()).or_else(owners) {
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
