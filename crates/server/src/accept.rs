//! The accept loop: at most `max_connections` open connections (one past it is answered 503 and
//! closed at once), each served by hyper's HTTP/1.1 with a header-read timeout that also bounds the
//! idle time between two requests of a kept-alive connection. So silent sockets are closed instead
//! of holding descriptors, and a full table never makes the loop wait.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tower::ServiceExt;

/// The connection bounds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConnLimits {
    pub(crate) max_connections: usize,
    pub(crate) header_timeout: Duration,
}

/// What a connection past the limit reads before it is closed.
fn busy() -> Vec<u8> {
    let body =
        crate::ApiError::unavailable("too many open connections (--max-connections); retry later")
            .body()
            .to_string();
    format!(
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Serves `app` on `listener` until the runtime stops. Accept errors (a full descriptor table,
/// an aborted handshake) are waited out, never fatal.
pub(crate) async fn serve(listener: TcpListener, app: Router, limits: ConnLimits) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    loop {
        let (sock, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(_) => {
                // EMFILE and the like: descriptors free up as connections close or time out.
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            refuse(sock);
            continue;
        };
        let app = app.clone();
        tokio::spawn(async move {
            let _slot = slot;
            connection(sock, peer, app, limits.header_timeout).await;
        });
    }
}

/// Answers 503 (if the socket takes it at once) and closes.
fn refuse(sock: TcpStream) {
    let _ = sock.try_write(&busy());
}

async fn connection(sock: TcpStream, peer: SocketAddr, app: Router, header_timeout: Duration) {
    let _ = sock.set_nodelay(true);
    let svc = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
        req.extensions_mut().insert(ConnectInfo(peer));
        app.clone().oneshot(req.map(axum::body::Body::new))
    });
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
        .keep_alive(true);
    // Errors here are one connection's (a reset, a timeout, a malformed head): it just ends.
    let _ = http.serve_connection(TokioIo::new(sock), svc).await;
}
