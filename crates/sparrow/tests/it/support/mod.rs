//! A real `sparrow serve` process on a free loopback port, and a minimal HTTP/1.1 client (one request
//! per connection, chunked bodies decoded, server-sent events read as they arrive).

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The repository's fixtures folder.
pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(name)
}

/// A running server; killed when dropped.
pub struct Server {
    child: Child,
    pub addr: SocketAddr,
    /// Everything it printed on stderr so far.
    pub log: Arc<Mutex<String>>,
}

impl Server {
    /// Starts `sparrow serve --port 0 ARGS` and waits for its "serving ... on http://ADDR" line.
    pub fn start(args: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_sparrow"))
            .arg("serve")
            .args(["--port", "0"])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("sparrow serve starts");
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let log = Arc::new(Mutex::new(String::new()));
        let mut addr = None;
        for line in lines.by_ref() {
            let line = line.expect("stderr is text");
            log.lock().unwrap().push_str(&format!("{line}\n"));
            if let Some(a) = line.split(" on http://").nth(1) {
                addr = Some(a.trim().parse().expect("an address"));
                break;
            }
        }
        let Some(addr) = addr else {
            let status = child.wait().unwrap();
            panic!(
                "sparrow serve exited ({status}) before listening:\n{}",
                log.lock().unwrap()
            );
        };
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                sink.lock().unwrap().push_str(&format!("{line}\n"));
            }
        });
        Server { child, addr, log }
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the process is still running.
    pub fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// `GET path` → (status, body).
    pub fn get(&self, path: &str) -> (u16, String) {
        request(self.addr, "GET", path, None)
    }

    /// `POST path` with a JSON body → (status, body).
    pub fn post(&self, path: &str, body: &str) -> (u16, String) {
        request(self.addr, "POST", path, Some(body))
    }

    /// `POST path` → (status, parsed JSON body).
    pub fn post_json(&self, path: &str, body: &serde_json::Value) -> (u16, serde_json::Value) {
        let (s, b) = self.post(path, &body.to_string());
        let v = serde_json::from_str(&b).unwrap_or_else(|e| panic!("{path}: {e}: {b}"));
        (s, v)
    }

    /// The value of an unlabelled metric in `/metrics`.
    pub fn metric(&self, name: &str) -> f64 {
        self.metrics(&[name])[0]
    }

    /// Several unlabelled metrics read from one `/metrics` scrape (consistent with each other).
    pub fn metrics(&self, names: &[&str]) -> Vec<f64> {
        let (s, text) = self.get("/metrics");
        assert_eq!(s, 200);
        names
            .iter()
            .map(|name| {
                text.lines()
                    .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
                    .unwrap_or_else(|| panic!("no metric {name} in:\n{text}"))
            })
            .collect()
    }

    /// Opens a streaming request; read its events with [`Sse::next_data`].
    pub fn stream(&self, path: &str, body: &serde_json::Value) -> Sse {
        Sse::open(self.addr, path, &body.to_string())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connects");
    s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
    s
}

fn send(s: &mut TcpStream, addr: SocketAddr, method: &str, path: &str, body: Option<&str>) {
    let body = body.unwrap_or("");
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    s.flush().unwrap();
}

/// Status line and headers (names lower-cased).
fn head(r: &mut impl BufRead) -> (u16, Vec<(String, String)>) {
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {line:?}"));
    let mut headers = Vec::new();
    loop {
        line.clear();
        r.read_line(&mut line).unwrap();
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        let (k, v) = l.split_once(':').expect("a header");
        headers.push((k.to_ascii_lowercase(), v.trim().to_string()));
    }
    (status, headers)
}

fn chunked(headers: &[(String, String)]) -> bool {
    headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"))
}

/// Next chunk of a chunked body (None at the end).
fn read_chunk(r: &mut impl BufRead) -> Option<Vec<u8>> {
    let mut line = String::new();
    if r.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let n = usize::from_str_radix(line.trim().split(';').next()?, 16).ok()?;
    if n == 0 {
        return None;
    }
    let mut buf = vec![0; n + 2];
    r.read_exact(&mut buf).ok()?;
    buf.truncate(n);
    Some(buf)
}

/// Sends one request on its own connection and returns the connection without reading the answer
/// (dropping it hangs up).
pub fn send_only(addr: SocketAddr, method: &str, path: &str, body: Option<&str>) -> TcpStream {
    let mut s = connect(addr);
    send(&mut s, addr, method, path, body);
    s
}

/// One request on its own connection → (status, body).
pub fn request(addr: SocketAddr, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
    let mut s = connect(addr);
    send(&mut s, addr, method, path, body);
    let mut r = BufReader::new(s);
    let (status, headers) = head(&mut r);
    let mut out = Vec::new();
    if chunked(&headers) {
        while let Some(c) = read_chunk(&mut r) {
            out.extend(c);
        }
    } else {
        r.read_to_end(&mut out).unwrap();
    }
    (status, String::from_utf8(out).expect("a UTF-8 body"))
}

/// A streaming response, read event by event.
pub struct Sse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    reader: BufReader<TcpStream>,
    buf: String,
    chunked: bool,
}

impl Sse {
    fn open(addr: SocketAddr, path: &str, body: &str) -> Sse {
        let mut s = connect(addr);
        send(&mut s, addr, "POST", path, Some(body));
        let mut reader = BufReader::new(s);
        let (status, headers) = head(&mut reader);
        let chunked = chunked(&headers);
        Sse {
            status,
            headers,
            reader,
            buf: String::new(),
            chunked,
        }
    }

    /// The next event's `data:` payload (None when the body ends).
    pub fn next_data(&mut self) -> Option<String> {
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let event: String = self.buf.drain(..end + 2).collect();
                let data: Vec<&str> = event
                    .lines()
                    .filter_map(|l| l.strip_prefix("data:"))
                    .map(|d| d.strip_prefix(' ').unwrap_or(d))
                    .collect();
                if data.is_empty() {
                    continue; // a comment or keep-alive
                }
                return Some(data.join("\n"));
            }
            let more = if self.chunked {
                read_chunk(&mut self.reader)?
            } else {
                let mut b = vec![0; 4096];
                let n = self.reader.read(&mut b).ok()?;
                if n == 0 {
                    return None;
                }
                b.truncate(n);
                b
            };
            self.buf
                .push_str(&String::from_utf8(more).expect("UTF-8 events"));
        }
    }

    /// Every remaining `data:` payload, `[DONE]` included.
    pub fn all(mut self) -> Vec<String> {
        let mut v = Vec::new();
        while let Some(d) = self.next_data() {
            v.push(d);
        }
        v
    }
}
