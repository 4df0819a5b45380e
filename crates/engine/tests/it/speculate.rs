//! Speculative decoding (`Engine::generate_speculative`, prompt lookup): greedy output is the output
//! of `generate`, token for token, on every tiny fixture in every precision and on SmolLM2; the
//! drafts are really used (kept and rejected, so the KV cache is cut back); sampled output keeps the
//! model's distribution (a two-sample test over many seeds, which a changed distribution fails).

use crate::common;

use std::collections::HashMap;
use std::path::PathBuf;

use engine::{
    DraftSource, Engine, EngineOptions, Flow, GenerateRequest, KvFormat, Lookup, ModelFile,
    Precision, SamplerConfig, SpecOptions, SpecStats,
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

fn engine(file: &ModelFile, precision: Precision, cache: KvFormat, context: usize) -> Engine<'_> {
    Engine::new(
        file,
        EngineOptions {
            threads: 2,
            precision,
            context,
            cache_type: Some(cache),
        },
    )
    .unwrap()
}

/// A prompt that repeats itself, so that lookup finds matches.
fn repetitive_prompt() -> Vec<u32> {
    let part: Vec<u32> = (0..12u32).map(|i| 3 + (i * 37 + 5) % 250).collect();
    part.iter()
        .chain(&part)
        .chain(&part[..5])
        .copied()
        .collect()
}

fn greedy(max_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        max_tokens,
        stop_at_eos: false,
        ..Default::default()
    }
}

/// Greedy output with lookup equals plain greedy output; returns the speculation's counts.
fn same_greedy(eng: &Engine<'_>, prompt: &[u32], req: &GenerateRequest, k: usize) -> SpecStats {
    let plain = eng.generate(prompt, req, |_| Flow::Continue).unwrap();
    let mut streamed = String::new();
    let spec = eng
        .generate_speculative(
            prompt,
            req,
            &mut Lookup::default(),
            SpecOptions { max_draft: k },
            |piece| {
                streamed.push_str(piece);
                Flow::Continue
            },
        )
        .unwrap();
    let g = &spec.generation;
    assert_eq!(
        g.generated_ids,
        plain.generated_ids,
        "{}: greedy with --lookup {k} differs from plain decoding",
        eng.model().path().display()
    );
    assert_eq!(g.text, plain.text);
    assert_eq!(streamed, plain.text, "the streamed text is the text");
    assert_eq!(g.stop_reason, plain.stop_reason);
    let s = spec.stats;
    assert!(s.accepted <= s.drafted);
    assert!(s.steps > 0 || g.generated_ids.len() <= 1, "{s:?}");
    // Every generated token but the prefill's first came from a verification step.
    let n = g.generated_ids.len();
    assert!(s.decoded + 1 >= n && s.decoded <= n, "{s:?}, {n} tokens");
    spec.stats
}

#[test]
fn greedy_lookup_gives_the_tokens_of_plain_decoding_on_every_fixture() {
    let prompt = repetitive_prompt();
    let mut total = SpecStats::default();
    for name in FIXTURES {
        let file = fixture(name);
        for precision in [Precision::Exact, Precision::Fast, Precision::Int8] {
            for cache in [KvFormat::F32, KvFormat::F16] {
                let eng = engine(&file, precision, cache, 128);
                for k in [1, 3, 8] {
                    total.add(&same_greedy(&eng, &prompt, &greedy(60), k));
                }
            }
        }
    }
    // Not vacuous: drafts were made, kept, and rejected (the cache cut back).
    assert!(total.drafted > 100, "{total:?}");
    assert!(total.accepted > 0, "{total:?}");
    assert!(total.accepted < total.drafted, "{total:?}");
    assert!(total.tokens_per_step() > 1.0, "{total:?}");
}

