//! ReLU experts converted neuron-major with a neuron profile (`convert_moe_with`, what `sparrow
//! convert --expert-recall R` does): each expert's read is its hot prefix (fewer bytes than the
//! whole expert), and the executor computes exactly the prefix's neurons: its logits equal those of
//! the in-memory model whose other neurons are switched off (gate rows zeroed, so their ReLU never
//! fires). The profile's recall on other text is measured too.

use std::path::{Path, PathBuf};

use engine::moe::NeuronTrace;
use engine::offload::{
    convert_moe_with, ConvertOptions, ExpertOffload, ExpertOffloadOptions, ReluExperts,
};
use engine::{Engine, EngineOptions, Logits, ModelFile, Precision};
use model_format::{DType, GgufFile};

use super::moe_reference::ci_options;
use crate::src::synth_moe::{self, Arch};

struct TempDir(PathBuf);
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn argmax(row: &[f32]) -> u32 {
    (0..row.len()).fold(0, |b, i| if row[i] > row[b] { i } else { b }) as u32
}

/// Prompt logits (every position) and `steps` greedy decode steps' logits.
fn run(eng: &Engine<'_>, prompt: &[u32], steps: usize) -> Vec<Vec<f32>> {
    let mut cache = eng.new_cache();
    let mut out = vec![eng.forward(&mut cache, prompt, Logits::All).unwrap()];
    let vocab = out[0].len() / prompt.len();
    let mut next = argmax(&out[0][out[0].len() - vocab..]);
    for _ in 0..steps {
        let l = eng.forward(&mut cache, &[next], Logits::Last).unwrap();
        next = argmax(&l);
        out.push(l);
    }
    out
}

/// A copy of the F16 model at `src` with every neuron of every expert that `keep(l, e)` does not
/// list switched off: its gate row zeroed.
fn masked(src: &Path, dst: &Path, ff: usize, keep: impl Fn(usize, usize) -> Vec<u32>) {
    let g = GgufFile::open(src).unwrap();
    let mut bytes = std::fs::read(src).unwrap();
    for info in g.tensor_infos() {
        let Some(l) = info
            .name
            .strip_prefix("blk.")
            .and_then(|r| r.strip_suffix(".ffn_gate_exps.weight"))
        else {
            continue;
        };
        let l: usize = l.parse().unwrap();
        assert_eq!(info.dtype, DType::F16);
        let (experts, d) = (info.shape[0], info.shape[2]);
        assert_eq!(info.shape[1], ff);
        let row = d * 2;
        let base = info.offset as usize;
        assert_eq!(info.n_bytes as usize, experts * ff * row);
        for e in 0..experts {
            let mut on = vec![false; ff];
            keep(l, e).iter().for_each(|&j| on[j as usize] = true);
            for j in (0..ff).filter(|&j| !on[j]) {
                let at = base + (e * ff + j) * row;
                bytes[at..at + row].fill(0);
            }
        }
    }
    std::fs::write(dst, bytes).unwrap();
}

