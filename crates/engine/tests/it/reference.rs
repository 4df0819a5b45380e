//! The engine against an independent implementation (HF transformers, fp32) on the real model:
//! tokenizer ids, per-position top-10 logits, greedy continuations and perplexity.

use crate::common;

use common::*;
use engine::{Engine, EngineOptions, GenerateRequest, Logits, ModelFile, Precision};

fn engine_for(file: &ModelFile, precision: Precision) -> Engine<'_> {
    Engine::new(
        file,
        EngineOptions {
            threads: 0,
            precision,
            context: 2048,
            ..Default::default()
        },
    )
    .expect("the default model loads")
}

#[test]
fn model_file_is_the_one_the_reference_used() {
    let r = reference();
    assert_eq!(
        r["model"]["sha256"].as_str().unwrap(),
        engine::fetch::DEFAULT_MODEL_SHA256
    );
    assert_eq!(
        r["model"]["package"].as_str().unwrap(),
        engine::fetch::DEFAULT_MODEL_PACKAGE
    );
}

#[test]
fn tokenizer_matches_reference_ids() {
    let file = ModelFile::open(model_path()).unwrap();
    let tok = engine::load_tokenizer(&file).unwrap();
    let r = reference();
    let mut cases: Vec<(String, Vec<u32>)> = Vec::new();
    for c in r["tokenizer_cases"].as_array().unwrap() {
        cases.push((c["text"].as_str().unwrap().to_string(), ids(&c["ids"])));
    }
    for p in r["prompts"].as_array().unwrap() {
        cases.push((p["text"].as_str().unwrap().to_string(), ids(&p["ids"])));
    }
    assert!(
        cases.len() >= 10,
        "the reference has tokenizer cases and prompts"
    );
    for (text, want) in &cases {
        assert_eq!(
            &tok.encode(text, false).unwrap(),
            want,
            "token ids of {text:?}"
        );
        // Decoding the ids gives back the text, at once and streamed token by token.
        assert_eq!(
            &tok.decode(want, false).unwrap(),
            text,
            "decode of {text:?}"
        );
        let mut stream = tok.stream_decoder(false);
        let mut streamed: String = want.iter().map(|&id| stream.push(id).unwrap()).collect();
        streamed.push_str(&stream.finish());
        assert_eq!(&streamed, text, "streamed decode of {text:?}");
    }
    for p in r["prompts"].as_array().unwrap() {
        let text = tok.decode(&ids(&p["greedy32_ids"]), false).unwrap();
        assert_eq!(
            text,
            p["greedy32_text"].as_str().unwrap(),
            "greedy text of {}",
            p["text"]
        );
    }
}

/// How the prompt goes through the model.
#[derive(Debug, Clone, Copy)]
enum Path {
    /// One batched forward step (prefill: matrix-matrix kernels).
    Batched,
    /// One token at a time (decode: matrix-vector kernels).
    Stepwise,
}

/// Compares every position's top-10 logits and log-sum-exp; returns the largest absolute difference.
fn logit_drift(engine: &Engine<'_>, prompt: &serde_json::Value, path: Path) -> f64 {
    let ids = ids(&prompt["ids"]);
    let vocab = engine.model().config.vocab_size;
    let mut cache = engine.new_cache();
    let logits = match path {
        Path::Batched => engine.forward(&mut cache, &ids, Logits::All).unwrap(),
        Path::Stepwise => ids
            .iter()
            .flat_map(|&t| engine.forward(&mut cache, &[t], Logits::Last).unwrap())
            .collect(),
    };
    let positions = prompt["positions"].as_array().unwrap();
    assert_eq!(positions.len(), ids.len());
    assert_eq!(logits.len(), ids.len() * vocab);
    let mut worst = 0.0f64;
    for (i, pos) in positions.iter().enumerate() {
        let row = &logits[i * vocab..(i + 1) * vocab];
        for (id, want) in ids_and_logits(pos) {
            worst = worst.max((row[id as usize] as f64 - want).abs());
        }
        worst = worst.max((engine::log_sum_exp(row) - pos["logsumexp"].as_f64().unwrap()).abs());
    }
    worst
}

fn ids_and_logits(pos: &serde_json::Value) -> Vec<(u32, f64)> {
    ids(&pos["top10_ids"])
        .into_iter()
        .zip(floats(&pos["top10_logits"]))
        .collect()
}

fn greedy(engine: &Engine<'_>, prompt: &serde_json::Value) -> Vec<u32> {
    let req = GenerateRequest {
        max_tokens: 32,
        ..Default::default()
    };
    engine
        .generate(&ids(&prompt["ids"]), &req, |_| engine::Flow::Continue)
        .unwrap()
        .generated_ids
}

/// Logits gaps below this are ties at the precision of the fast modes (their measured drift from the
/// reference is 5e-3..7e-3 here): a greedy step there may go either way.
const NEAR_TIE: f32 = 0.01;

