//! The red-team case on a real `sparrow serve` (SmolLM2, the default model): 24 concurrent
//! requests of 1 MB each, then 24 of 100 KB, against `--queue 4`. They used to be tokenized before
//! being admitted and drove the resident set from 125 MiB to 2.5 GiB; now each is admitted (or
//! refused, 429) before its body is read, one is tokenized at a time, and a prompt that cannot fit
//! the context is refused before it is tokenized. The server's peak resident set (`VmHWM`, Linux)
//! must stay within a wide margin of what it was before the burst, and it serves afterwards.

use crate::support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use support::Server;

/// A field of /proc/PID/status in bytes (`VmRSS`, `VmHWM`).
#[cfg(target_os = "linux")]
fn status_bytes(pid: u32, field: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = s
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in {s}"));
    kb << 10
}

/// Posts `body` to the chat endpoint on a connection of its own and returns the status, or 0 when
/// the server hung up before an answer could be read (it may answer 429 and close while the
/// client is still writing, which resets the connection).
fn post(addr: SocketAddr, body: &str) -> u16 {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let _ = s
        .write_all(head.as_bytes())
        .and_then(|_| s.write_all(body.as_bytes()));
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out)
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

fn chat_of(bytes: usize) -> String {
    let text = "lorem ipsum dolor sit amet ".repeat(bytes / 27 + 1);
    serde_json::json!({
        "messages": [{"role": "user", "content": &text[..bytes]}],
        "max_tokens": 4,
    })
    .to_string()
}

#[cfg(target_os = "linux")]
#[test]
fn a_burst_of_large_requests_keeps_memory_bounded() {
    let s = Server::start(&["--threads", "1", "--queue", "4", "--max-body", "2M"]);
    let small = serde_json::json!({
        "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
    })
    .to_string();
    assert_eq!(post(s.addr, &small), 200);
    let before = status_bytes(s.pid(), "VmRSS:");
    for size in [1 << 20, 100 << 10] {
        let body = std::sync::Arc::new(chat_of(size));
        let clients: Vec<_> = (0..24)
            .map(|_| {
                let (addr, body) = (s.addr, body.clone());
                std::thread::spawn(move || post(addr, &body))
            })
            .collect();
        for c in clients {
            let st = c.join().unwrap();
            assert!(
                [0, 400, 429].contains(&st),
                "{size} bytes: status {st} (the prompt cannot fit 4096 tokens)"
            );
        }
    }
    let peak = status_bytes(s.pid(), "VmHWM:");
    let grew = peak.saturating_sub(before) >> 20;
    eprintln!(
        "resident before the burst {} MiB, peak {} MiB",
        before >> 20,
        peak >> 20
    );
    assert!(
        grew < 256,
        "the peak grew by {grew} MiB (from {} MiB)",
        before >> 20
    );
    assert_eq!(post(s.addr, &small), 200, "still serving");
}
