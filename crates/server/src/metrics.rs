//! Counters behind `GET /metrics`, written by the handlers and the engine thread, read as Prometheus
//! text.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

/// The server's counters (all monotonic except the gauges named so).
#[derive(Default)]
pub struct Metrics {
    /// HTTP requests answered, by route.
    requests: Mutex<BTreeMap<String, u64>>,
    /// Responses with a 4xx/5xx status, by status.
    errors: Mutex<BTreeMap<u16, u64>>,
    /// Gauge: requests admitted and not yet taken by the engine (being read, tokenized or queued).
    pub(crate) waiting: AtomicU64,
    /// Gauge: 1 while the engine computes a request.
    pub(crate) busy: AtomicU64,
    /// Generations stopped because their client went away.
    pub(crate) cancelled: AtomicU64,
    /// Generations stopped by the request timeout.
    pub(crate) timed_out: AtomicU64,
    /// Prompt tokens prefilled.
    pub(crate) prompt_tokens: AtomicU64,
    /// Tokens generated.
    pub(crate) completion_tokens: AtomicU64,
    /// Nanoseconds in prefill.
    pub(crate) prefill_nanos: AtomicU64,
    /// Decode steps and their nanoseconds.
    pub(crate) decode_tokens: AtomicU64,
    pub(crate) decode_nanos: AtomicU64,
    /// Speculative decoding (`--lookup`, `--self-draft`, `--draft`): verification steps, tokens
    /// drafted, drafted tokens kept,
    /// tokens the steps kept in all.
    pub(crate) spec_steps: AtomicU64,
    pub(crate) spec_drafted: AtomicU64,
    pub(crate) spec_accepted: AtomicU64,
    pub(crate) spec_decoded: AtomicU64,
    /// Flash offload, when the model runs from a neuron store: units needed, found in memory, bytes
    /// read (copied from the engine's counters after each request).
    pub(crate) offload: Mutex<Option<OffloadFigures>>,
}

/// The offload counters shown by `/metrics`.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct OffloadFigures {
    pub(crate) units: u64,
    pub(crate) hits: u64,
    pub(crate) bytes_read: u64,
    pub(crate) resident_bytes: u64,
}

fn bump<K: Ord>(m: &Mutex<BTreeMap<K, u64>>, k: K) {
    let mut m = m.lock().unwrap_or_else(|e| e.into_inner());
    *m.entry(k).or_insert(0) += 1;
}

