//! `cargo xtask synth-model --arch mixtral --activation relu` (xtask/src/synth_relu.rs): the experts'
//! neurons fire with the planted density and power law, and the engine runs the experts as ReLU.

use crate::src::{synth_moe, synth_relu};

use std::path::{Path, PathBuf};

use engine::moe::{ExpertNeurons, NeuronTrace};
use engine::Precision;
use engine::{Engine, EngineOptions, Logits, ModelFile};
use kernels_neon::Activation;
use model_format::{DType, GgufFile, MetaValue};
use synth_moe::{Arch, Options};

fn small(relu: bool) -> Options {
    Options {
        layers: 2,
        d: 256,
        expert_ff: 512,
        heads: 4,
        kv_heads: 2,
        head_dim: 64,
        vocab: 258 + 1790,
        experts: 4,
        used: 2,
        format: DType::Q8_0,
        relu,
        ..Options::defaults(Arch::Mixtral)
    }
}

fn temp(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "sparrow-synth-relu-{tag}-{}.gguf",
        std::process::id()
    ))
}

/// A tensor's values, dequantized, row after row (3-D tensors: the rows of every expert in turn).
fn values(f: &GgufFile, name: &str) -> (usize, Vec<f32>) {
    let t = f.tensor(name).unwrap();
    let cols = t.shape[t.shape.len() - 1];
    let rb = t.dtype.row_bytes(cols).unwrap();
    let rows = t.data.len() / rb;
    let mut out = vec![0.0f32; rows * cols];
    for (r, dst) in out.chunks_mut(cols).enumerate() {
        kernels_neon::dequantize_row(t.dtype, &t.data[r * rb..(r + 1) * rb], dst).unwrap();
    }
    (cols, out)
}

/// Layer 0's FFN input is the token's embedding plus attention's output, which lies on the context
/// channel only, where the ReLU gate rows are zero; the norm scales it by a positive factor. So
/// whether neuron `j` of expert `e` fires on token `t` is the sign of `gate_{e,j} · embed_t`,
/// exactly as the engine computes it, for every token of the vocabulary.
#[test]
fn planted_neuron_sparsity_shows_in_every_experts_gate_preactivations() {
    let o = small(true);
    let path = temp("density");
    synth_moe::write_model(&o, &path, |_, _| {}).unwrap();
    let f = GgufFile::open(&path).unwrap();
    let act = f.get("sparrow.ffn_activation").and_then(MetaValue::as_str);
    assert_eq!(act, Some("relu"));
    let (d, embed) = values(&f, "token_embd.weight");
    let (_, gate) = values(&f, "blk.0.ffn_gate_exps.weight");
    let tokens = embed.len() / d;
    let ff = o.expert_ff;
    for e in 0..o.experts {
        let mut counts = vec![0u64; ff];
        for x in embed.chunks(d) {
            for (j, c) in counts.iter_mut().enumerate() {
                let row = &gate[(e * ff + j) * d..(e * ff + j + 1) * d];
                let dot: f64 = row.iter().zip(x).map(|(&a, &b)| a as f64 * b as f64).sum();
                *c += u64::from(dot > 0.0);
            }
        }
        let total: u64 = counts.iter().sum();
        let density = total as f64 / (tokens * ff) as f64;
        assert!(
            (0.07..0.13).contains(&density),
            "expert {e}: density {density} (planted {})",
            synth_relu::DENSITY
        );
        counts.sort_unstable_by(|a, b| b.cmp(a));
        let top: u64 = counts[..ff / 5].iter().sum();
        let share = top as f64 / total as f64;
        assert!(share > 0.55, "expert {e}: top 20% carry {share}");
    }
    drop(f);
    let _ = std::fs::remove_file(&path);
}

