//! `sparrow serve` as a client sees it: a real server process on a free loopback port, every endpoint,
//! streaming, OpenAI's error shapes and statuses, the queue bound (429), a disconnecting client
//! cancelling its generation, and the server still serving after each failure.

use crate::support;

use serde_json::{json, Value};
use support::{fixture, Server};

const MODEL: &str = "tiny-llama-silu-q4_0";

fn tiny(extra: &[&str]) -> Server {
    let model = fixture(&format!("{MODEL}.gguf"));
    let mut args = vec!["-m", model.to_str().unwrap(), "--threads", "1"];
    args.extend_from_slice(extra);
    Server::start(&args)
}

/// `sparrow run --json` with the same greedy settings, for comparison.
fn run_text(args: &[&str]) -> String {
    let model = fixture(&format!("{MODEL}.gguf"));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sparrow"))
        .args(["run", "-m", model.to_str().unwrap(), "--threads", "1"])
        .args(["--temp", "0", "--ignore-eos", "--json"])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["text"].as_str().unwrap().to_string()
}

fn assert_error(status: u16, body: &Value, want_status: u16, want_type: &str) -> String {
    assert_eq!(status, want_status, "{body}");
    let e = &body["error"];
    assert_eq!(e["type"], want_type, "{body}");
    let msg = e["message"].as_str().expect("a message").to_string();
    assert!(!msg.is_empty());
    msg
}

#[test]
fn health_models_and_metrics() {
    let s = tiny(&[]);
    let (st, body) = s.get("/health");
    assert_eq!((st, body.as_str()), (200, r#"{"status":"ok"}"#));
    let (st, body) = s.get("/v1/models");
    assert_eq!(st, 200);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], MODEL);
    assert_eq!(v["data"][0]["object"], "model");
    let (st, text) = s.get("/metrics");
    assert_eq!(st, 200);
    for name in [
        "sparrow_requests_total{route=\"/v1/models\"} 1",
        "sparrow_queue_length 0",
        "sparrow_decode_tokens_per_second",
        "sparrow_completion_tokens_total 0",
    ] {
        assert!(text.contains(name), "`{name}` in:\n{text}");
    }
    let (st, body) = s.get("/v1/nothing");
    assert_eq!(st, 404, "{body}");
    assert!(body.contains("no endpoint /v1/nothing"), "{body}");
}

#[test]
fn completion_matches_run_and_streams_the_same_text() {
    let s = tiny(&[]);
    let want = run_text(&["-p", "Once upon a time", "-n", "12"]);
    let req = json!({
        "model": MODEL, "prompt": "Once upon a time", "max_tokens": 12,
        "temperature": 0, "ignore_eos": true,
    });
    let (st, v) = s.post_json("/v1/completions", &req);
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["model"], MODEL);
    assert_eq!(v["choices"][0]["text"], want.as_str());
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    let u = &v["usage"];
    assert_eq!(u["completion_tokens"], 12);
    assert!(u["prompt_tokens"].as_u64().unwrap() >= 16, "{u}"); // 16 bytes
    assert_eq!(
        u["total_tokens"].as_u64(),
        Some(u["prompt_tokens"].as_u64().unwrap() + 12)
    );
    assert_eq!(s.metric("sparrow_completion_tokens_total"), 12.0);

    let mut sreq = req.clone();
    sreq["stream"] = json!(true);
    sreq["stream_options"] = json!({"include_usage": true});
    let sse = s.stream("/v1/completions", &sreq);
    assert_eq!(sse.status, 200);
    assert!(sse
        .headers
        .iter()
        .any(|(k, v)| k == "content-type" && v.starts_with("text/event-stream")));
    let events = sse.all();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert!(chunks.len() >= 3, "{events:?}");
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"].get(0)?["text"].as_str().map(str::to_string))
        .collect();
    assert_eq!(text, want);
    let finishes: Vec<_> = chunks
        .iter()
        .filter_map(|c| c["choices"].get(0)?["finish_reason"].as_str())
        .collect();
    assert_eq!(finishes, ["length"]);
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(usage["completion_tokens"], 12, "{events:?}");
    assert!(chunks.iter().all(|c| c["object"] == "text_completion"));
}

