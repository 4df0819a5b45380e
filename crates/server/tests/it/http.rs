//! The server's defences as a hostile client or web page meets them, over loopback on a free port,
//! with the tiny fixture model served in-process: the API key, the `Host` / `Origin` checks, the
//! JSON content type, the admin switch, 413 before `100 Continue`, admission before the body is
//! read, and the header / idle timeouts and the connection limit. Every wait is bounded.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use serde_json::Value;
use server::ServeOptions;

/// Serves the tiny fixture with `opts` (port 0) on a thread of its own; its address.
fn start(opts: ServeOptions) -> SocketAddr {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../fixtures/tiny-llama-silu-q4_0.gguf"
        );
        let file = engine::ModelFile::open(path).expect("the fixture opens");
        let eng = engine::Engine::new(
            &file,
            engine::EngineOptions {
                threads: 1,
                context: 128,
                ..Default::default()
            },
        )
        .expect("the fixture loads");
        let opts = ServeOptions { port: 0, ..opts };
        let r = server::serve(&eng, opts, |a| tx.send(a).unwrap());
        panic!("the server stopped: {r:?}");
    });
    rx.recv_timeout(Duration::from_secs(60))
        .expect("the server listens")
}

fn opts() -> ServeOptions {
    ServeOptions {
        model_id: "m".into(),
        ..Default::default()
    }
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s
}

/// Sends `head` (request line and headers, without the blank line) and `body`; the status and body
/// of the answer (read until the server closes).
fn exchange(addr: SocketAddr, head: &str, body: &str) -> (u16, String) {
    let mut s = connect(addr);
    write!(
        s,
        "{head}\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {text:?}"));
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    (status, body)
}

/// A request with the usual headers plus `extra` (each `Name: value`).
fn call(addr: SocketAddr, method: &str, path: &str, extra: &[&str], body: &str) -> (u16, String) {
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {addr}");
    for h in extra {
        head.push_str("\r\n");
        head.push_str(h);
    }
    exchange(addr, &head, body)
}

const JSON: &str = "Content-Type: application/json";
const PROMPT: &str = r#"{"prompt": "hi", "max_tokens": 2, "ignore_eos": true}"#;

fn error_of(body: &str) -> Value {
    let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
    v["error"].clone()
}

/// Whether the server closed `s` (EOF or reset) within `within`, reading and dropping anything it
/// sent first.
fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within)).unwrap();
    let t0 = Instant::now();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return false
            }
            Err(_) => return true, // reset
        }
        if t0.elapsed() > within {
            return false;
        }
    }
}

#[test]
fn the_api_key_guards_every_endpoint_but_health() {
    let addr = start(ServeOptions {
        api_key: Some("s3cret".into()),
        ..opts()
    });
    assert_eq!(call(addr, "GET", "/health", &[], "").0, 200);
    for auth in [
        None,
        Some("Bearer wrong"),
        Some("Bearer s3cre"),
        Some("s3cret"),
    ] {
        let extra: Vec<String> = auth
            .map(|a| format!("Authorization: {a}"))
            .into_iter()
            .collect();
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        let (st, body) = call(addr, "GET", "/v1/models", &extra, "");
        assert_eq!(st, 401, "{auth:?}: {body}");
        let e = error_of(&body);
        assert_eq!(e["type"], "authentication_error", "{body}");
        assert_eq!(e["code"], "invalid_api_key", "{body}");
    }
    let key = "Authorization: Bearer s3cret";
    assert_eq!(call(addr, "GET", "/v1/models", &[key], "").0, 200);
    assert_eq!(
        call(addr, "GET", "/v1/models", &["X-Api-Key: s3cret"], "").0,
        200
    );
    let (st, body) = call(addr, "POST", "/v1/completions", &[key, JSON], PROMPT);
    assert_eq!(st, 200, "{body}");
    // With a key, a proxy's Host is fine.
    let proxied = format!("GET /v1/models HTTP/1.1\r\nHost: api.example.com\r\n{key}");
    assert_eq!(exchange(addr, &proxied, "").0, 200);
    // The admin endpoint needs it too.
    let (st, _) = call(
        addr,
        "POST",
        "/admin/memory-budget",
        &[JSON],
        r#"{"budget": "1G"}"#,
    );
    assert_eq!(st, 401);
    let (st, body) = call(
        addr,
        "POST",
        "/admin/memory-budget",
        &[key, JSON],
        r#"{"budget": "1G"}"#,
    );
    assert_eq!(
        st, 400,
        "the key gets through (the fixture is in memory): {body}"
    );
}

