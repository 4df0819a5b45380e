//! The HTTP side: the axum router, one handler per endpoint, the queue's admission and the response
//! shapes (JSON bodies and server-sent event chunks as OpenAI writes them).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, Uri};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use engine::{CacheControl, Tokenizer};
use futures_util::StreamExt;
use serde_json::{json, Value};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use crate::admission::{estimate, Admission, Ticket, BYTES_PER_REQUEST};
use crate::api::{self, Kind, Limits, Plan};
use crate::job_queue::{JobQueue, Queued};
use crate::metrics::Metrics;
use crate::tokenizing::Tokenizing;
use crate::worker::{Event, Job};
use crate::{ApiError, ServeOptions};

/// What every handler shares.
pub(crate) struct AppState {
    pub(crate) opts: ServeOptions,
    pub(crate) tokenizer: Tokenizer,
    /// The engine's context in tokens (prompt and completion together).
    pub(crate) context: usize,
    pub(crate) jobs: Arc<JobQueue>,
    pub(crate) metrics: Arc<Metrics>,
    /// Server start, seconds since the epoch (the model's `created`).
    pub(crate) started: u64,
    /// The neuron cache's live budget, when the model is offloaded.
    pub(crate) cache: Option<CacheControl>,
    /// The address the server listens on (for the `Host` check).
    pub(crate) bound: std::net::SocketAddr,
    /// The queue's bounds (places and memory), taken before a body is read.
    pub(crate) admission: Arc<Admission>,
    /// The thread that parses and tokenizes requests.
    pub(crate) tokenizing: Tokenizing,
    /// The longest token's text in bytes (a prompt longer than `context` of them cannot fit).
    pub(crate) max_piece: usize,
}

type Shared = Arc<AppState>;

/// The router with every endpoint (the admin one unless `--no-admin`), the body limit, the
/// callers' checks ([`crate::guard`]) and the request counters.
pub(crate) fn router(state: Shared) -> Router {
    let mut r = Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/v1/models", get(models))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat));
    if state.opts.admin {
        r = r.route("/admin/memory-budget", post(crate::admin::memory_budget));
    }
    r.fallback(no_route)
        .layer(DefaultBodyLimit::max(state.opts.max_body_bytes))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            crate::guard::guard,
        ))
        .layer(middleware::from_fn_with_state(state.clone(), count))
        .with_state(state)
}

/// Counts each request by route (unknown paths as `other`, so labels stay few) and its status.
async fn count(State(st): State<Shared>, req: Request, next: Next) -> Response {
    let route = match req.uri().path() {
        p @ ("/health"
        | "/metrics"
        | "/v1/models"
        | "/v1/completions"
        | "/v1/chat/completions"
        | "/admin/memory-budget") => p.to_string(),
        _ => "other".to_string(),
    };
    let resp = next.run(req).await;
    st.metrics.record(&route, resp.status().as_u16());
    resp
}

async fn no_route(uri: Uri) -> ApiError {
    ApiError::no_route(uri.path())
}

async fn health() -> Json<Value> {
    Json(json!({ "status": "ok" }))
}

async fn metrics(State(st): State<Shared>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        st.metrics
            .render_with(st.cache.as_ref().map(|c| c.report()).as_ref()),
    )
        .into_response()
}

async fn models(State(st): State<Shared>) -> Json<Value> {
    Json(json!({
        "object": "list",
        "data": [{
            "id": st.opts.model_id,
            "object": "model",
            "created": st.started,
            "owned_by": "sparrow",
            "meta": { "n_ctx": st.context },
        }]
    }))
}

async fn completions(State(st): State<Shared>, req: Request) -> Response {
    generate(st, Kind::Completion, req).await
}

async fn chat(State(st): State<Shared>, req: Request) -> Response {
    generate(st, Kind::Chat, req).await
}

