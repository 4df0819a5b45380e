//! The engine's side: one request at a time on the thread that owns the [`Engine`], events back to
//! the request's handler. A handler that goes away (client disconnected) or a request past its
//! deadline stops its generation at the next token; a failed or panicking generation fails that
//! request only.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use engine::{Drafting, Engine, Flow, SpecOptions, SpecStats, StopReason};
use tokio::sync::mpsc::UnboundedSender;

use crate::admission::Ticket;
use crate::api::Plan;
use crate::job_queue::JobQueue;
use crate::metrics::{Metrics, OffloadFigures};
use crate::ApiError;

/// A request admitted to the queue.
pub(crate) struct Job {
    pub(crate) plan: Plan,
    pub(crate) events: UnboundedSender<Event>,
    pub(crate) deadline: Instant,
    pub(crate) timeout_s: f64,
    /// Its place in the queue (given back when the engine takes it) and its memory (when done).
    pub(crate) ticket: Ticket,
}

#[cfg(test)]
impl Job {
    /// A job with an empty plan, for the queue's tests.
    pub(crate) fn for_test(ticket: Ticket, events: UnboundedSender<Event>) -> Job {
        Job {
            plan: Plan {
                kind: crate::api::Kind::Completion,
                ids: vec![1],
                req: engine::GenerateRequest::default(),
                n: 1,
                stream: false,
                include_usage: false,
                speculative: None,
            },
            events,
            deadline: Instant::now(),
            timeout_s: 1.0,
            ticket,
        }
    }
}

/// What the engine reports to a request's handler.
#[derive(Debug)]
pub(crate) enum Event {
    /// Text of choice `index`, as soon as it is final.
    Text { index: usize, text: String },
    /// Choice `index` is complete.
    Done {
        index: usize,
        finish_reason: &'static str,
        completion_tokens: usize,
    },
    /// The request failed; nothing more follows.
    Failed(ApiError),
}

/// OpenAI's `finish_reason`.
fn finish_reason(r: StopReason) -> &'static str {
    match r {
        StopReason::Eos | StopReason::StopString => "stop",
        StopReason::Length | StopReason::Cancelled => "length",
    }
}

/// The result of a generation run under `catch_unwind`, or `None` after telling the request's
/// handler that it failed (an engine error or a panic: that request only).
fn finished<T>(
    result: std::thread::Result<engine::Result<T>>,
    events: &UnboundedSender<Event>,
) -> Option<T> {
    let message = match result {
        Ok(Ok(v)) => return Some(v),
        Ok(Err(e)) => format!("generation failed: {e}"),
        Err(_) => "generation failed: the engine panicked on this request".to_string(),
    };
    let _ = events.send(Event::Failed(ApiError::internal(message)));
    None
}

/// Adds a generation's figures to the metrics.
fn record(metrics: &Metrics, t: &engine::Timings, completion_tokens: usize) {
    let nanos = |s: f64| (s * 1e9) as u64;
    metrics
        .prompt_tokens
        .fetch_add(t.prefill_tokens as u64, Relaxed);
    metrics.prefill_nanos.fetch_add(nanos(t.prefill_s), Relaxed);
    metrics
        .decode_tokens
        .fetch_add(t.decode_tokens as u64, Relaxed);
    metrics.decode_nanos.fetch_add(nanos(t.decode_s), Relaxed);
    metrics
        .completion_tokens
        .fetch_add(completion_tokens as u64, Relaxed);
}

/// Adds a speculative generation's counts to the metrics.
fn record_spec(metrics: &Metrics, s: &SpecStats) {
    metrics.spec_steps.fetch_add(s.steps as u64, Relaxed);
    metrics.spec_drafted.fetch_add(s.drafted as u64, Relaxed);
    metrics.spec_accepted.fetch_add(s.accepted as u64, Relaxed);
    metrics.spec_decoded.fetch_add(s.decoded as u64, Relaxed);
}

/// Runs jobs as they come, for as long as the server runs.
pub(crate) fn run(
    eng: &Engine<'_>,
    jobs: &JobQueue,
    metrics: &Metrics,
    drafting: Option<Drafting<'_, '_>>,
) -> ! {
    loop {
        let mut job = jobs.pop();
        job.ticket.leave_queue();
        metrics.busy.store(1, Relaxed);
        run_job(eng, job, metrics, drafting);
        metrics.busy.store(0, Relaxed);
        if let Some(o) = eng.sparse().and_then(|s| s.offload()) {
            let s = o.stats();
            *metrics.offload.lock().unwrap_or_else(|e| e.into_inner()) = Some(OffloadFigures {
                units: s.units,
                hits: s.hot_hits + s.cold_hits,
                bytes_read: s.bytes_read,
                resident_bytes: s.resident_bytes as u64,
            });
        }
    }
}

