//! Admission: a request takes a place in the queue and a share of the queue's memory BEFORE its
//! body is read or its prompt tokenized, so a burst of large requests is refused (429) instead of
//! being held. The place and the memory are given back when the request is done (its [`Ticket`]
//! is dropped), whatever way it ends.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use crate::metrics::Metrics;
use crate::ApiError;

/// Bytes one admitted request is counted for, per byte of its body: the body, its parsed form, the
/// rendered conversation and its traced copy (see `model_tokenizer`'s `encode_chat`), each at most
/// the body's size.
pub(crate) const BYTES_PER_BODY_BYTE: u64 = 6;

/// Bytes every admitted request is counted for besides its body (its plan, buffers, bookkeeping).
pub(crate) const BYTES_PER_REQUEST: u64 = 64 << 10;

/// What a request with a body of `body` bytes is counted for while it is read and tokenized.
pub(crate) fn estimate(body: u64) -> u64 {
    body.saturating_mul(BYTES_PER_BODY_BYTE)
        .saturating_add(BYTES_PER_REQUEST)
}

/// The queue's two bounds: requests waiting and the memory they hold.
pub(crate) struct Admission {
    max_queue: u64,
    max_bytes: u64,
    bytes: AtomicU64,
    metrics: Arc<Metrics>,
}

impl Admission {
    pub(crate) fn new(max_queue: usize, max_bytes: u64, metrics: Arc<Metrics>) -> Arc<Self> {
        Arc::new(Admission {
            max_queue: max_queue as u64,
            max_bytes,
            bytes: AtomicU64::new(0),
            metrics,
        })
    }

    /// Bytes held by admitted requests now.
    #[cfg(test)]
    pub(crate) fn held(&self) -> u64 {
        self.bytes.load(Relaxed)
    }

    /// A place in the queue and `bytes` of its memory, or 429 saying which bound is full.
    pub(crate) fn admit(self: &Arc<Self>, bytes: u64) -> Result<Ticket, ApiError> {
        let limit = self.max_queue;
        self.metrics
            .waiting
            .fetch_update(Relaxed, Relaxed, |w| (w < limit).then_some(w + 1))
            .map_err(|_| ApiError::queue_full(limit as usize))?;
        let max = self.max_bytes;
        if self
            .bytes
            .fetch_update(Relaxed, Relaxed, |b| {
                b.checked_add(bytes).filter(|&t| t <= max)
            })
            .is_err()
        {
            self.metrics.waiting.fetch_sub(1, Relaxed);
            return Err(ApiError::queue_memory_full(bytes, max));
        }
        Ok(Ticket {
            adm: self.clone(),
            bytes,
            queued: true,
        })
    }
}

/// An admitted request's place and memory; both are given back on drop.
pub(crate) struct Ticket {
    adm: Arc<Admission>,
    bytes: u64,
    queued: bool,
}

impl std::fmt::Debug for Ticket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ticket")
            .field("bytes", &self.bytes)
            .field("queued", &self.queued)
            .finish()
    }
}

impl Ticket {
    /// Counts the request for `bytes` from now on (its plan once the body is gone).
    pub(crate) fn resize(&mut self, bytes: u64) {
        if bytes < self.bytes {
            self.adm.bytes.fetch_sub(self.bytes - bytes, Relaxed);
            self.bytes = bytes;
        }
    }

    /// The engine has taken the request: its place in the queue is free (its memory is not, yet).
    pub(crate) fn leave_queue(&mut self) {
        if std::mem::take(&mut self.queued) {
            self.adm.metrics.waiting.fetch_sub(1, Relaxed);
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.leave_queue();
        self.adm.bytes.fetch_sub(self.bytes, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_bounds_hold_and_tickets_give_back() {
        let m = Arc::new(Metrics::default());
        let a = Admission::new(2, 1000, m.clone());
        let t1 = a.admit(600).unwrap();
        let e = a.admit(600).unwrap_err();
        assert_eq!(e.status.as_u16(), 429);
        assert_eq!(m.waiting.load(Relaxed), 1, "a refusal keeps no place");
        let mut t2 = a.admit(400).unwrap();
        assert_eq!(a.admit(1).unwrap_err().code, Some("queue_full"));
        t2.resize(100);
        assert_eq!(a.held(), 700);
        t2.leave_queue();
        t2.leave_queue();
        assert_eq!(m.waiting.load(Relaxed), 1);
        drop(t1);
        drop(t2);
        assert_eq!((a.held(), m.waiting.load(Relaxed)), (0, 0));
    }
}
