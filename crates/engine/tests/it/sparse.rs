//! The sparse FFN (`engine::sparse`) on the tiny fixtures: with nothing skipped it computes what the dense
//! FFN computes (decode and batched steps, SiLU and ReLU models), calibrated thresholds skip the share of
//! neurons they were calibrated for, and a predictor decides which gate/up rows run.

use crate::common;

use common::rel_drift;
use std::path::PathBuf;

use engine::sparse::{thresholds_for_sparsity, Score, DEFAULT_DOWN_FORMAT};
use engine::{Engine, EngineOptions, ModelFile, NeuronPredictor, Precision, SparseFfn};
use kernels_neon::WeightFormat;

const TOKENS: &[u32] = &[1, 70, 80, 90, 100, 33, 7, 250, 12, 64, 5, 99];

fn fixture(name: &str) -> ModelFile {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(name);
    ModelFile::open(p).unwrap()
}

fn engine(file: &ModelFile) -> Engine<'_> {
    Engine::new(
        file,
        EngineOptions {
            threads: 1,
            precision: Precision::Exact,
            context: 64,
            ..Default::default()
        },
    )
    .unwrap()
}

fn logits(eng: &Engine<'_>, batched: bool) -> Vec<f32> {
    common::logits(eng, TOKENS, batched)
}

#[test]
fn zero_thresholds_compute_the_dense_ffn() {
    for name in [
        "tiny-llama-f16.gguf",
        "tiny-llama-silu-q4_0.gguf",
        "tiny-llama-relu-q8_0.gguf",
        "tiny-qwen2-q4_1.gguf",
    ] {
        let file = fixture(name);
        let mut eng = engine(&file);
        let n_layers = eng.model().config.n_layers;
        for batched in [false, true] {
            eng.set_sparse(None);
            let dense = logits(&eng, batched);
            for score in [Score::Gate, Score::GateNorm, Score::OutputNorm] {
                // F32 down rows: only the summation order differs from the dense product.
                let mut sp =
                    SparseFfn::new(eng.model(), vec![0.0; n_layers], WeightFormat::F32).unwrap();
                sp.score = score;
                eng.set_sparse(Some(sp));
                let sparse = logits(&eng, batched);
                let d = rel_drift(&sparse, &dense);
                assert!(d < 1e-4, "{name} {score:?} batched={batched}: drift {d}");
                let stats = eng.sparse().unwrap().stats();
                if !batched {
                    assert_eq!(stats.tokens, TOKENS.len() as u64, "{name}");
                    assert_eq!(
                        stats.gate_frac(),
                        1.0,
                        "{name}: no predictor, every gate row runs"
                    );
                }
            }
        }
    }
}

#[test]
fn relu_models_skip_their_zero_neurons_for_free() {
    let file = fixture("tiny-llama-relu-q8_0.gguf");
    let mut eng = engine(&file);
    let n_layers = eng.model().config.n_layers;
    let dense = logits(&eng, false);
    let mut sp = SparseFfn::new(eng.model(), vec![0.0; n_layers], DEFAULT_DOWN_FORMAT).unwrap();
    sp.score = Score::Gate;
    eng.set_sparse(Some(sp));
    let sparse = logits(&eng, false);
    let s = eng.sparse().unwrap().stats();
    // ReLU zeroes about half of the gate outputs: those down columns are never read.
    assert!(
        s.down_frac() > 0.2 && s.down_frac() < 0.8,
        "down share {}",
        s.down_frac()
    );
    // Q8_0 down rows against the file's Q8_0 down matrix: rounding only.
    let d = rel_drift(&sparse, &dense);
    assert!(d < 2e-2, "drift {d}");
}

#[test]
fn calibrated_thresholds_skip_the_calibrated_share() {
    let file = fixture("tiny-llama-silu-q4_0.gguf");
    let mut eng = engine(&file);
    let n_layers = eng.model().config.n_layers;
    let dense = logits(&eng, false);
    let mut prev_drift = 0.0;
    for target in [0.3f32, 0.6] {
        let probe = SparseFfn::new(eng.model(), vec![0.0; n_layers], DEFAULT_DOWN_FORMAT).unwrap();
        let mut samples =
            engine::profile::sample_scores(&eng, &probe, TOKENS, TOKENS.len(), 1, 1, |_, _| {})
                .unwrap();
        assert_eq!(samples.len(), n_layers);
        let t = thresholds_for_sparsity(&mut samples, target).unwrap();
        eng.set_sparse(Some(
            SparseFfn::new(eng.model(), t, DEFAULT_DOWN_FORMAT).unwrap(),
        ));
        // Decoding the calibration tokens themselves: the skipped share is the target (up to ties and
        // the small differences between batched and one-token steps).
        let sparse = logits(&eng, false);
        let s = eng.sparse().unwrap().stats();
        let skipped = 1.0 - s.down_frac();
        assert!(
            (skipped - target as f64).abs() < 0.05,
            "target {target}: skipped {skipped}"
        );
        let d = rel_drift(&sparse, &dense);
        assert!(
            d > prev_drift && d.is_finite(),
            "target {target}: drift {d} (previous {prev_drift})"
        );
        prev_drift = d;
        eng.set_sparse(None);
    }
}

