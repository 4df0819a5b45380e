//! Every object the double has handed out, behind one lock. Handles are registry keys cast to
//! pointers, never addresses: a stale or foreign handle is an error code, not a wild read.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::thread::ThreadId;

/// What a handle names.
pub(crate) enum Object {
    Log,
    Device,
    Backend { log: usize },
    Context { backend: usize, device: usize },
    Graph(Box<crate::graph::GraphObj>),
}

pub(crate) struct Entry {
    pub object: Object,
    /// The thread that created it (live-object counts are per thread, so parallel tests do not
    /// see each other's objects).
    pub owner: ThreadId,
}

#[derive(Default)]
pub(crate) struct Registry {
    next: usize,
    pub entries: HashMap<usize, Entry>,
    /// Frees refused because a dependent object was still alive, per thread.
    pub order_errors: HashMap<ThreadId, u64>,
}

impl Registry {
    pub fn insert(&mut self, object: Object) -> usize {
        self.next += 1;
        let key = self.next;
        self.entries.insert(
            key,
            Entry {
                object,
                owner: std::thread::current().id(),
            },
        );
        key
    }

    /// Whether any live object satisfies `f` (used to refuse freeing a parent before its children).
    pub fn any(&self, f: impl Fn(&Object) -> bool) -> bool {
        self.entries.values().any(|e| f(&e.object))
    }

    pub fn order_error(&mut self) {
        *self
            .order_errors
            .entry(std::thread::current().id())
            .or_default() += 1;
    }
}

static REGISTRY: OnceLock<Mutex<Registry>> = OnceLock::new();

/// The registry, locked (a panic elsewhere does not make it unusable).
pub(crate) fn lock() -> MutexGuard<'static, Registry> {
    REGISTRY
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// Handle → key (0 for null).
pub(crate) fn key(handle: *mut c_void) -> usize {
    handle as usize
}

/// Key → handle.
pub(crate) fn handle(key: usize) -> *mut c_void {
    key as *mut c_void
}
