//! Flash offload (`engine::offload`) on the tiny fixtures: `convert` writes a resident file and a neuron
//! store; a sparse FFN over the store computes what the in-memory sparse FFN computes, at every memory
//! budget, with and without the pipeline and the cold cache; I/O errors and damaged units are errors
//! that leave the engine serving; a resident file refuses to run without its store.

use crate::common;

use common::rel_drift;

use std::path::{Path, PathBuf};

use engine::offload::{convert, store_path_for, ConvertOptions, OffloadOptions};
use engine::sparse::DEFAULT_DOWN_FORMAT;
use engine::{Engine, EngineOptions, Logits, ModelFile, OffloadError, Precision, SparseFfn};
use predictor::Profile;
use ufs_io::{Fault, FaultPlan};

const TOKENS: &[u32] = &[1, 70, 80, 90, 100, 33, 7, 250, 12, 64, 5, 99];

fn fixture_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(name)
}

fn tmp_dir(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("offload-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn engine(file: &ModelFile) -> Engine<'_> {
    engine_t(file, 1)
}

fn engine_t(file: &ModelFile, threads: usize) -> Engine<'_> {
    Engine::new(
        file,
        EngineOptions {
            threads,
            precision: Precision::Exact,
            context: 64,
            ..Default::default()
        },
    )
    .unwrap()
}

/// A profile with pseudo-random frequencies (the order of neurons in the store), made for `file`.
fn profile_for(file: &ModelFile) -> Profile {
    common::synthetic_profile(engine(file).model())
}

fn converted(name: &str, opts: &ConvertOptions, tag: &str) -> PathBuf {
    let (resident, report) = common::convert_fixture(name, &tmp_dir(tag), opts);
    assert!(report.store_bytes % 4096 == 0 && report.store.exists() && report.resident.exists());
    resident
}

fn logits(eng: &Engine<'_>, batched: bool) -> Vec<f32> {
    common::logits(eng, TOKENS, batched)
}

fn in_memory_logits(name: &str, thresholds: f32, batched: bool) -> Vec<f32> {
    let file = ModelFile::open(fixture_path(name)).unwrap();
    let mut eng = engine(&file);
    let n = eng.model().config.n_layers;
    let sp = SparseFfn::new(eng.model(), vec![thresholds; n], DEFAULT_DOWN_FORMAT).unwrap();
    eng.set_sparse(Some(sp));
    logits(&eng, batched)
}

/// An engine over the store with 2 threads, so that decode runs two workers.
fn store_engine<'a>(resident: &'a ModelFile, thresholds: f32, opts: OffloadOptions) -> Engine<'a> {
    let mut eng = engine_t(resident, 2);
    let cfg = eng.model().config.clone();
    let store = store_path_for(resident.path());
    let sp = SparseFfn::from_store(&cfg, &store, vec![thresholds; cfg.n_layers], opts).unwrap();
    eng.set_sparse(Some(sp));
    eng
}

fn ffn_bytes(resident: &Path) -> usize {
    std::fs::metadata(store_path_for(resident)).unwrap().len() as usize
}

