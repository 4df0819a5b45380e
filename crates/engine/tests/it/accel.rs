//! The accelerator backends on the tiny fixtures (SiLU, ReLU, Qwen2 biases; Q4_0, Q8_0, Q4_1, F16):
//! the FFN of every layer on QNN (through the test double `qnn-double`, loaded by path exactly as
//! `libQnnHtp.so` would be) and on the CPU backend, against the CPU engine, for a prompt (batched
//! steps, cut into graphs of 8, 4, 2 and 1 tokens), decode steps, and batched decode of 2, 4 and 8
//! sequences. A library that fails to load, lacks the entry point, reports another API version or
//! fails at any step gives an error naming the library and the step: at set-up the caller stays on
//! the CPU; during a run the layer is computed on the CPU and the failure is kept.

use crate::common;
#[path = "accel/hybrid.rs"]
mod hybrid;
#[path = "accel/prefill.rs"]
mod prefill;
#[path = "accel/store_hybrid.rs"]
mod store_hybrid;

use std::path::{Path, PathBuf};

use engine::accel::{AccelKind, QnnWeights};
use engine::forward::forward_with;
use engine::{
    AccelFfn, Engine, EngineOptions, FfnMode, KvFormat, Logits, ModelFile, OffloadError, Precision,
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

fn double() -> PathBuf {
    qnn_double::library_path().unwrap_or_else(|| {
        panic!(
            "{} not found next to {:?}: cargo builds it as a dev-dependency",
            qnn_double::library_file_name(),
            std::env::current_exe()
        )
    })
}

fn qnn(weights: QnnWeights) -> AccelKind {
    let variant = (weights == QnnWeights::F32).then_some("f32");
    AccelKind::new("qnn", variant, Some(double()))
}

fn engine(file: &ModelFile, precision: Precision) -> Engine<'_> {
    Engine::new(
        file,
        EngineOptions {
            threads: 2,
            precision,
            context: 64,
            cache_type: Some(KvFormat::F32),
        },
    )
    .unwrap()
}

fn tokens(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32).map(|i| 3 + (i * 29 + salt) % 250).collect()
}

/// Every logit of: a 13-token prompt (all positions), 3 decode steps, then one batched decode step
/// of `seqs` sequences forked from it.
fn run(eng: &Engine<'_>, seqs: usize) -> Vec<f32> {
    let mut cache = eng.new_cache();
    let mut all = eng
        .forward(&mut cache, &tokens(13, 1), Logits::All)
        .unwrap();
    for t in [40u32, 41, 42] {
        all.extend(eng.forward(&mut cache, &[t], Logits::Last).unwrap());
    }
    let mut caches: Vec<_> = (0..seqs).map(|_| cache.clone()).collect();
    let mut refs: Vec<_> = caches.iter_mut().collect();
    let next: Vec<u32> = (0..seqs as u32).map(|i| 7 + 11 * i).collect();
    all.extend(eng.forward_batch(&mut refs, &next).unwrap());
    all
}

/// Largest |a - b| over the logits, and the largest |b|.
fn diff(a: &[f32], b: &[f32]) -> (f32, f32) {
    assert_eq!(a.len(), b.len());
    let d = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    (d, b.iter().fold(0f32, |m, y| m.max(y.abs())))
}

#[test]
fn qnn_with_f32_weights_computes_what_the_cpu_engine_does() {
    for name in FIXTURES {
        let file = fixture(name);
        for seqs in [2, 4, 8] {
            let mut eng = engine(&file, Precision::Exact);
            let want = run(&eng, seqs);
            let ffn = AccelFfn::open(&qnn(QnnWeights::F32), eng.model()).unwrap();
            eng.set_accel(Some(ffn));
            let got = run(&eng, seqs);
            let a = eng.accel().unwrap();
            assert_eq!(a.failure(), None, "{name}");
            let (d, scale) = diff(&got, &want);
            assert!(
                d <= 1e-4 * (1.0 + scale),
                "{name} {seqs} sequences: |Δ| {d} (logits up to {scale})"
            );
        }
    }
}

#[test]
fn int8_qnn_and_the_cpu_backend_stay_close_to_the_cpu_engine() {
    for name in FIXTURES {
        let file = fixture(name);
        let mut eng = engine(&file, Precision::Fast);
        let want = run(&eng, 4);
        for kind in [qnn(QnnWeights::Int8), AccelKind::cpu()] {
            let ffn = AccelFfn::open(&kind, eng.model()).unwrap();
            eng.set_accel(Some(ffn));
            let got = run(&eng, 4);
            assert_eq!(eng.accel().unwrap().failure(), None);
            let (d, scale) = diff(&got, &want);
            // 8-bit weights (per row for QNN, per 32 for the CPU backend's Q8_0) over 4- to 16-bit ones.
            assert!(
                d <= 0.05 * scale,
                "{name} {kind:?}: |Δ| {d} (logits up to {scale})"
            );
            assert!(
                d > 0.0,
                "{name} {kind:?}: re-quantized weights change something"
            );
        }
    }
}

