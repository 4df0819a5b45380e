//! `cargo xtask synth-model` (xtask/src/synth.rs) on small models: the planted power law shows in the gate
//! pre-activations computed from the file's own (dequantized) weights, the engine loads the file and its
//! forward pass is as sparse, the bytes depend only on the options, and bad options are refused.
//! Never the full-size model (4.0 GB) except in an ignored test, by hand.

use crate::src::synth;

use std::path::{Path, PathBuf};

use model_format::{DType, GgufFile, MetaValue};
use synth::Options;

/// A scratch directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("sparrow-synth-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn small(alpha: f64, seed: u64) -> Options {
    Options {
        out: None,
        layers: 4,
        d: 128,
        ff: 512,
        heads: 4,
        kv_heads: 2,
        vocab: 300,
        format: DType::Q4_0,
        q4_k_m: false,
        alpha,
        seed,
        arch: synth::SynthArch::Llama,
        head_dim: None,
    }
}

fn write(o: &Options, dir: &TempDir) -> PathBuf {
    let p = dir
        .0
        .join(format!("{}-a{}-s{}.gguf", o.file_name(), o.alpha, o.seed));
    let mut layers = Vec::new();
    synth::write_model(o, &p, |l, _| layers.push(l)).unwrap();
    assert_eq!(
        layers,
        (0..o.layers).collect::<Vec<_>>(),
        "one progress call per layer"
    );
    p
}

/// A tensor of the file, dequantized by the engine's kernels: (rows, cols, row-major values).
fn matrix(f: &GgufFile, name: &str) -> (usize, usize, Vec<f32>) {
    let t = f
        .tensor(name)
        .unwrap_or_else(|| panic!("{name} is missing"));
    let fmt = t.dtype;
    assert!(
        matches!(fmt, DType::F32 | DType::Q4_0 | DType::Q8_0),
        "{name}: unexpected type {fmt}"
    );
    let (rows, cols) = (t.rows(), t.cols());
    let rb = fmt.row_bytes(cols).unwrap();
    let mut out = vec![0.0f32; rows * cols];
    for (r, dst) in out.chunks_mut(cols).enumerate() {
        kernels_neon::dequantize_row(fmt, &t.data[r * rb..(r + 1) * rb], dst).unwrap();
    }
    (rows, cols, out)
}

fn matvec(w: &[f32], x: &[f64]) -> Vec<f64> {
    w.chunks(x.len())
        .map(|row| row.iter().zip(x).map(|(&a, b)| a as f64 * b).sum())
        .collect()
}

fn rms_norm(x: &[f64], w: &[f32]) -> Vec<f64> {
    let r = 1.0
        / (x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64 + synth::RMS_EPS as f64).sqrt();
    x.iter().zip(w).map(|(a, &b)| a * r * b as f64).collect()
}

/// How often each neuron of each layer fired, over `inputs` inputs.
struct Counts {
    inputs: usize,
    per_layer: Vec<Vec<u64>>,
}

impl Counts {
    /// Fraction of positive gate pre-activations in `layer` (all layers: `None`).
    fn density(&self, layer: Option<usize>) -> f64 {
        let layers: Vec<&Vec<u64>> = match layer {
            Some(l) => vec![&self.per_layer[l]],
            None => self.per_layer.iter().collect(),
        };
        let fired: u64 = layers.iter().map(|c| c.iter().sum::<u64>()).sum();
        fired as f64 / (self.inputs * layers.len() * layers[0].len()) as f64
    }

    /// Share of the activations of `layer` that its most frequent `frac` of neurons account for.
    fn top_share(&self, layer: usize, frac: f64) -> f64 {
        let mut c = self.per_layer[layer].clone();
        c.sort_unstable_by(|a, b| b.cmp(a));
        let k = (c.len() as f64 * frac).round() as usize;
        c[..k].iter().sum::<u64>() as f64 / c.iter().sum::<u64>().max(1) as f64
    }

