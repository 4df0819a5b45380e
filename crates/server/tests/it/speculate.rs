//! Speculative decoding in the server: `serve_speculative` with prompt lookup and with the model
//! drafting from memory (a bundle of the tiny fixture under a budget) gives a greedy request the
//! text the plain server gives; a request's `speculative` field turns it off or limits its draft
//! length; `/metrics` counts steps, drafted and kept tokens; sources that cannot work are refused
//! at start.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use engine::offload::{store_path_for, ConvertOptions, OffloadOptions};
use engine::{Drafting, Engine, EngineOptions, ModelFile, SparseFfn};
use serde_json::Value;
use server::ServeOptions;

const FIXTURE: &str = "tiny-llama-silu-q4_0.gguf";

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(name)
}

fn options() -> EngineOptions {
    EngineOptions {
        threads: 1,
        context: 128,
        ..Default::default()
    }
}

/// How a test server drafts.
#[derive(Clone, Copy)]
enum Spec {
    Off,
    Lookup(usize),
    SelfDraft(usize),
    /// Another fixture with the same vocabulary drafting.
    Model(&'static str, usize),
}

/// A profile of made-up firing rates (the store's neuron order only).
fn synthetic_profile(eng: &Engine<'_>) -> predictor::Profile {
    let cfg = &eng.model().config;
    let fingerprint = engine::profile::model_fingerprint(eng.model());
    predictor::Profile::synthetic("synthetic", fingerprint, cfg.n_layers, cfg.d_ff)
}

/// The fixture converted to a bundle (resident file and neuron store) once per test process.
fn bundle() -> PathBuf {
    static DONE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DONE.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("server-spec-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = ModelFile::open(fixture(FIXTURE)).unwrap();
        let eng = Engine::new(&file, options()).unwrap();
        let resident = dir.join(FIXTURE.replace(".gguf", ".resident.gguf"));
        let opts = ConvertOptions::default();
        engine::offload::convert(&file, &synthetic_profile(&eng), &resident, &opts, |_, _| {})
            .unwrap();
        resident
    })
    .clone()
}

/// The engine of `path`; over a neuron store (a resident file) with a quarter of it cached.
fn open(file: &ModelFile) -> Engine<'_> {
    let mut eng = Engine::new(file, options()).unwrap();
    let store = store_path_for(file.path());
    if store.is_file() {
        let cfg = eng.model().config.clone();
        let total = std::fs::metadata(&store).unwrap().len() as usize;
        let opts = OffloadOptions {
            ffn_budget: total / 4,
            hot_share: 0.5,
            ..Default::default()
        };
        let sp = SparseFfn::from_store(&cfg, &store, vec![0.05; cfg.n_layers], opts).unwrap();
        eng.set_sparse(Some(sp));
    }
    eng
}

/// Serves `model` (port 0) with `spec` on a thread of its own; its address.
fn start(model: &Path, spec: Spec) -> SocketAddr {
    let (tx, rx) = std::sync::mpsc::channel();
    let model = model.to_path_buf();
    std::thread::spawn(move || {
        let file = ModelFile::open(&model).expect("the model opens");
        let eng = open(&file);
        let opts = ServeOptions {
            port: 0,
            model_id: "m".into(),
            ..Default::default()
        };
        let on = |a| tx.send(a).unwrap();
        let draft_file = match spec {
            Spec::Model(name, _) => Some(ModelFile::open(fixture(name)).unwrap()),
            _ => None,
        };
        let draft = draft_file.as_ref().map(open);
        let r = match spec {
            Spec::Model(_, n) => {
                let d = Drafting::Model(draft.as_ref().unwrap(), n);
                server::serve_speculative(&eng, d, opts, on)
            }
            Spec::Off => server::serve(&eng, opts, on),
            Spec::Lookup(n) => server::serve_speculative(&eng, Drafting::Lookup(n), opts, on),
            Spec::SelfDraft(n) => server::serve_speculative(&eng, Drafting::SelfDraft(n), opts, on),
        };
        panic!("the server stopped: {r:?}");
    });
    rx.recv_timeout(Duration::from_secs(60))
        .expect("the server listens")
}

/// `method path` with `body` (JSON); the status and the body of the answer.
fn call(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (status, body.to_string())
}

/// The text of a completion of `prompt` with `extra` fields (`, "name": value`), greedy unless
/// `extra` says otherwise.
fn complete(addr: SocketAddr, prompt: &str, extra: &str) -> String {
    let body = format!(
        r#"{{"prompt": "{prompt}", "max_tokens": 24, "ignore_eos": true, "temperature": 0{extra}}}"#
    );
    let (st, b) = call(addr, "POST", "/v1/completions", &body);
    assert_eq!(st, 200, "{b}");
    let v: Value = serde_json::from_str(&b).unwrap();
    v["choices"][0]["text"].as_str().unwrap().to_string()
}