/// The engine reads `sparrow.ffn_activation` for the experts too, and a ReLU file runs.
#[test]
fn the_engine_runs_relu_experts_as_relu() {
    for relu in [false, true] {
        let o = small(relu);
        let path = temp(if relu { "relu" } else { "silu" });
        synth_moe::write_model(&o, &path, |_, _| {}).unwrap();
        assert_eq!(o.file_name().contains("-relu-"), relu);
        let file = ModelFile::open(&path).unwrap();
        let eng = Engine::new(&file, EngineOptions::default()).unwrap();
        let want = if relu {
            Activation::Relu
        } else {
            Activation::Silu
        };
        for l in &eng.model().layers {
            assert_eq!(l.ffn.moe().unwrap().block.activation, want);
        }
        let mut cache = eng.new_cache();
        let logits = eng
            .forward(&mut cache, &[1, 2, 3, 4], Logits::Last)
            .unwrap();
        assert!(logits.iter().all(|x| x.is_finite()));
        drop(eng);
        drop(file);
        let _ = std::fs::remove_file(&path);
    }
}

#[test]
fn relu_is_refused_where_it_is_not_planted() {
    let args: Vec<String> = ["--arch", "qwen2moe", "--activation", "relu"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let err = Options::parse(&args).unwrap_err().to_string();
    assert!(err.contains("shared expert"), "{err}");
    let bad: Vec<String> = ["--arch", "mixtral", "--activation", "gelu"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert!(Options::parse(&bad).is_err());
}

/// Per layer, per expert: what the engine's MoE blocks counted over `windows` windows of `len`
/// random tokens (in memory, exact precision).
fn engine_neurons(path: &Path, windows: usize, len: usize) -> Vec<Vec<ExpertNeurons>> {
    let file = ModelFile::open(path).unwrap();
    let eng = Engine::new(
        &file,
        EngineOptions {
            threads: 2,
            precision: Precision::Exact,
            ..Default::default()
        },
    )
    .unwrap();
    let vocab = eng.model().config.vocab_size as u64;
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let trace = NeuronTrace::start();
    for _ in 0..windows {
        let tokens: Vec<u32> = (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x % vocab) as u32
            })
            .collect();
        let mut cache = eng.new_cache();
        eng.forward(&mut cache, &tokens, Logits::Last).unwrap();
    }
    eng.model()
        .layers
        .iter()
        .map(|l| {
            let moe = l.ffn.moe().unwrap();
            let gates = moe.weights.experts.iter().map(|e| e.gate.data().as_ptr());
            gates.map(|g| trace.of(g).unwrap_or_default()).collect()
        })
        .collect()
}

/// Every layer of the engine's forward pass (not only layer 0, whose input the test above
/// computes from the file) activates about the planted 10% of each selected expert's neurons,
/// concentrated by the power law; SiLU experts are dense.
#[test]
fn the_engine_realises_the_planted_sparsity_in_every_layer() {
    for relu in [true, false] {
        let o = Options {
            layers: 4,
            ..small(relu)
        };
        let path = temp(if relu { "layers-relu" } else { "layers-silu" });
        synth_moe::write_model(&o, &path, |_, _| {}).unwrap();
        let counts = engine_neurons(&path, 4, 64);
        let _ = std::fs::remove_file(&path);
        for (l, layer) in counts.iter().enumerate() {
            let tokens: u64 = layer.iter().map(|e| e.tokens).sum();
            assert_eq!(
                tokens,
                4 * 64 * o.used as u64,
                "layer {l}: top-2 of 256 tokens"
            );
            for (e, c) in layer.iter().enumerate().filter(|(_, c)| c.tokens >= 32) {
                let (density, top) = (c.density(), c.top_share(0.2));
                if relu {
                    assert!(
                        (0.06..0.15).contains(&density) && top > 0.5,
                        "layer {l} expert {e}: density {density}, top 20% carry {top}"
                    );
                } else {
                    assert!(density > 0.99, "SiLU layer {l} expert {e}: {density}");
                }
            }
        }
    }
}