#[test]
fn greedy_lookup_stops_at_the_context_and_the_token_limit_as_plain_decoding() {
    let file = fixture("tiny-llama-silu-q4_0.gguf");
    let prompt = repetitive_prompt();
    // A context just past the prompt: the plain run fails when it is full, and so does lookup.
    let eng = engine(&file, Precision::Fast, KvFormat::F32, prompt.len() + 7);
    let req = greedy(40);
    let plain = eng.generate(&prompt, &req, |_| Flow::Continue);
    let spec = eng.generate_speculative(
        &prompt,
        &req,
        &mut Lookup::default(),
        SpecOptions { max_draft: 8 },
        |_| Flow::Continue,
    );
    assert_eq!(plain.is_err(), spec.is_err());
    for max in [1, 2, 5] {
        let eng = engine(&file, Precision::Fast, KvFormat::F32, 128);
        same_greedy(&eng, &prompt, &greedy(max), 8);
    }
}

#[test]
fn a_draft_source_proposing_wrong_tokens_changes_nothing() {
    /// Always proposes the same (mostly wrong) tokens.
    struct Stubborn;
    impl DraftSource for Stubborn {
        fn draft(&mut self, _: &[u32], max: usize, out: &mut Vec<u32>) {
            out.extend((0..max as u32).map(|i| 7 + i));
        }
    }
    let file = fixture("tiny-qwen2-q4_1.gguf");
    let eng = engine(&file, Precision::Fast, KvFormat::F32, 128);
    let prompt = repetitive_prompt();
    let req = greedy(30);
    let plain = eng.generate(&prompt, &req, |_| Flow::Continue).unwrap();
    let spec = eng
        .generate_speculative(
            &prompt,
            &req,
            &mut Stubborn,
            SpecOptions { max_draft: 4 },
            |_| Flow::Continue,
        )
        .unwrap();
    assert_eq!(spec.generation.generated_ids, plain.generated_ids);
    assert!(spec.stats.drafted > spec.stats.accepted);
}

#[test]
fn bad_speculation_settings_are_refused() {
    let file = fixture("tiny-llama-f16.gguf");
    let eng = engine(&file, Precision::Fast, KvFormat::F32, 64);
    let run = |prompt: &[u32], k: usize| {
        eng.generate_speculative(
            prompt,
            &greedy(4),
            &mut Lookup::default(),
            SpecOptions { max_draft: k },
            |_| Flow::Continue,
        )
        .map(|_| ())
        .unwrap_err()
        .to_string()
    };
    assert!(run(&[5, 6], 0).contains("at least one drafted token"));
    assert!(run(&[], 2).contains("prompt is empty"));
}

/// Counts of the token at `pos` of the generations of seeds `0..n`, with or without lookup.
fn sampled(
    eng: &Engine<'_>,
    cfg: &SamplerConfig,
    lookup: bool,
    n: u64,
) -> Vec<HashMap<u32, usize>> {
    let prompt = repetitive_prompt();
    let mut counts = vec![HashMap::new(); 4];
    for seed in 0..n {
        let req = GenerateRequest {
            max_tokens: 4,
            stop_at_eos: false,
            sampler: SamplerConfig {
                seed,
                ..cfg.clone()
            },
            ..Default::default()
        };
        let ids = if lookup {
            eng.generate_speculative(
                &prompt,
                &req,
                &mut Lookup::default(),
                SpecOptions { max_draft: 3 },
                |_| Flow::Continue,
            )
            .unwrap()
            .generation
            .generated_ids
        } else {
            eng.generate(&prompt, &req, |_| Flow::Continue)
                .unwrap()
                .generated_ids
        };
        for (c, t) in counts.iter_mut().zip(ids) {
            *c.entry(t).or_insert(0) += 1;
        }
    }
    counts
}

/// Two-sample chi-square statistic of equal-size samples (tokens seen fewer than 10 times in both
/// pooled into one bin) and its degrees of freedom.
fn chi2(a: &HashMap<u32, usize>, b: &HashMap<u32, usize>) -> (f64, usize) {
    let mut keys: Vec<u32> = a.keys().chain(b.keys()).copied().collect();
    keys.sort_unstable();
    keys.dedup();
    let (mut x, mut bins, mut ra, mut rb) = (0.0, 0usize, 0usize, 0usize);
    let mut add = |ca: usize, cb: usize| {
        x += (ca as f64 - cb as f64).powi(2) / (ca + cb) as f64;
        bins += 1;
    };
    for k in keys {
        let (ca, cb) = (
            a.get(&k).copied().unwrap_or(0),
            b.get(&k).copied().unwrap_or(0),
        );
        if ca + cb >= 10 {
            add(ca, cb);
        } else {
            ra += ca;
            rb += cb;
        }
    }
    if ra + rb > 0 {
        add(ra, rb);
    }
    (x, bins.saturating_sub(1))
}