    /// Mean over neurons of |measured firing frequency − planted propensity|.
    fn mean_abs_error(&self, layer: usize, planted: &[f64]) -> f64 {
        let c = &self.per_layer[layer];
        c.iter()
            .zip(planted)
            .map(|(&n, p)| (n as f64 / self.inputs as f64 - p).abs())
            .sum::<f64>()
            / c.len() as f64
    }
}

/// Runs every token of the vocabulary alone (position 0, where attention returns the token's own value
/// vector) through the model in f64 from the file's dequantized weights, counting, in every layer, the
/// neurons whose gate pre-activation (after the RMSNorm of the residual stream) is positive.
fn single_token_counts(path: &Path, o: &Options) -> Counts {
    let f = GgufFile::open(path).unwrap();
    let (d, hd) = (o.d, o.d / o.heads);
    let group = o.heads / o.kv_heads;
    let (vocab, _, emb) = matrix(&f, "token_embd.weight");
    assert_eq!(vocab, o.vocab);
    let layers: Vec<_> = (0..o.layers)
        .map(|l| {
            let m = |t: &str| matrix(&f, &format!("blk.{l}.{t}.weight")).2;
            (
                m("attn_norm"),
                m("attn_v"),
                m("attn_output"),
                m("ffn_norm"),
                m("ffn_gate"),
                m("ffn_up"),
                m("ffn_down"),
            )
        })
        .collect();
    let mut per_layer = vec![vec![0u64; o.ff]; o.layers];
    for t in 0..vocab {
        let mut x: Vec<f64> = emb[t * d..(t + 1) * d].iter().map(|&v| v as f64).collect();
        for (l, (attn_norm, wv, wo, ffn_norm, gate, up, down)) in layers.iter().enumerate() {
            let v = matvec(wv, &rms_norm(&x, attn_norm));
            let att: Vec<f64> = (0..o.heads)
                .flat_map(|h| v[(h / group) * hd..(h / group + 1) * hd].to_vec())
                .collect();
            x.iter_mut()
                .zip(matvec(wo, &att))
                .for_each(|(a, b)| *a += b);
            let xn = rms_norm(&x, ffn_norm);
            let g = matvec(gate, &xn);
            let u = matvec(up, &xn);
            for (c, &gj) in per_layer[l].iter_mut().zip(&g) {
                *c += u64::from(gj > 0.0);
            }
            let h: Vec<f64> = g.iter().zip(&u).map(|(g, u)| g.max(0.0) * u).collect();
            x.iter_mut()
                .zip(matvec(down, &h))
                .for_each(|(a, b)| *a += b);
        }
    }
    Counts {
        inputs: vocab,
        per_layer,
    }
}

#[test]
fn planted_power_law_shows_in_the_gate_preactivations() {
    let dir = TempDir::new("law");
    let o = small(1.0, 7);
    let counts = single_token_counts(&write(&o, &dir), &o);
    let overall = counts.density(None);
    eprintln!(
        "alpha 1: {} inputs, overall density {overall:.4}",
        counts.inputs
    );
    // (a) About 10% of gate pre-activations are positive (90% sparsity), in every layer.
    assert!(
        (0.07..=0.13).contains(&overall),
        "overall density {overall:.4} is outside 0.07..=0.13"
    );
    for l in 0..o.layers {
        let (dens, top, err) = (
            counts.density(Some(l)),
            counts.top_share(l, 0.2),
            counts.mean_abs_error(l, &synth::propensities(&o, l)),
        );
        eprintln!("alpha 1: layer {l}: density {dens:.4}, top-20% share {top:.3}, mean |freq - planted| {err:.4}");
        assert!(
            (0.07..=0.13).contains(&dens),
            "layer {l}: density {dens:.4} is outside 0.07..=0.13"
        );
        // (b) Power law: the 20% most frequent neurons carry at least 60% of the activations.
        assert!(
            top >= 0.60,
            "layer {l}: the top 20% of neurons carry {top:.3} of the activations, under 0.60"
        );
        // And the neurons that fire are the planted ones, about as often as planted (300 inputs: a
        // frequency's standard error is up to 0.029).
        assert!(
            err <= 0.03,
            "layer {l}: measured frequencies are {err:.4} from the planted propensities on average"
        );
    }
}

