//! OLMoE (GGUF `olmoe`, OLMoE-1B-7B): llama's block with an RMSNorm of each token's WHOLE query and
//! key vectors (weights `attn_q_norm` of `n_heads × head_dim` and `attn_k_norm` of
//! `n_kv_heads × head_dim`, not per head) before RoPE, and a Mixture-of-Experts FFN with raw top-k
//! weights, as llama.cpp's `src/models/olmoe.cpp` computes it. NEOX (half-split) RoPE.

use kernels_neon::RopeStyle;

use super::{Family, LayerShape, LayerTensors};
use crate::error::Result;
use crate::layer::{AttnStep, HeadShape, LayerFfn};

/// The olmoe family.
pub struct Olmoe;

impl Family for Olmoe {
    fn name(&self) -> &'static str {
        "olmoe"
    }

    /// GGUF only: HF MoE checkpoints are not read.
    fn hf_names(&self) -> &'static [&'static str] {
        &[]
    }

    fn gguf_rope(&self) -> RopeStyle {
        RopeStyle::Half
    }

    fn attention(&self, t: &dyn LayerTensors<'_>, s: &LayerShape) -> Result<Box<dyn AttnStep>> {
        Ok(Box::new(FullQkNorm {
            q: t.vector("q_norm", s.q_dim)?,
            k: t.vector("k_norm", s.kv_dim)?,
        }))
    }

    fn ffn<'a>(&self, t: &dyn LayerTensors<'a>, s: &LayerShape) -> Result<LayerFfn<'a>> {
        super::experts::moe_ffn(t, s)
    }
}

/// RMSNorm of each token's whole q row and whole k row.
struct FullQkNorm {
    /// Query norm weight, `q_dim`.
    q: Vec<f32>,
    /// Key norm weight, `kv_dim`.
    k: Vec<f32>,
}

fn norm_rows(x: &mut [f32], w: &[f32], eps: f32) {
    let mut row = vec![0.0f32; w.len()];
    for r in x.chunks_exact_mut(w.len()) {
        row.copy_from_slice(r);
        kernels_neon::rms_norm(&row, w, eps, r);
    }
}

impl AttnStep for FullQkNorm {
    fn before_rope(&self, q: &mut [f32], k: &mut [f32], _v: &mut [f32], heads: &HeadShape) {
        norm_rows(q, &self.q, heads.rms_eps);
        norm_rows(k, &self.k, heads.rms_eps);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each token's q (and k) row comes out as `x / rms(x) * w` over the whole row, computed in
    /// f64 (a per-head norm would differ: the heads' scales differ here); v is untouched.
    #[test]
    fn each_tokens_whole_q_and_k_rows_are_normed() {
        let heads = HeadShape {
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 8,
            rms_eps: 1e-6,
        };
        let (qd, kd) = (heads.q_dim(), heads.kv_dim());
        let step = FullQkNorm {
            q: (0..qd).map(|i| 0.5 + i as f32 / 32.0).collect(),
            k: (0..kd).map(|i| 1.5 - i as f32 / 32.0).collect(),
        };
        let n = 3;
        // Head h of every row is scaled by h + 1, so per-head and whole-row norms disagree.
        let val = |i: usize, w: usize| {
            (((i * 7919) % 23) as f32 - 11.0 + 0.25 * (i % 3) as f32) * ((i % w) / 8 + 1) as f32
        };
        let q0: Vec<f32> = (0..n * qd).map(|i| val(i, qd)).collect();
        let k0: Vec<f32> = (0..n * kd).map(|i| val(i + 5, kd)).collect();
        let v0: Vec<f32> = (0..n * kd).map(|i| val(i + 9, kd)).collect();
        let (mut q, mut k, mut v) = (q0.clone(), k0.clone(), v0.clone());
        step.before_rope(&mut q, &mut k, &mut v, &heads);
        assert_eq!(v, v0);
        for (got, x, w) in [(&q, &q0, &step.q), (&k, &k0, &step.k)] {
            let len = w.len();
            for (g, x) in got.chunks(len).zip(x.chunks(len)) {
                let ms = x.iter().map(|&a| (a as f64).powi(2)).sum::<f64>() / len as f64;
                let s = 1.0 / (ms + 1e-6).sqrt();
                for i in 0..len {
                    let want = x[i] as f64 * s * w[i] as f64;
                    assert!((g[i] as f64 - want).abs() < 1e-4, "{} vs {want}", g[i]);
                }
            }
        }
    }
}
