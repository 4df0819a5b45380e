//! Speculative decoding over every FFN executor: a verification step gives each token the logits of
//! its own one-token step, bit for bit, with the sparse FFN (in memory, with dense batch sizes, over
//! a neuron store at every budget: each unit read once for the step), the hybrid FFN, the
//! accelerator FFN and the in-memory MoE block; greedy output with lookup, `SelfDraft` (the model
//! from memory only) and `ModelDraft` (a second model) is the output of plain decoding.

use crate::common;

use std::path::PathBuf;

use engine::accel::AccelKind;
use engine::offload::{store_path_for, ConvertOptions, OffloadOptions};
use engine::sparse::DEFAULT_DOWN_FORMAT;
use engine::{
    AccelFfn, DraftSource, Engine, EngineOptions, Flow, GenerateRequest, HotSplit, HybridFfn,
    KvFormat, Logits, Lookup, ModelDraft, ModelFile, OffloadError, Precision, SelfDraft, SparseFfn,
    SpecOptions,
};

fn fixture(name: &str) -> ModelFile {
    ModelFile::open(
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../fixtures")
            .join(name),
    )
    .unwrap()
}

fn engine(file: &ModelFile, precision: Precision) -> Engine<'_> {
    Engine::new(
        file,
        EngineOptions {
            threads: 2,
            precision,
            context: 128,
            cache_type: Some(KvFormat::F16),
        },
    )
    .unwrap()
}

const PROMPT: &[u32] = &[5, 9, 77, 3, 120, 64];
const TOKENS: &[u32] = &[11, 200, 7, 7, 150, 42];

/// A verification step of `TOKENS` after `PROMPT` gives the logits of one-token steps bit for bit.
fn verifies_exactly(eng: &Engine<'_>, what: &str) {
    let mut cache = eng.new_cache();
    eng.forward(&mut cache, PROMPT, Logits::Last).unwrap();
    let mut one = cache.clone();
    let mut want = Vec::new();
    for &t in TOKENS {
        want.extend(eng.forward(&mut one, &[t], Logits::Last).unwrap());
    }
    let got = eng.verify_logits(&mut cache, TOKENS).unwrap();
    assert_eq!(cache.len(), one.len());
    assert_eq!(got.len(), want.len(), "{what}");
    let differ = got
        .iter()
        .zip(&want)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    assert_eq!(differ, 0, "{what}: {differ} logits differ");
}

const SILU: [&str; 3] = [
    "tiny-llama-silu-q4_0.gguf",
    "tiny-llama-relu-q8_0.gguf",
    "tiny-qwen2-q4_1.gguf",
];

#[test]
fn verification_over_the_in_memory_executors_is_one_token_steps_bit_for_bit() {
    for name in SILU {
        let file = fixture(name);
        for precision in [Precision::Exact, Precision::Fast] {
            let mut eng = engine(&file, precision);
            let n = eng.model().config.n_layers;
            let sp = || SparseFfn::new(eng.model(), vec![0.05; n], DEFAULT_DOWN_FORMAT).unwrap();
            let (plain, dense_two) = (sp(), sp().with_dense_batches(vec![(2, true)]).unwrap());
            let accel = AccelFfn::open(&AccelKind::cpu(), eng.model()).unwrap();
            let d_ff = eng.model().config.d_ff;
            // A hybrid split that grows with the batch size, as a profile's does.
            let split = HotSplit {
                order: vec![(0..d_ff as u32).collect(); n],
                counts: vec![[8, 24, 40, d_ff]; n],
            };
            let blocks = HybridFfn::open_blocks(&AccelKind::cpu(), eng.model(), &split).unwrap();
            let hybrid = HybridFfn::new(sp(), blocks, eng.model(), &split).unwrap();
            eng.set_sparse(Some(plain));
            verifies_exactly(&eng, &format!("{name} {precision:?} sparse"));
            eng.set_sparse(Some(dense_two));
            verifies_exactly(&eng, &format!("{name} {precision:?} sparse, dense batches"));
            eng.set_sparse(None);
            eng.set_accel(Some(accel));
            verifies_exactly(&eng, &format!("{name} {precision:?} accel cpu"));
            eng.set_accel(None);
            eng.set_hybrid(Some(hybrid));
            verifies_exactly(&eng, &format!("{name} {precision:?} hybrid cpu"));
        }
    }
    let moe = fixture("tiny-qwen3moe-q8_0.gguf");
    for precision in [Precision::Exact, Precision::Fast, Precision::Int8] {
        verifies_exactly(&engine(&moe, precision), &format!("qwen3moe {precision:?}"));
    }
}

