//! The tiny synthetic models in `fixtures/` (written by `cargo xtask fixtures`) run through the engine
//! and are compared with a naive f64 forward pass written here from the equations. They cover what the
//! real model does not: ReLU FFNs, Qwen2's q/k/v biases and half-split RoPE, Q4_0/Q8_0/F16 weights, an
//! untied output matrix.

use std::path::PathBuf;

use engine::{Activation, Engine, EngineOptions, Logits, ModelFile, Precision};
use model_format::GgufFile;

const D: usize = 64;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HD: usize = D / HEADS;
const LAYERS: usize = 2;
const EPS: f64 = 1e-5;
const BASE: f64 = 10_000.0;

/// What the engine must make of a fixture.
struct Variant {
    name: &'static str,
    qwen2: bool,
    relu: bool,
    untied: bool,
}

/// Every tensor of a fixture, dequantized to f64, by GGUF name.
type Tensors = std::collections::HashMap<String, Vec<f64>>;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(format!("tiny-{name}.gguf"))
}

fn read_tensors(path: &std::path::Path) -> Tensors {
    let f = GgufFile::open(path).unwrap();
    f.tensors()
        .map(|t| {
            let fmt = t.dtype;
            let cols = t.cols();
            let rb = fmt.row_bytes(cols).unwrap();
            let mut row = vec![0.0f32; cols];
            let mut out = Vec::with_capacity(t.n_elements());
            for r in 0..t.rows() {
                kernels_neon::dequantize_row(fmt, &t.data[r * rb..(r + 1) * rb], &mut row).unwrap();
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
    let r = 1.0 / (ms + EPS).sqrt();
    x.iter().zip(w).map(|(a, b)| a * r * b).collect()
}

/// RoPE on one head: interleaved pairs (2i, 2i+1) for GGUF llama, half-split pairs (i, i+hd/2) for qwen2.
fn rope(h: &mut [f64], pos: usize, interleaved: bool) {
    let half = h.len() / 2;
    for i in 0..half {
        let theta = pos as f64 * BASE.powf(-2.0 * i as f64 / h.len() as f64);
        let (a, b) = if interleaved {
            (2 * i, 2 * i + 1)
        } else {
            (i, i + half)
        };
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
            if v.qwen2 {
                q.iter_mut()
                    .zip(g(&n("attn_q.bias")))
                    .for_each(|(a, b)| *a += b);
                k.iter_mut()
                    .zip(g(&n("attn_k.bias")))
                    .for_each(|(a, b)| *a += b);
                vv.iter_mut()
                    .zip(g(&n("attn_v.bias")))
                    .for_each(|(a, b)| *a += b);
            }
            let inter = !v.qwen2;
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
                    .map(|k| {
                        qh.iter()
                            .zip(&k[kvh * HD..(kvh + 1) * HD])
                            .map(|(a, b)| a * b)
                            .sum::<f64>()
                            / (HD as f64).sqrt()
                    })
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
                .map(|(&a, &u)| {
                    if v.relu {
                        a.max(0.0) * u
                    } else {
                        a / (1.0 + (-a).exp()) * u
                    }
                })
                .collect();
            let dn = matvec(g(&n("ffn_down.weight")), &act);
            x.iter_mut().zip(&dn).for_each(|(a, b)| *a += b);
        }
        let h = rms_norm(&x, g("output_norm.weight"));
        let w_out = if v.untied {
            g("output.weight")
        } else {
            g("token_embd.weight")
        };
        out.push(matvec(w_out, &h));
    }
    out
}

fn check(v: Variant) {
    let path = fixture(v.name);
    let tensors = read_tensors(&path);
    let file = ModelFile::open(&path).unwrap();
    let cfg = file.config().unwrap();
    assert_eq!(
        (cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.n_layers),
        (D, HEADS, KV_HEADS, LAYERS)
    );
    assert_eq!(cfg.arch.name() == "qwen2", v.qwen2);
    let tokens: Vec<u32> = vec![
        256, 72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100, 33, 257, 3,
    ];
    let want = reference_logits(&v, &tensors, &tokens);
    let scale = want.iter().flatten().map(|x| x.abs()).fold(0.0, f64::max);
    assert!(
        scale > 0.1,
        "{}: logits are not degenerate ({scale})",
        v.name
    );
    // Fast's bound is this random model's sensitivity, not the activations' rounding alone: the
    // qwen2 variant's error moves with the 16-bit step by itself (largest quant 32767: 1.38e-2,
    // 32700: 1.43e-2, 32639 (the quantizer's since stop 92): 3.38e-2, 32600: 2.37e-2, 32512:
    // 2.92e-2, at a logit scale of 12.57; its Int8 error 0.67), so 2e-3 of the scale, met at
    // 32767, was within that spread by chance; 4e-3 holds it with room. Real models' greedy text
    // in Fast is checked against the reference (`reference*.rs`).
    for (precision, tol) in [
        (Precision::Exact, 2e-4),
        (Precision::Fast, 4e-3),
        (Precision::Int8, 0.15),
    ] {
        for threads in [1, 2] {
            let e = Engine::new(
                &file,
                EngineOptions {
                    threads,
                    precision,
                    context: 64,
                    ..Default::default()
                },
            )
            .unwrap();
            assert_eq!(e.model().config.activation == Activation::Relu, v.relu);
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
            assert!(
                worst <= tol * scale.max(1.0),
                "{} {precision:?}: logits off by {worst}",
                v.name
            );
        }
    }
}

#[test]
fn llama_silu_q4_0_tied_f16_embedding() {
    check(Variant {
        name: "llama-silu-q4_0",
        qwen2: false,
        relu: false,
        untied: false,
    });
}

#[test]
fn llama_relu_q8_0_untied() {
    check(Variant {
        name: "llama-relu-q8_0",
        qwen2: false,
        relu: true,
        untied: true,
    });
}

#[test]
fn qwen2_biases_q4_1_f32_embedding() {
    check(Variant {
        name: "qwen2-q4_1",
        qwen2: true,
        relu: false,
        untied: true,
    });
}

#[test]
fn llama_f16_weights() {
    check(Variant {
        name: "llama-f16",
        qwen2: false,
        relu: false,
        untied: false,
    });
}
