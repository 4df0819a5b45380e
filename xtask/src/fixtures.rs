//! Test fixtures: tiny synthetic models, written deterministically as GGUF files into `fixtures/`.
//!
//! `cargo xtask fixtures` (re)writes them; `xtask/tests/it/fixtures.rs` checks that the committed files
//! are what this code writes. The engine's `tests/it/tiny_models.rs` runs them against a naive f64
//! forward pass. Weights are random (clearly synthetic: `general.name` says so).

use std::path::{Path, PathBuf};

use model_format::{DType, GgufWriter, MetaValue};

/// Hidden size of the tiny models.
pub const D: usize = 64;
/// Query heads.
pub const HEADS: usize = 4;
/// Key/value heads.
pub const KV_HEADS: usize = 2;
/// Head dimension.
pub const HD: usize = D / HEADS;
/// FFN neurons per layer.
pub const FF: usize = 96;
/// Layers.
pub const LAYERS: usize = 2;
/// RMSNorm epsilon.
pub const EPS: f64 = 1e-5;
/// RoPE base.
pub const BASE: f64 = 10_000.0;

/// Deterministic pseudo-random numbers in [-1, 1).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    }
}

/// GPT-2's byte-to-unicode table: the 256 base tokens of a byte-level BPE vocabulary.
pub fn byte_tokens() -> Vec<String> {
    let mut bs: Vec<u32> = (b'!' as u32..=b'~' as u32)
        .chain(0xA1..=0xAC)
        .chain(0xAE..=0xFF)
        .collect();
    let mut cs = bs.clone();
    let mut n = 0;
    for b in 0..256u32 {
        if !bs.contains(&b) {
            bs.push(b);
            cs.push(256 + n);
            n += 1;
        }
    }
    let mut out = vec![String::new(); 256];
    for (b, c) in bs.iter().zip(cs) {
        out[*b as usize] = char::from_u32(c).unwrap().to_string();
    }
    out
}

fn f16_bytes(x: f32) -> [u8; 2] {
    half::f16::from_f32(x).to_le_bytes()
}

/// Random weight bytes of `rows × cols` in `dtype`: random quants with small scales.
fn random_weight(rng: &mut Rng, dtype: DType, rows: usize, cols: usize, scale: f32) -> Vec<u8> {
    let n = rows * cols;
    let mut out = Vec::new();
    match dtype {
        DType::F32 => {
            (0..n).for_each(|_| out.extend_from_slice(&((rng.next() as f32) * scale).to_le_bytes()))
        }
        DType::F16 => {
            (0..n).for_each(|_| out.extend_from_slice(&f16_bytes(rng.next() as f32 * scale)))
        }
        DType::Q8_0 => (0..n / 32).for_each(|_| {
            out.extend_from_slice(&f16_bytes(
                scale / 127.0 * (0.5 + 0.5 * rng.next().abs() as f32),
            ));
            (0..32).for_each(|_| out.push((rng.next() * 127.0) as i8 as u8));
        }),
        DType::Q4_0 => (0..n / 32).for_each(|_| {
            out.extend_from_slice(&f16_bytes(
                scale / 8.0 * (0.5 + 0.5 * rng.next().abs() as f32),
            ));
            (0..16).for_each(|_| out.push(((rng.next() + 1.0) * 128.0) as u8));
        }),
        DType::Q4_1 => (0..n / 32).for_each(|_| {
            out.extend_from_slice(&f16_bytes(scale / 8.0));
            out.extend_from_slice(&f16_bytes(-scale * (0.8 + 0.2 * rng.next() as f32)));
            (0..16).for_each(|_| out.push(((rng.next() + 1.0) * 128.0) as u8));
        }),
        other => panic!("no generator for {other:?}"),
    }
    out
}

pub struct Variant {
    pub name: &'static str,
    pub arch: &'static str,
    pub relu: bool,
    pub weights: DType,
    pub embed: DType,
    pub untied: bool,
}