/// Predicts a fixed set of rows for every layer.
struct Fixed(Vec<u32>);

impl NeuronPredictor for Fixed {
    fn predict(
        &self,
        _layer: usize,
        _x: &[f32],
        out: &mut Vec<u32>,
    ) -> Result<(), engine::OffloadError> {
        out.clear();
        out.extend_from_slice(&self.0);
        Ok(())
    }
}

#[test]
fn predictor_chooses_the_gate_and_up_rows() {
    let file = fixture("tiny-llama-f16.gguf");
    let mut eng = engine(&file);
    let cfg = eng.model().config.clone();
    let rows: Vec<u32> = (0..cfg.d_ff as u32).step_by(3).collect();
    let sp = SparseFfn::new(eng.model(), vec![0.0; cfg.n_layers], WeightFormat::F32)
        .unwrap()
        .with_predictor(Box::new(Fixed(rows.clone())));
    assert!(sp.has_predictor());
    eng.set_sparse(Some(sp));
    let with_some = logits(&eng, false);
    let s = eng.sparse().unwrap().stats();
    let want = rows.len() as f64 / cfg.d_ff as f64;
    assert!(
        (s.gate_frac() - want).abs() < 1e-9 && (s.up_frac() - want).abs() < 1e-9,
        "{s:?}"
    );
    assert!(s.down_frac() <= want + 1e-9, "{s:?}");

    // Predicting every row is the dense FFN again.
    let all = SparseFfn::new(eng.model(), vec![0.0; cfg.n_layers], WeightFormat::F32)
        .unwrap()
        .with_predictor(Box::new(Fixed((0..cfg.d_ff as u32).collect())));
    eng.set_sparse(Some(all));
    let with_all = logits(&eng, false);
    eng.set_sparse(None);
    let dense = logits(&eng, false);
    assert!(rel_drift(&with_all, &dense) < 1e-4);
    assert!(
        rel_drift(&with_some, &dense) > 1e-3,
        "dropping two thirds of the neurons must change the logits"
    );
}

#[test]
fn wrong_thresholds_are_errors() {
    let file = fixture("tiny-llama-f16.gguf");
    let eng = engine(&file);
    let n = eng.model().config.n_layers;
    assert!(SparseFfn::new(eng.model(), vec![0.0; n + 1], DEFAULT_DOWN_FORMAT).is_err());
    let mut bad = vec![0.0; n];
    bad[0] = f32::NAN;
    let e = SparseFfn::new(eng.model(), bad, DEFAULT_DOWN_FORMAT)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("layer 0"), "{e}");
    bad = vec![0.0; n];
    bad[n - 1] = -1.0;
    assert!(SparseFfn::new(eng.model(), bad, DEFAULT_DOWN_FORMAT).is_err());
}

/// Decode steps of several sequences at once (Best-of-N) with calibrated thresholds and no
/// predictor: the batched gate/up products read the weights once for all of them, and each
/// sequence's logits and selection are bit for bit what one step per sequence gives.
#[test]
fn a_batched_sparse_decode_step_equals_one_step_per_sequence() {
    use engine::{KvFormat, Logits};
    for name in ["tiny-llama-silu-q4_0.gguf", "tiny-qwen2-q4_1.gguf"] {
        let file = fixture(name);
        for precision in [Precision::Fast, Precision::Exact] {
            let mut eng = Engine::new(
                &file,
                EngineOptions {
                    threads: 2,
                    precision,
                    context: 64,
                    cache_type: Some(KvFormat::F32),
                },
            )
            .unwrap();
            let n_layers = eng.model().config.n_layers;
            let probe =
                SparseFfn::new(eng.model(), vec![0.0; n_layers], DEFAULT_DOWN_FORMAT).unwrap();
            let mut samples =
                engine::profile::sample_scores(&eng, &probe, TOKENS, TOKENS.len(), 1, 1, |_, _| {})
                    .unwrap();
            let t = thresholds_for_sparsity(&mut samples, 0.5).unwrap();
            let sp = SparseFfn::new(eng.model(), t, DEFAULT_DOWN_FORMAT).unwrap();
            assert_eq!(sp.score, Score::OutputNorm);
            eng.set_sparse(Some(sp));
            let prompts: [&[u32]; 3] = [&TOKENS[..5], &TOKENS[5..6], &TOKENS[3..12]];
            let mut caches: Vec<_> = prompts
                .iter()
                .map(|p| {
                    let mut c = eng.new_cache();
                    eng.forward(&mut c, p, Logits::Last).unwrap();
                    c
                })
                .collect();
            let mut singles = caches.clone();
            for step in 0..3u32 {
                let toks: Vec<u32> = [17u32, 200, 42].iter().map(|t| t + step).collect();
                let before = eng.sparse().unwrap().stats();
                let mut refs: Vec<_> = caches.iter_mut().collect();
                let got = eng.forward_batch(&mut refs, &toks).unwrap();
                let batched = eng.sparse().unwrap().stats();
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
                }
                // The same neurons: the batched step's down columns are the three single steps'.
                let after = eng.sparse().unwrap().stats();
                assert_eq!(
                    batched.down_rows - before.down_rows,
                    after.down_rows - batched.down_rows,
                    "{name} {precision:?} step {step}"
                );
                assert!(batched.down_rows - before.down_rows < batched.neurons - before.neurons);
            }
        }
    }
}

