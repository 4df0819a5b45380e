//! The KV cache in each of its formats (f32, f16, q8_0) on the real model: it allocates a chunk of
//! positions at a time and gives chunks back when positions are forgotten, never more than
//! `ModelConfig::kv_cache_bytes` at its capacity; a forward step that fails half-way through the
//! layers leaves it as it was, to the byte (the next step's logits are those of a cache that never
//! saw the failed step); exact mode defaults to f32, the fast modes to f16.

use crate::common;

use common::*;
use engine::forward::forward_with;
use engine::{
    DenseFfn, Engine, EngineOptions, FfnExecutor, FfnLayer, FfnMode, FfnScratch, KvFormat, Logits,
    ModelError, ModelFile, Precision, KV_CHUNK,
};

fn engine_for(file: &ModelFile, format: KvFormat, context: usize) -> Engine<'_> {
    Engine::new(
        file,
        EngineOptions {
            threads: 0,
            precision: Precision::Fast,
            context,
            cache_type: Some(format),
        },
    )
    .expect("the default model loads")
}

fn tokens(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| 100 + (i * 37 + salt) % 20_000)
        .collect()
}

/// A dense FFN that fails at one layer: the step fails after the layers before it wrote their keys
/// and values.
struct FailsAt(usize);

impl FfnExecutor for FailsAt {
    fn decode(
        &self,
        l: FfnLayer<'_, '_>,
        x: &[f32],
        out: &mut [f32],
        s: &mut FfnScratch,
    ) -> Result<(), ModelError> {
        self.batch(l, x, 1, out, s)
    }

    fn batch(
        &self,
        l: FfnLayer<'_, '_>,
        x: &[f32],
        n: usize,
        out: &mut [f32],
        s: &mut FfnScratch,
    ) -> Result<(), ModelError> {
        if l.index == self.0 {
            return Err(ModelError::Request(format!(
                "injected failure at layer {}",
                self.0
            )));
        }
        let dense = DenseFfn::new(engine::Activation::Silu);
        if n == 1 {
            dense.decode(l, x, out, s)
        } else {
            dense.batch(l, x, n, out, s)
        }
    }
}

#[test]
fn a_failed_step_leaves_every_cache_type_as_it_was() {
    let file = ModelFile::open(model_path()).unwrap();
    for format in KvFormat::ALL {
        let eng = engine_for(&file, format, 600);
        let prompt = tokens(250, 1);
        let next = 4_242;
        let mut cache = eng.new_cache();
        assert_eq!(cache.format(), format);
        eng.forward(&mut cache, &prompt, Logits::Last).unwrap();
        let before = cache.bytes();
        // A 10-token step past the first chunk (a new chunk is allocated) that fails at layer 7.
        let failing = FailsAt(7);
        let e = forward_with(
            eng.model(),
            &mut cache,
            &tokens(10, 2),
            Precision::Fast,
            Logits::Last,
            FfnMode {
                exec: Some(&failing),
                ..Default::default()
            },
        )
        .unwrap_err();
        assert!(e.to_string().contains("injected"), "{e}");
        assert_eq!(cache.len(), 250, "{format}: positions kept");
        assert_eq!(cache.bytes(), before, "{format}: the new chunk given back");
        let after_failure = eng.forward(&mut cache, &[next], Logits::Last).unwrap();
        let mut fresh = eng.new_cache();
        eng.forward(&mut fresh, &prompt, Logits::Last).unwrap();
        let want = eng.forward(&mut fresh, &[next], Logits::Last).unwrap();
        assert!(
            after_failure == want,
            "{format}: the step after a failed one sees the cache as it was"
        );
    }
}