#[test]
fn alpha_sets_the_concentration() {
    let dir = TempDir::new("alpha");
    let shares: Vec<f64> = [0.0, 1.5]
        .into_iter()
        .map(|alpha| {
            let o = small(alpha, 7);
            let counts = single_token_counts(&write(&o, &dir), &o);
            let share =
                (0..o.layers).map(|l| counts.top_share(l, 0.2)).sum::<f64>() / o.layers as f64;
            eprintln!(
                "alpha {alpha}: overall density {:.4}, mean top-20% share {share:.3}",
                counts.density(None)
            );
            assert!(
                (0.07..=0.13).contains(&counts.density(None)),
                "alpha {alpha}: density {:.4}",
                counts.density(None)
            );
            share
        })
        .collect();
    // alpha 0 plants no law: every neuron fires 10% of the time, so the top 20% carry little more than 20%
    // (sampling noise); alpha 1.5 concentrates more than alpha 1 (about 0.66).
    assert!(shares[0] < 0.35, "alpha 0: top-20% share {:.3}", shares[0]);
    assert!(
        shares[1] > 0.72,
        "alpha 1.5: top-20% share {:.3}",
        shares[1]
    );
}

#[test]
fn zipf_propensities_have_the_planted_mean_and_order() {
    for (ff, alpha) in [(512, 1.0), (14336, 1.0), (512, 0.0), (4096, 2.5)] {
        let p = synth::zipf_propensities(ff, alpha);
        let mean = p.iter().sum::<f64>() / ff as f64;
        assert!(
            (mean - synth::DENSITY).abs() < 1e-6,
            "ff {ff} alpha {alpha}: mean {mean}"
        );
        assert!(
            p.windows(2).all(|w| w[0] >= w[1]),
            "ff {ff} alpha {alpha}: not decreasing"
        );
        assert!(p
            .iter()
            .all(|&x| (synth::P_MIN..=synth::P_MAX).contains(&x)));
    }
    // The planted law alone (before any sampling) at the default alpha: about 66% in the top 20%.
    let p = synth::zipf_propensities(14336, 1.0);
    let share = p[..14336 / 5].iter().sum::<f64>() / p.iter().sum::<f64>();
    assert!((0.62..0.70).contains(&share), "{share}");
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[test]
fn same_options_same_bytes() {
    let (a, b) = (TempDir::new("det-a"), TempDir::new("det-b"));
    let o = Options {
        layers: 2,
        ..small(1.0, 42)
    };
    let h1 = fnv1a(&std::fs::read(write(&o, &a)).unwrap());
    let h2 = fnv1a(&std::fs::read(write(&o, &b)).unwrap());
    assert_eq!(h1, h2, "two runs with the same options differ");
    let other = fnv1a(
        &std::fs::read(write(
            &Options {
                seed: 43,
                ..o.clone()
            },
            &a,
        ))
        .unwrap(),
    );
    assert_ne!(h1, other, "the seed changes nothing");
    let q8 = fnv1a(
        &std::fs::read(write(
            &Options {
                format: DType::Q8_0,
                ..o
            },
            &a,
        ))
        .unwrap(),
    );
    assert_ne!(h1, q8);
}

#[test]
fn the_file_is_labelled_synthetic_and_shaped_as_asked() {
    let dir = TempDir::new("meta");
    let o = Options {
        layers: 2,
        vocab: 333,
        format: DType::Q8_0,
        ..small(1.25, 0xABCD)
    };
    let path = write(&o, &dir);
    let f = GgufFile::open(&path).unwrap();
    let s = |k: &str| f.get(k).and_then(|v| v.as_str()).map(str::to_string);
    assert_eq!(s("general.name").as_deref(), Some(synth::GENERAL_NAME));
    assert!(
        synth::GENERAL_NAME.starts_with("SYNTHETIC")
            && synth::GENERAL_NAME.contains("not a language model")
    );
    assert_eq!(f.get("sparrow.synthetic"), Some(&MetaValue::Bool(true)));
    assert_eq!(f.get("sparrow.synth.alpha"), Some(&MetaValue::F32(1.25)));
    assert_eq!(f.get("sparrow.synth.seed"), Some(&MetaValue::U64(0xABCD)));
    assert_eq!(s("sparrow.ffn_activation").as_deref(), Some("relu"));
    assert_eq!(s("general.architecture").as_deref(), Some("llama"));
    assert_eq!(
        f.get("tokenizer.ggml.tokens")
            .and_then(|v| v.as_array())
            .map(|a| a.len()),
        Some(333)
    );
    assert_eq!(f.tensor("token_embd.weight").unwrap().shape, &[333, 128]);
    assert_eq!(
        f.tensor("blk.1.ffn_down.weight").unwrap().shape,
        &[128, 512]
    );
    assert_eq!(f.tensor("blk.1.attn_k.weight").unwrap().shape, &[64, 128]);
    assert_eq!(
        f.tensor("blk.0.ffn_gate.weight").unwrap().dtype,
        DType::Q8_0
    );
    assert_eq!(f.tensor("blk.0.ffn_norm.weight").unwrap().dtype, DType::F32);
    assert!(f.tensor("output.weight").is_none(), "the output is tied");
    assert_eq!(f.tensor_infos().len(), 2 + 2 * 9);
    // The size estimate printed before writing is the data's size.
    let data: u64 = f.tensors().map(|t| t.data.len() as u64).sum();
    assert_eq!(data, o.data_bytes());
}

/// `--format q4_k_m`: llama.cpp's Q4_K_M choice per tensor (Q6_K for the tied embedding and for
/// `attn_v`/`ffn_down` of the layers `use_more_bits` picks, Q4_K elsewhere, Q5_0/Q8_0 for rows that are
/// not whole super-blocks), a size estimate that matches, and a file the engine runs.
#[test]
fn the_q4_k_m_mix_is_llama_cpps() {
    let dir = TempDir::new("q4km");
    let o = Options {
        layers: 8,
        d: 256,
        ff: 640, // not a multiple of 256: ffn_down falls back
        heads: 4,
        kv_heads: 2,
        format: DType::Q4_K,
        q4_k_m: true,
        ..small(1.0, 3)
    };
    assert!(o.file_name().ends_with("-q4_k_m.gguf"), "{}", o.file_name());
    let path = write(&o, &dir);
    let f = GgufFile::open(&path).unwrap();
    let ty = |n: &str| f.tensor(n).unwrap().dtype;
    assert_eq!(ty("token_embd.weight"), DType::Q6_K);
    // use_more_bits(i, 8): layers 0 and 7 (first and last eighth) and 3, 6 ((i - 1) % 3 == 2).
    for l in 0..8 {
        let more = [0, 3, 6, 7].contains(&l);
        let v = ty(&format!("blk.{l}.attn_v.weight"));
        assert_eq!(
            v,
            if more { DType::Q6_K } else { DType::Q4_K },
            "layer {l} attn_v"
        );
        let down = ty(&format!("blk.{l}.ffn_down.weight"));
        assert_eq!(
            down,
            if more { DType::Q8_0 } else { DType::Q5_0 },
            "layer {l} ffn_down (640 wide)"
        );
        for m in ["attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up"] {
            assert_eq!(
                ty(&format!("blk.{l}.{m}.weight")),
                DType::Q4_K,
                "layer {l} {m}"
            );
        }
    }
    let data: u64 = f.tensors().map(|t| t.data.len() as u64).sum();
    assert_eq!(data, o.data_bytes());
    // The engine runs it, and the planted sparsity survives the K-quants.
    let density = engine_counts(&path, 2, 16).density(None);
    assert!((0.05..0.2).contains(&density), "density {density}");
}

/// Runs `windows` windows of `len` random tokens through the engine (dense FFN, observed), counting how
/// often each neuron's `relu(gate·x)` is positive.
fn engine_counts(path: &Path, windows: usize, len: usize) -> Counts {
    let file = engine::ModelFile::open(path).unwrap();
    let eng = engine::Engine::new(
        &file,
        engine::EngineOptions {
            threads: 2,
            ..Default::default()
        },
    )
    .unwrap();
    let cfg = &eng.model().config;
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % cfg.vocab_size as u64) as u32
    };
    let mut per_layer = vec![vec![0u64; cfg.d_ff]; cfg.n_layers];
    for _ in 0..windows {
        let tokens: Vec<u32> = (0..len).map(|_| next()).collect();
        let mut cache = eng.new_cache();
        let logits = eng
            .forward_observed(
                &mut cache,
                &tokens,
                engine::Logits::Last,
                &mut |s: engine::FfnSample<'_>| {
                    for row in s.act_gate.chunks(s.act_gate.len() / s.n) {
                        for (c, &a) in per_layer[s.layer].iter_mut().zip(row) {
                            *c += u64::from(a > 0.0);
                        }
                    }
                },
            )
            .unwrap();
        assert!(logits.iter().all(|x| x.is_finite()));
    }
    Counts {
        inputs: windows * len,
        per_layer,
    }
}