/// The speculative counters of `/metrics`: (steps, drafted, accepted), zeros while absent.
fn counters(addr: SocketAddr) -> (f64, f64, f64) {
    let (_, m) = call(addr, "GET", "/metrics", "");
    let value = |name: &str| -> f64 {
        m.lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .map_or(0.0, |l| l.rsplit(' ').next().unwrap().parse().unwrap())
    };
    (
        value("sparrow_speculative_steps_total"),
        value("sparrow_speculative_drafted_tokens_total"),
        value("sparrow_speculative_accepted_tokens_total"),
    )
}

/// A prompt that repeats itself, so that lookup drafts.
const REPEATS: &str = "abcabcabcabcabcabcabc";

#[test]
fn lookup_serves_the_same_greedy_text_and_a_request_can_turn_it_off() {
    let model = fixture(FIXTURE);
    let plain = start(&model, Spec::Off);
    let spec = start(&model, Spec::Lookup(4));
    let want = complete(plain, REPEATS, "");
    assert_eq!(complete(spec, REPEATS, ""), want);
    let (steps, drafted, accepted) = counters(spec);
    assert!(steps >= 1.0 && drafted >= 1.0 && accepted <= drafted);
    let (_, m) = call(spec, "GET", "/metrics", "");
    assert!(
        m.contains("# TYPE sparrow_speculative_steps_total counter"),
        "{m}"
    );
    assert!(m.contains("sparrow_speculative_tokens_per_step "), "{m}");
    // Off for one request: the same text, no step counted.
    for off in [r#", "speculative": false"#, r#", "speculative.n_max": 0"#] {
        assert_eq!(complete(spec, REPEATS, off), want);
        assert_eq!(counters(spec), (steps, drafted, accepted), "{off}");
    }
    // At most one drafted token a step.
    assert_eq!(
        complete(spec, REPEATS, r#", "speculative": {"n_max": 1}"#),
        want
    );
    let (s2, d2, _) = counters(spec);
    assert!(s2 > steps && d2 - drafted <= s2 - steps, "{s2} {d2}");
    let (_, m) = call(plain, "GET", "/metrics", "");
    assert!(
        !m.contains("sparrow_speculative"),
        "no speculation, no figures"
    );
}

#[test]
fn self_draft_over_a_store_keeps_greedy_text_and_samples() {
    let model = bundle();
    let plain = start(&model, Spec::Off);
    let spec = start(&model, Spec::SelfDraft(4));
    for prompt in [REPEATS, "the quick brown fox"] {
        assert_eq!(
            complete(spec, prompt, ""),
            complete(plain, prompt, ""),
            "{prompt}"
        );
    }
    let (steps, drafted, accepted) = counters(spec);
    assert!(steps >= 1.0 && drafted >= 1.0 && accepted <= drafted);
    // Sampled requests run too (the rejection rule), and give as many tokens.
    let body = r#"{"prompt": "hello", "max_tokens": 16, "ignore_eos": true, "temperature": 0.9, "seed": 5}"#;
    let (st, b) = call(spec, "POST", "/v1/completions", body);
    assert_eq!(st, 200, "{b}");
    let v: Value = serde_json::from_str(&b).unwrap();
    assert_eq!(v["usage"]["completion_tokens"], 16, "{b}");
    assert!(counters(spec).0 > steps);
}

#[test]
fn sources_that_cannot_work_are_refused_at_start() {
    let file = ModelFile::open(fixture(FIXTURE)).unwrap();
    let eng = Engine::new(&file, options()).unwrap();
    let opts = ServeOptions {
        port: 0,
        ..Default::default()
    };
    let refused = |d: Drafting<'_, '_>| {
        server::serve_speculative(&eng, d, opts.clone(), |_| panic!("it listened"))
            .unwrap_err()
            .to_string()
    };
    let e = refused(Drafting::SelfDraft(4));
    assert!(e.contains("--self-draft") && e.contains(FIXTURE), "{e}");
    assert!(refused(Drafting::Lookup(0)).contains("at least one"));
}

#[test]
fn a_draft_model_serves_the_same_greedy_text() {
    let model = fixture(FIXTURE);
    let plain = start(&model, Spec::Off);
    let spec = start(&model, Spec::Model("tiny-qwen2-q4_1.gguf", 3));
    assert_eq!(complete(spec, REPEATS, ""), complete(plain, REPEATS, ""));
    let (steps, drafted, _) = counters(spec);
    assert!(steps >= 1.0 && drafted >= 1.0);
}
