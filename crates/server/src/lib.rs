//! Sparrow's OpenAI-compatible HTTP server, as llama.cpp's `llama-server` and Ollama users expect:
//! `GET /v1/models`, `POST /v1/completions`, `POST /v1/chat/completions` (the model's chat template,
//! as `sparrow run --chat` renders it), streaming with server-sent events (`stream: true`, OpenAI's
//! chunks, then `data: [DONE]`), `GET /health` and `GET /metrics` (Prometheus text); for an offloaded
//! model `POST /admin/memory-budget` (loopback clients only, off with [`ServeOptions::admin`]) shrinks
//! or grows the neuron cache while serving.
//!
//! [`serve`] runs one [`Engine`]: the calling thread computes the requests one at a time; an async
//! runtime (axum on tokio, behind a hand-written accept loop) on other threads answers HTTP, admits
//! requests, and queues them for the engine; one more thread parses and tokenizes them, one at a
//! time.
//!
//! # Example
//! ```no_run
//! use engine::{Engine, EngineOptions, ModelFile};
//! let file = ModelFile::open("model.gguf")?;
//! let engine = Engine::new(&file, EngineOptions::default())?;
//! let opts = server::ServeOptions { model_id: "model".into(), ..Default::default() };
//! server::serve(&engine, opts, |addr| eprintln!("listening on http://{addr}"))?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Invariants
//! - Binds loopback unless told otherwise ([`ServeOptions::host`]).
//! - With [`ServeOptions::api_key`], every endpoint but `/health` needs the key (401). Without one, a
//!   request whose `Host` or `Origin` names another server is refused (403), so web pages cannot use
//!   it. JSON endpoints need `Content-Type: application/json` (415).
//! - At most [`ServeOptions::max_connections`] connections; one that sends no complete request head
//!   within [`ServeOptions::header_timeout`] of opening or of its previous answer is closed.
//! - A request is admitted (a queue place and its share of [`ServeOptions::queue_memory`], else 429)
//!   before its body is read; a declared body over the limit is 413 before `100 Continue`.
//! - Message contents are tokenized as text: special tokens come from the chat template only.
//! - A bad request (JSON, parameters, a prompt longer than the context), an unknown model, a full
//!   queue, a timeout or an engine error fails that request only, with OpenAI's error JSON and a
//!   status that fits (400, 404, 413, 429, 500, 503); the server keeps serving, and a panic inside a
//!   generation is caught and answered as a 500.
//! - At most [`ServeOptions::max_queue`] requests are admitted and not yet taken by the engine; more
//!   get 429.
//! - A client that disconnects stops its generation at the next token (the engine's `cancelled` stop),
//!   and a queued request whose client has gone is skipped.
//! - Nothing here touches model files: the engine was loaded by the caller.

mod accept;
mod admin;
mod admission;
mod api;
mod api_error;
mod error;
mod guard;
mod job_queue;
mod metrics;
mod options;
mod routes;
mod tokenizing;
mod worker;

use std::net::SocketAddr;
use std::sync::Arc;

use engine::{Drafting, Engine};

pub use api::check_request;
pub use api_error::ApiError;
pub use error::ServerError;
pub use metrics::Metrics;
pub use options::ServeOptions;

/// Serves `engine` over HTTP for as long as the process runs; returns only an error at start (bad
/// options, a port that cannot be bound). `on_listen` gets the bound address (useful with port 0)
/// once connections are accepted. The engine runs on the calling thread.
pub fn serve(
    engine: &Engine<'_>,
    opts: ServeOptions,
    on_listen: impl FnOnce(SocketAddr),
) -> Result<(), ServerError> {
    serve_with(engine, None, opts, on_listen)
}

/// [`serve`] with speculative decoding: every request of one choice (`n` = 1) that does not turn
/// it off (its `speculative` field, [`check_request`]) drafts with `drafting` and verifies the
/// drafts in one step ([`Engine::generate_speculative`]: greedy output unchanged, sampled output of
/// the same distribution); statistics in `/metrics`. A source that cannot work with `engine` (a
/// self-draft of a model all in memory, a draft model of another vocabulary) or that drafts no
/// token is refused before anything listens.
pub fn serve_speculative(
    engine: &Engine<'_>,
    drafting: Drafting<'_, '_>,
    opts: ServeOptions,
    on_listen: impl FnOnce(SocketAddr),
) -> Result<(), ServerError> {
    serve_with(engine, Some(drafting), opts, on_listen)
}

fn serve_with(
    engine: &Engine<'_>,
    drafting: Option<Drafting<'_, '_>>,
    opts: ServeOptions,
    on_listen: impl FnOnce(SocketAddr),
) -> Result<(), ServerError> {
    if let Some(d) = drafting {
        if d.max_draft() == 0 {
            return Err(ServerError::Options(format!(
                "--{} needs at least one drafted token",
                d.name()
            )));
        }
        d.source(engine)
            .map_err(|e| ServerError::Options(e.to_string()))?;
    }
    if opts.max_queue == 0
        || opts.max_body_bytes == 0
        || opts.max_n == 0
        || opts.max_connections == 0
    {
        return Err(ServerError::Options(
            "the queue bound, body limit, largest n and connection limit must be at least 1".into(),
        ));
    }
    if opts.header_timeout.is_zero() {
        return Err(ServerError::Options(
            "the header timeout must be above 0".into(),
        ));
    }
    let smallest = admission::estimate(opts.max_body_bytes as u64);
    if opts.queue_memory < smallest {
        return Err(ServerError::Options(format!(
            "the queue memory ({} KiB) must hold at least one request of the largest body ({} KiB)",
            opts.queue_memory / 1024,
            smallest.div_ceil(1024)
        )));
    }
    if opts.api_key.as_deref().is_some_and(str::is_empty) {
        return Err(ServerError::Options("the API key is empty".into()));
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("sparrow-http")
        .enable_all()
        .build()
        .map_err(ServerError::Runtime)?;
    let listener = rt
        .block_on(tokio::net::TcpListener::bind((
            opts.host.as_str(),
            opts.port,
        )))
        .map_err(|source| ServerError::Bind {
            addr: format!("{}:{}", opts.host, opts.port),
            source,
        })?;
    let addr = listener.local_addr().map_err(|source| ServerError::Bind {
        addr: format!("{}:{}", opts.host, opts.port),
        source,
    })?;
    let jobs = Arc::new(job_queue::JobQueue::default());
    let metrics = Arc::new(Metrics::default());
    let limits = accept::ConnLimits {
        max_connections: opts.max_connections,
        header_timeout: opts.header_timeout,
    };
    let tokenizer = engine.tokenizer().clone();
    let state = Arc::new(routes::AppState {
        admission: admission::Admission::new(opts.max_queue, opts.queue_memory, metrics.clone()),
        tokenizing: tokenizing::Tokenizing::start().map_err(ServerError::Runtime)?,
        max_piece: api::longest_piece(&tokenizer),
        bound: addr,
        opts,
        tokenizer,
        context: engine.options().context,
        jobs: jobs.clone(),
        metrics: metrics.clone(),
        started: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        cache: engine
            .sparse()
            .and_then(|s| s.offload())
            .map(|o| o.control()),
    });
    let app = routes::router(state);
    // Accept errors are waited out, so the loop and the engine's run last as long as the process.
    let _accepting = rt.spawn(accept::serve(listener, app, limits));
    on_listen(addr);
    worker::run(engine, &jobs, &metrics, drafting)
}
