//! One thread that parses and tokenizes requests, one at a time. Tokenizing a large prompt takes
//! many times its size in working memory; done on one thread, that memory is needed once (not once
//! per request in flight) and is reused from one request to the next by the same allocator arena.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{channel, Sender};
use std::sync::Mutex;

type Work = Box<dyn FnOnce() + Send>;

/// The tokenizing thread's queue.
pub(crate) struct Tokenizing {
    work: Mutex<Sender<Work>>,
}

impl Tokenizing {
    /// Starts the thread; it ends when this is dropped.
    pub(crate) fn start() -> std::io::Result<Self> {
        let (work, todo) = channel::<Work>();
        std::thread::Builder::new()
            .name("sparrow-tokenize".into())
            .spawn(move || {
                for w in todo {
                    // A panic fails that request only (its answer channel is dropped).
                    let _ = catch_unwind(AssertUnwindSafe(w));
                }
            })?;
        Ok(Tokenizing {
            work: Mutex::new(work),
        })
    }

    /// Runs `f` on the thread, after the work queued before it; `None` if it panicked.
    pub(crate) async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Option<T> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let w: Work = Box::new(move || {
            if tx.is_closed() {
                return; // the client went away while this waited
            }
            let _ = tx.send(f());
        });
        self.work
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(w)
            .ok()?;
        rx.await.ok()
    }
}