#[test]
fn chat_uses_the_template_as_run_chat_does() {
    let s = tiny(&[]);
    let want = run_text(&["--chat", "-p", "Hello there", "-n", "10"]);
    let req = json!({
        "model": MODEL, "max_tokens": 10, "temperature": 0, "ignore_eos": true,
        "messages": [{"role": "user", "content": "Hello there"}],
    });
    let (st, v) = s.post_json("/v1/chat/completions", &req);
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(v["choices"][0]["message"]["content"], want.as_str());
    assert_eq!(v["usage"]["completion_tokens"], 10);

    let mut sreq = req.clone();
    sreq["stream"] = json!(true);
    let events = s.stream("/v1/chat/completions", &sreq).all();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert!(chunks
        .iter()
        .all(|c| c["object"] == "chat.completion.chunk"));
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, want);
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "length"
    );
}

#[test]
fn stop_strings_seed_and_n() {
    let s = tiny(&[]);
    let base = json!({
        "model": MODEL, "prompt": "abc", "max_tokens": 40, "temperature": 0, "ignore_eos": true,
    });
    let (_, v) = s.post_json("/v1/completions", &base);
    let full = v["choices"][0]["text"].as_str().unwrap().to_string();
    // A stop string from the middle of the greedy text: the answer is the text before it.
    let chars: Vec<char> = full.chars().collect();
    assert!(chars.len() >= 8, "{full:?}");
    let stop: String = chars[chars.len() / 2..chars.len() / 2 + 2].iter().collect();
    let expect = &full[..full.find(&stop).unwrap()];
    for stream in [false, true] {
        let mut req = base.clone();
        req["stop"] = json!([stop, "never-appears"]);
        if stream {
            req["stream"] = json!(true);
            let events = s.stream("/v1/completions", &req).all();
            let chunks: Vec<Value> = events[..events.len() - 1]
                .iter()
                .map(|e| serde_json::from_str(e).unwrap())
                .collect();
            let text: String = chunks
                .iter()
                .filter_map(|c| c["choices"][0]["text"].as_str())
                .collect();
            assert_eq!(text, expect, "stop {stop:?} in {full:?}");
            assert_eq!(
                chunks.last().unwrap()["choices"][0]["finish_reason"],
                "stop"
            );
        } else {
            let (st, v) = s.post_json("/v1/completions", &req);
            assert_eq!(st, 200, "{v}");
            assert_eq!(v["choices"][0]["text"], expect, "stop {stop:?} in {full:?}");
            assert_eq!(v["choices"][0]["finish_reason"], "stop");
        }
    }
    // Sampling: the same seed gives the same text; n choices come back indexed, computed with
    // successive seeds (so choice 1 of seed 7 is choice 0 of seed 8).
    let sampled = |seed: u64, n: u64| {
        let req = json!({
            "model": MODEL, "prompt": "abc", "max_tokens": 16, "temperature": 1.0, "top_p": 0.9,
            "seed": seed, "n": n, "ignore_eos": true,
        });
        let (st, v) = s.post_json("/v1/completions", &req);
        assert_eq!(st, 200, "{v}");
        v
    };
    let a = sampled(7, 2);
    let b = sampled(8, 1);
    assert_eq!(a["choices"].as_array().unwrap().len(), 2);
    assert_eq!(a["choices"][1]["index"], 1);
    assert_eq!(a["choices"][1]["text"], b["choices"][0]["text"]);
    assert_eq!(a["usage"]["completion_tokens"], 32);
    assert_eq!(sampled(7, 1)["choices"][0]["text"], a["choices"][0]["text"]);
}

