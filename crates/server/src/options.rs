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
        }
    }
}
