//! Flash offload on the real default model: converted with a synthetic neuron order and run at half
//! the FFN in memory, decode gives the logits and greedy tokens of in-memory sparse decode (same rows,
//! only the summation order differs), with page-packed Q8_0 down columns and with Q5_0 down columns in
//! multi-page units of several neurons (full packing).

use crate::common;

use common::*;
use engine::offload::{convert, store_path_for, ConvertOptions, OffloadOptions, Packing};
use engine::sparse::DEFAULT_DOWN_FORMAT;
use engine::{Engine, EngineOptions, Logits, ModelFile, Precision, SparseFfn, WeightFormat};

#[test]
fn offloaded_decode_matches_in_memory_sparse_decode_on_the_real_model() {
    // SmolLM2 Q4_1 + Q8_0 down: 3 bundles of 1332 bytes per page.
    check(DEFAULT_DOWN_FORMAT, Packing::Page, (3, 1));
}

#[test]
fn fully_packed_q5_0_store_matches_in_memory_sparse_decode() {
    // Q4_1 + Q5_0 down: 1116-byte bundles, 3 per page (82%) or 7 in 2 pages (95.4%).
    check(WeightFormat::Q5_0, Packing::Full, (7, 2));
}

fn check(down: WeightFormat, packing: Packing, layout: (usize, usize)) {
    let file = ModelFile::open(model_path()).unwrap();
    let opts = EngineOptions {
        threads: 2,
        precision: Precision::Fast,
        context: 256,
        ..Default::default()
    };
    let mut mem = Engine::new(&file, opts.clone()).unwrap();
    let n_layers = mem.model().config.n_layers;
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("offload-real-{}-{down}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let resident = dir.join("smollm2.resident.gguf");
    let report = convert(
        &file,
        &synthetic_profile(mem.model()),
        &resident,
        &ConvertOptions {
            down_format: Some(down),
            packing: Some(packing),
            ..Default::default()
        },
        |_, _| {},
    )
    .unwrap();
    assert_eq!((report.layout.neurons, report.layout.pages), layout);
    assert_eq!(report.down_format, down);
    mem.set_sparse(Some(
        SparseFfn::new(mem.model(), vec![0.0; n_layers], down).unwrap(),
    ));

    let rfile = ModelFile::open(&resident).unwrap();
    let mut off = Engine::new(&rfile, opts).unwrap();
    // SmolLM2's 49,152-row Q8_0 output is worth a proxy, so the resident file carries one, and the
    // planner counts a step's reads of the streamed output through it unless it is turned off.
    assert!(engine::output_proxy::proxy_pays(&mem.model().output));
    assert!(off.model().output_proxy().is_some());
    let touched = |eng: &Engine<'_>| {
        let s = engine::model_summary(eng, &engine::SparseSidecars::default()).unwrap();
        let t = s
            .tensors
            .iter()
            .find(|t| t.name == engine::STREAMED)
            .unwrap();
        (t.touched_bytes, s.output_bytes)
    };
    let out = &off.model().output;
    let (row, proxied, whole) = (
        off.model().embed.row_bytes() as u64,
        engine::output_proxy::proxy_step_bytes(out),
        out.data().len() as u64,
    );
    assert_eq!(touched(&off), (proxied + row, proxied));
    off.set_output_proxy(false);
    assert_eq!(touched(&off), (whole + row, whole));
    off.set_output_proxy(true);
    let cfg = off.model().config.clone();
    let ffn = std::fs::metadata(store_path_for(&resident)).unwrap().len() as usize;
    let o = OffloadOptions {
        ffn_budget: ffn / 2,
        ..Default::default()
    };
    off.set_sparse(Some(
        SparseFfn::from_store(&cfg, &store_path_for(&resident), vec![0.0; n_layers], o).unwrap(),
    ));

    let prompt = ids(&reference()["prompts"][0]["ids"]);
    let (mut cm, mut co) = (mem.new_cache(), off.new_cache());
    let mut tok = prompt[0];
    let mut worst = 0f32;
    for step in 0..prompt.len() + 12 {
        let a = mem.forward(&mut cm, &[tok], Logits::Last).unwrap();
        let b = off.forward(&mut co, &[tok], Logits::Last).unwrap();
        let m = a.iter().fold(0f32, |m, v| m.max(v.abs()));
        worst = worst.max(
            a.iter()
                .zip(&b)
                .fold(0f32, |d, (x, y)| d.max((x - y).abs()))
                / m,
        );
        let (ga, gb) = (engine::argmax(&a), engine::argmax(&b));
        assert_eq!(ga, gb, "greedy token differs at step {step}");
        tok = if step + 1 < prompt.len() {
            prompt[step + 1]
        } else {
            ga
        };
    }
    eprintln!("offloaded vs in-memory sparse: max relative logit difference {worst:.2e}");
    // Measured 1.6e-4 (f32 summation order over 30 layers); a wrong row or unit gives O(1).
    assert!(worst < 1e-3, "drift {worst}");
    let st = off.sparse().unwrap().offload().unwrap().stats();
    assert!(
        st.misses > 0 && st.hot_hits > 0 && st.bytes_read > 0,
        "half the FFN in memory reads the rest: {st:?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn offloaded_decode_is_the_same_on_one_thread_and_on_two_and_at_any_cache_size() {
    // Which worker takes which unit, in what order reads complete, and which units are cached must
    // not change a bit of the logits: each unit is summed alone and those sums added in fixed point
    // (f32 sums in arrival order, then f32 lanes of the hot units, made greedy text differ between
    // runs of one command: a process budget's cache size moves with the measured memory). A prompt
    // step's chunks are fixed by unit index, wherever the hot prefix ends.
    let file = ModelFile::open(model_path()).unwrap();
    let mem = Engine::new(&file, EngineOptions::default()).unwrap();
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("offload-threads-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let resident = dir.join("smollm2.resident.gguf");
    convert(
        &file,
        &synthetic_profile(mem.model()),
        &resident,
        &ConvertOptions::default(),
        |_, _| {},
    )
    .unwrap();
    let rfile = ModelFile::open(&resident).unwrap();
    let n_layers = mem.model().config.n_layers;
    let ffn = std::fs::metadata(store_path_for(&resident)).unwrap().len() as usize;
    let run = |threads: usize, cached: usize| {
        let mut off = Engine::new(
            &rfile,
            EngineOptions {
                threads,
                precision: Precision::Fast,
                context: 64,
                ..Default::default()
            },
        )
        .unwrap();
        let cfg = off.model().config.clone();
        let o = OffloadOptions {
            ffn_budget: cached,
            // Several chunks a layer in the prompt step.
            prefill_neurons: 64,
            ..Default::default()
        };
        off.set_sparse(Some(
            SparseFfn::from_store(&cfg, &store_path_for(&resident), vec![0.0; n_layers], o)
                .unwrap(),
        ));
        let prompt = ids(&reference()["prompts"][0]["ids"]);
        // Decode steps, then one prompt step of 12 tokens (the layer streamed in chunks).
        let mut cache = off.new_cache();
        let mut logits: Vec<f32> = prompt
            .iter()
            .take(10)
            .flat_map(|&t| off.forward(&mut cache, &[t], Logits::Last).unwrap())
            .collect();
        let mut cache = off.new_cache();
        logits.extend(
            off.forward(&mut cache, &prompt[..12.min(prompt.len())], Logits::All)
                .unwrap(),
        );
        logits
    };
    let one = run(1, ffn / 3);
    for _ in 0..2 {
        assert!(
            run(2, ffn / 3) == one,
            "offloaded logits differ between 1 and 2 threads"
        );
    }
    // A hot region a few units longer or shorter in every layer, and none at all.
    for cached in [ffn / 3 + 40_000, ffn / 3 - 40_000, 0] {
        assert!(
            run(2, cached) == one,
            "offloaded logits differ with {cached} bytes of cache against {}",
            ffn / 3
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