/// A bound the statistic passes with probability below about 1e-6 under the same distribution
/// (a normal approximation with a wide margin).
fn bound(df: usize) -> f64 {
    df as f64 + 7.0 * (2.0 * df as f64).sqrt() + 10.0
}

#[test]
fn sampling_with_lookup_keeps_the_models_distribution() {
    let file = fixture("tiny-llama-silu-q4_0.gguf");
    let eng = engine(&file, Precision::Fast, KvFormat::F32, 64);
    let cfg = SamplerConfig {
        temperature: 0.6,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        ..Default::default()
    };
    let n = 1500;
    let plain = sampled(&eng, &cfg, false, n);
    let spec = sampled(&eng, &cfg, true, n);
    // The positions after the first come from verification steps with drafts.
    for pos in 1..4 {
        let (x, df) = chi2(&plain[pos], &spec[pos]);
        assert!(df >= 1, "position {pos}: too few distinct tokens to test");
        assert!(
            x < bound(df),
            "position {pos}: chi2 {x:.1} over {df} degrees of freedom"
        );
    }
    // The test has power: another temperature is told apart.
    let hotter = sampled(
        &eng,
        &SamplerConfig {
            temperature: 1.2,
            ..cfg
        },
        false,
        n,
    );
    let (x, df) = chi2(&plain[1], &hotter[1]);
    assert!(
        x > bound(df),
        "temperature 0.6 against 1.2: chi2 {x:.1} over {df}"
    );
}

#[test]
fn greedy_lookup_gives_the_tokens_of_plain_decoding_on_smollm2() {
    let path = common::model_path();
    let file = ModelFile::open(&path).unwrap();
    let eng = engine(&file, Precision::Fast, KvFormat::F32, 512);
    let text = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\n\
                # The same two functions with type hints:\n";
    let prompt = eng.tokenizer().encode(text, false).unwrap();
    let s = same_greedy(&eng, &prompt, &greedy(48), 6);
    assert!(s.drafted > 0 && s.accepted > 0, "{s:?}");
}

#[test]
fn a_draft_is_cut_after_a_token_that_ends_the_sequence() {
    /// Proposes an end-of-sequence token followed by more tokens, every step.
    struct PastTheEnd(u32);
    impl DraftSource for PastTheEnd {
        fn draft(&mut self, _: &[u32], max: usize, out: &mut Vec<u32>) {
            out.push(self.0);
            out.extend((1..max as u32).map(|i| 7 + i));
        }
        fn draft_len(&self, _: usize, max: usize) -> usize {
            max
        }
    }
    let file = fixture("tiny-qwen2-q4_1.gguf");
    let eng = engine(&file, Precision::Fast, KvFormat::F32, 128);
    let eos = eng.tokenizer().stop_ids()[0];
    let prompt = repetitive_prompt();
    let req = GenerateRequest {
        max_tokens: 30,
        stop_at_eos: true,
        ..Default::default()
    };
    let plain = eng.generate(&prompt, &req, |_| Flow::Continue).unwrap();
    let spec = eng
        .generate_speculative(
            &prompt,
            &req,
            &mut PastTheEnd(eos),
            SpecOptions { max_draft: 4 },
            |_| Flow::Continue,
        )
        .unwrap();
    assert_eq!(spec.generation.generated_ids, plain.generated_ids);
    let s = spec.stats;
    assert!(s.steps > 0, "{s:?}");
    // Each step verifies the end token alone, not the three after it (the last step, at the token
    // limit, drafts nothing).
    assert!(s.drafted <= s.steps && s.drafted + 1 >= s.steps, "{s:?}");
}