/// `engine`'s greedy continuation equals the reference's, except that it may leave it at a near tie:
/// a step where the exact engine (which matches the reference's logits to 1e-4), following the
/// reference's tokens, puts the two candidates within [`NEAR_TIE`] of each other. After such a step
/// the texts differ legitimately, so the comparison ends there. Returns the step of a tie taken.
fn assert_greedy_up_to_near_ties(
    engine: &Engine<'_>,
    exact: &Engine<'_>,
    prompt: &serde_json::Value,
) -> Option<usize> {
    let got = greedy(engine, prompt);
    let want = ids(&prompt["greedy32_ids"]);
    let Some(step) = got.iter().zip(&want).position(|(a, b)| a != b) else {
        assert_eq!(got, want, "greedy continuation of {}", prompt["text"]);
        return None;
    };
    let mut cache = exact.new_cache();
    let mut context = ids(&prompt["ids"]);
    context.extend_from_slice(&want[..step]);
    let logits = exact.forward(&mut cache, &context, Logits::Last).unwrap();
    let gap = logits[want[step] as usize] - logits[got[step] as usize];
    assert!(
        gap.abs() < NEAR_TIE,
        "greedy continuation of {} leaves the reference at step {step} (token {} for {}), where the exact logits differ by {gap} (no near tie)",
        prompt["text"],
        got[step],
        want[step]
    );
    eprintln!(
        "greedy continuation of {:?}: a near tie at step {step} went the other way (exact logits {gap:.4} apart)",
        prompt["text"].as_str().unwrap()
    );
    Some(step)
}

#[test]
fn exact_mode_matches_reference_logits_and_greedy_text() {
    let file = ModelFile::open(model_path()).unwrap();
    let engine = engine_for(&file, Precision::Exact);
    let r = reference();
    for p in r["prompts"].as_array().unwrap() {
        for path in [Path::Batched, Path::Stepwise] {
            let drift = logit_drift(&engine, p, path);
            eprintln!(
                "exact mode, {path:?}: max |logit - reference| = {drift:.2e} for {:?}",
                p["text"].as_str().unwrap()
            );
            assert!(
                drift <= 1e-3,
                "exact-mode logits drift {drift} > 1e-3 ({path:?}) for {}",
                p["text"]
            );
        }
        assert_eq!(
            greedy(&engine, p),
            ids(&p["greedy32_ids"]),
            "greedy continuation of {}",
            p["text"]
        );
    }
}

#[test]
fn fast_mode_keeps_greedy_text_and_reports_drift() {
    let file = ModelFile::open(model_path()).unwrap();
    let engine = engine_for(&file, Precision::Fast);
    let exact = engine_for(&file, Precision::Exact);
    let r = reference();
    let mut worst = 0.0f64;
    let mut ties = 0;
    for p in r["prompts"].as_array().unwrap() {
        for path in [Path::Batched, Path::Stepwise] {
            let drift = logit_drift(&engine, p, path);
            worst = worst.max(drift);
            eprintln!(
                "fast mode, {path:?}: max |logit - reference| = {drift:.2e} for {:?}",
                p["text"].as_str().unwrap()
            );
        }
        ties += usize::from(assert_greedy_up_to_near_ties(&engine, &exact, p).is_some());
    }
    // One prompt's last step is a tie of 2.4e-3 logits that the f16 KV cache takes the other way;
    // more than that is no longer noise.
    assert!(
        ties <= 1,
        "{ties} continuations left the reference at near ties"
    );
    // 16-bit activations drift by ~5e-3 here (8-bit ones by ~1, which flips greedy tokens).
    eprintln!("fast mode: worst drift {worst:.2e}");
    assert!(
        worst < 0.05,
        "fast-mode drift {worst} is far beyond 16-bit activation noise"
    );
}

#[test]
fn exact_mode_perplexity_matches_reference() {
    let file = ModelFile::open(model_path()).unwrap();
    let engine = engine_for(&file, Precision::Exact);
    let (ppl, want) = reference_perplexity(&engine, &reference());
    eprintln!("exact-mode perplexity {ppl:.4} (reference {want})");
    assert!(
        (ppl - want).abs() <= 0.05,
        "perplexity {ppl} vs reference {want}"
    );
}

/// The check on the real model: the sparse FFN with thresholds of zero (nothing skipped) and the
/// transposed down matrices in f32 gives the same greedy tokens as dense decode. The default Q8_0 down rows
/// (re-quantized from Q4_1 across the other axis) add a small logit drift, bounded here; it is enough to
/// flip one near-tie of the reference continuations, so that format is not held to identical tokens.
#[test]
fn sparse_decode_with_zero_thresholds_keeps_greedy_tokens() {
    let file = ModelFile::open(model_path()).unwrap();
    let mut engine = engine_for(&file, Precision::Fast);
    let exact = engine_for(&file, Precision::Exact);
    let n_layers = engine.model().config.n_layers;
    let r = reference();
    for format in [
        kernels_neon::WeightFormat::F32,
        engine::sparse::DEFAULT_DOWN_FORMAT,
    ] {
        let sp = engine::SparseFfn::new(engine.model(), vec![0.0; n_layers], format).unwrap();
        engine.set_sparse(Some(sp));
        let mut worst = 0.0f64;
        for p in r["prompts"].as_array().unwrap() {
            let drift = logit_drift(&engine, p, Path::Stepwise);
            eprintln!("sparse, zero thresholds, {format:?} down: max |logit - reference| = {drift:.2e} for {:?}", p["text"].as_str().unwrap());
            worst = worst.max(drift);
            if format == kernels_neon::WeightFormat::F32 {
                assert_greedy_up_to_near_ties(&engine, &exact, p);
            }
        }
        let s = engine.sparse().unwrap().stats();
        assert!(s.tokens > 0 && s.down_frac() > 0.99, "{format:?}: {s:?}");
        // Measured: F32 1.6e-3..3.2e-3, Q8_0 0.47..1.0 (Q4_1 rows would give ~7, F16 ~6e-3).
        let bound = if format == kernels_neon::WeightFormat::F32 {
            0.05
        } else {
            1.5
        };
        assert!(worst < bound, "{format:?} down: drift {worst} >= {bound}");
    }
}