impl Metrics {
    /// The speculative-decoding metrics, appended to `s` once a request has used it.
    fn render_spec(&self, s: &mut String) {
        let g = |a: &AtomicU64| a.load(Relaxed);
        let steps = g(&self.spec_steps);
        if steps == 0 {
            return;
        }
        let per_step = g(&self.spec_decoded) as f64 / steps as f64;
        for (name, kind, help, v) in [
            (
                "sparrow_speculative_steps_total",
                "counter",
                "Verification steps of speculative decoding.",
                steps as f64,
            ),
            (
                "sparrow_speculative_drafted_tokens_total",
                "counter",
                "Tokens drafted (by lookup, self-draft or a draft model) and verified.",
                g(&self.spec_drafted) as f64,
            ),
            (
                "sparrow_speculative_accepted_tokens_total",
                "counter",
                "Drafted tokens kept (the acceptance rate is accepted / drafted).",
                g(&self.spec_accepted) as f64,
            ),
            (
                "sparrow_speculative_tokens_per_step",
                "gauge",
                "Tokens kept per verification step, over all requests (1 without speculation).",
                per_step,
            ),
        ] {
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}");
        }
    }

    /// Counts a request to `route` answered with `status`.
    pub(crate) fn record(&self, route: &str, status: u16) {
        bump(&self.requests, route.to_string());
        if status >= 400 {
            bump(&self.errors, status);
        }
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        self.render_with(None)
    }

    /// [`Metrics::render`], with the live figures of an offloaded model's neuron cache: its budgets
    /// and the bytes it holds now.
    pub fn render_with(&self, cache: Option<&engine::CacheReport>) -> String {
        let mut s = String::new();
        let by_label = |m: Vec<(String, u64)>| -> Vec<(String, f64)> {
            m.into_iter().map(|(l, n)| (l, n as f64)).collect()
        };
        let requests = (self
            .requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter())
        .map(|(r, n)| (format!("{{route=\"{r}\"}}"), *n))
        .collect();
        metric(
            &mut s,
            "sparrow_requests_total",
            "counter",
            "HTTP requests answered, by route.",
            by_label(requests),
        );
        let errors = (self.errors.lock().unwrap_or_else(|e| e.into_inner()).iter())
            .map(|(c, n)| (format!("{{status=\"{c}\"}}"), *n))
            .collect();
        metric(
            &mut s,
            "sparrow_request_errors_total",
            "counter",
            "Responses with an error status, by status.",
            by_label(errors),
        );
        for (name, kind, help, v) in self.scalars() {
            metric(&mut s, name, kind, help, vec![(String::new(), v)]);
        }
        for (name, kind, help, v) in self.offload_figures(cache) {
            metric(&mut s, name, kind, help, vec![(String::new(), v)]);
        }
        self.render_spec(&mut s);
        s
    }

    /// The unlabelled figures every server has: queue, counts and speeds.
    fn scalars(&self) -> Vec<Figure> {
        let g = |a: &AtomicU64| a.load(Relaxed);
        let secs = |a: &AtomicU64| g(a) as f64 * 1e-9;
        let rate = |n: u64, s: f64| if s > 0.0 { n as f64 / s } else { 0.0 };
        vec![
            (
                "sparrow_queue_length",
                "gauge",
                "Requests admitted and not yet taken by the engine (being read, tokenized or queued).",
                g(&self.waiting) as f64,
            ),
            (
                "sparrow_busy",
                "gauge",
                "1 while the engine computes a request.",
                g(&self.busy) as f64,
            ),
            (
                "sparrow_cancelled_total",
                "counter",
                "Generations stopped because the client disconnected.",
                g(&self.cancelled) as f64,
            ),
            (
                "sparrow_timed_out_total",
                "counter",
                "Requests stopped by the request timeout.",
                g(&self.timed_out) as f64,
            ),
            (
                "sparrow_prompt_tokens_total",
                "counter",
                "Prompt tokens prefilled.",
                g(&self.prompt_tokens) as f64,
            ),
            (
                "sparrow_completion_tokens_total",
                "counter",
                "Tokens generated.",
                g(&self.completion_tokens) as f64,
            ),
            (
                "sparrow_prefill_tokens_per_second",
                "gauge",
                "Prompt tokens per second of prefill, over all requests.",
                rate(g(&self.prompt_tokens), secs(&self.prefill_nanos)),
            ),
            (
                "sparrow_decode_tokens_per_second",
                "gauge",
                "Tokens per second of decode steps, over all requests.",
                rate(g(&self.decode_tokens), secs(&self.decode_nanos)),
            ),
        ]
    }

    /// The figures of flash offload (when the model has a neuron store) and of the live neuron
    /// cache's budgets (`cache`).
    fn offload_figures(&self, cache: Option<&engine::CacheReport>) -> Vec<Figure> {
        let mut out = Vec::new();
        let off = *self.offload.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(o) = off {
            out.push((
                "sparrow_neuron_cache_hit_ratio",
                "gauge",
                "Share of needed FFN units found in memory (flash offload).",
                o.hits as f64 / o.units.max(1) as f64,
            ));
            out.push((
                "sparrow_flash_read_bytes_total",
                "counter",
                "Bytes of FFN units read from flash.",
                o.bytes_read as f64,
            ));
        }
        if let Some(c) = cache {
            out.push((
                "sparrow_memory_budget_bytes",
                "gauge",
                "The process memory budget (POST /admin/memory-budget, or at start what stays resident plus the neuron cache's budget).",
                c.memory_budget as f64,
            ));
            out.push((
                "sparrow_neuron_cache_budget_bytes",
                "gauge",
                "Bytes the neuron cache may hold (at most the whole FFN).",
                c.cache_budget as f64,
            ));
        }
        let resident = cache
            .map(|c| c.cache_bytes)
            .or(off.map(|o| o.resident_bytes));
        if let Some(bytes) = resident {
            out.push((
                "sparrow_neuron_cache_resident_bytes",
                "gauge",
                "Bytes of FFN units held in the neuron cache.",
                bytes as f64,
            ));
        }
        out
    }
}

/// An unlabelled figure: name, Prometheus type, help text, value.
type Figure = (&'static str, &'static str, &'static str, f64);

/// Appends one metric family: its help and type lines, then a line per labelled value.
fn metric(s: &mut String, name: &str, kind: &str, help: &str, lines: Vec<(String, f64)>) {
    let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} {kind}");
    for (labels, v) in lines {
        let _ = writeln!(s, "{name}{labels} {v}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_by_label() {
        let m = Metrics::default();
        m.record("/v1/completions", 200);
        m.record("/v1/completions", 429);
        m.completion_tokens.store(7, Relaxed);
        let t = m.render();
        assert!(
            t.contains("sparrow_requests_total{route=\"/v1/completions\"} 2"),
            "{t}"
        );
        assert!(
            t.contains("sparrow_request_errors_total{status=\"429\"} 1"),
            "{t}"
        );
        assert!(t.contains("sparrow_completion_tokens_total 7"), "{t}");
        assert!(
            !t.contains("flash"),
            "no offload figures for a model in memory: {t}"
        );
    }

    #[test]
    fn live_cache_figures_replace_the_last_requests_ones() {
        let m = Metrics::default();
        *m.offload.lock().unwrap() = Some(OffloadFigures {
            resident_bytes: 999,
            ..Default::default()
        });
        let live = engine::CacheReport {
            memory_budget: 300,
            minimum: 100,
            cache_budget: 200,
            cache_asked: 200,
            cache_bytes: 150,
            ffn_bytes: 1000,
        };
        let t = m.render_with(Some(&live));
        for line in [
            "sparrow_memory_budget_bytes 300",
            "sparrow_neuron_cache_budget_bytes 200",
            "sparrow_neuron_cache_resident_bytes 150",
        ] {
            assert!(t.contains(line), "`{line}` in {t}");
        }
        assert!(!t.contains(" 999"), "{t}");
        assert!(m
            .render()
            .contains("sparrow_neuron_cache_resident_bytes 999"));
    }
}
