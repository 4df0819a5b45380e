//! `cargo xtask synth-model --arch qwen3` (xtask/src/synth_arch.rs): the options, the file's keys and
//! tensors, and the engine's forward pass on it against a naive f64 forward pass written here from
//! llama.cpp's `src/models/qwen3.cpp`: per-head RMSNorm of q and k before NEOX (half-split) RoPE, a
//! head size that is not `d / heads`, SiLU gated FFN, tied output.

use crate::src::synth;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use engine::{Engine, EngineOptions, Logits, ModelFile, Precision};
use model_format::{DType, GgufFile};
use synth::{Options, SynthArch};

/// A small qwen3: 2 layers, d 128, 4 query heads and 2 key/value heads of 64 (query width 256).
fn small() -> Options {
    Options {
        layers: 2,
        d: 128,
        ff: 256,
        heads: 4,
        kv_heads: 2,
        head_dim: Some(64),
        vocab: 300,
        format: DType::Q8_0,
        seed: 7,
        ..SynthArch::Qwen3.defaults()
    }
}

/// The model written to a scratch file, removed on drop.
struct Written(PathBuf);

impl Written {
    fn new(o: &Options, tag: &str) -> Written {
        let p =
            std::env::temp_dir().join(format!("sparrow-qwen3-{tag}-{}.gguf", std::process::id()));
        synth::write_model(o, &p, |_, _| {}).unwrap();
        Written(p)
    }
}

