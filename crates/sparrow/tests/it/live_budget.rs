//! `POST /admin/memory-budget` on a real `sparrow serve` over an offloaded SmolLM2 bundle (made here by
//! `sparrow profile` and `sparrow convert`, as `cli.rs` does): requests keep being answered while the
//! budget shrinks and grows, `/metrics` reports the new budget with the cache's bytes within it,
//! resident memory follows a shrink (Linux: the server's `VmRSS`, with a wide margin), bad bodies and
//! budgets below the minimum are 400s, other machines get 403, and a model in memory has nothing to
//! resize.

use crate::support;

use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{json, Value};
use support::{fixture, Server};

fn sparrow(args: &[&str]) {
    let out = Command::new(env!("CARGO_BIN_EXE_sparrow"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A SmolLM2 bundle (the default model, fetched like `sparrow run` does) in its own folder.
fn bundle() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("sparrow-live-budget-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let profile = dir.join("m.sparrow-profile");
    let resident = dir.join("m.resident.gguf");
    let (p, r) = (profile.to_str().unwrap(), resident.to_str().unwrap());
    sparrow(&[
        "profile",
        "--window",
        "64",
        "--windows",
        "2",
        "--calib-windows",
        "1",
        "--sparsity",
        "0.3",
        "-o",
        p,
    ]);
    sparrow(&["convert", "--profile", p, "-o", r]);
    resident
}

/// The server's resident memory in bytes (`VmRSS` of /proc/PID/status).
#[cfg(target_os = "linux")]
fn rss(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = s
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmRSS in /proc/PID/status");
    kb * 1024
}

fn post_budget(s: &Server, body: &str) -> (u16, Value) {
    let (st, b) = s.post("/admin/memory-budget", body);
    (
        st,
        serde_json::from_str(&b).unwrap_or_else(|e| panic!("{e}: {b}")),
    )
}

fn error_message(v: &Value) -> String {
    v["error"]["message"]
        .as_str()
        .expect("an error message")
        .to_string()
}

/// Sets its flag when dropped (also while unwinding from a failed assertion).
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Removes its folder when dropped (also while unwinding from a failed assertion): the bundle is
/// about 110 MB.
struct RemoveOnDrop(std::path::PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn memory_budget_shrinks_and_grows_while_serving() {
    let resident = bundle();
    // Declared before the server, so dropped after it has stopped.
    let _remove = RemoveOnDrop(resident.parent().unwrap().to_path_buf());
    let s = Server::start(&[
        "-m",
        resident.to_str().unwrap(),
        "--threads",
        "1",
        "--ctx",
        "256",
        "--host",
        "0.0.0.0",
    ]);
    let ffn = s.metric("sparrow_neuron_cache_budget_bytes");
    let full = s.metric("sparrow_neuron_cache_resident_bytes");
    assert!(ffn > 30e6, "SmolLM2's FFN is tens of MB: {ffn}");
    assert!(
        full > 0.9 * ffn,
        "the whole FFN is preloaded: {full} of {ffn}"
    );

    // Bad bodies and a budget below the minimum: 400, one line, the minimum named.
    for bad in [r#"{"budget": "lots"}"#, "300M", r#"{"bytes": -5}"#, "{}"] {
        let (st, v) = post_budget(&s, bad);
        assert_eq!(st, 400, "{bad}: {v}");
        assert!(!error_message(&v).contains('\n'), "{v}");
    }
    let (st, v) = post_budget(&s, r#"{"bytes": 1}"#);
    assert_eq!(st, 400, "{v}");
    let msg = error_message(&v);
    let minimum: u64 = msg
        .split("minimum of ")
        .nth(1)
        .and_then(|t| t.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("names the minimum in bytes: {msg}"));
    assert!(minimum > 1 << 20, "{msg}");

    // Requests all along: a streamed one and plain ones, from two clients.
    let stop = AtomicBool::new(false);
    let (shrunk, grown) = std::thread::scope(|sc| {
        let clients: Vec<_> = (0..2)
            .map(|c| {
                let (s, stop) = (&s, &stop);
                sc.spawn(move || {
                    let mut answered = 0;
                    while !stop.load(Ordering::Relaxed) || answered < 2 {
                        let req = json!({
                            "prompt": format!("Client {c} counts to ten:"),
                            "max_tokens": 12, "temperature": 0, "ignore_eos": true,
                        });
                        let (st, v) = s.post_json("/v1/completions", &req);
                        assert_eq!(st, 200, "a request failed during a resize: {v}");
                        assert_eq!(v["usage"]["completion_tokens"], 12, "{v}");
                        answered += 1;
                    }
                    answered
                })
            })
            .collect();
        // A failed check below stops the clients too (else the scope would wait for them forever).
        let _stop_on_exit = StopOnDrop(&stop);
        std::thread::sleep(Duration::from_millis(500));
        #[cfg(target_os = "linux")]
        let before = rss(s.pid());
        let asked = minimum + (ffn * 0.1) as u64;
        let (st, v) = post_budget(&s, &format!(r#"{{"bytes": {asked}}}"#));
        assert_eq!(st, 200, "{v}");
        assert_eq!(v["memory_budget_bytes"], asked, "{v}");
        let cache_budget = v["cache_budget_bytes"].as_u64().unwrap();
        assert!(
            v["cache_bytes"].as_u64().unwrap() <= cache_budget && (cache_budget as f64) < 0.2 * ffn,
            "{v}"
        );
        std::thread::sleep(Duration::from_secs(2));
        assert_eq!(s.metric("sparrow_memory_budget_bytes"), asked as f64);
        // One scrape: a prompt step lending cache memory between two scrapes would lower the budget
        // below resident bytes read just before.
        let [shrunk, budget] = s.metrics(&[
            "sparrow_neuron_cache_resident_bytes",
            "sparrow_neuron_cache_budget_bytes",
        ])[..] else {
            unreachable!()
        };
        assert!(shrunk <= budget, "resident {shrunk} > budget {budget}");
        #[cfg(target_os = "linux")]
        {
            // The cache let go of ~90% of the FFN; the process must show at least half of that
            // (other allocations come and go with the requests).
            let after = rss(s.pid());
            eprintln!("RSS {before} -> {after}; cache {full} -> {shrunk} of an FFN of {ffn} bytes");
            assert!(
                (after as f64) < before as f64 - 0.45 * ffn,
                "RSS {before} -> {after} after the cache shrank from {full} to {shrunk} bytes"
            );
        }
        // Grow: the budget as a size string, more than the whole process needs.
        let (st, v) = post_budget(&s, r#"{"budget": "2G"}"#);
        assert_eq!(st, 200, "{v}");
        assert_eq!(v["memory_budget_bytes"], 2u64 << 30, "{v}");
        assert_eq!(v["cache_budget_bytes"].as_f64().unwrap(), ffn, "{v}");
        let grown = s.metric("sparrow_neuron_cache_resident_bytes");
        stop.store(true, Ordering::Relaxed);
        let answered: usize = clients.into_iter().map(|c| c.join().unwrap()).sum();
        assert!(answered >= 4, "{answered}");
        (shrunk, grown)
    });
    assert!(
        grown > 0.9 * ffn && grown > 2.0 * shrunk,
        "{shrunk} -> {grown}"
    );
    let (_, text) = s.get("/metrics");
    assert!(!text.contains("status=\"500\""), "{text}");

    // From another machine (this one's non-loopback address, when it has one): 403.
    let local = std::net::UdpSocket::bind("0.0.0.0:0")
        .and_then(|u| u.connect("192.0.2.1:9").and(u.local_addr()));
    match local {
        Ok(a) if !a.ip().is_loopback() && !a.ip().is_unspecified() => {
            let addr = std::net::SocketAddr::new(a.ip(), s.addr.port());
            let (st, b) = support::request(
                addr,
                "POST",
                "/admin/memory-budget",
                Some(r#"{"bytes": 1}"#),
            );
            assert_eq!(st, 403, "{b}");
            assert!(b.contains("loopback"), "{b}");
        }
        _ => eprintln!(
            "no non-loopback address here: the 403 is checked by the server's unit test only"
        ),
    }
}

#[test]
fn a_model_in_memory_has_no_cache_to_resize() {
    let model = fixture("tiny-llama-silu-q4_0.gguf");
    let s = Server::start(&["-m", model.to_str().unwrap(), "--threads", "1"]);
    let (st, v) = post_budget(&s, r#"{"budget": "100M"}"#);
    assert_eq!(st, 400, "{v}");
    assert!(error_message(&v).contains("not offloaded"), "{v}");
    let (_, text) = s.get("/metrics");
    assert!(!text.contains("sparrow_memory_budget_bytes"), "{text}");
}
