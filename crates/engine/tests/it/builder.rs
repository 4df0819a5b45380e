//! The engine as a library: [`engine::EngineBuilder`] runs a model as the engine made by hand does,
//! carries a budget to the neuron cache as the live path sets it, and says what it decided.

use std::sync::{Arc, Mutex};

use engine::offload::{convert, ConvertOptions};
use engine::{EngineBuilder, EngineOptions, Level, Logits, MemoryBudget, ModelBundle, ModelFile};

use crate::common;

fn fixture(name: &str) -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(name)
}

#[test]
fn a_builder_runs_the_model_as_the_engine_made_by_hand() {
    let path = fixture("tiny-llama-silu-q4_0.gguf");
    let loaded = EngineBuilder {
        threads: 1,
        context: Some(64),
        ..EngineBuilder::new(&path)
    }
    .open()
    .unwrap();
    assert!(loaded.plan().is_none());
    let eng = loaded.engine().unwrap();
    assert_eq!(eng.options().context, 64);
    let file = ModelFile::open(&path).unwrap();
    let opts = EngineOptions {
        threads: 1,
        context: 64,
        ..Default::default()
    };
    let by_hand = engine::Engine::new(&file, opts).unwrap();
    let tokens = [1, 5, 9, 42];
    let mut a = eng.new_cache();
    let mut b = by_hand.new_cache();
    assert_eq!(
        eng.forward(&mut a, &tokens, Logits::Last).unwrap(),
        by_hand.forward(&mut b, &tokens, Logits::Last).unwrap()
    );
}

#[test]
fn the_budget_reaches_the_neuron_cache_as_the_live_path_sets_it() {
    let dir = std::env::temp_dir().join(format!("sparrow-builder-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = ModelFile::open(fixture("tiny-llama-relu-q8_0.gguf")).unwrap();
    let eng = engine::Engine::new(&file, EngineOptions::default()).unwrap();
    let profile = common::synthetic_profile(eng.model());
    let resident = ModelBundle::new(dir.join("m.gguf")).resident();
    convert(
        &file,
        &profile,
        &resident,
        &ConvertOptions::default(),
        |_, _| {},
    )
    .unwrap();
    profile.save(ModelBundle::new(&resident).profile()).unwrap();

    let lines = Arc::new(Mutex::new(Vec::new()));
    let seen = lines.clone();
    let cache_budget = |budget: MemoryBudget| {
        let seen = seen.clone();
        let b = EngineBuilder::new(&resident)
            .budget(budget)
            .log(move |level, line| seen.lock().unwrap().push((level, line.to_string())));
        let loaded = b.open().unwrap();
        let eng = loaded.engine().unwrap();
        let off = eng.sparse().and_then(|s| s.offload()).expect("offloaded");
        (off.control().report().cache_asked, off.control())
    };
    // A share is of the store's bytes.
    let store = std::fs::metadata(engine::offload::store_path_for(&resident))
        .unwrap()
        .len();
    let (half, control) = cache_budget(MemoryBudget::Share(0.5));
    assert_eq!(half, (0.5 * store as f64) as u64);
    // The live path: the same budget type, the same cache size asked.
    let (quarter, _) = cache_budget(MemoryBudget::Share(0.25));
    assert!(quarter < half);
    let live = control.set_budget(MemoryBudget::Share(0.25)).unwrap();
    assert_eq!(live.cache_asked, quarter);
    let (bytes, _) = cache_budget(MemoryBudget::Bytes(store / 3));
    assert_eq!(bytes, store / 3);
    let live = control.set_budget(MemoryBudget::Bytes(store / 3)).unwrap();
    assert_eq!(live.cache_asked, bytes);
    // Its lines say what it set up.
    let lines = lines.lock().unwrap();
    assert!(
        lines
            .iter()
            .any(|(l, t)| *l == Level::Note && t.starts_with("sparse FFN from ")),
        "{lines:?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