/// The fixture models.
pub const VARIANTS: &[Variant] = &[
    Variant {
        name: "llama-silu-q4_0",
        arch: "llama",
        relu: false,
        weights: DType::Q4_0,
        embed: DType::F16,
        untied: false,
    },
    Variant {
        name: "llama-relu-q8_0",
        arch: "llama",
        relu: true,
        weights: DType::Q8_0,
        embed: DType::Q8_0,
        untied: true,
    },
    Variant {
        name: "qwen2-q4_1",
        arch: "qwen2",
        relu: false,
        weights: DType::Q4_1,
        embed: DType::F32,
        untied: true,
    },
    Variant {
        name: "llama-f16",
        arch: "llama",
        relu: false,
        weights: DType::F16,
        embed: DType::F16,
        untied: false,
    },
];

/// File name of a fixture model.
pub fn file_name(v: &Variant) -> String {
    format!("tiny-{}.gguf", v.name)
}

/// Writes the GGUF of one variant to `path`.
pub fn write_model(v: &Variant, path: &Path) -> Result<(), model_format::FormatError> {
    let seed = 0x5EED ^ v.name.len() as u64;
    let mut rng = Rng(seed);
    let mut tokens = byte_tokens();
    tokens.push("<|im_start|>".into());
    tokens.push("<|im_end|>".into());
    let vocab = tokens.len();
    let mut types = vec![1i32; 256];
    types.extend([3, 3]);
    let mut w = GgufWriter::new();
    let a = v.arch;
    let u32v = |x: usize| MetaValue::U32(x as u32);
    w.metadata("general.architecture", MetaValue::String(a.into()));
    w.metadata(
        "general.name",
        MetaValue::String(format!(
            "sparrow synthetic fixture {} (random weights)",
            v.name
        )),
    );
    w.metadata(&format!("{a}.block_count"), u32v(LAYERS));
    w.metadata(&format!("{a}.embedding_length"), u32v(D));
    w.metadata(&format!("{a}.feed_forward_length"), u32v(FF));
    w.metadata(&format!("{a}.attention.head_count"), u32v(HEADS));
    w.metadata(&format!("{a}.attention.head_count_kv"), u32v(KV_HEADS));
    w.metadata(
        &format!("{a}.attention.layer_norm_rms_epsilon"),
        MetaValue::F32(EPS as f32),
    );
    w.metadata(&format!("{a}.rope.freq_base"), MetaValue::F32(BASE as f32));
    w.metadata(&format!("{a}.context_length"), u32v(128));
    if v.relu {
        w.metadata("sparrow.ffn_activation", MetaValue::String("relu".into()));
    }
    w.metadata("tokenizer.ggml.model", MetaValue::String("gpt2".into()));
    w.metadata("tokenizer.ggml.pre", MetaValue::String("gpt-2".into()));
    w.metadata(
        "tokenizer.ggml.tokens",
        MetaValue::Array(tokens.into_iter().map(MetaValue::String).collect()),
    );
    w.metadata(
        "tokenizer.ggml.token_type",
        MetaValue::Array(types.into_iter().map(MetaValue::I32).collect()),
    );
    w.metadata("tokenizer.ggml.merges", MetaValue::Array(Vec::new()));
    w.metadata("tokenizer.ggml.eos_token_id", MetaValue::U32(257));

    let add = |w: &mut GgufWriter,
               rng: &mut Rng,
               name: String,
               dtype: DType,
               shape: &[usize],
               scale: f32| {
        let (rows, cols) = if shape.len() == 1 {
            (1, shape[0])
        } else {
            (shape[0], shape[1])
        };
        let bytes = if shape.len() == 1 {
            // Norm weights near 1, biases small.
            let vals: Vec<f32> = (0..cols)
                .map(|_| {
                    if name.ends_with("bias") {
                        0.2 * rng.next() as f32
                    } else {
                        1.0 + 0.3 * rng.next() as f32
                    }
                })
                .collect();
            vals.iter().flat_map(|x| x.to_le_bytes()).collect()
        } else {
            random_weight(rng, dtype, rows, cols, scale)
        };
        w.tensor(&name, dtype, shape, bytes)
            .expect("fixture shapes are consistent");
    };
    add(
        &mut w,
        &mut rng,
        "token_embd.weight".into(),
        v.embed,
        &[vocab, D],
        1.0,
    );
    add(
        &mut w,
        &mut rng,
        "output_norm.weight".into(),
        DType::F32,
        &[D],
        0.0,
    );
    if v.untied {
        add(
            &mut w,
            &mut rng,
            "output.weight".into(),
            v.weights,
            &[vocab, D],
            0.5,
        );
    }
    let s = 1.0 / (D as f32).sqrt() * 2.0;
    for l in 0..LAYERS {
        let n = |t: &str| format!("blk.{l}.{t}");
        add(
            &mut w,
            &mut rng,
            n("attn_norm.weight"),
            DType::F32,
            &[D],
            0.0,
        );
        add(&mut w, &mut rng, n("attn_q.weight"), v.weights, &[D, D], s);
        add(
            &mut w,
            &mut rng,
            n("attn_k.weight"),
            v.weights,
            &[KV_HEADS * HD, D],
            s,
        );
        add(
            &mut w,
            &mut rng,
            n("attn_v.weight"),
            v.weights,
            &[KV_HEADS * HD, D],
            s,
        );
        if a == "qwen2" {
            add(&mut w, &mut rng, n("attn_q.bias"), DType::F32, &[D], 0.0);
            add(
                &mut w,
                &mut rng,
                n("attn_k.bias"),
                DType::F32,
                &[KV_HEADS * HD],
                0.0,
            );
            add(
                &mut w,
                &mut rng,
                n("attn_v.bias"),
                DType::F32,
                &[KV_HEADS * HD],
                0.0,
            );
        }
        add(
            &mut w,
            &mut rng,
            n("attn_output.weight"),
            v.weights,
            &[D, D],
            s,
        );
        add(
            &mut w,
            &mut rng,
            n("ffn_norm.weight"),
            DType::F32,
            &[D],
            0.0,
        );
        add(
            &mut w,
            &mut rng,
            n("ffn_gate.weight"),
            v.weights,
            &[FF, D],
            s,
        );
        add(&mut w, &mut rng, n("ffn_up.weight"), v.weights, &[FF, D], s);
        add(
            &mut w,
            &mut rng,
            n("ffn_down.weight"),
            v.weights,
            &[D, FF],
            1.0 / (FF as f32).sqrt() * 2.0,
        );
    }
    w.write(path)
}

/// The Mixture-of-Experts fixture's file name.
pub const MOE_FILE: &str = "tiny-qwen3moe-q8_0.gguf";

/// The Mixture-of-Experts fixture: a 2-layer, 64-wide qwen3moe of 8 experts (32 neurons each, 2
/// per token) in Q8_0, written by `synth_moe` (its measured routing law) for the CLI's tests of a
/// bundle of experts.
pub fn moe_options() -> super::synth_moe::Options {
    use super::synth_moe::{Arch, Options};
    Options {
        layers: 2,
        d: 64,
        expert_ff: 32,
        heads: 2,
        kv_heads: 1,
        head_dim: 32,
        vocab: 258,
        experts: 8,
        used: 2,
        format: DType::Q8_0,
        ..Options::defaults(Arch::Qwen3Moe)
    }
}

/// Writes every fixture into `dir`; returns the paths.
pub fn write_all(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut paths = VARIANTS
        .iter()
        .map(|v| {
            let p = dir.join(file_name(v));
            write_model(v, &p).map(|()| p)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let moe = dir.join(MOE_FILE);
    super::synth_moe::write_model(&moe_options(), &moe, |_, _| {})?;
    paths.push(moe);
    Ok(paths)
}
