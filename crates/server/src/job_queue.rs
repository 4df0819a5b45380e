//! The requests waiting for the engine, in order. A request whose client goes away while it waits
//! is taken out at once (its handler's [`Queued`] guard is dropped), so dead requests never hold the
//! queue's places or memory while the engine computes another one.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use crate::worker::Job;

/// The queue the handlers push to and the engine's thread pops from.
#[derive(Default)]
pub(crate) struct JobQueue {
    jobs: Mutex<VecDeque<(u64, Job)>>,
    ready: Condvar,
    next_id: std::sync::atomic::AtomicU64,
}

impl JobQueue {
    fn lock(&self) -> MutexGuard<'_, VecDeque<(u64, Job)>> {
        self.jobs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `job`; dropping the guard takes it out again if the engine has not taken it yet.
    pub(crate) fn push(self: &Arc<Self>, job: Job) -> Queued {
        let id = self
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.lock().push_back((id, job));
        self.ready.notify_one();
        Queued {
            queue: self.clone(),
            id,
        }
    }

    /// The oldest job, waiting for one.
    pub(crate) fn pop(&self) -> Job {
        let mut q = self.lock();
        loop {
            if let Some((_, job)) = q.pop_front() {
                return job;
            }
            q = self.ready.wait(q).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Jobs waiting now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }
}

/// A handler's hold on its queued job.
pub(crate) struct Queued {
    queue: Arc<JobQueue>,
    id: u64,
}

impl Drop for Queued {
    fn drop(&mut self) {
        let removed = {
            let mut q = self.queue.lock();
            q.iter()
                .position(|(id, _)| *id == self.id)
                .and_then(|i| q.remove(i))
        };
        // The job (and its ticket) is dropped outside the lock.
        drop(removed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::Admission;
    use crate::metrics::Metrics;

    #[test]
    fn a_dropped_guard_takes_its_job_out_and_frees_its_place() {
        let m = Arc::new(Metrics::default());
        let adm = Admission::new(4, 1 << 20, m.clone());
        let q = Arc::new(JobQueue::default());
        let job = |n: u64| {
            let (events, _) = tokio::sync::mpsc::unbounded_channel();
            Job::for_test(adm.admit(n).unwrap(), events)
        };
        let a = q.push(job(1));
        let b = q.push(job(2));
        assert_eq!(m.waiting.load(std::sync::atomic::Ordering::Relaxed), 2);
        drop(a);
        assert_eq!(q.len(), 1);
        assert_eq!(m.waiting.load(std::sync::atomic::Ordering::Relaxed), 1);
        let taken = q.pop();
        drop(b); // already taken: nothing to remove
        assert_eq!(q.len(), 0);
        drop(taken);
        assert_eq!(m.waiting.load(std::sync::atomic::Ordering::Relaxed), 0);
    }
}
