//! (A module of the `accel` test binary: one link for both.)
//!
//! Hybrid decode (`HybridFfn`) on the tiny fixtures: each layer's hot neurons as one dense block on an
//! accelerator (QNN through the test double `qnn-double`, or the CPU backend), the rest sparse on
//! the CPU, summed. With nothing skipped (zero thresholds, no predictor) it is the dense FFN for any
//! hot set, in decode and batched steps; with no hot neuron it is the sparse FFN; the sparse part
//! never computes a hot neuron; an accelerator that fails mid-run leaves the sparse FFN's result and
//! names the failing step. A split that grows with the batch size runs each step's share on the
//! accelerator and the rest on the CPU, and is still the dense FFN with nothing skipped.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::double;

use super::common::{logits, rel_drift};
use engine::accel::{open, AccelKind};
use engine::forward::forward_with;
use engine::{
    Engine, EngineOptions, FfnMode, HotSplit, HybridFfn, Logits, ModelFile, Precision, SparseFfn,
};
use kernels_neon::WeightFormat;

const TOKENS: &[u32] = &[1, 70, 80, 90, 100, 33, 7, 250, 12, 64, 5, 99];

pub(crate) fn fixture(name: &str) -> ModelFile {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(name);
    ModelFile::open(p).unwrap()
}

/// An exact engine on 2 threads (the accelerator's half and the CPU's run side by side).
pub(crate) fn engine(file: &ModelFile) -> Engine<'_> {
    Engine::new(
        file,
        EngineOptions {
            threads: 2,
            precision: Precision::Exact,
            context: 64,
            ..Default::default()
        },
    )
    .unwrap()
}

fn qnn_f32() -> AccelKind {
    AccelKind::new("qnn", Some("f32"), Some(double()))
}

/// Hot sets of every layer: none, the first 16 neurons, every third one, all.
fn hot_sets(layers: usize, d_ff: usize) -> Vec<Vec<Vec<u32>>> {
    let per = |f: &dyn Fn(u32) -> bool| -> Vec<Vec<u32>> {
        (0..layers)
            .map(|_| (0..d_ff as u32).filter(|&j| f(j)).collect())
            .collect()
    };
    vec![
        per(&|_| false),
        per(&|j| j < 16),
        per(&|j| j % 3 == 1),
        per(&|_| true),
    ]
}

fn hybrid(eng: &Engine<'_>, sparse: SparseFfn, kind: &AccelKind, hot: &[Vec<u32>]) -> HybridFfn {
    let accel = open(
        kind,
        engine::accel::blocks_for_model(eng.model(), Some(hot)),
    )
    .unwrap();
    HybridFfn::new(sparse, accel, eng.model(), &HotSplit::fixed(hot.to_vec())).unwrap()
}

#[test]
fn a_split_per_batch_size_runs_each_steps_share_and_is_the_dense_ffn() {
    let file = fixture("tiny-llama-silu-q4_0.gguf");
    let mut eng = engine(&file);
    let cfg = eng.model().config.clone();
    let dense: Vec<Vec<f32>> = [false, true].map(|b| logits(&eng, TOKENS, b)).to_vec();
    // Every third neuron first, then the rest; 16 of them at batch size 1, up to all at 8.
    let order: Vec<u32> = (0..cfg.d_ff as u32)
        .filter(|j| j % 3 == 0)
        .chain((0..cfg.d_ff as u32).filter(|j| j % 3 != 0))
        .collect();
    let split = HotSplit {
        order: vec![order; cfg.n_layers],
        counts: vec![[16, 40, 64, cfg.d_ff]; cfg.n_layers],
    };
    for kind in [qnn_f32(), AccelKind::cpu()] {
        let sp = SparseFfn::new(eng.model(), vec![0.0; cfg.n_layers], WeightFormat::F32).unwrap();
        let accel = HybridFfn::open_blocks(&kind, eng.model(), &split).unwrap();
        let h = HybridFfn::new(sp, accel, eng.model(), &split).unwrap();
        assert_eq!(
            (h.hot_count(0, 1), h.hot_count(0, 5), h.hot_count(0, 12)),
            (16, 64, cfg.d_ff)
        );
        eng.set_hybrid(Some(h));
        let tol = if kind == AccelKind::cpu() { 2e-2 } else { 1e-4 };
        for (batched, want) in [false, true].into_iter().zip(&dense) {
            let d = rel_drift(&logits(&eng, TOKENS, batched), want);
            assert!(d < tol, "{kind:?}, batched={batched}: drift {d}");
        }
        let h = eng.hybrid().unwrap();
        assert_eq!(h.failure(), None);
        // Decode steps (batch size 1): in memory without a predictor the CPU computed every gate
        // row (whole-matrix products) and the down columns of every neuron but the first 16 of
        // the block.
        let st = h.sparse().stats();
        let cold = (cfg.d_ff - 16) as f64 / cfg.d_ff as f64;
        assert!(
            st.gate_frac() == 1.0 && (st.down_frac() - cold).abs() < 1e-9,
            "{kind:?}: gate share {}, down share {} for a cold share {cold}",
            st.gate_frac(),
            st.down_frac()
        );
        eng.set_hybrid(None);
    }
    // Counts that shrink with the batch size, or pass the block, are refused.
    for counts in [[40, 16, 64, 64], [16, 40, 64, cfg.d_ff + 1]] {
        let bad = HotSplit {
            order: split.order.clone(),
            counts: vec![counts; cfg.n_layers],
        };
        let sp = SparseFfn::new(eng.model(), vec![0.0; cfg.n_layers], WeightFormat::F32).unwrap();
        let accel = HybridFfn::open_blocks(&AccelKind::cpu(), eng.model(), &bad).unwrap();
        let e = HybridFfn::new(sp, accel, eng.model(), &bad)
            .err()
            .expect("refused");
        assert!(e.to_string().contains("hot counts"), "{e}");
    }
}