#[test]
fn offloaded_ffn_equals_in_memory_sparse_ffn_at_every_budget() {
    for name in [
        "tiny-llama-silu-q4_0.gguf",
        "tiny-llama-relu-q8_0.gguf",
        "tiny-qwen2-q4_1.gguf",
    ] {
        let resident = converted(name, &ConvertOptions::default(), "budgets");
        let file = ModelFile::open(&resident).unwrap();
        let total = ffn_bytes(&resident);
        let total_units = neuron_store_index(&resident).ffn_bytes();
        for t in [0.0f32, 0.05] {
            let want = in_memory_logits(name, t, false);
            for (budget, hot_share, cache_cold, pipeline, queue_depth, async_io) in [
                (usize::MAX, 1.0, true, true, 32, true),
                (total / 2, 0.5, true, true, 256, true),
                (total / 2, 0.5, true, true, 32, false),
                (total / 2, 0.5, false, false, 32, true),
                (0, 0.0, true, true, 32, true),
                (0, 0.0, true, true, 32, false),
                (0, 0.0, true, true, 1, true),
            ] {
                let eng = store_engine(
                    &file,
                    t,
                    OffloadOptions {
                        ffn_budget: budget,
                        hot_share,
                        cache_cold,
                        pipeline,
                        queue_depth,
                        async_io,
                        ..Default::default()
                    },
                );
                let got = logits(&eng, false);
                let d = rel_drift(&got, &want);
                assert!(
                    d < 1e-5,
                    "{name} t={t} budget {budget} cold {cache_cold} pipeline {pipeline} depth {queue_depth} aio {async_io}: drift {d}"
                );
                let st = eng.sparse().unwrap().offload().unwrap().stats();
                assert_eq!(st.tokens, TOKENS.len() as u64);
                assert_eq!(st.units, st.hot_hits + st.cold_hits + st.misses, "{st:?}");
                if budget == usize::MAX {
                    assert_eq!(st.misses, 0, "everything is hot: {st:?}");
                } else if budget == 0 {
                    assert_eq!(
                        st.hot_hits + st.cold_hits,
                        0,
                        "nothing can be cached: {st:?}"
                    );
                    assert_eq!(st.bytes_read, st.misses * 4096);
                } else {
                    assert!(st.misses > 0 && st.hot_hits > 0, "{st:?}");
                }
                // A prompt streams the store (each unit read once): the same numbers.
                let off = eng.sparse().unwrap().offload().unwrap();
                off.reset_stats();
                let batched = logits(&eng, true);
                assert!(
                    rel_drift(&batched, &in_memory_logits(name, t, true)) < 1e-5,
                    "{name} batched"
                );
                let st = off.stats();
                assert_eq!((st.tokens, st.units, st.bytes_read), (0, 0, 0), "{st:?}");
                assert!(st.prefill_s > 0.0, "the streamed FFN is timed: {st:?}");
                if budget == 0 {
                    // Each layer after the first had its first chunk read while the one before
                    // computed, and that read served it (no unit read twice).
                    assert_eq!(st.prefill_bytes_read, total_units as u64, "{st:?}");
                    assert!(st.prefill_reads_ahead > 0, "{st:?}");
                } else if budget == usize::MAX {
                    assert_eq!(st.prefill_bytes_read, 0, "everything is hot: {st:?}");
                    assert_eq!(st.prefill_reads_ahead, 0, "{st:?}");
                }
            }
        }
    }
}

/// The store's index (its layout and units), opened on its own.
fn neuron_store_index(resident: &Path) -> neuron_store::StoreIndex {
    let io = ufs_io::IoEngine::new(ufs_io::IoConfig::default()).unwrap();
    let store = neuron_store::NeuronStore::open(
        &io,
        store_path_for(resident),
        ufs_io::OpenOptions::default(),
    )
    .unwrap();
    store.index().clone()
}

/// Predicts for each token the neurons whose index mixes with the token's first input value: a
/// different, input-dependent candidate set per token.
struct ByInput(u32);

impl engine::NeuronPredictor for ByInput {
    fn predict(&self, layer: usize, x: &[f32], out: &mut Vec<u32>) -> Result<(), OffloadError> {
        let key = (x[0].to_bits() >> 13) as usize + layer;
        out.clear();
        out.extend((0..self.0).filter(|&j| (j as usize + key) % 3 != 0));
        Ok(())
    }
}

