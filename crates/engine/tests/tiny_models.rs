//! Small synthetic models, written as GGUF files at test time, run through the engine and compared with a
//! naive f64 forward pass written here from the equations. Covers what the real model does not: ReLU FFNs,
//! Qwen2's q/k/v biases and half-split RoPE, Q4_0/Q8_0/F16 weights, an untied output matrix.

use std::path::PathBuf;

use engine::{Engine, EngineOptions, Logits, ModelFile, Precision};
use kernels_neon::WeightFormat;
use model_format::{DType, GgufWriter, MetaValue};

const D: usize = 64;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HD: usize = D / HEADS;
const FF: usize = 96;
const LAYERS: usize = 2;
const EPS: f64 = 1e-5;
const BASE: f64 = 10_000.0;

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
fn byte_tokens() -> Vec<String> {
    let mut bs: Vec<u32> = (b'!' as u32..=b'~' as u32).chain(0xA1..=0xAC).chain(0xAE..=0xFF).collect();
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
        DType::F32 => (0..n).for_each(|_| out.extend_from_slice(&((rng.next() as f32) * scale).to_le_bytes())),
        DType::F16 => (0..n).for_each(|_| out.extend_from_slice(&f16_bytes(rng.next() as f32 * scale))),
        DType::Q8_0 => (0..n / 32).for_each(|_| {
            out.extend_from_slice(&f16_bytes(scale / 127.0 * (0.5 + 0.5 * rng.next().abs() as f32)));
            (0..32).for_each(|_| out.push((rng.next() * 127.0) as i8 as u8));
        }),
        DType::Q4_0 => (0..n / 32).for_each(|_| {
            out.extend_from_slice(&f16_bytes(scale / 8.0 * (0.5 + 0.5 * rng.next().abs() as f32)));
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

struct Variant {
    name: &'static str,
    arch: &'static str,
    relu: bool,
    weights: DType,
    embed: DType,
    untied: bool,
}

/// A dequantized tensor of the tiny model, by GGUF name.
type Tensors = std::collections::HashMap<String, Vec<f64>>;

fn dequant(dtype: DType, rows: usize, cols: usize, bytes: &[u8]) -> Vec<f64> {
    let fmt: WeightFormat = engine::model::weight_format(dtype).unwrap();
    let rb = fmt.row_bytes(cols).unwrap();
    let mut row = vec![0.0f32; cols];
    let mut out = Vec::with_capacity(rows * cols);
    for r in 0..rows {
        kernels_neon::dequantize_row(fmt, &bytes[r * rb..(r + 1) * rb], &mut row).unwrap();
        out.extend(row.iter().map(|&x| x as f64));
    }
    out
}

fn write_model(v: &Variant, seed: u64) -> (PathBuf, Tensors) {
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
    w.metadata(&format!("{a}.block_count"), u32v(LAYERS));
    w.metadata(&format!("{a}.embedding_length"), u32v(D));
    w.metadata(&format!("{a}.feed_forward_length"), u32v(FF));
    w.metadata(&format!("{a}.attention.head_count"), u32v(HEADS));
    w.metadata(&format!("{a}.attention.head_count_kv"), u32v(KV_HEADS));
    w.metadata(&format!("{a}.attention.layer_norm_rms_epsilon"), MetaValue::F32(EPS as f32));
    w.metadata(&format!("{a}.rope.freq_base"), MetaValue::F32(BASE as f32));
    w.metadata(&format!("{a}.context_length"), u32v(128));
    if v.relu {
        w.metadata("sparrow.ffn_activation", MetaValue::String("relu".into()));
    }
    w.metadata("tokenizer.ggml.model", MetaValue::String("gpt2".into()));
    w.metadata("tokenizer.ggml.pre", MetaValue::String("gpt-2".into()));
    w.metadata("tokenizer.ggml.tokens", MetaValue::Array(tokens.into_iter().map(MetaValue::String).collect()));
    w.metadata("tokenizer.ggml.token_type", MetaValue::Array(types.into_iter().map(MetaValue::I32).collect()));
    w.metadata("tokenizer.ggml.merges", MetaValue::Array(Vec::new()));
    w.metadata("tokenizer.ggml.eos_token_id", MetaValue::U32(257));

    let mut tensors = Tensors::new();
    let mut add = |w: &mut GgufWriter, rng: &mut Rng, name: String, dtype: DType, shape: &[usize], scale: f32| {
        let (rows, cols) = if shape.len() == 1 { (1, shape[0]) } else { (shape[0], shape[1]) };
        let bytes = if shape.len() == 1 {
            // Norm weights near 1, biases small.
            let vals: Vec<f32> = (0..cols).map(|_| if name.ends_with("bias") { 0.2 * rng.next() as f32 } else { 1.0 + 0.3 * rng.next() as f32 }).collect();
            vals.iter().flat_map(|x| x.to_le_bytes()).collect()
        } else {
            random_weight(rng, dtype, rows, cols, scale)
        };
        tensors.insert(name.clone(), dequant(dtype, rows, cols, &bytes));
        w.tensor(&name, dtype, shape, bytes).unwrap();
    };
    add(&mut w, &mut rng, "token_embd.weight".into(), v.embed, &[vocab, D], 1.0);
    add(&mut w, &mut rng, "output_norm.weight".into(), DType::F32, &[D], 0.0);
    if v.untied {
        add(&mut w, &mut rng, "output.weight".into(), v.weights, &[vocab, D], 0.5);
    }
    let s = 1.0 / (D as f32).sqrt() * 2.0;
    for l in 0..LAYERS {
        let n = |t: &str| format!("blk.{l}.{t}");
        add(&mut w, &mut rng, n("attn_norm.weight"), DType::F32, &[D], 0.0);
        add(&mut w, &mut rng, n("attn_q.weight"), v.weights, &[D, D], s);
        add(&mut w, &mut rng, n("attn_k.weight"), v.weights, &[KV_HEADS * HD, D], s);
        add(&mut w, &mut rng, n("attn_v.weight"), v.weights, &[KV_HEADS * HD, D], s);
        if a == "qwen2" {
            add(&mut w, &mut rng, n("attn_q.bias"), DType::F32, &[D], 0.0);
            add(&mut w, &mut rng, n("attn_k.bias"), DType::F32, &[KV_HEADS * HD], 0.0);
            add(&mut w, &mut rng, n("attn_v.bias"), DType::F32, &[KV_HEADS * HD], 0.0);
        }
        add(&mut w, &mut rng, n("attn_output.weight"), v.weights, &[D, D], s);
        add(&mut w, &mut rng, n("ffn_norm.weight"), DType::F32, &[D], 0.0);
        add(&mut w, &mut rng, n("ffn_gate.weight"), v.weights, &[FF, D], s);
        add(&mut w, &mut rng, n("ffn_up.weight"), v.weights, &[FF, D], s);
        add(&mut w, &mut rng, n("ffn_down.weight"), v.weights, &[D, FF], 1.0 / (FF as f32).sqrt() * 2.0);
    }
    let path = std::env::temp_dir().join(format!("sparrow-tiny-{}-{}.gguf", v.name, std::process::id()));
    w.write(&path).unwrap();
    (path, tensors)
}

fn matvec(w: &[f64], x: &[f64]) -> Vec<f64> {
    w.chunks(x.len()).map(|r| r.iter().zip(x).map(|(a, b)| a * b).sum()).collect()
}

fn rms_norm(x: &[f64], w: &[f64]) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let r = 1.0 / (ms + EPS).sqrt();
    x.iter().zip(w).map(|(a, b)| a * r * b).collect()
}

/// RoPE on one head: interleaved pairs (2i, 2i+1) for GGUF llama, half-split pairs (i, i+hd/2) for qwen2.
fn rope(h: &mut [f64], pos: usize, interleaved: bool) {
    let half = h.len() / 2;
    for i in 0..half {
        let theta = pos as f64 * BASE.powf(-2.0 * i as f64 / h.len() as f64);
        let (a, b) = if interleaved { (2 * i, 2 * i + 1) } else { (i, i + half) };
        let (x0, x1) = (h[a], h[b]);
        h[a] = x0 * theta.cos() - x1 * theta.sin();
        h[b] = x0 * theta.sin() + x1 * theta.cos();
    }
}

fn reference_logits(v: &Variant, t: &Tensors, tokens: &[u32]) -> Vec<Vec<f64>> {
    let g = |n: &str| t.get(n).unwrap_or_else(|| panic!("{n}")).as_slice();
    let mut ks: Vec<Vec<Vec<f64>>> = vec![Vec::new(); LAYERS];
    let mut vs: Vec<Vec<Vec<f64>>> = vec![Vec::new(); LAYERS];
    let mut out = Vec::new();
    for (pos, &tok) in tokens.iter().enumerate() {
        let mut x = g("token_embd.weight")[tok as usize * D..(tok as usize + 1) * D].to_vec();
        for l in 0..LAYERS {
            let n = |s: &str| format!("blk.{l}.{s}");
            let h = rms_norm(&x, g(&n("attn_norm.weight")));
            let mut q = matvec(g(&n("attn_q.weight")), &h);
            let mut k = matvec(g(&n("attn_k.weight")), &h);
            let mut vv = matvec(g(&n("attn_v.weight")), &h);
            if v.arch == "qwen2" {
                q.iter_mut().zip(g(&n("attn_q.bias"))).for_each(|(a, b)| *a += b);
                k.iter_mut().zip(g(&n("attn_k.bias"))).for_each(|(a, b)| *a += b);
                vv.iter_mut().zip(g(&n("attn_v.bias"))).for_each(|(a, b)| *a += b);
            }
            let inter = v.arch == "llama";
            q.chunks_mut(HD).for_each(|hh| rope(hh, pos, inter));
            k.chunks_mut(HD).for_each(|hh| rope(hh, pos, inter));
            ks[l].push(k);
            vs[l].push(vv);
            let mut att = vec![0.0; D];
            for hq in 0..HEADS {
                let kvh = hq / (HEADS / KV_HEADS);
                let qh = &q[hq * HD..(hq + 1) * HD];
                let scores: Vec<f64> = ks[l]
                    .iter()
                    .map(|k| qh.iter().zip(&k[kvh * HD..(kvh + 1) * HD]).map(|(a, b)| a * b).sum::<f64>() / (HD as f64).sqrt())
                    .collect();
                let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for (j, ej) in e.iter().enumerate() {
                    for d in 0..HD {
                        att[hq * HD + d] += ej / z * vs[l][j][kvh * HD + d];
                    }
                }
            }
            let o = matvec(g(&n("attn_output.weight")), &att);
            x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
            let h = rms_norm(&x, g(&n("ffn_norm.weight")));
            let gate = matvec(g(&n("ffn_gate.weight")), &h);
            let up = matvec(g(&n("ffn_up.weight")), &h);
            let act: Vec<f64> = gate
                .iter()
                .zip(&up)
                .map(|(&a, &u)| if v.relu { a.max(0.0) * u } else { a / (1.0 + (-a).exp()) * u })
                .collect();
            let dn = matvec(g(&n("ffn_down.weight")), &act);
            x.iter_mut().zip(&dn).for_each(|(a, b)| *a += b);
        }
        let h = rms_norm(&x, g("output_norm.weight"));
        let w_out = if v.untied { g("output.weight") } else { g("token_embd.weight") };
        out.push(matvec(w_out, &h));
    }
    out
}

fn check(v: Variant) {
    let (path, tensors) = write_model(&v, 0x5EED ^ v.name.len() as u64);
    let file = ModelFile::open(&path).unwrap();
    let tokens: Vec<u32> = vec![256, 72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100, 33, 257, 3];
    let want = reference_logits(&v, &tensors, &tokens);
    let scale = want.iter().flatten().map(|x| x.abs()).fold(0.0, f64::max);
    assert!(scale > 0.1, "{}: logits are not degenerate ({scale})", v.name);
    for (precision, tol) in [(Precision::Exact, 2e-4), (Precision::Fast, 2e-3), (Precision::Int8, 0.15)] {
        for threads in [1, 2] {
            let e = Engine::new(&file, EngineOptions { threads, precision, context: 64 }).unwrap();
            assert_eq!(e.model().config.activation == engine::Activation::Relu, v.relu);
            assert_eq!(e.model().tied_embeddings, !v.untied);
            // Prefill in two batched steps, then decode one token at a time: both paths are checked.
            let mut cache = e.new_cache();
            let mut got = e.forward(&mut cache, &tokens[..6], Logits::All).unwrap();
            got.extend(e.forward(&mut cache, &tokens[6..10], Logits::All).unwrap());
            for &t in &tokens[10..] {
                got.extend(e.forward(&mut cache, &[t], Logits::Last).unwrap());
            }
            let worst = got
                .chunks(want[0].len())
                .zip(&want)
                .flat_map(|(g, w)| g.iter().zip(w).map(|(a, b)| (*a as f64 - b).abs()))
                .fold(0.0, f64::max);
            eprintln!("{} {precision:?} threads={threads}: max |logit error| = {worst:.2e} (logit scale {scale:.2})", v.name);
            assert!(worst <= tol * scale.max(1.0), "{} {precision:?}: logits off by {worst}", v.name);
        }
    }
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn llama_silu_q4_0_tied_f16_embedding() {
    check(Variant { name: "llama-silu-q4_0", arch: "llama", relu: false, weights: DType::Q4_0, embed: DType::F16, untied: false });
}

#[test]
fn llama_relu_q8_0_untied() {
    check(Variant { name: "llama-relu-q8_0", arch: "llama", relu: true, weights: DType::Q8_0, embed: DType::Q8_0, untied: true });
}

#[test]
fn qwen2_biases_q4_1_f32_embedding() {
    check(Variant { name: "qwen2-q4_1", arch: "qwen2", relu: false, weights: DType::Q4_1, embed: DType::F32, untied: true });
}

#[test]
fn llama_f16_weights() {
    check(Variant { name: "llama-f16", arch: "llama", relu: false, weights: DType::F16, embed: DType::F16, untied: false });
}