#[test]
fn one_graph_per_layer_and_batch_size() {
    let file = fixture("tiny-llama-silu-q4_0.gguf");
    let model = engine::Model::load(&file).unwrap();
    let blocks: Vec<_> = engine::accel::blocks_for_model(&model, None)
        .collect::<Result<_, _>>()
        .unwrap();
    let blocks = blocks.into_iter().map(Ok);
    let q = engine::accel::QnnAccelerator::new(Some(&double()), blocks, QnnWeights::F32).unwrap();
    let d = model.config.d_model;
    use engine::Accelerator;
    for n in [1usize, 13, 2, 8] {
        let x = vec![0.5f32; n * d];
        let mut y = vec![0f32; n * d];
        q.ffn(1, q.block_neurons(1), &x, n, &mut y).unwrap();
        // Every token got the same input: every output row is the same.
        assert!(y.chunks(d).all(|r| r == &y[..d]), "{n} tokens");
    }
    // 1; 8, 4, 1 (13); 2; 8 again: graphs of 1, 2, 4 and 8 tokens for layer 1.
    assert_eq!(q.graphs(), 4);
    // A prefix of the block is another graph; more neurons than the block is an error.
    let x = vec![0.5f32; d];
    let mut y = vec![0f32; d];
    q.ffn(1, 32, &x, 1, &mut y).unwrap();
    assert_eq!(q.graphs(), 5);
    let past = q.ffn(1, q.block_neurons(1) + 1, &x, 1, &mut y).unwrap_err();
    assert!(past.to_string().contains("neurons asked"), "{past}");
}

/// The first 32 neurons of a whole layer's block compute what a block of those 32 neurons does, on
/// QNN (f32 weights) and on the CPU backend, for batches of 1, 3 and 8 tokens.
#[test]
fn a_prefix_of_the_block_is_the_block_of_those_neurons() {
    let file = fixture("tiny-llama-silu-q4_0.gguf");
    let model = engine::Model::load(&file).unwrap();
    let (d, ff) = (model.config.d_model, model.config.d_ff);
    assert!(ff > 32);
    let first: Vec<Vec<u32>> = (0..model.config.n_layers)
        .map(|_| (0..32).collect())
        .collect();
    for kind in [qnn(QnnWeights::F32), AccelKind::cpu()] {
        let whole =
            engine::accel::open(&kind, engine::accel::blocks_for_model(&model, None)).unwrap();
        let part =
            engine::accel::open(&kind, engine::accel::blocks_for_model(&model, Some(&first)))
                .unwrap();
        for n in [1usize, 3, 8] {
            let x: Vec<f32> = (0..n * d)
                .map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.05)
                .collect();
            let (mut a, mut b, mut all) = (vec![0f32; n * d], vec![0f32; n * d], vec![0f32; n * d]);
            whole.ffn(1, 32, &x, n, &mut a).unwrap();
            part.ffn(1, 32, &x, n, &mut b).unwrap();
            whole.ffn(1, ff, &x, n, &mut all).unwrap();
            let (drift, scale) = diff(&a, &b);
            assert!(
                drift <= 1e-5 * scale && scale > 0.0,
                "{kind:?} n={n}: prefix against block drift {drift} of {scale}"
            );
            let (moved, scale) = diff(&a, &all);
            assert!(
                moved > 1e-3 * scale,
                "{kind:?} n={n}: the prefix left out nothing ({moved} of {scale})"
            );
        }
    }
}

fn accel_error(e: OffloadError) -> String {
    match e {
        OffloadError::Accel(engine::accel::AccelError::Library { .. }) => e.to_string(),
        other => panic!("not an accelerator error: {other}"),
    }
}

#[test]
fn a_library_that_cannot_be_used_is_a_named_error_at_set_up() {
    let file = fixture("tiny-llama-silu-q4_0.gguf");
    let eng = engine(&file, Precision::Exact);
    let open = |library: &Path| {
        AccelFfn::open(
            &AccelKind::new("qnn", None, Some(library.to_path_buf())),
            eng.model(),
        )
        .map(|_| ())
        .unwrap_err()
    };
    let e = accel_error(open(Path::new("/nonexistent/libQnnHtp.so")));
    assert!(e.contains("/nonexistent/libQnnHtp.so"), "{e}");
    // A library without QnnInterface_getProviders.
    let e = accel_error(open(Path::new("libm.so.6")));
    assert!(e.contains("QnnInterface_getProviders"), "{e}");
    let control = qnn_double::Control::open(&double()).unwrap();
    control.set_api_major(Some(3));
    let e = accel_error(open(&double()));
    control.set_api_major(None);
    assert!(e.contains("core API 3"), "{e}");
    for step in ["backendCreate", "contextCreate"] {
        control.set_fail(Some(step));
        let e = accel_error(open(&double()));
        control.set_fail(None);
        assert!(e.contains(step), "{step}: {e}");
    }
}

#[test]
fn a_failing_step_falls_back_to_the_cpu_and_names_the_step() {
    let file = fixture("tiny-qwen2-q4_1.gguf");
    let eng = engine(&file, Precision::Exact);
    let control = qnn_double::Control::open(&double()).unwrap();
    let prompt = tokens(6, 3);
    let step = |exec: Option<&AccelFfn>| {
        let mut cache = eng.new_cache();
        forward_with(
            eng.model(),
            &mut cache,
            &prompt,
            Precision::Exact,
            Logits::All,
            FfnMode {
                exec: exec.map(|e| e as &dyn engine::FfnExecutor),
                ..Default::default()
            },
        )
        .unwrap()
    };
    let cpu = step(None);
    for fail in [
        "graphCreate",
        "tensorCreateGraphTensor",
        "graphAddNode",
        "graphFinalize",
        "graphExecute",
    ] {
        // Graphs are built on first use, on this thread (forward_with runs the FFN steps here).
        let ffn = AccelFfn::open(&qnn(QnnWeights::F32), eng.model()).unwrap();
        control.set_fail(Some(fail));
        let got = step(Some(&ffn));
        control.set_fail(None);
        let f = ffn
            .failure()
            .unwrap_or_else(|| panic!("{fail}: no failure kept"));
        assert!(f.contains(fail), "{fail}: {f}");
        // The CPU computed every layer from the failure on: the logits are the CPU engine's.
        let (d, scale) = diff(&got, &cpu);
        assert!(d <= 1e-4 * (1.0 + scale), "{fail}: |Δ| {d}");
    }
}