/// The drafting a request gets: the server's, limited or turned off by the request's `speculative`.
fn drafting_for<'e, 'a>(
    server: Option<Drafting<'e, 'a>>,
    asked: Option<usize>,
) -> Option<Drafting<'e, 'a>> {
    let d = server?;
    let d = asked.map_or(d, |n| d.limited(n));
    (d.max_draft() > 0).then_some(d)
}

fn run_job(eng: &Engine<'_>, job: Job, metrics: &Metrics, drafting: Option<Drafting<'_, '_>>) {
    let Job {
        plan,
        events,
        deadline,
        timeout_s,
        ticket: _ticket,
    } = job;
    if events.is_closed() {
        metrics.cancelled.fetch_add(1, Relaxed);
        return;
    }
    if plan.n > 1 {
        return run_batch(eng, &plan, &events, deadline, timeout_s, metrics);
    }
    let drafting = drafting_for(drafting, plan.speculative);
    for index in 0..plan.n {
        if Instant::now() >= deadline {
            metrics.timed_out.fetch_add(1, Relaxed);
            let _ = events.send(Event::Failed(ApiError::timeout(timeout_s)));
            return;
        }
        let mut req = plan.req.clone();
        req.sampler.seed = req.sampler.seed.wrapping_add(index as u64);
        let mut late = false;
        let result = catch_unwind(AssertUnwindSafe(|| {
            let on_text = |piece: &str| {
                if Instant::now() >= deadline {
                    late = true;
                    return Flow::Stop;
                }
                let text = piece.to_string();
                match events.send(Event::Text { index, text }) {
                    Ok(()) => Flow::Continue,
                    Err(_) => Flow::Stop, // the client went away
                }
            };
            match drafting {
                None => eng.generate(&plan.ids, &req, on_text),
                Some(d) => {
                    let opts = SpecOptions {
                        max_draft: d.max_draft(),
                    };
                    let mut source = d.source(eng)?;
                    let s =
                        eng.generate_speculative(&plan.ids, &req, source.as_mut(), opts, on_text)?;
                    record_spec(metrics, &s.stats);
                    Ok(s.generation)
                }
            }
        }));
        let Some(g) = finished(result, &events) else {
            return;
        };
        record(metrics, &g.timings, g.generated_ids.len());
        if g.stop_reason == StopReason::Cancelled {
            if late {
                metrics.timed_out.fetch_add(1, Relaxed);
                let _ = events.send(Event::Failed(ApiError::timeout(timeout_s)));
            } else {
                metrics.cancelled.fetch_add(1, Relaxed);
            }
            return;
        }
        let done = Event::Done {
            index,
            finish_reason: finish_reason(g.stop_reason),
            completion_tokens: g.generated_ids.len(),
        };
        if events.send(done).is_err() {
            metrics.cancelled.fetch_add(1, Relaxed);
            return;
        }
    }
}

/// `n > 1`: the choices decoded as one batch ([`Engine::generate_best_of`]); choice `i` is the text
/// a request with seed `seed + i` gives, as when they ran one after another.
fn run_batch(
    eng: &Engine<'_>,
    plan: &Plan,
    events: &UnboundedSender<Event>,
    deadline: Instant,
    timeout_s: f64,
    metrics: &Metrics,
) {
    let mut late = false;
    let mut gone = false;
    let result = catch_unwind(AssertUnwindSafe(|| {
        eng.generate_best_of(&plan.ids, &plan.req, plan.n, |index, piece| {
            if Instant::now() >= deadline {
                late = true;
                return Flow::Stop;
            }
            let text = piece.to_string();
            match events.send(Event::Text { index, text }) {
                Ok(()) => Flow::Continue,
                Err(_) => {
                    gone = true;
                    Flow::Stop
                }
            }
        })
    }));
    let Some(r) = finished(result, events) else {
        return;
    };
    let completion = r
        .candidates
        .iter()
        .map(|c| c.generation.generated_ids.len())
        .sum();
    record(metrics, &r.timings, completion);
    if late {
        metrics.timed_out.fetch_add(1, Relaxed);
        let _ = events.send(Event::Failed(ApiError::timeout(timeout_s)));
        return;
    }
    if gone {
        metrics.cancelled.fetch_add(1, Relaxed);
        return;
    }
    // Choices in request order (seed order), not ranked.
    let mut by_index: Vec<_> = r.candidates.iter().collect();
    by_index.sort_by_key(|c| c.seed.wrapping_sub(plan.req.sampler.seed));
    for (index, c) in by_index.into_iter().enumerate() {
        let done = Event::Done {
            index,
            finish_reason: finish_reason(c.generation.stop_reason),
            completion_tokens: c.generation.generated_ids.len(),
        };
        if events.send(done).is_err() {
            metrics.cancelled.fetch_add(1, Relaxed);
            return;
        }
    }
}
