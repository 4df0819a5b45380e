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

/// Bytes read per token from flash under a cache of `cache` bytes, for a model whose experts'
/// active neurons `counts` measured (per layer, per expert), experts of `expert_bytes`, `used` per
/// token, neurons read one unit of `unit` bytes each (`neuron-store`: a bundle of gate row, up row
/// and down column, rounded up to whole pages when over one). Returns (whole experts: the most
/// selected pinned, every other selected expert read whole; neurons: the neurons of highest
/// expected activations per token pinned, every other active neuron of a selected expert read).
/// Both are steady-state expectations with a static cache (no recency), not Belady bounds.
fn bytes_model(
    counts: &[Vec<ExpertNeurons>],
    used: usize,
    expert_bytes: u64,
    unit: u64,
    cache: u64,
) -> (f64, f64) {
    // Whole experts: expected selections per token of each (layer, expert), most first.
    let mut experts: Vec<f64> = Vec::new();
    let mut neurons: Vec<f64> = Vec::new();
    for layer in counts {
        let tokens: u64 = layer.iter().map(|e| e.tokens).sum();
        for e in layer {
            // Selections per token (summing to `used` over a layer's experts).
            let sel = e.tokens as f64 / tokens.max(1) as f64 * used as f64;
            experts.push(sel);
            let t = e.tokens.max(1) as f64;
            neurons.extend(e.active.iter().map(|&a| sel * a as f64 / t));
        }
    }
    let whole = |v: &mut Vec<f64>, each: u64| {
        v.sort_by(|a, b| b.total_cmp(a));
        let pinned = (cache / each) as usize;
        v.iter().skip(pinned).sum::<f64>() * each as f64
    };
    (whole(&mut experts, expert_bytes), whole(&mut neurons, unit))
}

/// The Mixtral-8x7B-width ReLU synthetic: `SPARROW_RELU_MOE=FILE` (`cargo xtask synth-model --arch
/// mixtral --activation relu --layers 4`); prints each layer's realised density and the bytes per
/// token of whole-expert and neuron-level offload at the budgets of 25% and 50% caps.
#[test]
#[ignore = "needs SPARROW_RELU_MOE=FILE, a Mixtral-width ReLU synthetic (3.2 GB with 4 layers)"]
fn full_width_relu_mixtral_density_and_bytes() {
    let path = PathBuf::from(std::env::var("SPARROW_RELU_MOE").expect("SPARROW_RELU_MOE"));
    let counts = engine_neurons(&path, 2, 32);
    for (l, layer) in counts.iter().enumerate() {
        let d: Vec<String> = layer
            .iter()
            .map(|e| format!("{:.3}/{:.2}", e.density(), e.top_share(0.2)))
            .collect();
        println!(
            "layer {l}: per expert density/top-20% share {}",
            d.join(" ")
        );
    }
    let f = GgufFile::open(&path).unwrap();
    let file_bytes = std::fs::metadata(&path).unwrap().len();
    let part = |n: &str| f.tensor(n).unwrap().data.len() as u64;
    let (e, ff) = (counts[0].len() as u64, counts[0][0].active.len() as u64);
    let expert_bytes = ["gate", "up", "down"]
        .iter()
        .map(|p| part(&format!("blk.0.ffn_{p}_exps.weight")))
        .sum::<u64>()
        / e;
    let all_experts = expert_bytes * e * counts.len() as u64;
    let d = f.tensor("token_embd.weight").unwrap().shape[1] as u64;
    // A neuron's gate and up rows as stored, and its down column transposed into Q4_0 or Q8_0
    // (`transformer::transpose`'s default), its unit rounded up to whole pages when over one.
    let gate_up = 2 * part("blk.0.ffn_gate_exps.weight") / e / ff;
    println!("file {file_bytes} B, experts {all_experts} B, expert {expert_bytes} B");
    for (down_t, col) in [("q4_0", d / 32 * 18), ("q8_0", d / 32 * 34)] {
        let bundle = gate_up + col;
        let unit = if bundle > 4096 {
            bundle.next_multiple_of(4096)
        } else {
            bundle
        };
        for cap in [0.25, 0.5] {
            let budget = (file_bytes as f64 * cap * 0.9) as u64;
            let cache = budget.saturating_sub(file_bytes - all_experts);
            let (whole, neuron) = bytes_model(&counts, 2, expert_bytes, unit, cache);
            println!(
                "down_t {down_t} (bundle {bundle} B, unit {unit} B), cap {cap}: budget {budget} B, expert cache {cache} B: \
                 whole experts {:.1} MB/token, active neurons {:.1} MB/token ({:.1}x fewer)",
                whole / 1e6,
                neuron / 1e6,
                whole / neuron.max(1.0)
            );
        }
    }
}