#[test]
fn the_engine_loads_it_and_its_forward_pass_is_as_sparse() {
    let dir = TempDir::new("engine");
    let o = small(1.0, 9);
    let path = write(&o, &dir);
    let file = engine::ModelFile::open(&path).unwrap();
    let cfg = file.config().unwrap();
    assert_eq!(cfg.activation, engine::Activation::Relu);
    assert_eq!(
        (
            cfg.n_layers,
            cfg.d_model,
            cfg.d_ff,
            cfg.n_heads,
            cfg.n_kv_heads,
            cfg.vocab_size
        ),
        (4, 128, 512, 4, 2, 300)
    );
    let eng = engine::Engine::new(
        &file,
        engine::EngineOptions {
            threads: 2,
            ..Default::default()
        },
    )
    .unwrap();
    let ids = eng.tokenizer().encode("synthetic!", false).unwrap();
    assert_eq!(eng.tokenizer().decode(&ids, false).unwrap(), "synthetic!");

    // Windows of random tokens: attention now mixes positions.
    let (windows, len) = (8, 48);
    let counts = engine_counts(&path, windows, len);
    for l in 0..o.layers {
        let (dens, top) = (counts.density(Some(l)), counts.top_share(l, 0.2));
        eprintln!(
            "engine, {windows}x{len} tokens: layer {l}: density {dens:.4}, top-20% share {top:.3}"
        );
        assert!(
            (0.06..=0.13).contains(&dens),
            "layer {l}: density {dens:.4} is outside 0.06..=0.13"
        );
        assert!(
            top >= 0.60,
            "layer {l}: the top 20% of neurons carry {top:.3} of the activations, under 0.60"
        );
    }
}