#[test]
fn errors_have_openai_shape_and_the_server_keeps_serving() {
    let s = tiny(&["--max-body", "4K"]);
    let (st, body) = s.post("/v1/completions", "{\"prompt\": \"hi\", ");
    let v: Value = serde_json::from_str(&body).unwrap();
    let msg = assert_error(st, &v, 400, "invalid_request_error");
    assert!(msg.contains("invalid JSON"), "{msg}");

    let (st, v) = s.post_json(
        "/v1/completions",
        &json!({"model": "gpt-4", "prompt": "hi"}),
    );
    assert_error(st, &v, 404, "invalid_request_error");
    assert_eq!(v["error"]["code"], "model_not_found");

    // The fixture's context is 128 tokens; a byte-level prompt of 300 bytes cannot fit.
    let long = "x".repeat(300);
    let (st, v) = s.post_json("/v1/completions", &json!({"model": MODEL, "prompt": long}));
    let msg = assert_error(st, &v, 400, "invalid_request_error");
    assert!(msg.contains("128"), "names the limit: {msg}");
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    let (st, v) = s.post_json(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": long}]}),
    );
    assert_error(st, &v, 400, "invalid_request_error");

    for (bad, param) in [
        (json!({"prompt": "hi", "temperature": 9}), "temperature"),
        (json!({"prompt": "hi", "top_p": 0}), "top_p"),
        (json!({"prompt": "hi", "n": 0}), "n"),
        (json!({"prompt": "hi", "max_tokens": 0}), "max_tokens"),
        (
            json!({"prompt": "hi", "stop": ["a", "b", "c", "d", "e"]}),
            "stop",
        ),
        (json!({"prompt": [999999]}), "prompt"),
        (json!({"messages": []}), "messages"),
    ] {
        let path = if bad.get("messages").is_some() {
            "/v1/chat/completions"
        } else {
            "/v1/completions"
        };
        let (st, v) = s.post_json(path, &bad);
        assert_error(st, &v, 400, "invalid_request_error");
        assert_eq!(v["error"]["param"], param, "{bad}: {v}");
    }
    let (st, v) = s.post_json("/v1/completions", &json!({"prompt": 5}));
    assert_error(st, &v, 400, "invalid_request_error");

    let big = json!({"prompt": "y".repeat(8192)}).to_string();
    let (st, body) = s.post("/v1/completions", &big);
    let v: Value = serde_json::from_str(&body).unwrap();
    let msg = assert_error(st, &v, 413, "invalid_request_error");
    assert!(msg.contains("4096"), "{msg}");

    // Still serving, and the errors were counted.
    let (st, v) = s.post_json(
        "/v1/completions",
        &json!({"model": MODEL, "prompt": "ok", "max_tokens": 3, "ignore_eos": true}),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 3);
    let (_, text) = s.get("/metrics");
    assert!(
        text.contains("sparrow_request_errors_total{status=\"400\"} 11"),
        "{text}"
    );
    assert!(text.contains("sparrow_request_errors_total{status=\"404\"} 1"));
    assert!(text.contains("sparrow_request_errors_total{status=\"413\"} 1"));
}