/// A prompt over the store streamed in chunks of a few neurons (many reads per layer, the hot
/// prefix in several chunks, buffers reused), with a per-token predictor and a threshold: the
/// in-memory sparse prefill's numbers, and every non-hot unit read once.
#[test]
fn a_streamed_prompt_in_small_chunks_computes_what_memory_does() {
    let name = "tiny-llama-silu-q4_0.gguf";
    let resident = converted(name, &ConvertOptions::default(), "prefill-chunks");
    let file = ModelFile::open(&resident).unwrap();
    let total = ffn_bytes(&resident);
    let index = neuron_store_index(&resident);
    let mem = ModelFile::open(fixture_path(name)).unwrap();
    let cfg = engine(&mem).model().config.clone();
    for (t, predicted) in [(0.0f32, false), (0.05, true)] {
        let mut eng = engine(&mem);
        let sp = SparseFfn::new(eng.model(), vec![t; cfg.n_layers], DEFAULT_DOWN_FORMAT).unwrap();
        eng.set_sparse(Some(if predicted {
            sp.with_predictor(Box::new(ByInput(cfg.d_ff as u32)))
        } else {
            sp
        }));
        let want = logits(&eng, true);
        for (budget, neurons) in [(total / 2, 1), (total / 2, 40), (0, 7)] {
            let mut eng = engine_t(&file, 2);
            let sp = SparseFfn::from_store(
                &cfg,
                &store_path_for(&resident),
                vec![t; cfg.n_layers],
                OffloadOptions {
                    ffn_budget: budget,
                    hot_share: 1.0,
                    cluster_units: 2,
                    prefill_neurons: neurons,
                    ..Default::default()
                },
            )
            .unwrap();
            eng.set_sparse(Some(if predicted {
                sp.with_predictor(Box::new(ByInput(cfg.d_ff as u32)))
            } else {
                sp
            }));
            let got = logits(&eng, true);
            let d = rel_drift(&got, &want);
            assert!(
                d < 1e-5,
                "t {t} budget {budget} chunks of {neurons}: drift {d}"
            );
            // Nothing but the hot prefixes is cached; the prompt read every other unit once, and
            // those the cache lent it (`a_prompt_borrows_the_cache_and_gives_it_back`), but never
            // more than the whole store.
            let st = eng.sparse().unwrap().offload().unwrap().stats();
            let cold = index.ffn_bytes() as u64 - st.resident_bytes as u64;
            assert!(
                st.prefill_bytes_read >= cold
                    && st.prefill_bytes_read <= index.ffn_bytes() as u64
                    && st.prefill_bytes_read % index.layout.unit_bytes() as u64 == 0,
                "budget {budget}: {st:?}"
            );
        }
    }
}

/// A prompt step borrows its working memory from a neuron cache whose budget binds: afterwards the
/// cache has its budget and its hot clusters back (read again), and decode finds them hot; with the
/// whole FFN cached nothing is lent (no read at all).
#[test]
fn a_prompt_borrows_the_cache_and_gives_it_back() {
    let name = "tiny-llama-silu-q4_0.gguf";
    let resident = converted(name, &ConvertOptions::default(), "lend");
    let file = ModelFile::open(&resident).unwrap();
    let total = neuron_store_index(&resident).ffn_bytes();
    let want = in_memory_logits(name, 0.0, true);
    for (budget, lends) in [(total / 2, true), (usize::MAX, false)] {
        let eng = store_engine(
            &file,
            0.0,
            OffloadOptions {
                ffn_budget: budget,
                hot_share: 1.0,
                cluster_units: 1,
                ..Default::default()
            },
        );
        let off = eng.sparse().unwrap().offload().unwrap();
        let before = off.control().report();
        let reads = off.io().stats().requests;
        let got = logits(&eng, true);
        assert!(rel_drift(&got, &want) < 1e-5, "budget {budget}");
        let after = off.control().report();
        assert_eq!(
            (after.cache_budget, after.cache_bytes),
            (before.cache_budget, before.cache_bytes),
            "budget {budget}"
        );
        let st = off.stats();
        // The prompt's own reads: every unit not hot during it, once (the lent clusters too).
        let cold = (total - st.resident_bytes) as u64;
        if lends {
            assert!(
                st.prefill_bytes_read > cold && st.prefill_bytes_read <= total as u64,
                "budget {budget}: {st:?}"
            );
        } else {
            assert_eq!(st.prefill_bytes_read, 0, "everything hot: {st:?}");
        }
        let extra = off.io().stats().requests - reads;
        let layers = neuron_store_index(&resident).layers.len() as u64;
        if lends {
            // The cold units in one chunk per layer, then the hot clusters read back.
            assert!(extra > layers, "budget {budget}: {extra} reads");
        } else {
            assert_eq!(extra, 0, "everything hot, nothing lent");
        }
        // Decode then finds the hot prefix as before the prompt.
        off.reset_stats();
        let mut cache = eng.new_cache();
        eng.forward(&mut cache, &[TOKENS[0]], Logits::Last).unwrap();
        let st = off.stats();
        assert!(st.hot_hits > 0 || budget == 0, "{st:?}");
    }
}