/// Admits the request, reads and checks it, waits for its turn and answers in one body or as a
/// stream.
async fn generate(st: Shared, kind: Kind, req: Request) -> Response {
    let arrived = Instant::now();
    let max_body = st.opts.max_body_bytes;
    // From the declared length, before anything reads the body (so before `100 Continue`).
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max_body as u64) {
        return ApiError::too_large(max_body).into_response();
    }
    let mut ticket = match st
        .admission
        .admit(estimate(declared.unwrap_or(max_body as u64)))
    {
        Ok(t) => t,
        Err(e) => return e.into_response(),
    };
    let body = match read_body(req.into_body(), max_body, st.opts.header_timeout).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let st2 = st.clone();
    let planned = st
        .tokenizing
        .run(move || {
            let lim = Limits {
                tokenizer: &st2.tokenizer,
                model_id: &st2.opts.model_id,
                context: st2.context,
                max_n: st2.opts.max_n,
                max_piece: st2.max_piece,
            };
            api::plan(kind, &body, &lim)
        })
        .await;
    let plan = match planned {
        Some(Ok(p)) => p,
        Some(Err(e)) => return e.into_response(),
        None => return ApiError::internal("checking the request failed").into_response(),
    };
    // The body and its parsed form are gone; the plan stays until the request is done.
    ticket.resize(plan.ids.len() as u64 * 4 + BYTES_PER_REQUEST);
    let (tx, mut rx) = unbounded_channel();
    let deadline = arrived + st.opts.request_timeout;
    let queued = submit(&st, &plan, tx, deadline, ticket);
    let reply = Reply::new(&st, &plan);
    // A little after the engine's own deadline, which normally answers first.
    let until = tokio::time::Instant::from_std(deadline + Duration::from_secs(1));
    if plan.stream {
        // The head goes out with the first event: until then this handler is pending, and a client
        // that hangs up drops it (and `queued`), which takes the job out of the queue.
        let first = match tokio::time::timeout_at(until, rx.recv()).await {
            Ok(first) => first,
            Err(_) => {
                return ApiError::timeout(st.opts.request_timeout.as_secs_f64()).into_response()
            }
        };
        drop(queued);
        stream(reply, first, rx).into_response()
    } else {
        let answer = tokio::time::timeout_at(until, collect(&plan, rx)).await;
        drop(queued);
        match answer {
            Ok(Ok(done)) => Json(reply.whole(done)).into_response(),
            Ok(Err(e)) => e.into_response(),
            Err(_) => ApiError::timeout(st.opts.request_timeout.as_secs_f64()).into_response(),
        }
    }
}

/// The whole body, at most `max` bytes (413 past it), arriving within `within` (408 past it).
async fn read_body(body: Body, max: usize, within: Duration) -> Result<Bytes, ApiError> {
    let read = async {
        let mut chunks = body.into_data_stream();
        let mut buf = Vec::new();
        while let Some(chunk) = chunks.next().await {
            let chunk =
                chunk.map_err(|e| ApiError::bad_request(format!("reading the body: {e}")))?;
            if buf.len() + chunk.len() > max {
                return Err(ApiError::too_large(max));
            }
            buf.extend_from_slice(&chunk);
        }
        Ok(Bytes::from(buf))
    };
    tokio::time::timeout(within, read)
        .await
        .unwrap_or_else(|_| Err(ApiError::body_timeout(within.as_secs_f64())))
}

/// Hands the admitted request to the engine; dropping the guard (the client went away) takes it
/// out of the queue if it is still there.
fn submit(
    st: &AppState,
    plan: &Plan,
    events: tokio::sync::mpsc::UnboundedSender<Event>,
    deadline: Instant,
    ticket: Ticket,
) -> Queued {
    st.jobs.push(Job {
        plan: plan.clone(),
        events,
        deadline,
        timeout_s: st.opts.request_timeout.as_secs_f64(),
        ticket,
    })
}

/// Each choice's text, finish reason, and the completion tokens of all.
struct Collected {
    texts: Vec<String>,
    finish: Vec<&'static str>,
    completion_tokens: usize,
}

async fn collect(plan: &Plan, mut rx: UnboundedReceiver<Event>) -> Result<Collected, ApiError> {
    let mut c = Collected {
        texts: vec![String::new(); plan.n],
        finish: vec![""; plan.n],
        completion_tokens: 0,
    };
    let mut done = 0;
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Text { index, text } => c.texts[index].push_str(&text),
            Event::Done {
                index,
                finish_reason,
                completion_tokens,
            } => {
                c.finish[index] = finish_reason;
                c.completion_tokens += completion_tokens;
                done += 1;
                if done == plan.n {
                    return Ok(c);
                }
            }
            Event::Failed(e) => return Err(e),
        }
    }
    Err(ApiError::internal("the engine stopped before finishing"))
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// The fields every response of one request repeats.
struct Reply {
    kind: Kind,
    id: String,
    created: u64,
    model: String,
    prompt_tokens: usize,
    n: usize,
    include_usage: bool,
}

impl Reply {
    fn new(st: &AppState, plan: &Plan) -> Self {
        let created = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let prefix = match plan.kind {
            Kind::Completion => "cmpl",
            Kind::Chat => "chatcmpl",
        };
        Reply {
            kind: plan.kind,
            id: format!("{prefix}-{created:x}{:06x}", NEXT_ID.fetch_add(1, Relaxed)),
            created,
            model: st.opts.model_id.clone(),
            prompt_tokens: plan.ids.len(),
            n: plan.n,
            include_usage: plan.include_usage,
        }
    }