#[test]
fn the_cache_grows_and_shrinks_by_chunks_within_its_reservation() {
    let file = ModelFile::open(model_path()).unwrap();
    let capacity = KV_CHUNK + 44;
    for format in KvFormat::ALL {
        let eng = engine_for(&file, format, capacity);
        let cfg = &eng.model().config;
        let chunk_bytes = cfg.kv_cache_bytes(KV_CHUNK, format) as usize;
        let mut cache = eng.new_cache();
        assert_eq!(cache.bytes(), 0, "{format}: nothing before the first token");
        eng.forward(&mut cache, &tokens(3, 3), Logits::Last)
            .unwrap();
        assert_eq!(cache.bytes(), chunk_bytes, "{format}: one chunk");
        eng.forward(&mut cache, &tokens(KV_CHUNK, 4), Logits::Last)
            .unwrap();
        assert_eq!(cache.len(), KV_CHUNK + 3);
        // The last chunk is cut to the capacity: the whole cache is what the budget reserves.
        assert_eq!(
            cache.bytes() as u64,
            cfg.kv_cache_bytes(capacity, format),
            "{format}: two chunks, the second cut to the capacity"
        );
        assert_eq!(
            eng.kv_cache_reserved_bytes(),
            cfg.kv_cache_bytes(capacity, format)
        );
        cache.truncate(10);
        assert_eq!(
            cache.bytes(),
            chunk_bytes,
            "{format}: the second chunk given back"
        );
        cache.truncate(0);
        assert_eq!(cache.bytes(), 0);
    }
    // f16 halves f32, q8_0 takes 34 bytes per 32 elements.
    let cfg = engine_for(&file, KvFormat::F32, 64).model().config.clone();
    let per = |f| cfg.kv_cache_bytes(1000, f);
    assert_eq!(per(KvFormat::F32), 2 * per(KvFormat::F16));
    assert_eq!(per(KvFormat::F16) * 34, per(KvFormat::Q8_0) * 64);
}

#[test]
fn exact_mode_defaults_to_f32_the_others_to_f16() {
    let file = ModelFile::open(model_path()).unwrap();
    for (precision, want) in [
        (Precision::Exact, KvFormat::F32),
        (Precision::Fast, KvFormat::F16),
        (Precision::Int8, KvFormat::F16),
    ] {
        let eng = Engine::new(
            &file,
            EngineOptions {
                precision,
                context: 64,
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(eng.cache_type(), want, "{precision:?}");
        assert_eq!(eng.options().cache_type, Some(want));
        assert_eq!(eng.new_cache().format(), want);
    }
}

#[test]
fn every_cache_type_stays_close_to_f32() {
    // The quality figure is perplexity (docs/BENCHMARKS.md; reference.rs holds the default f16 cache
    // to the reference's greedy tokens); here: each format's logits, batched and in a decode step,
    // stay near those of an f32 cache on a real prompt.
    let file = ModelFile::open(model_path()).unwrap();
    let r = reference();
    let p = &r["prompts"][0];
    let prompt = ids(&p["ids"]);
    let logits = |format| {
        let eng = engine_for(&file, format, 256);
        let mut cache = eng.new_cache();
        let mut out = eng.forward(&mut cache, &prompt, Logits::All).unwrap();
        out.extend(eng.forward(&mut cache, &[prompt[0]], Logits::Last).unwrap());
        out
    };
    let f32_logits = logits(KvFormat::F32);
    for (format, tol) in [(KvFormat::F16, 0.05), (KvFormat::Q8_0, 1.0)] {
        let got = logits(format);
        let drift = got
            .iter()
            .zip(&f32_logits)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        eprintln!("{format}: max |logit - f32 cache| = {drift:.2e}");
        assert!(drift > 0.0, "{format} rounds");
        assert!(drift < tol, "{format}: drift {drift}");
    }
}

#[test]
fn q8_0_needs_whole_blocks_per_head() {
    // The fixtures have 16-wide heads: a q8_0 block would straddle two.
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/tiny-llama-silu-q4_0.gguf");
    let file = ModelFile::open(&path).unwrap();
    let e = Engine::new(
        &file,
        EngineOptions {
            context: 16,
            cache_type: Some(KvFormat::Q8_0),
            ..Default::default()
        },
    )
    .err()
    .expect("a q8_0 cache is refused")
    .to_string();
    assert!(
        e.contains("tiny-llama-silu-q4_0.gguf") && e.contains("multiple of 32"),
        "{e}"
    );
    for format in [KvFormat::F32, KvFormat::F16] {
        let eng = engine_for(&file, format, 16);
        let mut cache = eng.new_cache();
        eng.forward(&mut cache, &[1, 2, 3], Logits::Last).unwrap();
        assert_eq!(cache.len(), 3);
    }
}