/// A plan's dense layers run the dense FFN bit for bit (one-token and prompt steps, no predictor
/// asked, no neuron counted), the others sparse as before; a wrong layer count is an error.
#[test]
fn dense_layers_run_the_dense_ffn() {
    let file = fixture("tiny-llama-silu-q4_0.gguf");
    let mut eng = engine(&file);
    let (n, d_ff) = (eng.model().config.n_layers, eng.model().config.d_ff);
    assert!(n >= 2);
    let quarter = || Box::new(Fixed((0..d_ff as u32 / 4).collect()));
    let build = |eng: &Engine<'_>| {
        SparseFfn::new(eng.model(), vec![0.0; n], DEFAULT_DOWN_FORMAT)
            .unwrap()
            .with_predictor(quarter())
    };
    for batched in [false, true] {
        eng.set_sparse(None);
        let dense = logits(&eng, batched);
        eng.set_sparse(Some(build(&eng)));
        let sparse = logits(&eng, batched);
        let all_neurons = eng.sparse().unwrap().stats().neurons;
        assert!(rel_drift(&sparse, &dense) > 1e-3, "batched={batched}");

        let all = build(&eng).with_dense_layers(vec![true; n]).unwrap();
        assert_eq!(
            all.down_t_bytes(),
            0,
            "a dense layer keeps no transposed rows"
        );
        eng.set_sparse(Some(all));
        assert_eq!(logits(&eng, batched), dense, "batched={batched}");
        assert_eq!(eng.sparse().unwrap().stats().neurons, 0);

        let mut first = vec![false; n];
        first[0] = true;
        eng.set_sparse(Some(build(&eng).with_dense_layers(first).unwrap()));
        let mixed = logits(&eng, batched);
        assert!(eng.sparse().unwrap().is_dense(0) && !eng.sparse().unwrap().is_dense(1));
        assert!(mixed != dense && mixed != sparse, "batched={batched}");
        if !batched {
            let neurons = eng.sparse().unwrap().stats().neurons;
            assert_eq!(neurons * n as u64, all_neurons * (n as u64 - 1));
        }
    }
    let e = build(&eng)
        .with_dense_layers(vec![true; n + 1])
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("layers"), "{e}");
}

/// A plan's dense batch sizes: a decode step of two or more sequences runs every layer dense, bit
/// for bit the dense engine's batched step, from the planned size on; smaller steps and one-token
/// steps stay sparse.
#[test]
fn dense_batches_run_batched_decode_steps_dense() {
    use engine::{KvFormat, Logits};
    let file = fixture("tiny-llama-silu-q4_0.gguf");
    let mut eng = Engine::new(
        &file,
        EngineOptions {
            threads: 2,
            precision: Precision::Fast,
            context: 64,
            cache_type: Some(KvFormat::F32),
        },
    )
    .unwrap();
    let (n, d_ff) = (eng.model().config.n_layers, eng.model().config.d_ff);
    let sparse = |eng: &Engine<'_>| {
        SparseFfn::new(eng.model(), vec![0.0; n], DEFAULT_DOWN_FORMAT)
            .unwrap()
            .with_predictor(Box::new(Fixed((0..d_ff as u32 / 4).collect())))
            .with_dense_batches(vec![(4, true), (2, false)])
            .unwrap()
    };
    // Four sequences' prompts, run dense (the same caches under either FFN).
    let prompts: [&[u32]; 4] = [&TOKENS[..5], &TOKENS[5..6], &TOKENS[3..12], &TOKENS[1..3]];
    let caches: Vec<_> = prompts
        .iter()
        .map(|p| {
            let mut c = eng.new_cache();
            eng.forward(&mut c, p, Logits::Last).unwrap();
            c
        })
        .collect();
    // One batched decode step over the first `k` sequences.
    let step = |eng: &Engine<'_>, k: usize| {
        let mut caches = caches[..k].to_vec();
        let mut refs: Vec<_> = caches.iter_mut().collect();
        eng.forward_batch(&mut refs, &[17, 200, 42, 9][..k])
            .unwrap()
    };
    for (k, dense_step) in [(2, false), (3, false), (4, true)] {
        eng.set_sparse(None);
        let dense = step(&eng, k);
        eng.set_sparse(Some(sparse(&eng)));
        let got = step(&eng, k);
        let sp = eng.sparse().unwrap();
        assert_eq!(sp.dense_batch(k), dense_step);
        assert_eq!(got == dense, dense_step, "{k} sequences");
        // Neurons are counted where the step ran sparse.
        assert_eq!(sp.stats().neurons == 0, dense_step, "{k} sequences");
    }
    assert!(!eng.sparse().unwrap().dense_batch(1));
}