#[test]
fn with_nothing_skipped_hybrid_decode_is_the_dense_ffn() {
    for name in [
        "tiny-llama-silu-q4_0.gguf",
        "tiny-llama-relu-q8_0.gguf",
        "tiny-qwen2-q4_1.gguf",
        "tiny-llama-f16.gguf",
    ] {
        let file = fixture(name);
        let mut eng = engine(&file);
        let cfg = eng.model().config.clone();
        let dense: Vec<Vec<f32>> = [false, true].map(|b| logits(&eng, TOKENS, b)).to_vec();
        for hot in hot_sets(cfg.n_layers, cfg.d_ff) {
            for (kind, tol) in [(qnn_f32(), 1e-4), (AccelKind::cpu(), 2e-2)] {
                // F32 down rows and zero thresholds: the sparse part computes every cold neuron.
                let sp = SparseFfn::new(eng.model(), vec![0.0; cfg.n_layers], WeightFormat::F32)
                    .unwrap();
                let h = hybrid(&eng, sp, &kind, &hot);
                eng.set_hybrid(Some(h));
                for (batched, want) in [false, true].into_iter().zip(&dense) {
                    let got = logits(&eng, TOKENS, batched);
                    let d = rel_drift(&got, want);
                    assert!(
                        d < tol,
                        "{name} {} hot, {kind:?}, batched={batched}: drift {d}",
                        hot[0].len()
                    );
                }
                let h = eng.hybrid().unwrap();
                assert_eq!(h.failure(), None);
                // Decode steps: in memory without a predictor the sparse part computed every
                // gate row while at least half the neurons are cold (else the cold rows alone),
                // and only cold neurons' down columns (the firing ones: a ReLU gate below zero
                // does not fire even at a zero threshold).
                let st = h.sparse().stats();
                let cold = (cfg.d_ff - hot[0].len()) as f64 / cfg.d_ff as f64;
                let gate = if cold >= 0.5 { 1.0 } else { cold };
                assert!(
                    (st.gate_frac() - gate).abs() < 1e-9 && st.down_frac() <= cold + 1e-9,
                    "{name}: gate share {}, down share {} for a cold share {cold}",
                    st.gate_frac(),
                    st.down_frac()
                );
                eng.set_hybrid(None);
            }
        }
    }
}

#[test]
fn with_no_hot_neuron_hybrid_decode_is_the_sparse_ffn() {
    let file = fixture("tiny-llama-silu-q4_0.gguf");
    let mut eng = engine(&file);
    let cfg = eng.model().config.clone();
    // Thresholds that skip a good share of the neurons.
    let sparse = |eng: &Engine<'_>| {
        SparseFfn::new(
            eng.model(),
            vec![0.02; cfg.n_layers],
            engine::sparse::DEFAULT_DOWN_FORMAT,
        )
        .unwrap()
    };
    eng.set_sparse(Some(sparse(&eng)));
    let want = logits(&eng, TOKENS, false);
    let skipped = 1.0 - eng.sparse().unwrap().stats().down_frac();
    assert!(
        skipped > 0.1,
        "the thresholds skip {skipped} of the neurons"
    );
    eng.set_sparse(None);
    let none = vec![Vec::new(); cfg.n_layers];
    let h = hybrid(&eng, sparse(&eng), &qnn_f32(), &none);
    eng.set_hybrid(Some(h));
    let got = logits(&eng, TOKENS, false);
    let d = rel_drift(&got, &want);
    assert!(d < 1e-6, "drift {d}");
    // And with hot neurons the result moves (they are computed although the thresholds skip some).
    let hot: Vec<Vec<u32>> = (0..cfg.n_layers)
        .map(|_| (0..cfg.d_ff as u32 / 2).collect())
        .collect();
    let h = hybrid(&eng, sparse(&eng), &qnn_f32(), &hot);
    eng.set_hybrid(Some(h));
    let moved = logits(&eng, TOKENS, false);
    assert!(rel_drift(&moved, &want) > 1e-5);
}