fn tmp_dir(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("spec-exec-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Predicts for each token the neurons whose index mixes with the token's first input value: a
/// different candidate set per token, so that a step's tokens want different units.
struct ByInput(u32);

impl engine::NeuronPredictor for ByInput {
    fn predict(&self, layer: usize, x: &[f32], out: &mut Vec<u32>) -> Result<(), OffloadError> {
        let key = (x[0].to_bits() >> 13) as usize + layer;
        out.clear();
        out.extend((0..self.0).filter(|&j| (j as usize + key) % 3 != 0));
        Ok(())
    }
}

/// An engine over the store of `resident` with `budget` bytes of FFN cache.
fn store_engine(resident: &ModelFile, budget: usize, precision: Precision) -> Engine<'_> {
    store_engine_p(resident, budget, precision, false)
}

/// [`store_engine`], with the `ByInput` predictor where `predicted`.
fn store_engine_p(
    resident: &ModelFile,
    budget: usize,
    precision: Precision,
    predicted: bool,
) -> Engine<'_> {
    let mut eng = engine(resident, precision);
    let cfg = eng.model().config.clone();
    let store = store_path_for(resident.path());
    let opts = OffloadOptions {
        ffn_budget: budget,
        hot_share: 0.5,
        ..Default::default()
    };
    let mut sp = SparseFfn::from_store(&cfg, &store, vec![0.05; cfg.n_layers], opts).unwrap();
    if predicted {
        sp = sp.with_predictor(Box::new(ByInput(cfg.d_ff as u32)));
    }
    eng.set_sparse(Some(sp));
    eng
}

#[test]
fn verification_over_a_neuron_store_is_exact_and_reads_each_unit_once() {
    for name in SILU {
        let (resident, _) =
            common::convert_fixture(name, &tmp_dir("store"), &ConvertOptions::default());
        let file = ModelFile::open(&resident).unwrap();
        let total = std::fs::metadata(store_path_for(&resident)).unwrap().len() as usize;
        for budget in [0, total / 2, usize::MAX] {
            for (precision, predicted) in [
                (Precision::Exact, false),
                (Precision::Fast, false),
                (Precision::Fast, true),
            ] {
                let eng = store_engine_p(&file, budget, precision, predicted);
                let what = format!("{name} budget {budget} {precision:?} predictor {predicted}");
                verifies_exactly(&eng, &what);
            }
        }
        // Nothing cached: one-token steps read every wanted unit each, a verification step each
        // unit once for all its tokens.
        let eng = store_engine(&file, 0, Precision::Fast);
        let off = eng.sparse().unwrap().offload().unwrap();
        let mut cache = eng.new_cache();
        eng.forward(&mut cache, PROMPT, Logits::Last).unwrap();
        let mut one = cache.clone();
        off.reset_stats();
        for &t in TOKENS {
            eng.forward(&mut one, &[t], Logits::Last).unwrap();
        }
        let single = off.stats().bytes_read;
        off.reset_stats();
        eng.verify_logits(&mut cache, TOKENS).unwrap();
        let batch = off.stats().bytes_read;
        let ix_units = single / 4096 / TOKENS.len() as u64;
        assert!(
            batch > 0 && batch * 3 < single,
            "{name}: {batch} bytes for the step, {single} one token at a time ({ix_units} units a token)"
        );
    }
}

