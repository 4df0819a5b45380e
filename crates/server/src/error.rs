//! The server's error type: what keeps the server from starting (a request's failure is an
//! [`ApiError`](crate::ApiError) answered to that client only).

/// Why [`serve`](crate::serve) could not start (once serving, it only fails requests).
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The listening socket could not be opened.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The async runtime could not start.
    #[error("cannot start the server's runtime: {0}")]
    Runtime(std::io::Error),
    /// The options cannot work (e.g. a zero body limit).
    #[error("{0}")]
    Options(String),
}
