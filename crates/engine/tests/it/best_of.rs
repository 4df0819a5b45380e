//! Batched decode of several sequences (`forward_seqs`, Best-of-N) on the tiny fixtures: each
//! sequence's logits are those of a one-token step on its own cache, bit for bit (same kernels;
//! the batch only shares the weight reads), in every precision and weight format; a failed or
//! refused batched step leaves every cache as it was; `generate_best_of` candidate `i` is the
//! text `generate` gives with seed `seed + i`, and candidates come best first.

use std::path::PathBuf;

use engine::forward::forward_seqs;
use engine::{
    Engine, EngineOptions, Flow, GenerateRequest, KvFormat, Logits, ModelFile, Precision,
    SamplerConfig,
};

fn fixture(name: &str) -> ModelFile {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(name);
    ModelFile::open(&p).unwrap()
}

const FIXTURES: [&str; 4] = [
    "tiny-llama-silu-q4_0.gguf",
    "tiny-llama-relu-q8_0.gguf",
    "tiny-qwen2-q4_1.gguf",
    "tiny-llama-f16.gguf",
];

fn engine(file: &ModelFile, precision: Precision, cache: KvFormat) -> Engine<'_> {
    Engine::new(
        file,
        EngineOptions {
            threads: 2,
            precision,
            context: 64,
            cache_type: Some(cache),
        },
    )
    .unwrap()
}

fn prompt(len: usize, salt: u32) -> Vec<u32> {
    (0..len as u32).map(|i| 3 + (i * 31 + salt) % 250).collect()
}

#[test]
fn a_batched_step_equals_one_step_per_sequence() {
    for name in FIXTURES {
        let file = fixture(name);
        for precision in [Precision::Exact, Precision::Fast, Precision::Int8] {
            let eng = engine(&file, precision, KvFormat::F32);
            // Three sequences of different lengths (one of a single token).
            let prompts = [prompt(5, 1), prompt(1, 2), prompt(9, 3)];
            let mut caches: Vec<_> = prompts
                .iter()
                .map(|p| {
                    let mut c = eng.new_cache();
                    eng.forward(&mut c, p, Logits::Last).unwrap();
                    c
                })
                .collect();
            let mut singles = caches.clone();
            let next = [17u32, 200, 42];
            for step in 0..3 {
                let toks: Vec<u32> = next.iter().map(|t| t + step).collect();
                let mut refs: Vec<_> = caches.iter_mut().collect();
                let got = eng.forward_batch(&mut refs, &toks).unwrap();
                let vocab = got.len() / toks.len();
                for (i, c) in singles.iter_mut().enumerate() {
                    let want = eng.forward(c, &[toks[i]], Logits::Last).unwrap();
                    let row = &got[i * vocab..(i + 1) * vocab];
                    assert!(
                        row.iter()
                            .zip(&want)
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{name} {precision:?} step {step} sequence {i}: batched logits differ"
                    );
                    assert_eq!(caches[i].len(), c.len());
                }
            }
        }
    }
}

#[test]
fn a_refused_batched_step_leaves_every_cache_as_it_was() {
    let file = fixture("tiny-llama-silu-q4_0.gguf");
    let eng = engine(&file, Precision::Fast, KvFormat::F16);
    let mut a = eng.new_cache();
    let mut b = eng.new_cache();
    eng.forward(&mut a, &prompt(10, 1), Logits::Last).unwrap();
    // b is full: its next position is past the context.
    eng.forward(&mut b, &prompt(64, 2), Logits::Last).unwrap();
    let (la, lb, ba) = (a.len(), b.len(), a.bytes());
    let e = forward_seqs(
        eng.model(),
        &mut [&mut a, &mut b],
        &[5, 6],
        Precision::Fast,
        Default::default(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("context is full"), "{e}");
    assert_eq!((a.len(), b.len(), a.bytes()), (la, lb, ba));
    let e = eng.forward_batch(&mut [&mut a], &[1, 2]).unwrap_err();
    assert!(e.to_string().contains("one token per sequence"), "{e}");
}

#[test]
fn best_of_candidates_are_the_sequential_generations_ranked() {
    for name in ["tiny-llama-silu-q4_0.gguf", "tiny-qwen2-q4_1.gguf"] {
        let file = fixture(name);
        let eng = engine(&file, Precision::Fast, KvFormat::F16);
        let ids = eng.tokenizer().encode("Once upon a time", false).unwrap();
        let req = GenerateRequest {
            max_tokens: 12,
            sampler: SamplerConfig {
                // The random fixtures are very sure of themselves: a hot temperature spreads them.
                temperature: 20.0,
                top_k: 0,
                top_p: 1.0,
                min_p: 0.0,
                seed: 7,
                ..Default::default()
            },
            stop_strings: Vec::new(),
            stop_at_eos: true,
        };
        let mut streamed = vec![String::new(); 4];
        let r = eng
            .generate_best_of(&ids, &req, 4, |i, piece| {
                streamed[i].push_str(piece);
                Flow::Continue
            })
            .unwrap();
        assert_eq!(r.candidates.len(), 4);
        let mut seeds: Vec<u64> = r.candidates.iter().map(|c| c.seed).collect();
        seeds.sort();
        assert_eq!(seeds, vec![7, 8, 9, 10]);
        for w in r.candidates.windows(2) {
            assert!(w[0].mean_logprob >= w[1].mean_logprob, "{name}: ranked");
        }
        let distinct: std::collections::HashSet<_> = r
            .candidates
            .iter()
            .map(|c| c.generation.generated_ids.clone())
            .collect();
        assert!(
            distinct.len() > 1,
            "{name}: sampled candidates differ: {:?}",
            r.candidates
        );
        for c in &r.candidates {
            assert!(c.mean_logprob.is_finite() && c.mean_logprob <= 0.0);
            let mut one = req.clone();
            one.sampler.seed = c.seed;
            let g = eng.generate(&ids, &one, |_| Flow::Continue).unwrap();
            assert_eq!(
                g.generated_ids, c.generation.generated_ids,
                "{name} seed {}",
                c.seed
            );
            assert_eq!(g.text, c.generation.text);
            let i = (c.seed - 7) as usize;
            assert_eq!(
                streamed[i], c.generation.text,
                "{name}: sequence {i} streamed whole"
            );
            assert_eq!(g.stop_reason, c.generation.stop_reason);
        }
        let total: usize = r
            .candidates
            .iter()
            .map(|c| c.generation.generated_ids.len() - 1)
            .sum();
        assert_eq!(
            r.timings.decode_tokens, total,
            "{name}: decode tokens counted"
        );
    }
}

#[test]
fn best_of_can_be_cancelled() {
    let file = fixture("tiny-llama-silu-q4_0.gguf");
    let eng = engine(&file, Precision::Fast, KvFormat::F16);
    let req = GenerateRequest {
        max_tokens: 40,
        stop_at_eos: false,
        ..Default::default()
    };
    let mut pieces = 0;
    let r = eng
        .generate_best_of(&prompt(4, 0), &req, 3, |_, _| {
            pieces += 1;
            if pieces >= 5 {
                Flow::Stop
            } else {
                Flow::Continue
            }
        })
        .unwrap();
    assert_eq!(pieces, 5, "nothing streamed after Stop");
    for c in &r.candidates {
        assert_eq!(c.generation.stop_reason, engine::StopReason::Cancelled);
        assert!(
            c.generation.generated_ids.len() <= 2,
            "{:?}",
            c.generation.generated_ids
        );
    }
}