/// By hand, after `cargo xtask synth-model` (4.0 GB, never in CI): the engine loads the full-size file and
/// its forward pass over 64 tokens has the planted density in every layer. `SPARROW_SYNTH_MODEL` names
/// another file.
#[test]
#[ignore = "needs the full-size model: run `cargo xtask synth-model` first"]
fn full_size_model_runs_in_the_engine_with_the_planted_density() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let path = std::env::var_os("SPARROW_SYNTH_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| Options::default().out_path(root));
    assert!(
        path.exists(),
        "{} does not exist: run `cargo xtask synth-model` first",
        path.display()
    );
    let (windows, len) = (2, 32);
    let t0 = std::time::Instant::now();
    let counts = engine_counts(&path, windows, len);
    eprintln!(
        "{}: {windows}x{len} tokens in {:.1} s",
        path.display(),
        t0.elapsed().as_secs_f64()
    );
    for (l, _) in counts.per_layer.iter().enumerate() {
        let (dens, top) = (counts.density(Some(l)), counts.top_share(l, 0.2));
        eprintln!("layer {l}: density {dens:.4}, top-20% share {top:.3}");
        assert!(
            (0.06..=0.13).contains(&dens),
            "layer {l}: density {dens:.4} is outside 0.06..=0.13"
        );
    }
    eprintln!("all layers: density {:.4}", counts.density(None));
}