/// The queue bound and cancellation need a generation that lasts: the default model (SmolLM2,
/// fetched like `sparrow run` does) asked for 1500 tokens, which takes many seconds on any CPU,
/// while the steps below take milliseconds. The test reads the figures from /metrics, not clocks.
#[test]
fn full_queue_is_429_and_a_disconnect_cancels_the_generation() {
    let mut s = Server::start(&["--threads", "1", "--queue", "1", "--ctx", "2048"]);
    let long = json!({
        "prompt": "The history of", "max_tokens": 1500, "temperature": 0, "ignore_eos": true,
        "stream": true,
    });
    let mut a = s.stream("/v1/completions", &long);
    assert_eq!(a.status, 200);
    let first = a.next_data().expect("a first chunk");
    assert!(first.contains("text_completion"), "{first}");
    // B waits behind A; wait until the server has admitted it.
    let addr = s.addr;
    let b = std::thread::spawn(move || {
        support::request(
            addr,
            "POST",
            "/v1/completions",
            Some(r#"{"prompt": "Hello", "max_tokens": 4, "ignore_eos": true}"#),
        )
    });
    while s.metric("sparrow_queue_length") < 1.0 {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // C finds the queue full.
    let (st, body) = s.post("/v1/completions", r#"{"prompt": "Hi", "max_tokens": 4}"#);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_error(st, &v, 429, "rate_limit_error");
    assert_eq!(s.metric("sparrow_busy"), 1.0);
    // A's client goes away: its generation stops and B runs.
    drop(a);
    let (st, body) = b.join().unwrap();
    assert_eq!(st, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["usage"]["completion_tokens"], 4);
    assert_eq!(s.metric("sparrow_cancelled_total"), 1.0);
    let generated = s.metric("sparrow_completion_tokens_total");
    assert!(
        generated < 1500.0,
        "A stopped early: {generated} tokens in all"
    );
    assert!(s.alive());
    let (st, _) = s.get("/health");
    assert_eq!(st, 200);
}

/// A client that hangs up on a request that does not stream is noticed too: its generation stops
/// (counted as cancelled) long before its 1500 tokens, and the server answers the next request.
/// Bounded waits on /metrics, no clock figures.
#[test]
fn a_disconnect_cancels_a_request_that_does_not_stream() {
    let mut s = Server::start(&["--threads", "1", "--ctx", "2048"]);
    let body =
        r#"{"prompt": "The history of", "max_tokens": 1500, "temperature": 0, "ignore_eos": true}"#;
    let conn = support::send_only(s.addr, "POST", "/v1/completions", Some(body));
    let wait = |what: &str, done: &dyn Fn() -> bool| {
        let t0 = std::time::Instant::now();
        while !done() {
            assert!(t0.elapsed().as_secs() < 120, "{what}: not within 120 s");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    };
    wait("the request runs", &|| s.metric("sparrow_busy") == 1.0);
    drop(conn);
    wait("the generation is cancelled", &|| {
        s.metric("sparrow_cancelled_total") == 1.0
    });
    let generated = s.metric("sparrow_completion_tokens_total");
    assert!(generated < 1500.0, "stopped early: {generated} tokens");
    assert!(s.alive());
    let (st, body) = s.post("/v1/completions", r#"{"prompt": "Hi", "max_tokens": 2}"#);
    assert_eq!(st, 200, "{body}");
}

/// `--timeout`: a request past it gets 503 (code `timeout`), or an error event before `[DONE]` when
/// streaming, and the server goes on. 1500 tokens of the default model take far more than 1 s.
#[test]
fn requests_past_the_timeout_are_stopped_with_503() {
    let s = Server::start(&["--threads", "1", "--ctx", "2048", "--timeout", "1"]);
    let mut long = json!({
        "prompt": "The history of", "max_tokens": 1500, "temperature": 0, "ignore_eos": true,
    });
    let (st, v) = s.post_json("/v1/completions", &long);
    assert_error(st, &v, 503, "server_error");
    assert_eq!(v["error"]["code"], "timeout");
    long["stream"] = json!(true);
    let events = s.stream("/v1/completions", &long).all();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let err: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(err["error"]["code"], "timeout", "{err}");
    assert_eq!(s.metric("sparrow_timed_out_total"), 2.0);
    let (st, v) = s.post_json("/v1/completions", &json!({"prompt": "Hi", "max_tokens": 2}));
    assert_eq!(st, 200, "{v}");
}

/// A queued request whose client hangs up gives its place back at once, while the engine still
/// computes another one (it used to hold it until the engine reached it: clients that queue a
/// stream and hang up could keep the queue full). Bounded waits on /metrics.
#[test]
fn a_queued_request_whose_client_leaves_frees_its_place() {
    let s = Server::start(&["--threads", "1", "--queue", "1", "--ctx", "2048"]);
    let long = json!({
        "prompt": "The history of", "max_tokens": 1500, "temperature": 0, "ignore_eos": true,
        "stream": true,
    });
    let mut a = s.stream("/v1/completions", &long);
    assert!(a.next_data().is_some(), "A streams");
    let wait = |what: &str, done: &dyn Fn() -> bool| {
        let t0 = std::time::Instant::now();
        while !done() {
            assert!(t0.elapsed().as_secs() < 60, "{what}: not within 60 s");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    };
    for body in [
        r#"{"prompt": "Hello", "max_tokens": 4, "stream": true}"#,
        r#"{"prompt": "Hello", "max_tokens": 4}"#,
    ] {
        let b = support::send_only(s.addr, "POST", "/v1/completions", Some(body));
        wait("B is queued", &|| s.metric("sparrow_queue_length") == 1.0);
        drop(b);
        wait("B's place is free", &|| {
            s.metric("sparrow_queue_length") == 0.0
        });
        assert_eq!(s.metric("sparrow_busy"), 1.0, "A still runs");
    }
    drop(a);
    let (st, body) = s.post("/v1/completions", r#"{"prompt": "Hi", "max_tokens": 2}"#);
    assert_eq!(st, 200, "{body}");
}
