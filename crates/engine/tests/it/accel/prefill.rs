//! (A module of the `accel` test binary: one link for both.)
//!
//! NPU-centric prefill over a neuron store (`Offload::set_prompt_accel`): a prompt step streams each
//! layer's FFN from flash in chunks and hands every chunk to the accelerator (QNN through the test
//! double, its weights as graph inputs; or the CPU backend), dense. With zero thresholds and no
//! predictor the CPU's streamed prompt is dense too, so both must give its logits, for every chunk
//! shape (chunks of 7 and 40 neurons, the hot/cold boundary's shorter one) and layer type (SiLU,
//! ReLU, Qwen2 biases). A QNN call that fails mid-prompt is kept as the failure and that chunk and
//! every later one run on the CPU, with the same result.

use std::path::{Path, PathBuf};

use super::common::{convert_fixture, logits, rel_drift};
use super::double;
use super::hybrid::engine;
use engine::accel::{open, AccelKind, QnnWeights};
use engine::offload::{store_path_for, ConvertOptions, OffloadOptions};
use engine::{Engine, ModelFile, SparseFfn};

/// 13 tokens: QNN graphs of 8, 4 and 1 tokens.
const TOKENS: &[u32] = &[1, 70, 80, 90, 100, 33, 7, 250, 12, 64, 5, 99, 41];

/// The fixture `name` converted to a resident file and a neuron store in a folder of its own for
/// the tests tagged `tag` (tests running at once never write the same files).
pub(crate) fn converted_in(tag: &str, name: &str) -> PathBuf {
    let dir =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    convert_fixture(name, &dir, &ConvertOptions::default()).0
}

fn converted(name: &str) -> PathBuf {
    converted_in("accel-prefill", name)
}

/// An engine over the store (half of it hot, chunks of `neurons`), zero thresholds, prompt steps
/// on `accel` when given.
fn store_engine<'a>(
    resident: &'a ModelFile,
    path: &Path,
    neurons: usize,
    accel: Option<&AccelKind>,
) -> Engine<'a> {
    let mut eng = engine(resident);
    let cfg = eng.model().config.clone();
    let ffn = std::fs::metadata(store_path_for(path)).unwrap().len() as usize;
    let mut sp = SparseFfn::from_store(
        &cfg,
        &store_path_for(path),
        vec![0.0; cfg.n_layers],
        OffloadOptions {
            ffn_budget: ffn / 2,
            hot_share: 1.0,
            cluster_units: 2,
            prefill_neurons: neurons,
            ..Default::default()
        },
    )
    .unwrap();
    if let Some(kind) = accel {
        let a = open(kind, std::iter::empty()).unwrap();
        sp.offload_mut().unwrap().set_prompt_accel(Some(a));
    }
    eng.set_sparse(Some(sp));
    eng
}

fn qnn_f32() -> AccelKind {
    AccelKind::new("qnn", Some("f32"), Some(double()))
}

#[test]
fn streamed_prompt_steps_on_an_accelerator_compute_the_dense_ffn() {
    for name in [
        "tiny-llama-silu-q4_0.gguf",
        "tiny-llama-relu-q8_0.gguf",
        "tiny-qwen2-q4_1.gguf",
    ] {
        let path = converted(name);
        let resident = ModelFile::open(&path).unwrap();
        let want = logits(&store_engine(&resident, &path, 40, None), TOKENS, true);
        // f32 sums in another order (QNN's; other chunk bounds) and, below 32 tokens, the CPU's
        // 16-bit activations (its short `Fast` prompts run decode's products) where QNN's f32
        // graph has none: a few 1e-5 of the largest logit.
        for kind in [qnn_f32(), AccelKind::cpu()] {
            for neurons in [7, 40] {
                let eng = store_engine(&resident, &path, neurons, Some(&kind));
                let got = logits(&eng, TOKENS, true);
                let off = eng.sparse().unwrap().offload().unwrap();
                assert_eq!(off.prompt_accel().unwrap().name(), kind.name());
                assert_eq!(off.prompt_accel_failure(), None, "{name}");
                let d = rel_drift(&got, &want);
                assert!(
                    d < 1e-4,
                    "{name} on {} in chunks of {neurons}: drift {d}",
                    kind.name()
                );
            }
        }
    }
}