#[test]
fn a_failing_accelerator_leaves_the_sparse_ffn_and_names_the_step() {
    let file = fixture("tiny-qwen2-q4_1.gguf");
    let eng = engine(&file);
    let cfg = eng.model().config.clone();
    let control = qnn_double::Control::open(&double()).unwrap();
    let make = || SparseFfn::new(eng.model(), vec![0.01; cfg.n_layers], WeightFormat::F32).unwrap();
    let step = |exec: &dyn engine::FfnExecutor| {
        let mut cache = eng.new_cache();
        forward_with(
            eng.model(),
            &mut cache,
            &TOKENS[..5],
            Precision::Exact,
            Logits::All,
            FfnMode {
                exec: Some(exec),
                ..Default::default()
            },
        )
        .unwrap()
    };
    let sparse = make();
    let want = step(&sparse);
    let hot: Vec<Vec<u32>> = (0..cfg.n_layers).map(|_| (0..32).collect()).collect();
    let h = hybrid(&eng, make(), &qnn_f32(), &hot);
    // Graphs are built and run on first use, on a thread of the engine's (QNN runs beside the
    // cores): the double takes the faults of the thread that created the graphs' context, this one.
    control.set_fail(Some("graphExecute"));
    let got = eng.install(|| step(&h));
    control.set_fail(None);
    let f = h.failure().expect("the failure is kept");
    assert!(f.contains("graphExecute"), "{f}");
    let d = rel_drift(&got, &want);
    assert!(
        d < 1e-6,
        "after the failure the CPU computed the sparse FFN: drift {d}"
    );
}

/// A backend that runs the CPU stand-in's blocks and records whether each call ran on a thread of
/// the engine's compute pool, declaring itself beside the cores or not.
struct Recording {
    inner: Box<dyn engine::Accelerator>,
    beside: bool,
    /// Calls on a pool thread, and outside the pool.
    calls: Arc<[AtomicUsize; 2]>,
}

impl engine::Accelerator for Recording {
    fn name(&self) -> &str {
        "recording"
    }

    fn ffn(
        &self,
        layer: usize,
        neurons: usize,
        x: &[f32],
        n: usize,
        out: &mut [f32],
    ) -> Result<(), engine::accel::AccelError> {
        let outside = rayon::current_thread_index().is_none();
        self.calls[usize::from(outside)].fetch_add(1, Ordering::Relaxed);
        self.inner.ffn(layer, neurons, x, n, out)
    }

    fn block_neurons(&self, layer: usize) -> usize {
        self.inner.block_neurons(layer)
    }

    fn beside_cores(&self) -> bool {
        self.beside
    }

    fn block_bytes(&self, neurons: usize, d_model: usize, format: WeightFormat) -> u64 {
        self.inner.block_bytes(neurons, d_model, format)
    }

    fn ffn_rows(
        &self,
        rows: &engine::accel::StreamedRows<'_>,
        x: &[f32],
        n: usize,
        out: &mut [f32],
    ) -> Result<(), engine::accel::AccelError> {
        self.inner.ffn_rows(rows, x, n, out)
    }

    fn streamed_bytes(&self, neurons: usize, d_model: usize) -> u64 {
        self.inner.streamed_bytes(neurons, d_model)
    }
}

/// An accelerator beside the cores (an NPU: its calls only wait) is called from a thread outside
/// the compute pool, so that every pool thread takes the CPU's part; one that computes on the
/// pool's threads (the CPU stand-in) runs there. Either way the step is the same.
#[test]
fn an_accelerator_beside_the_cores_waits_outside_the_compute_pool() {
    let file = fixture("tiny-llama-silu-q4_0.gguf");
    let mut eng = engine(&file);
    let cfg = eng.model().config.clone();
    let hot: Vec<Vec<u32>> = (0..cfg.n_layers)
        .map(|_| (0..cfg.d_ff as u32 / 4).collect())
        .collect();
    let mut got = Vec::new();
    for beside in [false, true] {
        let calls: Arc<[AtomicUsize; 2]> = Arc::default();
        let rec = Recording {
            inner: open(
                &AccelKind::cpu(),
                engine::accel::blocks_for_model(eng.model(), Some(&hot)),
            )
            .unwrap(),
            beside,
            calls: calls.clone(),
        };
        let sp = SparseFfn::new(eng.model(), vec![0.0; cfg.n_layers], WeightFormat::F32).unwrap();
        let h = HybridFfn::new(
            sp,
            Box::new(rec),
            eng.model(),
            &HotSplit::fixed(hot.clone()),
        )
        .unwrap();
        eng.set_hybrid(Some(h));
        got.push(logits(&eng, TOKENS, false));
        let h = eng.hybrid().unwrap();
        assert_eq!(h.failure(), None);
        let (inside, outside) = (
            calls[0].load(Ordering::Relaxed),
            calls[1].load(Ordering::Relaxed),
        );
        if beside {
            assert!(
                inside == 0 && outside > 0,
                "{inside} in the pool, {outside} outside"
            );
        } else {
            assert!(
                inside > 0 && outside == 0,
                "{inside} in the pool, {outside} outside"
            );
        }
        eng.set_hybrid(None);
    }
    assert_eq!(got[0], got[1]);
}