#[test]
fn bad_options_are_refused_with_the_reason() {
    let args = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();
    let ok = Options::parse(&args("--layers 2 --d=256 --ff 512 --heads 8 --kv-heads 2 --vocab 1000 --format Q8_0 --alpha 0.5 --seed 0x10 --out /x/y.gguf")).unwrap();
    assert_eq!(
        ok,
        Options {
            out: Some("/x/y.gguf".into()),
            layers: 2,
            d: 256,
            ff: 512,
            heads: 8,
            kv_heads: 2,
            vocab: 1000,
            format: DType::Q8_0,
            q4_k_m: false,
            alpha: 0.5,
            seed: 16,
            arch: synth::SynthArch::Llama,
            head_dim: None,
        }
    );
    assert_eq!(Options::parse(&[]).unwrap(), Options::default());
    assert_eq!(
        Options::default().file_name(),
        "synth-32x4096x14336-q4_0.gguf"
    );
    assert_eq!(
        Options::default().out_path(Path::new("/r")),
        Path::new("/r/target/synth/synth-32x4096x14336-q4_0.gguf")
    );
    for (bad, why) in [
        ("--layers 0", "--layers"),
        ("--layers two", "whole number"),
        ("--d 100", "multiple of 32"),
        ("--ff 0", "--ff"),
        ("--heads 5", "--heads must divide"),
        ("--d 96 --heads 32", "even"),
        ("--kv-heads 3", "--kv-heads"),
        ("--vocab 100", "--vocab"),
        ("--format q4_1", "q4_0, q8_0, q4_k_m or f16"),
        ("--alpha -1", "--alpha"),
        ("--alpha nan", "--alpha"),
        ("--seed -3", "--seed"),
        ("--seed", "needs a value"),
        ("--frobnicate 1", "unknown option"),
        ("stray", "unknown option"),
    ] {
        let e = Options::parse(&args(bad)).expect_err(bad).to_string();
        assert!(
            e.contains(why),
            "`{bad}` gave `{e}`, which does not say `{why}`"
        );
    }
}

/// Relative drift: the largest difference over the largest magnitude of `b`.
fn rel_drift(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let m = b.iter().fold(0f32, |m, v| m.max(v.abs()));
    a.iter().zip(b).fold(0f32, |d, (x, y)| d.max((x - y).abs())) / m
}