impl Drop for Written {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn arch_qwen3_has_qwen3_0_6b_shape_and_flags_override_it_wherever_they_are() {
    let args = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();
    let o = Options::parse(&args("--arch qwen3")).unwrap();
    assert_eq!(
        (
            o.arch,
            o.layers,
            o.d,
            o.ff,
            o.heads,
            o.kv_heads,
            o.head_dim(),
            o.vocab
        ),
        (SynthArch::Qwen3, 28, 1024, 3072, 16, 8, 128, 151_936)
    );
    assert_eq!(o.q_dim(), 2048);
    let o = Options::parse(&args("--layers 2 --head-dim 32 --arch=qwen3")).unwrap();
    assert_eq!((o.layers, o.d, o.head_dim()), (2, 1024, 32));
    assert_eq!(o.file_name(), "synth-qwen3-2x1024x3072-q4_0.gguf");
    let err = Options::parse(&args("--arch gpt2"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("llama or qwen3"), "{err}");
}

#[test]
fn a_qwen3_file_has_its_keys_and_head_norms() {
    let o = small();
    let w = Written::new(&o, "keys");
    let f = GgufFile::open(&w.0).unwrap();
    assert_eq!(
        f.get("general.architecture").and_then(|v| v.as_str()),
        Some("qwen3")
    );
    assert_eq!(
        f.get("qwen3.attention.key_length").and_then(|v| v.as_u64()),
        Some(64)
    );
    assert!(
        f.get("sparrow.ffn_activation").is_none(),
        "SiLU, as llama.cpp runs it"
    );
    for l in 0..2 {
        for t in ["attn_q_norm", "attn_k_norm"] {
            let v = f.tensor(&format!("blk.{l}.{t}.weight")).unwrap();
            assert_eq!((v.dtype, v.shape.to_vec()), (DType::F32, vec![64]));
        }
    }
    assert_eq!(
        f.tensor("blk.0.attn_q.weight").unwrap().shape.to_vec(),
        vec![256, 128]
    );
    let size = std::fs::metadata(&w.0).unwrap().len();
    assert_eq!(size - f.data_offset(), o.data_bytes());
    let cfg = ModelFile::open(&w.0).unwrap().config().unwrap();
    assert_eq!(
        (cfg.arch.name(), cfg.head_dim, cfg.q_dim()),
        ("qwen3", 64, 256)
    );
    assert_eq!(cfg.activation, engine::Activation::Silu);
}

/// Every tensor, dequantized to f64, by GGUF name.
fn read_tensors(path: &Path) -> HashMap<String, Vec<f64>> {
    let f = GgufFile::open(path).unwrap();
    f.tensors()
        .map(|t| {
            let cols = t.cols();
            let rb = t.dtype.row_bytes(cols).unwrap();
            let mut row = vec![0.0f32; cols];
            let mut out = Vec::with_capacity(t.n_elements());
            for r in 0..t.rows() {
                kernels_neon::dequantize_row(t.dtype, &t.data[r * rb..(r + 1) * rb], &mut row)
                    .unwrap();
                out.extend(row.iter().map(|&x| x as f64));
            }
            (t.name.to_string(), out)
        })
        .collect()
}

fn matvec(w: &[f64], x: &[f64]) -> Vec<f64> {
    w.chunks(x.len())
        .map(|r| r.iter().zip(x).map(|(a, b)| a * b).sum())
        .collect()
}

fn rms_norm(x: &[f64], w: &[f64]) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let r = 1.0 / (ms + synth::RMS_EPS as f64).sqrt();
    x.iter().zip(w).map(|(a, b)| a * r * b).collect()
}

/// NEOX RoPE on one head: pairs (i, i + hd/2).
fn rope(h: &mut [f64], pos: usize) {
    let half = h.len() / 2;
    for i in 0..half {
        let theta = pos as f64 * (synth::ROPE_BASE as f64).powf(-2.0 * i as f64 / h.len() as f64);
        let (x0, x1) = (h[i], h[i + half]);
        h[i] = x0 * theta.cos() - x1 * theta.sin();
        h[i + half] = x0 * theta.sin() + x1 * theta.cos();
    }
}

/// The logits of every token, one token at a time with a cache, as qwen3.cpp computes them.
fn reference_logits(o: &Options, t: &HashMap<String, Vec<f64>>, tokens: &[u32]) -> Vec<Vec<f64>> {
    let g = |n: &str| t.get(n).unwrap_or_else(|| panic!("{n}")).as_slice();
    let (d, hd, heads, group) = (o.d, o.head_dim(), o.heads, o.heads / o.kv_heads);
    let mut ks: Vec<Vec<Vec<f64>>> = vec![Vec::new(); o.layers];
    let mut vs: Vec<Vec<Vec<f64>>> = vec![Vec::new(); o.layers];
    let mut out = Vec::new();
    for (pos, &tok) in tokens.iter().enumerate() {
        let mut x = g("token_embd.weight")[tok as usize * d..(tok as usize + 1) * d].to_vec();
        for l in 0..o.layers {
            let n = |s: &str| format!("blk.{l}.{s}");
            let h = rms_norm(&x, g(&n("attn_norm.weight")));
            let mut q = matvec(g(&n("attn_q.weight")), &h);
            let mut k = matvec(g(&n("attn_k.weight")), &h);
            let v = matvec(g(&n("attn_v.weight")), &h);
            for (m, w) in [
                (&mut q, "attn_q_norm.weight"),
                (&mut k, "attn_k_norm.weight"),
            ] {
                for head in m.chunks_mut(hd) {
                    let normed = rms_norm(head, g(&n(w)));
                    head.copy_from_slice(&normed);
                    rope(head, pos);
                }
            }
            ks[l].push(k);
            vs[l].push(v);
            let mut att = vec![0.0; heads * hd];
            for hq in 0..heads {
                let kv = (hq / group) * hd;
                let qh = &q[hq * hd..(hq + 1) * hd];
                let scores: Vec<f64> = ks[l]
                    .iter()
                    .map(|k| {
                        let dot: f64 = qh.iter().zip(&k[kv..kv + hd]).map(|(a, b)| a * b).sum();
                        dot / (hd as f64).sqrt()
                    })
                    .collect();
                let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for (j, ej) in e.iter().enumerate() {
                    for i in 0..hd {
                        att[hq * hd + i] += ej / z * vs[l][j][kv + i];
                    }
                }
            }
            let a = matvec(g(&n("attn_output.weight")), &att);
            x.iter_mut().zip(&a).for_each(|(x, a)| *x += a);
            let h = rms_norm(&x, g(&n("ffn_norm.weight")));
            let gate = matvec(g(&n("ffn_gate.weight")), &h);
            let up = matvec(g(&n("ffn_up.weight")), &h);
            let act: Vec<f64> = gate
                .iter()
                .zip(&up)
                .map(|(&a, &u)| a / (1.0 + (-a).exp()) * u)
                .collect();
            let dn = matvec(g(&n("ffn_down.weight")), &act);
            x.iter_mut().zip(&dn).for_each(|(x, d)| *x += d);
        }
        let h = rms_norm(&x, g("output_norm.weight"));
        out.push(matvec(g("token_embd.weight"), &h));
    }
    out
}

#[test]
fn the_engine_computes_what_qwen3_cpp_does() {
    let o = small();
    let w = Written::new(&o, "naive");
    let tensors = read_tensors(&w.0);
    let tokens: Vec<u32> = vec![
        72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100, 33, 3,
    ];
    let want = reference_logits(&o, &tensors, &tokens);
    let scale = want.iter().flatten().map(|x| x.abs()).fold(0.0, f64::max);
    assert!(scale > 0.1, "logits are not degenerate ({scale})");
    let file = ModelFile::open(&w.0).unwrap();
    for (precision, tol) in [(Precision::Exact, 2e-4), (Precision::Fast, 2e-3)] {
        let e = Engine::new(
            &file,
            EngineOptions {
                threads: 2,
                precision,
                context: 64,
                ..Default::default()
            },
        )
        .unwrap();
        // A batched prompt step, then one token at a time: both paths.
        let mut cache = e.new_cache();
        let mut got = e.forward(&mut cache, &tokens[..8], Logits::All).unwrap();
        for &t in &tokens[8..] {
            got.extend(e.forward(&mut cache, &[t], Logits::Last).unwrap());
        }
        let worst = got
            .chunks(o.vocab)
            .zip(&want)
            .flat_map(|(g, w)| g.iter().zip(w).map(|(a, b)| (*a as f64 - b).abs()))
            .fold(0.0, f64::max);
        eprintln!("{precision:?}: max |logit error| = {worst:.2e} (logit scale {scale:.2})");
        assert!(
            worst <= tol * scale.max(1.0),
            "{precision:?}: logits off by {worst}"
        );
    }
}
