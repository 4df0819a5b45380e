//! Who may call: the API key when one is set, else the `Host` and `Origin` checks that keep web
//! pages out (DNS rebinding, cross-site requests); and `Content-Type: application/json` on the
//! endpoints that take JSON, so that a browser's "simple" cross-site POST (`text/plain`, sent
//! without asking first) is refused before anything reads its body.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::routes::AppState;
use crate::ApiError;

/// Paths that answer without a key, as llama-server's `/health` does.
const OPEN: &[&str] = &["/health"];

/// The endpoints whose body is JSON.
const JSON: &[&str] = &[
    "/v1/completions",
    "/v1/chat/completions",
    "/admin/memory-budget",
];

/// The middleware: 401, 403 or 415 in OpenAI's error shape, or the request goes on.
pub(crate) async fn guard(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if let Err(e) = check(&st, req.method(), req.uri().path(), req.headers()) {
        return e.into_response();
    }
    next.run(req).await
}

fn check(st: &AppState, method: &Method, path: &str, h: &HeaderMap) -> Result<(), ApiError> {
    match &st.opts.api_key {
        Some(key) if !OPEN.contains(&path) => {
            if !given_key(h).is_some_and(|k| same(k.as_bytes(), key.as_bytes())) {
                return Err(ApiError::unauthorized());
            }
        }
        Some(_) => {}
        None => local_only(st.bound, &st.opts.host, h)?,
    }
    if method == Method::POST && JSON.contains(&path) {
        let ct = h
            .get(header::CONTENT_TYPE)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .unwrap_or_default();
        let essence = ct.split(';').next().unwrap_or("").trim();
        if !essence.eq_ignore_ascii_case("application/json") {
            return Err(ApiError::not_json(&ct));
        }
    }
    Ok(())
}

/// The key of `Authorization: Bearer KEY`, else of `X-Api-Key: KEY`.
fn given_key(h: &HeaderMap) -> Option<&str> {
    if let Some(v) = h.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) {
        let (scheme, key) = v.trim().split_once(' ')?;
        return scheme.eq_ignore_ascii_case("bearer").then(|| key.trim());
    }
    h.get("x-api-key").and_then(|v| v.to_str().ok())
}

/// Whether `a` equals `b`, in time that depends on their lengths only (not on where they differ).
pub(crate) fn same(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a
        .iter()
        .zip(b)
        .fold(0u8, |acc, (x, y)| acc | std::hint::black_box(x ^ y));
    std::hint::black_box(diff) == 0
}

/// Without a key: `Host` (when given) and `Origin` (when given) must name this server.
fn local_only(bound: SocketAddr, host_flag: &str, h: &HeaderMap) -> Result<(), ApiError> {
    if let Some(v) = h.get(header::HOST) {
        let host = v.to_str().unwrap_or("");
        if !names_this_server(host, bound, host_flag) {
            return Err(ApiError::forbidden(format!(
                "the Host `{}` is not this server's address (a page reached through another name is refused; set --api-key to serve behind a proxy)",
                host.escape_debug()
            )));
        }
    }
    if let Some(v) = h.get(header::ORIGIN) {
        let origin = v.to_str().unwrap_or("");
        let own = origin
            .strip_prefix("http://")
            .is_some_and(|a| names_this_server(a, bound, host_flag));
        if !own {
            return Err(ApiError::forbidden(format!(
                "requests from the web page origin `{}` are refused (set --api-key to allow other origins)",
                origin.escape_debug()
            )));
        }
    }
    Ok(())
}

/// Whether `authority` (`host:port` as in `Host`) names this server: an IP address (no name, so no
/// DNS rebinding), `localhost`, or the `--host` given, each with the bound port (or none for 80).
pub(crate) fn names_this_server(authority: &str, bound: SocketAddr, host_flag: &str) -> bool {
    let (name, port) = split_authority(authority);
    let port_ok = match port {
        Some(p) => p.parse::<u16>().ok() == Some(bound.port()),
        None => bound.port() == 80,
    };
    if !port_ok || name.is_empty() {
        return false;
    }
    let bare = name.trim_start_matches('[').trim_end_matches(']');
    bare.parse::<IpAddr>().is_ok()
        || name.eq_ignore_ascii_case("localhost")
        || name.eq_ignore_ascii_case(host_flag)
}

/// `host:port` → (host, port); `[v6]:port` → (`[v6]`, port).
fn split_authority(a: &str) -> (&str, Option<&str>) {
    if a.starts_with('[') {
        return match a.find(']') {
            Some(end) => {
                let rest = &a[end + 1..];
                (&a[..=end], rest.strip_prefix(':'))
            }
            None => (a, None),
        };
    }
    match a.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => (h, Some(p)),
        _ => (a, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_compare_whole() {
        assert!(same(b"secret", b"secret"));
        assert!(!same(b"secret", b"secreT"));
        assert!(!same(b"secret", b"secret2"));
        assert!(!same(b"", b"x"));
    }

    #[test]
    fn host_names_this_server_or_an_address() {
        let bound: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        for ok in [
            "127.0.0.1:8080",
            "localhost:8080",
            "LOCALHOST:8080",
            "[::1]:8080",
            "192.168.1.5:8080",
            "box.lan:8080",
        ] {
            assert!(names_this_server(ok, bound, "box.lan"), "{ok}");
        }
        for bad in [
            "evil.example:8080",
            "localhost:8081",
            "localhost",
            "127.0.0.1",
            "localhost.evil.example:8080",
            "",
            ":8080",
            "[::1]",
        ] {
            assert!(!names_this_server(bad, bound, "127.0.0.1"), "{bad}");
        }
        let port80: SocketAddr = "127.0.0.1:80".parse().unwrap();
        assert!(names_this_server("localhost", port80, "127.0.0.1"));
    }
}