/// Two-phase loading (PowerInfer-2 §4.4) needs bundles larger than a page: at d = 2560 a bundle (two
/// Q4_0 rows and a Q8_0 down row) spans two pages with the gate rows in the first. With nothing cached,
/// a ReLU neuron whose gate output is zero costs only its first page, and decode computes exactly what
/// in-memory sparse decode computes, with two phases or without; a damaged first page is an error.
#[test]
fn two_phase_loading_reads_gate_pages_alone_and_computes_the_same() {
    use engine::offload::{convert, store_path_for, ConvertOptions, OffloadOptions};
    use engine::{Engine, EngineOptions, Logits, ModelFile, Precision, SparseFfn};
    use predictor::{ActivationKind, LayerProfile, Profile, ScoreKind};

    let dir = TempDir::new("two-phase");
    let o = Options {
        layers: 2,
        d: 2560,
        ff: 256,
        heads: 8,
        kv_heads: 4,
        ..small(1.0, 3)
    };
    let path = write(&o, &dir);
    let file = ModelFile::open(&path).unwrap();
    let opts = EngineOptions {
        threads: 2,
        precision: Precision::Exact,
        context: 32,
        ..Default::default()
    };
    let tokens = [1u32, 70, 80, 90, 100, 33, 7, 250];
    let run = |eng: &Engine<'_>| -> Vec<f32> {
        let mut cache = eng.new_cache();
        tokens
            .iter()
            .flat_map(|&t| eng.forward(&mut cache, &[t], Logits::Last).unwrap())
            .collect()
    };
    // In memory: sparse decode with zero thresholds (ReLU zeros skipped).
    let mut eng = Engine::new(&file, opts.clone()).unwrap();
    let n = o.layers;
    let down = engine::sparse::DEFAULT_DOWN_FORMAT;
    eng.set_sparse(Some(
        SparseFfn::new(eng.model(), vec![0.0; n], down).unwrap(),
    ));
    let want = run(&eng);
    let profile = Profile {
        model: "synthetic".into(),
        model_fingerprint: engine::profile::model_fingerprint(eng.model()),
        corpus: "none".into(),
        tokens: 0,
        activation: ActivationKind::Relu,
        score: ScoreKind::OutputNorm,
        batch_sizes: vec![1],
        layers: (0..n)
            .map(|_| LayerProfile {
                n_neurons: o.ff as u32,
                threshold: 0.0,
                freq: vec![(0..o.ff).map(|i| 1.0 / (1 + i) as f32).collect()],
                mean_abs: vec![0.0; o.ff],
                max_abs: vec![0.0; o.ff],
                coact_gate_up: vec![1.0; o.ff],
                coact_gate_down: vec![1.0; o.ff],
            })
            .collect(),
    };
    drop(eng);
    let resident = dir.0.join("two-phase.resident.gguf");
    convert(
        &file,
        &profile,
        &resident,
        &ConvertOptions::default(),
        |_, _| {},
    )
    .unwrap();
    let rfile = ModelFile::open(&resident).unwrap();
    let cfg = rfile.config().unwrap();
    let store = store_path_for(&resident);
    let offloaded = |two_phase: bool| {
        let mut eng = Engine::new(&rfile, opts.clone()).unwrap();
        let oo = OffloadOptions {
            ffn_budget: 0,
            hot_share: 0.0,
            two_phase,
            ..Default::default()
        };
        eng.set_sparse(Some(
            SparseFfn::from_store(&cfg, &store, vec![0.0; n], oo).unwrap(),
        ));
        let got = run(&eng);
        let st = eng.sparse().unwrap().offload().unwrap().stats();
        (got, st)
    };
    let unit = 8192u64;
    let (whole, st) = offloaded(false);
    assert!(
        rel_drift(&whole, &want) < 1e-5,
        "one-phase reads: drift {}",
        rel_drift(&whole, &want)
    );
    assert_eq!(
        st.misses,
        (tokens.len() * n * o.ff) as u64,
        "no predictor, nothing cached: {st:?}"
    );
    assert_eq!(
        (st.rest_skipped, st.bytes_read),
        (0, st.misses * unit),
        "{st:?}"
    );
    let (split, st) = offloaded(true);
    assert!(
        rel_drift(&split, &want) < 1e-5,
        "two-phase reads: drift {}",
        rel_drift(&split, &want)
    );
    // About 90% of the neurons are ReLU zeros: their units cost one page.
    let read = (st.misses - st.rest_skipped) * unit + st.rest_skipped * 4096;
    assert_eq!(st.bytes_read, read, "{st:?}");
    assert!(
        st.rest_skipped * 10 >= st.misses * 7,
        "most units end after their gate page: {st:?}"
    );
    assert!(st.rest_skipped < st.misses, "some neurons fire: {st:?}");
    eprintln!(
        "two-phase: {} of {} missed units read their gate page only; {:.1} vs {:.1} MiB",
        st.rest_skipped,
        st.misses,
        st.bytes_read as f64 / (1 << 20) as f64,
        (st.misses * unit) as f64 / (1 << 20) as f64
    );

    // A damaged first page of a unit: its own check fails (two-phase reads check it alone).
    let mut bytes = std::fs::read(&store).unwrap();
    let first_unit = bytes.len() - (n * o.ff) * unit as usize;
    bytes[first_unit + 100] ^= 0x55;
    std::fs::write(&store, &bytes).unwrap();
    let mut eng = Engine::new(&rfile, opts.clone()).unwrap();
    let oo = OffloadOptions {
        ffn_budget: 0,
        hot_share: 0.0,
        two_phase: true,
        ..Default::default()
    };
    eng.set_sparse(Some(
        SparseFfn::from_store(&cfg, &store, vec![0.0; n], oo).unwrap(),
    ));
    let mut cache = eng.new_cache();
    let err = eng
        .forward(&mut cache, &[1], Logits::Last)
        .unwrap_err()
        .to_string();
    assert!(err.contains("checksum") && err.contains("unit 0"), "{err}");
}