#[test]
fn a_failing_qnn_call_mid_prompt_leaves_the_rest_to_the_cpu() {
    let name = "tiny-llama-silu-q4_0.gguf";
    let path = converted(name);
    let resident = ModelFile::open(&path).unwrap();
    let want = logits(&store_engine(&resident, &path, 40, None), TOKENS, true);
    let control = qnn_double::Control::open(&double()).unwrap();
    let eng = store_engine(&resident, &path, 40, Some(&qnn_f32()));
    // The double's faults are per thread: the prompt runs on the engine's thread that sets them.
    let got = eng.install(|| {
        control.set_fail(Some("graphExecute"));
        let got = logits(&eng, TOKENS, true);
        control.set_fail(None);
        got
    });
    let off = eng.sparse().unwrap().offload().unwrap();
    let f = off.prompt_accel_failure().expect("the failure is kept");
    assert!(f.contains("graphExecute"), "{f}");
    let d = rel_drift(&got, &want);
    assert!(d < 1e-6, "the CPU computed every chunk: drift {d}");
    // Later prompts stay on the CPU (no call fails any more, the result is the CPU's).
    let again = logits(&eng, TOKENS, true);
    assert!(rel_drift(&again, &want) < 1e-6);
}

/// `ffn_rows` alone, on a chunk of 40 neurons of width 64 in `Q8_0` (gate, up) and `Q5_0` (down):
/// QNN (through the double, f32 graph inputs) gives what the CPU backend gives for 13 tokens, with
/// one graph per batch run (8, 4, 1) reused by the next chunk of the same shape; rows of another
/// width than the chunk's are a named error.
#[test]
fn streamed_rows_on_qnn_equal_the_cpu_backend() {
    use engine::accel::{Accelerator, CpuAccelerator, QnnAccelerator, StreamedRows};
    use kernels_neon::{QMatrix, WeightFormat};
    let (k, d, n) = (40usize, 64usize, 13usize);
    let values = |salt: usize, len: usize| -> Vec<f32> {
        (0..len)
            .map(|i| (((i * 7919 + salt * 104_729) % 2003) as f32 / 2003.0 - 0.5) * 0.2)
            .collect()
    };
    let q = |f: WeightFormat, v: &[f32]| kernels_neon::quantize_matrix(f, v, k, d).unwrap();
    let qnn = QnnAccelerator::new(Some(&double()), std::iter::empty(), QnnWeights::F32).unwrap();
    let cpu = CpuAccelerator::new(std::iter::empty()).unwrap();
    let x = values(9, n * d);
    for salt in [1, 2] {
        let (g, u, dn) = (
            q(WeightFormat::Q8_0, &values(salt, k * d)),
            q(WeightFormat::Q8_0, &values(salt + 10, k * d)),
            q(WeightFormat::Q5_0, &values(salt + 20, k * d)),
        );
        let rows = StreamedRows {
            gate: QMatrix::new(WeightFormat::Q8_0, k, d, &g).unwrap(),
            up: QMatrix::new(WeightFormat::Q8_0, k, d, &u).unwrap(),
            down: QMatrix::new(WeightFormat::Q5_0, k, d, &dn).unwrap(),
            activation: engine::Activation::Silu,
        };
        let (mut a, mut b) = (vec![f32::NAN; n * d], vec![f32::NAN; n * d]);
        qnn.ffn_rows(&rows, &x, n, &mut a).unwrap();
        cpu.ffn_rows(&rows, &x, n, &mut b).unwrap();
        // The CPU's 13 tokens take 16-bit activations (decode's products), QNN's graph f32.
        let drift = rel_drift(&a, &b);
        assert!(drift < 1e-4, "chunk {salt}: drift {drift}");
        assert!(b.iter().any(|v| v.abs() > 1e-4), "degenerate test data");
        assert_eq!(
            qnn.streamed_graphs(),
            3,
            "graphs of 8, 4 and 1 tokens, reused"
        );
        let mut short = vec![0f32; n * (d - 32)];
        let e = qnn
            .ffn_rows(&rows, &x[..n * (d - 32)], n, &mut short)
            .unwrap_err();
        assert!(e.to_string().contains("streamed rows"), "{e}");
    }
}
