//! What [`serve`](crate::serve) is told: where to listen and the limits it enforces.

use std::time::Duration;

/// Server settings. [`Default`] binds loopback port 8080.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Host or address to bind (`127.0.0.1`: loopback only).
    pub host: String,
    /// TCP port (0: any free port; the chosen address is passed to `on_listen`).
    pub port: u16,
    /// The model's name in `/v1/models`; requests naming another model get 404.
    pub model_id: String,
    /// Requests that may wait while the engine computes one; more get 429.
    pub max_queue: usize,
    /// Largest request body in bytes; larger gets 413.
    pub max_body_bytes: usize,
    /// Time a request may take, waiting included; past it, it is stopped and gets 503 (or an error
    /// event when streaming).
    pub request_timeout: Duration,
    /// Largest `n` (choices per request, decoded as one batch).
    pub max_n: usize,
    /// The key clients must give (`Authorization: Bearer KEY` or `X-Api-Key: KEY`) on every
    /// endpoint but `/health`; 401 otherwise. Without one, requests must name this server in `Host`
    /// (and `Origin`, when they carry one): see the crate's invariants.
    pub api_key: Option<String>,
    /// Whether `POST /admin/memory-budget` exists (404 when off).
    pub admin: bool,
    /// Open connections at most; a connection past it is answered 503 and closed at once.
    pub max_connections: usize,
    /// Time a connection may take to send a request's head, counted from its opening or from its
    /// previous response (so it is also the keep-alive idle timeout); past it, it is closed. A
    /// request's body must arrive within the same time after its head (else 408).
    pub header_timeout: Duration,
    /// Bytes that admitted requests (read, tokenized or queued, not yet finished) may hold
    /// together, as estimated from their bodies' lengths; a request that does not fit gets 429.
    pub queue_memory: u64,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            host: "127.0.0.1".into(),
            port: 8080,
            model_id: "sparrow".into(),
            max_queue: 16,
            max_body_bytes: 1 << 20,
            request_timeout: Duration::from_secs(600),
            max_n: 8,
            api_key: None,
            admin: true,
            max_connections: 64,
            header_timeout: Duration::from_secs(10),
            queue_memory: 32 << 20,
        }
    }
}