/// A budget set while prompts borrow from the cache is the budget once they are done: a loan ends by
/// growing back to what was asked last, not to what the cache held when the loan began, and leaves
/// the process budget as set.
#[test]
fn a_budget_set_while_prompts_borrow_is_the_budget_after_them() {
    let name = "tiny-llama-silu-q4_0.gguf";
    let resident = converted(name, &ConvertOptions::default(), "lend-race");
    let file = ModelFile::open(&resident).unwrap();
    let total = neuron_store_index(&resident).ffn_bytes();
    let outside = 1u64 << 20;
    let eng = store_engine(
        &file,
        0.0,
        OffloadOptions {
            ffn_budget: total / 2,
            hot_share: 1.0,
            cluster_units: 1,
            outside_ffn_bytes: outside,
            ..Default::default()
        },
    );
    let ctl = eng.sparse().unwrap().offload().unwrap().control();
    let want = in_memory_logits(name, 0.0, true);
    let budgets = [total / 3, 3 * total / 4, total / 4, total / 2, total / 5];
    std::thread::scope(|s| {
        let prompts = s.spawn(|| {
            for _ in 0..30 {
                assert!(rel_drift(&logits(&eng, true), &want) < 1e-5);
            }
        });
        for &b in &budgets {
            ctl.set_cache_budget(b).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        let last = *budgets.last().unwrap();
        let r = ctl.report();
        assert_eq!(r.memory_budget, outside + last as u64, "{r:?}");
        // A process budget above what the whole FFN needs stays the budget asked, though loans
        // ending after it resize the cache again (to at most the whole FFN).
        let big = outside + 2 * total as u64;
        assert_eq!(ctl.set_memory_budget(big).unwrap().memory_budget, big);
        prompts.join().unwrap();
    });
    let r = ctl.report();
    assert_eq!(r.cache_budget as usize, total, "{r:?}");
    assert_eq!(r.memory_budget, outside + 2 * total as u64, "{r:?}");
    assert!(r.cache_bytes <= r.cache_budget, "{r:?}");
}

#[test]
fn unpacked_store_computes_the_same() {
    let name = "tiny-llama-silu-q4_0.gguf";
    let resident = converted(
        name,
        &ConvertOptions {
            packing: Some(engine::offload::Packing::None),
            ..Default::default()
        },
        "unpacked",
    );
    let file = ModelFile::open(&resident).unwrap();
    let eng = store_engine(
        &file,
        0.0,
        OffloadOptions {
            ffn_budget: 0,
            hot_share: 0.0,
            ..Default::default()
        },
    );
    assert_eq!(
        eng.sparse()
            .unwrap()
            .offload()
            .unwrap()
            .store()
            .index()
            .layout
            .neurons,
        1
    );
    let d = rel_drift(&logits(&eng, false), &in_memory_logits(name, 0.0, false));
    assert!(d < 1e-5, "drift {d}");
}

#[test]
fn io_errors_fail_the_step_and_the_engine_keeps_serving() {
    let name = "tiny-llama-silu-q4_0.gguf";
    let resident = converted(name, &ConvertOptions::default(), "faults");
    let file = ModelFile::open(&resident).unwrap();
    let want = in_memory_logits(name, 0.0, false);
    for fault in [Fault::Eio, Fault::ShortRead] {
        let eng = store_engine(
            &file,
            0.0,
            OffloadOptions {
                ffn_budget: 0,
                hot_share: 0.0,
                ..Default::default()
            },
        );
        let off = eng.sparse().unwrap().offload().unwrap();
        off.io().set_fault_plan(FaultPlan::new().with(3, fault));
        let mut cache = eng.new_cache();
        let e = eng
            .forward(&mut cache, &[TOKENS[0]], Logits::Last)
            .unwrap_err()
            .to_string();
        assert!(e.contains(".neurons"), "the error names the store: {e}");
        assert_eq!(cache.len(), 0, "a failed step leaves the cache as it was");
        // The next steps succeed and give the right numbers.
        let got: Vec<f32> = TOKENS
            .iter()
            .flat_map(|&t| eng.forward(&mut cache, &[t], Logits::Last).unwrap())
            .collect();
        assert!(rel_drift(&got, &want) < 1e-5, "{fault:?}");
    }
}

/// Without a predictor every unit is wanted, so each decode step queues the next layer's uncached
/// units (and the last layer the first layer's, for the next token): the numbers are those without
/// read-ahead, the misses were read ahead, and a step that fails with reads ahead in flight (a
/// fault at several points of a token) leaves none behind: the next tokens compute the right
/// numbers.
#[test]
fn reads_ahead_compute_the_same_and_a_failed_step_leaves_none_in_flight() {
    let name = "tiny-llama-silu-q4_0.gguf";
    let resident = converted(name, &ConvertOptions::default(), "read-ahead");
    let file = ModelFile::open(&resident).unwrap();
    let want = in_memory_logits(name, 0.0, false);
    let opts = |read_ahead| OffloadOptions {
        ffn_budget: ffn_bytes(&resident) / 3,
        hot_share: 1.0,
        read_ahead,
        ..Default::default()
    };
    for read_ahead in [true, false] {
        let eng = store_engine(&file, 0.0, opts(read_ahead));
        let d = rel_drift(&logits(&eng, false), &want);
        assert!(d < 1e-5, "read-ahead {read_ahead}: drift {d}");
        let st = eng.sparse().unwrap().offload().unwrap().stats();
        assert!(st.misses > 0, "{st:?}");
        if read_ahead {
            assert!(st.read_ahead > 0 && st.read_ahead <= st.misses, "{st:?}");
        } else {
            assert_eq!(st.read_ahead, 0, "{st:?}");
        }
    }
    // This fixture's token queues 6 reads at this budget: a fault at each of them. The read that
    // fails may be one read ahead for the next token: that token's step fails then.
    for n in 1..=6u64 {
        let eng = store_engine(&file, 0.0, opts(true));
        let off = eng.sparse().unwrap().offload().unwrap();
        let mut cache = eng.new_cache();
        let mut got: Vec<f32> = TOKENS[..2]
            .iter()
            .flat_map(|&t| eng.forward(&mut cache, &[t], Logits::Last).unwrap())
            .collect();
        off.io()
            .set_fault_plan(FaultPlan::new().with(n, Fault::Eio));
        let mut failed = 0;
        for &t in &TOKENS[2..] {
            let out = match eng.forward(&mut cache, &[t], Logits::Last) {
                Ok(out) => out,
                Err(e) => {
                    failed += 1;
                    let e = e.to_string();
                    assert!(
                        e.contains(".neurons"),
                        "fault {n}: the error names the store: {e}"
                    );
                    // The step left the KV cache as it was: the same token again.
                    eng.forward(&mut cache, &[t], Logits::Last).unwrap()
                }
            };
            got.extend(out);
        }
        assert_eq!(failed, 1, "fault at read {n}: one step fails");
        let d = rel_drift(&got, &want);
        assert!(d < 1e-5, "fault at read {n}: drift {d}");
        assert!(off.stats().read_ahead > 0);
    }
}

/// A fault in the middle of a multi-token forward (prefill) over an offloaded model: the request fails
/// naming the store, the KV cache keeps what it held before it, and the same prefill then succeeds
/// with the numbers of a fault-free run.
#[test]
fn faults_during_prefill_fail_the_request_and_the_engine_keeps_serving() {
    let name = "tiny-llama-silu-q4_0.gguf";
    let resident = converted(name, &ConvertOptions::default(), "prefill-faults");
    let file = ModelFile::open(&resident).unwrap();
    // No FFN cache: every prefill reads the same units, so request numbers repeat; one unit per
    // streamed chunk, so each layer takes several reads.
    let opts = OffloadOptions {
        ffn_budget: 0,
        hot_share: 0.0,
        prefill_neurons: 1,
        ..Default::default()
    };
    let (head, rest) = TOKENS.split_at(3);
    // A fault-free run: the prefill's logits, and how many flash requests one prefill makes.
    let clean = store_engine(&file, 0.0, opts.clone());
    let mut cache = clean.new_cache();
    clean.forward(&mut cache, head, Logits::Last).unwrap();
    let io = clean.sparse().unwrap().offload().unwrap().io();
    let before = io.stats().requests;
    let want = clean.forward(&mut cache, rest, Logits::All).unwrap();
    let requests = io.stats().requests - before;
    assert!(
        requests >= 4,
        "the prefill reads from the store ({requests} requests)"
    );
    for fault in [Fault::Eio, Fault::ShortRead] {
        for at in [0, requests / 2, requests - 1] {
            let eng = store_engine(&file, 0.0, opts.clone());
            let mut cache = eng.new_cache();
            eng.forward(&mut cache, head, Logits::Last).unwrap();
            let off = eng.sparse().unwrap().offload().unwrap();
            off.io().set_fault_plan(FaultPlan::new().with(at, fault));
            let e = eng
                .forward(&mut cache, rest, Logits::All)
                .expect_err("a faulted prefill fails")
                .to_string();
            assert!(
                e.contains(".neurons"),
                "{fault:?} at {at}: the error names the store: {e}"
            );
            assert_eq!(
                cache.len(),
                head.len(),
                "{fault:?} at {at}: the cache is as before"
            );
            off.io().set_fault_plan(FaultPlan::new());
            let got = eng.forward(&mut cache, rest, Logits::All).unwrap();
            assert!(rel_drift(&got, &want) < 1e-6, "{fault:?} at {at}");
            assert_eq!(cache.len(), TOKENS.len());
        }
    }
}

#[test]
fn a_damaged_unit_is_an_error_naming_it() {
    let name = "tiny-llama-silu-q4_0.gguf";
    let resident = converted(name, &ConvertOptions::default(), "damaged");
    let store = store_path_for(&resident);
    let mut bytes = std::fs::read(&store).unwrap();
    let n = bytes.len();
    bytes[n - 4096 + 10] ^= 0x40; // the last unit of the last layer
    std::fs::write(&store, &bytes).unwrap();
    let file = ModelFile::open(&resident).unwrap();
    let eng = store_engine(
        &file,
        0.0,
        OffloadOptions {
            ffn_budget: 0,
            hot_share: 0.0,
            ..Default::default()
        },
    );
    let mut cache = eng.new_cache();
    let e = eng
        .forward(&mut cache, &[TOKENS[0]], Logits::Last)
        .unwrap_err()
        .to_string();
    assert!(e.contains("checksum") && e.contains("layer 1"), "{e}");
}

#[test]
fn a_resident_file_needs_its_store() {
    let name = "tiny-llama-silu-q4_0.gguf";
    let resident = converted(name, &ConvertOptions::default(), "needs-store");
    let file = ModelFile::open(&resident).unwrap();
    let eng = engine(&file);
    let e = eng
        .forward(&mut eng.new_cache(), &[1], Logits::Last)
        .unwrap_err()
        .to_string();
    assert!(e.contains("neuron store"), "{e}");
    // Converting a resident file again is refused, and so is a profile of another model.
    let other = ModelFile::open(fixture_path("tiny-llama-relu-q8_0.gguf")).unwrap();
    let e = convert(
        &file,
        &profile_for(&other),
        &tmp_dir("again").join("x.gguf"),
        &ConvertOptions::default(),
        |_, _| {},
    )
    .unwrap_err();
    assert!(e.to_string().contains("already"), "{e}");
    let orig = ModelFile::open(fixture_path(name)).unwrap();
    let e = convert(
        &orig,
        &profile_for(&other),
        &tmp_dir("other").join("x.gguf"),
        &ConvertOptions::default(),
        |_, _| {},
    )
    .unwrap_err();
    assert!(e.to_string().contains("another model"), "{e}");
    // A missing store is an error naming it.
    std::fs::remove_file(store_path_for(&resident)).unwrap();
    let cfg = eng.model().config.clone();
    let e = SparseFfn::from_store(
        &cfg,
        &store_path_for(&resident),
        vec![0.0; cfg.n_layers],
        OffloadOptions::default(),
    )
    .err()
    .unwrap();
    assert!(e.to_string().contains(".neurons"), "{e}");
}

/// A predictor that names a neuron the layer does not have.
struct OutOfRange;

impl engine::NeuronPredictor for OutOfRange {
    fn predict(&self, _layer: usize, _x: &[f32], out: &mut Vec<u32>) -> Result<(), OffloadError> {
        out.clear();
        out.extend([0, 1_000_000]);
        Ok(())
    }
}

#[test]
fn a_predictor_naming_a_missing_neuron_is_an_error() {
    let resident = converted(
        "tiny-llama-silu-q4_0.gguf",
        &ConvertOptions::default(),
        "bad-predictor",
    );
    let file = ModelFile::open(&resident).unwrap();
    let mut eng = engine_t(&file, 2);
    let cfg = eng.model().config.clone();
    let sp = SparseFfn::from_store(
        &cfg,
        &store_path_for(&resident),
        vec![0.0; cfg.n_layers],
        OffloadOptions::default(),
    )
    .unwrap();
    eng.set_sparse(Some(sp.with_predictor(Box::new(OutOfRange))));
    let mut cache = eng.new_cache();
    let e = eng
        .forward(&mut cache, &[1], Logits::Last)
        .unwrap_err()
        .to_string();
    assert!(e.contains("neuron 1000000"), "{e}");
    assert_eq!(cache.len(), 0);
}

/// A live budget ([`engine::CacheControl`]): shrinking and growing the cache between and during
/// decode steps (from another thread) changes what is cached, never what is computed; the cache
/// never holds more than its budget; a process budget below the minimum is refused.
#[test]
fn a_live_budget_change_keeps_results_and_the_cache_within_its_budget() {
    let name = "tiny-llama-silu-q4_0.gguf";
    let resident = converted(name, &ConvertOptions::default(), "live");
    let file = ModelFile::open(&resident).unwrap();
    let want = in_memory_logits(name, 0.05, false);
    let eng = store_engine(
        &file,
        0.05,
        OffloadOptions {
            hot_share: 0.6,
            // Small clusters, so that a shrink cuts some in two.
            cluster_units: 3,
            outside_ffn_bytes: 1 << 20,
            ..Default::default()
        },
    );
    let off = eng.sparse().unwrap().offload().unwrap();
    let ctl = off.control();
    let full = ctl.report();
    // The store's units (the file less its header and index).
    let total = full.ffn_bytes as usize;
    assert!(total > 0 && total < ffn_bytes(&resident));
    assert_eq!(full.cache_budget as usize, total);
    assert!(full.cache_bytes <= full.cache_budget);
    assert!(rel_drift(&logits(&eng, false), &want) < 1e-5);
    for budget in [
        total / 3,
        0,
        total / 5,
        total / 2,
        usize::MAX,
        7 * total / 10,
    ] {
        ctl.set_cache_budget(budget).unwrap();
        let r = ctl.report();
        assert_eq!(r.cache_budget as usize, budget.min(total));
        assert!(r.cache_bytes <= r.cache_budget, "{r:?}");
        let got = logits(&eng, false);
        assert!(rel_drift(&got, &want) < 1e-5, "budget {budget}");
        let r = ctl.report();
        assert!(r.cache_bytes <= r.cache_budget, "after decoding: {r:?}");
        if budget == 0 {
            assert_eq!(r.cache_bytes, 0);
        }
    }
    // Resizes from another thread while decoding.
    std::thread::scope(|s| {
        let c = ctl.clone();
        let resizer = s.spawn(move || {
            for i in 0..40 {
                c.set_cache_budget([total / 4, total, 0, total / 2][i % 4])
                    .unwrap();
                let r = c.report();
                assert!(r.cache_bytes <= r.cache_budget, "{r:?}");
            }
        });
        for _ in 0..3 {
            assert!(rel_drift(&logits(&eng, false), &want) < 1e-5);
        }
        resizer.join().unwrap();
    });
    // A process budget: what stays resident (here 1 MiB) first; below the minimum: an error naming it.
    let r = ctl.set_memory_budget((1 << 20) + total as u64 / 2).unwrap();
    assert_eq!(r.cache_budget as usize, total / 2);
    assert_eq!(r.memory_budget, (1 << 20) + total as u64 / 2);
    let e = ctl.set_memory_budget(1 << 19).unwrap_err().to_string();
    assert!(
        e.contains("minimum") && e.contains(&r.minimum.to_string()),
        "{e}"
    );
    assert_eq!(ctl.report().cache_budget as usize, total / 2, "unchanged");
}

#[test]
fn auto_packing_reads_the_fewest_bytes() {
    use engine::offload::{auto_packing, Packing};
    use engine::WeightFormat;
    use neuron_store::Formats;
    use predictor::{ActivationKind, LayerProfile, ScoreKind};
    // Qwen2.5-0.5B's bundle: 2184 bytes, one per page (53% used) or 9 in 5 pages (96%).
    let f = Formats {
        gate: WeightFormat::Q5_0,
        up: WeightFormat::Q5_0,
        down: WeightFormat::Q8_0,
    };
    let ff = 900;
    let profile = |freq: f32| Profile {
        model: "synthetic".into(),
        model_fingerprint: 0,
        corpus: "synthetic".into(),
        tokens: 0,
        activation: ActivationKind::Silu,
        score: ScoreKind::OutputNorm,
        batch_sizes: vec![1],
        layers: (0..2)
            .map(|_| LayerProfile {
                n_neurons: ff as u32,
                threshold: 0.0,
                freq: vec![vec![freq; ff]],
                mean_abs: vec![0.0; ff],
                max_abs: vec![0.0; ff],
                coact_gate_up: vec![1.0; ff],
                coact_gate_down: vec![1.0; ff],
            })
            .collect(),
    };
    // Without predictors every unit is read: the fuller units win.
    assert_eq!(
        auto_packing(896, f, &profile(0.05), false).unwrap(),
        Packing::Full
    );
    // With predictors and rare neurons, a page per neuron reads far less than 5 pages per 9.
    assert_eq!(
        auto_packing(896, f, &profile(0.05), true).unwrap(),
        Packing::Page
    );
    // Neurons that nearly always fire: nearly every unit is read again, and fuller units win.
    assert_eq!(
        auto_packing(896, f, &profile(0.9), true).unwrap(),
        Packing::Full
    );
}