    fn usage(&self, completion_tokens: usize) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": self.prompt_tokens + completion_tokens,
        })
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.kind, chunk) {
            (Kind::Completion, _) => "text_completion",
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
        }
    }

    fn envelope(&self, chunk: bool, choices: Value) -> Value {
        json!({
            "id": self.id,
            "object": self.object(chunk),
            "created": self.created,
            "model": self.model,
            "system_fingerprint": null,
            "choices": choices,
        })
    }

    /// The non-streaming response.
    fn whole(&self, c: Collected) -> Value {
        let choices: Vec<Value> = c
            .texts
            .into_iter()
            .zip(c.finish)
            .enumerate()
            .map(|(index, (text, finish))| match self.kind {
                Kind::Completion => json!({
                    "index": index, "text": text, "logprobs": null, "finish_reason": finish,
                }),
                Kind::Chat => json!({
                    "index": index,
                    "message": { "role": "assistant", "content": text },
                    "logprobs": null,
                    "finish_reason": finish,
                }),
            })
            .collect();
        let mut v = self.envelope(false, Value::Array(choices));
        v["usage"] = self.usage(c.completion_tokens);
        v
    }

    /// One streamed chunk: `text` of choice `index`, or its end when `finish` is given.
    fn chunk(&self, index: usize, text: Option<&str>, finish: Option<&str>) -> Value {
        let choice = match self.kind {
            Kind::Completion => json!({
                "index": index, "text": text.unwrap_or(""), "logprobs": null, "finish_reason": finish,
            }),
            Kind::Chat => {
                let delta = match text {
                    Some(t) => json!({ "content": t }),
                    None => json!({}),
                };
                json!({ "index": index, "delta": delta, "logprobs": null, "finish_reason": finish })
            }
        };
        self.envelope(true, json!([choice]))
    }
}

/// State of a streamed response.
struct Streaming {
    reply: Reply,
    rx: UnboundedReceiver<Event>,
    pending: VecDeque<SseEvent>,
    done: usize,
    completion_tokens: usize,
    over: bool,
}

fn data(v: &Value) -> SseEvent {
    SseEvent::default().data(v.to_string())
}

/// Server-sent events: one chunk per piece of text, a last chunk per choice with its finish reason,
/// the usage chunk when asked for (`stream_options.include_usage`), then `data: [DONE]`. A failure
/// after the headers went out is an `{"error": ...}` event before `[DONE]`. Dropping the stream (the
/// client went away) closes the channel, which stops the generation.
fn stream(reply: Reply, first: Option<Event>, rx: UnboundedReceiver<Event>) -> impl IntoResponse {
    let mut pending = VecDeque::new();
    if reply.kind == Kind::Chat {
        for i in 0..reply.n {
            let mut c = reply.chunk(i, None, None);
            c["choices"][0]["delta"] = json!({ "role": "assistant", "content": "" });
            pending.push_back(data(&c));
        }
    }
    let mut state = Streaming {
        reply,
        rx,
        pending,
        done: 0,
        completion_tokens: 0,
        over: false,
    };
    state.take(first);
    let events = futures_util::stream::unfold(state, |mut s| async move {
        loop {
            if let Some(e) = s.pending.pop_front() {
                return Some((Ok::<_, Infallible>(e), s));
            }
            if s.over {
                return None;
            }
            s.next().await;
        }
    });
    Sse::new(events)
}

impl Streaming {
    /// Waits for the engine's next event and queues what it becomes.
    async fn next(&mut self) {
        let ev = self.rx.recv().await;
        self.take(ev);
    }

    /// Queues what `ev` becomes (`None`: the engine dropped the request).
    fn take(&mut self, ev: Option<Event>) {
        match ev {
            Some(Event::Text { index, text }) => {
                let c = self.reply.chunk(index, Some(&text), None);
                self.pending.push_back(data(&c));
            }
            Some(Event::Done {
                index,
                finish_reason,
                completion_tokens,
            }) => {
                let c = self.reply.chunk(index, None, Some(finish_reason));
                self.pending.push_back(data(&c));
                self.completion_tokens += completion_tokens;
                self.done += 1;
                if self.done == self.reply.n {
                    if self.reply.include_usage {
                        let mut u = self.reply.envelope(true, json!([]));
                        u["usage"] = self.reply.usage(self.completion_tokens);
                        self.pending.push_back(data(&u));
                    }
                    self.finish();
                }
            }
            Some(Event::Failed(e)) => {
                self.pending.push_back(data(&e.body()));
                self.finish();
            }
            None => {
                let e = ApiError::internal("the engine stopped before finishing");
                self.pending.push_back(data(&e.body()));
                self.finish();
            }
        }
    }

    fn finish(&mut self) {
        self.pending.push_back(SseEvent::default().data("[DONE]"));
        self.over = true;
    }
}