fn greedy(max_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        max_tokens,
        stop_at_eos: false,
        ..Default::default()
    }
}

/// Greedy generation with `source` equals plain greedy generation; returns (drafted, accepted).
fn same_greedy(eng: &Engine<'_>, source: &mut dyn DraftSource, k: usize) -> (usize, usize) {
    let prompt: Vec<u32> = PROMPT
        .iter()
        .chain(PROMPT)
        .chain(&PROMPT[..3])
        .copied()
        .collect();
    let req = greedy(40);
    let plain = eng.generate(&prompt, &req, |_| Flow::Continue).unwrap();
    let spec = eng
        .generate_speculative(&prompt, &req, source, SpecOptions { max_draft: k }, |_| {
            Flow::Continue
        })
        .unwrap();
    assert_eq!(
        spec.generation.generated_ids,
        plain.generated_ids,
        "{}",
        eng.model().path().display()
    );
    (spec.stats.drafted, spec.stats.accepted)
}

#[test]
fn greedy_self_draft_and_lookup_over_a_store_give_the_tokens_of_plain_decoding() {
    let (mut drafted, mut accepted) = (0, 0);
    for name in SILU {
        let (resident, _) =
            common::convert_fixture(name, &tmp_dir("self-draft"), &ConvertOptions::default());
        let file = ModelFile::open(&resident).unwrap();
        let total = std::fs::metadata(store_path_for(&resident)).unwrap().len() as usize;
        for budget in [0, total / 4, usize::MAX] {
            let eng = store_engine(&file, budget, Precision::Fast);
            for k in [1, 4] {
                same_greedy(&eng, &mut Lookup::default(), k);
                let (d, a) = same_greedy(&eng, &mut SelfDraft::new(&eng).unwrap(), k);
                drafted += d;
                accepted += a;
                if budget == usize::MAX {
                    // Everything in memory: the draft is the model, every drafted token is kept.
                    assert_eq!(d, a, "{name} budget {budget}, k {k}");
                }
            }
        }
    }
    assert!(
        accepted > 0 && drafted > accepted,
        "{accepted} of {drafted}"
    );
    // In memory there is nothing cheaper to draft with.
    let name = SILU[0];
    let mem = fixture(name);
    let eng = engine(&mem, Precision::Fast);
    let e = SelfDraft::new(&eng).err().unwrap().to_string();
    assert!(e.contains("--self-draft") && e.contains(name), "{e}");
}

#[test]
fn a_draft_model_that_is_the_model_is_always_right_and_another_vocabulary_is_refused() {
    let name = "tiny-qwen2-q4_1.gguf";
    let (a, b) = (fixture(name), fixture(name));
    for precision in [Precision::Exact, Precision::Fast] {
        let (eng, draft) = (engine(&a, precision), engine(&b, precision));
        for k in [1, 3, 8] {
            let mut src = ModelDraft::new(&eng, &draft).unwrap();
            let (d, acc) = same_greedy(&eng, &mut src, k);
            assert!(d > 0 && acc == d, "{precision:?} k {k}: {acc} of {d} kept");
        }
        // Another model with the same vocabulary: output unchanged, drafts rejected too.
        let other = fixture("tiny-llama-silu-q4_0.gguf");
        let other = engine(&other, precision);
        let mut src = ModelDraft::new(&eng, &other).unwrap();
        let (d, acc) = same_greedy(&eng, &mut src, 4);
        assert!(d > acc, "{acc} of {d}");
    }
    let smol = ModelFile::open(common::model_path()).unwrap();
    let big = engine(&smol, Precision::Fast);
    let tiny = engine(&a, Precision::Fast);
    let e = ModelDraft::new(&big, &tiny).err().unwrap().to_string();
    assert!(
        e.contains(name) && e.contains("SmolLM2") && e.contains("vocabulary"),
        "{e}"
    );
}