#[test]
fn without_a_key_only_this_servers_own_pages_get_in() {
    let addr = start(opts());
    let port = addr.port();
    // DNS rebinding: the attacker's name in Host.
    let rebound = format!("POST /v1/completions HTTP/1.1\r\nHost: evil.example:{port}\r\n{JSON}");
    let (st, body) = exchange(addr, &rebound, PROMPT);
    assert_eq!(st, 403, "{body}");
    assert!(error_of(&body)["message"]
        .as_str()
        .unwrap()
        .contains("evil.example"));
    let localhost = format!("GET /v1/models HTTP/1.1\r\nHost: localhost:{port}");
    assert_eq!(exchange(addr, &localhost, "").0, 200);
    // A cross-site request: a foreign Origin.
    let (st, body) = call(
        addr,
        "POST",
        "/v1/completions",
        &[JSON, "Origin: https://evil.example"],
        PROMPT,
    );
    assert_eq!(st, 403, "{body}");
    let own = format!("Origin: http://127.0.0.1:{port}");
    let (st, body) = call(addr, "POST", "/v1/completions", &[JSON, &own], PROMPT);
    assert_eq!(st, 200, "{body}");
    // A browser's simple POST carries text/plain: 415, as does a missing content type.
    for ct in [&["Content-Type: text/plain"][..], &[]] {
        let (st, body) = call(addr, "POST", "/v1/chat/completions", ct, PROMPT);
        assert_eq!(st, 415, "{ct:?}: {body}");
        assert!(error_of(&body)["message"]
            .as_str()
            .unwrap()
            .contains("application/json"));
    }
    let charset = "Content-Type: application/json; charset=utf-8";
    assert_eq!(
        call(addr, "POST", "/v1/completions", &[charset], PROMPT).0,
        200
    );
    // The issue's case: a page changing the budget.
    let page = ["Content-Type: text/plain", "Origin: http://evil.example"];
    let (st, _) = call(
        addr,
        "POST",
        "/admin/memory-budget",
        &page,
        r#"{"bytes": 1}"#,
    );
    assert_eq!(st, 403);
    let (st, _) = call(
        addr,
        "POST",
        "/admin/memory-budget",
        &["Content-Type: text/plain"],
        r#"{"bytes": 1}"#,
    );
    assert_eq!(st, 415);
}

#[test]
fn no_admin_removes_the_admin_endpoint() {
    let addr = start(ServeOptions {
        admin: false,
        ..opts()
    });
    let (st, body) = call(
        addr,
        "POST",
        "/admin/memory-budget",
        &[JSON],
        r#"{"bytes": 1}"#,
    );
    assert_eq!(st, 404, "{body}");
    assert_eq!(call(addr, "GET", "/health", &[], "").0, 200);
}

#[test]
fn an_oversized_body_is_413_before_100_continue() {
    let addr = start(ServeOptions {
        max_body_bytes: 4096,
        ..opts()
    });
    let mut s = connect(addr);
    write!(
        s,
        "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\n{JSON}\r\nExpect: 100-continue\r\nContent-Length: 1000000000\r\n\r\n"
    )
    .unwrap();
    let mut buf = [0u8; 512];
    let n = s.read(&mut buf).unwrap();
    let first = String::from_utf8_lossy(&buf[..n]);
    assert!(first.starts_with("HTTP/1.1 413"), "{first}");
}

#[test]
fn requests_are_admitted_before_their_body_is_read() {
    // Room for one largest request: a second one is refused while the first one's body is awaited.
    let addr = start(ServeOptions {
        max_body_bytes: 64 << 10,
        queue_memory: 6 * (64 << 10) + (64 << 10),
        header_timeout: Duration::from_secs(5),
        ..opts()
    });
    let mut slow = connect(addr);
    write!(
        slow,
        "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\n{JSON}\r\nContent-Length: 60000\r\n\r\n{{"
    )
    .unwrap();
    // Admitted (counted in the queue) while its body does not come.
    let t0 = Instant::now();
    while !call(addr, "GET", "/metrics", &[], "")
        .1
        .contains("sparrow_queue_length 1")
    {
        assert!(t0.elapsed() < Duration::from_secs(3), "never admitted");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Meanwhile others get 429 at once.
    let (st, body) = call(addr, "POST", "/v1/completions", &[JSON], PROMPT);
    assert_eq!(st, 429, "{body}");
    assert!(error_of(&body)["message"]
        .as_str()
        .unwrap()
        .contains("--queue-memory"));
    // Its body never completes: 408 after the header timeout, and the memory is free again.
    let mut answer = String::new();
    let _ = slow.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert_eq!(
        call(addr, "POST", "/v1/completions", &[JSON], PROMPT).0,
        200
    );
}

#[test]
fn silent_and_idle_connections_are_closed() {
    let addr = start(ServeOptions {
        header_timeout: Duration::from_secs(1),
        ..opts()
    });
    // Says nothing.
    let mut silent = connect(addr);
    // Starts a head and stops (slow loris).
    let mut loris = connect(addr);
    loris.write_all(b"GET /health HTTP/1.1\r\nHost: x").unwrap();
    // Gets an answer, keeps the connection, then idles.
    let mut idle = connect(addr);
    write!(idle, "GET /health HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut buf = [0u8; 1024];
    let n = idle.read(&mut buf).unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
    for (what, s) in [
        ("silent", &mut silent),
        ("loris", &mut loris),
        ("idle", &mut idle),
    ] {
        assert!(
            closed_within(s, Duration::from_secs(10)),
            "{what} still open"
        );
    }
}

#[test]
fn connections_past_the_limit_are_refused_at_once_and_slots_come_back() {
    let addr = start(ServeOptions {
        max_connections: 3,
        header_timeout: Duration::from_secs(3),
        ..opts()
    });
    let silent: Vec<TcpStream> = (0..3).map(|_| connect(addr)).collect();
    std::thread::sleep(Duration::from_millis(200));
    // A fourth is answered 503 (or just closed) without waiting for the others.
    let mut fourth = connect(addr);
    let _ = write!(fourth, "GET /health HTTP/1.1\r\nHost: {addr}\r\n\r\n");
    let mut got = Vec::new();
    fourth
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let r = fourth.read_to_end(&mut got);
    let text = String::from_utf8_lossy(&got);
    let waited = matches!(&r, Err(e) if matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    ));
    assert!(
        text.starts_with("HTTP/1.1 503") || (text.is_empty() && !waited),
        "{text:?} {r:?}"
    );
    // The silent ones time out and free their slots.
    let t0 = Instant::now();
    loop {
        let mut s = connect(addr);
        let _ = write!(
            s,
            "GET /health HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
        );
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        if out.starts_with("HTTP/1.1 200") {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "no slot came back: {out:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(silent);
}