#[test]
fn relu_experts_compute_exactly_their_hot_prefix() {
    let o = synth_moe::Options {
        relu: true,
        format: DType::F16,
        ..ci_options(Arch::Mixtral)
    };
    let dir = std::env::temp_dir().join(format!("sparrow-relu-experts-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let _gone = TempDir(dir.clone());
    let path = dir.join("m.gguf");
    synth_moe::write_model(&o, &path, |_, _| {}).unwrap();
    let file = ModelFile::open(&path).unwrap();
    let opts = EngineOptions {
        threads: 2,
        precision: Precision::Exact,
        context: 256,
        ..Default::default()
    };
    let mem = Engine::new(&file, opts.clone()).unwrap();
    let tok = |s: &str| mem.tokenizer().encode(s, false).unwrap();
    let calib = tok(&"Calibration text, not the evaluation text: the routers and the neurons of every expert are counted here. ".repeat(4));
    let (routing, neurons) = engine::measure_routing_neurons(&mem, &calib, 64).unwrap();
    assert_eq!(neurons.experts.len(), o.layers);
    let resident = dir.join("m.resident.gguf");
    let relu = ReluExperts {
        profile: Some(&neurons),
        recall: 0.7,
    };
    let r = convert_moe_with(
        &file,
        &routing,
        &relu,
        &resident,
        &ConvertOptions::default(),
        |_, _| {},
    )
    .unwrap();
    assert!(r.neuron_major);

    let rfile = ModelFile::open(&resident).unwrap();
    let mut eng = Engine::new(&rfile, opts.clone()).unwrap();
    let x = ExpertOffload::open(
        &r.store,
        &r.experts,
        None,
        ExpertOffloadOptions {
            cache_bytes: 0,
            ..ExpertOffloadOptions::default()
        },
    )
    .unwrap();
    let ff = o.expert_ff;
    let mut computed = vec![vec![Vec::new(); o.experts]; o.layers];
    for (l, row) in computed.iter_mut().enumerate() {
        for (e, c) in row.iter_mut().enumerate() {
            *c = x
                .computed_neurons(l, e)
                .expect("ReLU experts from a neuron store");
            assert!(!c.is_empty() && c.len() <= ff);
        }
        assert!(
            x.blob_bytes(l) < r.blob_bytes[l],
            "layer {l}: a read of {} bytes, the whole expert is {}",
            x.blob_bytes(l),
            r.blob_bytes[l]
        );
    }
    let some_left_out = computed.iter().flatten().any(|c| c.len() < ff);
    assert!(some_left_out, "recall 0.7 leaves neurons out");
    // The planner prices what the run reads: each layer's mean prefix, not a whole expert (it
    // opened this neuron store as an expert store and failed before).
    let summary = engine::planning::model_summary(&eng, &Default::default()).unwrap();
    assert_eq!(summary.layers.len(), o.layers);
    for (l, layer) in summary.layers.iter().enumerate() {
        assert_eq!(layer.read_bytes, x.blob_bytes(l) as u64, "layer {l}");
        assert!(layer.read_bytes < r.blob_bytes[l] as u64, "layer {l}");
        let parts = layer.gate_up_bytes + layer.down_bytes;
        eprintln!(
            "layer {l}: read {} bytes, of which bundles {parts}",
            layer.read_bytes
        );
        assert!(
            parts <= layer.read_bytes && parts * 2 >= layer.read_bytes,
            "layer {l}"
        );
    }
    eng.set_experts(Some(x));

    let prompt = tok("The evaluation prompt: a different sentence with other words in it.");
    // Recall of the computed neurons on the evaluation prompt (in memory, every neuron counted).
    let trace = NeuronTrace::start();
    let exact = run(&mem, &prompt, 4);
    let (mut hit, mut all) = (0u64, 0u64);
    for (l, layer) in mem.model().layers.iter().enumerate() {
        let w = &layer.ffn.moe().unwrap().weights;
        for (e, ex) in w.experts.iter().enumerate() {
            let Some(n) = trace.of(ex.gate.data().as_ptr()) else {
                continue;
            };
            all += n.active.iter().sum::<u64>();
            hit += computed[l][e]
                .iter()
                .map(|&j| n.active[j as usize])
                .sum::<u64>();
        }
    }
    drop(trace);
    let recall = hit as f64 / all.max(1) as f64;
    eprintln!("recall of the computed neurons on other text: {recall:.3}");
    assert!(recall > 0.4 && recall < 1.0, "recall {recall}");

    let got = run(&eng, &prompt, 4);
    let c = eng.experts().unwrap().counters();
    assert!(c.reads > 0 && c.bytes_read < c.reads * r.blob_bytes[0] as u64);

    let masked_path = dir.join("masked.gguf");
    masked(&path, &masked_path, ff, |l, e| computed[l][e].clone());
    let mfile = ModelFile::open(&masked_path).unwrap();
    let reference = Engine::new(&mfile, opts).unwrap();
    let want = run(&reference, &prompt, 4);
    let diff = |a: &[Vec<f32>], b: &[Vec<f32>]| {
        a.iter()
            .zip(b)
            .flat_map(|(a, b)| a.iter().zip(b).map(|(x, y)| (x - y).abs()))
            .fold(0.0f32, f32::max)
    };
    // The same greedy path and the same logits as the model with only the prefix's neurons...
    assert!(
        diff(&want, &got) <= 1e-4,
        "differs by {}",
        diff(&want, &got)
    );
    // ...which is not the full model's.
    assert!(diff(&exact, &got) > 1e-3, "{}", diff(&exact, &got));
}
