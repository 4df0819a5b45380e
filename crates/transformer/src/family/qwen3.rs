//! Qwen3 (dense): llama's block without biases, plus an RMSNorm of every query and key head (weights
//! `attn_q_norm` and `attn_k_norm`, `head_dim` long) applied before RoPE, as llama.cpp's
//! `src/models/qwen3.cpp` does; the head size comes from `qwen3.attention.key_length` and may differ
//! from `d_model / n_heads`. GGUF files keep the HF row order: NEOX (half-split) RoPE.

use kernels_neon::RopeStyle;

use super::{Family, LayerShape, LayerTensors};
use crate::error::Result;
use crate::layer::{AttnStep, HeadShape};

/// The qwen3 family.
pub struct Qwen3;

impl Family for Qwen3 {
    fn name(&self) -> &'static str {
        "qwen3"
    }

    fn hf_names(&self) -> &'static [&'static str] {
        &["Qwen3ForCausalLM", "qwen3"]
    }

    fn gguf_rope(&self) -> RopeStyle {
        RopeStyle::Half
    }

    fn attention(&self, t: &dyn LayerTensors<'_>, s: &LayerShape) -> Result<Box<dyn AttnStep>> {
        QkNorm::per_head(t, s)
    }
}

/// RMSNorm of each head of q and k with one weight per head dimension, shared by the heads.
pub(crate) struct QkNorm {
    /// Query head norm weight, `head_dim`.
    pub(crate) q: Vec<f32>,
    /// Key head norm weight, `head_dim`.
    pub(crate) k: Vec<f32>,
}

impl QkNorm {
    /// The per-head norm of a layer's `q_norm` and `k_norm` weights (`head_dim` long each), as
    /// qwen3, qwen3moe and gemma3 have it.
    pub(crate) fn per_head(t: &dyn LayerTensors<'_>, s: &LayerShape) -> Result<Box<dyn AttnStep>> {
        Ok(Box::new(QkNorm {
            q: t.vector("q_norm", s.head_dim)?,
            k: t.vector("k_norm", s.head_dim)?,
        }))
    }
}

fn norm_heads(x: &mut [f32], w: &[f32], eps: f32) {
    let mut head = vec![0.0f32; w.len()];
    for h in x.chunks_exact_mut(w.len()) {
        head.copy_from_slice(h);
        kernels_neon::rms_norm(&head, w, eps, h);
    }
}

impl AttnStep for QkNorm {
    fn before_rope(&self, q: &mut [f32], k: &mut [f32], _v: &mut [f32], heads: &HeadShape) {
        norm_heads(q, &self.q, heads.rms_eps);
        norm_heads(k, &self.k, heads.rms_eps);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every head of q and of k comes out as `x / rms(x) * w` with its own weight, computed in f64;
    /// v is untouched.
    #[test]
    fn each_head_of_q_and_k_is_normed_with_its_weight() {
        let heads = HeadShape {
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 8,
            rms_eps: 1e-6,
        };
        let step = QkNorm {
            q: (0..8).map(|i| 0.5 + i as f32 / 8.0).collect(),
            k: (0..8).map(|i| 1.5 - i as f32 / 16.0).collect(),
        };
        let n = 3;
        let val = |i: usize| ((i * 7919) % 23) as f32 - 11.0 + 0.25 * (i % 3) as f32;
        let q0: Vec<f32> = (0..n * heads.q_dim()).map(val).collect();
        let k0: Vec<f32> = (0..n * heads.kv_dim()).map(|i| val(i + 5) * 3.0).collect();
        let v0: Vec<f32> = (0..n * heads.kv_dim()).map(|i| val(i + 9)).collect();
        let (mut q, mut k, mut v) = (q0.clone(), k0.clone(), v0.clone());
        step.before_rope(&mut q, &mut k, &mut v, &heads);
        assert_eq!(v, v0);
        for (got, x, w) in [(&q, &q0, &step.q), (&k, &k0, &step.k)] {
            for (g, x) in got.chunks(8).zip(x.chunks(8)) {
                let ms = x.iter().map(|&a| (a as f64).powi(2)).sum::<f64>() / 8.0;
                let s = 1.0 / (ms + 1e-6).sqrt();
                for i in 0..8 {
                    let want = x[i] as f64 * s * w[i] as f64;
                    assert!((g[i] as f64 - want).abs() < 1e-5, "{} vs {want}", g[i]);
                }
            }
        }
    }
}
