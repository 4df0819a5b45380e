//! Gemma 3, as llama.cpp's `src/models/gemma3.cpp` computes it: llama's block with per-head q/k
//! RMSNorms before RoPE (qwen3's [`QkNorm`]), RMSNorms of the attention output and of the FFN
//! output before each residual add (`post_attention_norm`, `post_ffw_norm`), a GeGLU FFN with GELU's
//! tanh form, input embeddings scaled by `sqrt(d_model)`, and sliding-window attention on five
//! layers of six (`gemma3.attention.sliding_window`, pattern `attention.sliding_window_pattern`,
//! default 6: layer `i` slides when `i % 6 < 5`) with RoPE base `rope.freq_base_swa` (default
//! 10,000) there and `rope.freq_base` on the global layers. The attention scale is
//! `1/sqrt(attention.key_length)`, the engine's default (llama.cpp differs for the 27B model only,
//! which this module does not special-case). GGUF files keep the HF row order: NEOX (half-split)
//! RoPE. The GGUF converter has already added 1 to every norm weight, so all norms are plain
//! RMSNorms; HF checkpoints store them without it, so no HF names are claimed.

use kernels_neon::RopeStyle;

use super::qwen3::QkNorm;
use super::{ConfigKeys, Family, LayerShape, LayerTensors};
use crate::error::Result;
use crate::layer::{AttnSpan, AttnStep, PostNorms};
use tensor_types::Activation;

/// The gemma3 family.
pub struct Gemma3;

/// llama.cpp's default sliding-window pattern for Gemma 3 (`load_swa_pattern(ml, 6)`).
const DEFAULT_PATTERN: u64 = 6;
/// llama.cpp's default RoPE base of sliding layers (`rope_freq_base_train_swa`).
const DEFAULT_SWA_BASE: f64 = 10_000.0;

impl Family for Gemma3 {
    fn name(&self) -> &'static str {
        "gemma3"
    }

    fn hf_names(&self) -> &'static [&'static str] {
        &[]
    }

    fn gguf_rope(&self) -> RopeStyle {
        RopeStyle::Half
    }

    fn attention(&self, t: &dyn LayerTensors<'_>, s: &LayerShape) -> Result<Box<dyn AttnStep>> {
        QkNorm::per_head(t, s)
    }

    fn post_norms(&self, t: &dyn LayerTensors<'_>, s: &LayerShape) -> Result<PostNorms> {
        Ok(PostNorms {
            attn: Some(t.vector("post_attention_norm", s.d_model)?),
            ffn: Some(t.vector("post_ffw_norm", s.d_model)?),
        })
    }

    fn attn_span(
        &self,
        keys: &dyn ConfigKeys,
        rope_base: f32,
        index: usize,
    ) -> std::result::Result<AttnSpan, String> {
        let global = AttnSpan {
            window: None,
            rope_base,
        };
        let window = match keys.uint("attention.sliding_window") {
            Some(w) if w > 0 => w,
            Some(_) => return Ok(global),
            None if keys.present("attention.sliding_window") => {
                return Err("gemma3.attention.sliding_window is not an unsigned integer".into())
            }
            None => return Ok(global),
        };
        let pattern = match keys.uint("attention.sliding_window_pattern") {
            Some(p) => p,
            None if keys.present("attention.sliding_window_pattern") => {
                return Err(
                    "gemma3.attention.sliding_window_pattern is not an unsigned integer (a per-layer list is not read)"
                        .into(),
                )
            }
            None => DEFAULT_PATTERN,
        };
        let sliding = pattern == 0 || (index as u64) % pattern < pattern - 1;
        if !sliding {
            return Ok(global);
        }
        let base = keys.float("rope.freq_base_swa").unwrap_or(DEFAULT_SWA_BASE) as f32;
        if !(base.is_finite() && base > 0.0) {
            return Err(format!(
                "gemma3.rope.freq_base_swa {base} is not a finite number above 0"
            ));
        }
        Ok(AttnSpan {
            window: Some(usize::try_from(window).unwrap_or(usize::MAX)),
            rope_base: base,
        })
    }

    fn embedding_scale(&self, d_model: usize) -> Option<f32> {
        Some((d_model as f32).sqrt())
    }

    fn activation(&self) -> Activation {
        Activation::GeluTanh
    }

    fn check_keys(&self, keys: &dyn ConfigKeys) -> std::result::Result<(), String> {
        match keys.float("final_logit_softcapping") {
            Some(c) if c != 0.0 => Err(format!(
                "gemma3.final_logit_softcapping {c}: logit soft-capping is not computed"
            )),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    struct Keys(HashMap<&'static str, f64>);

    impl ConfigKeys for Keys {
        fn uint(&self, key: &str) -> Option<u64> {
            self.0
                .get(key)
                .filter(|v| v.fract() == 0.0)
                .map(|&v| v as u64)
        }
        fn float(&self, key: &str) -> Option<f64> {
            self.0.get(key).copied()
        }
        fn present(&self, key: &str) -> bool {
            self.0.contains_key(key)
        }
    }

    /// The file's `rope.freq_base`.
    const BASE: f32 = 1e6;

    /// Layers 5, 11 and 17 of 18 are global with the file's base; the others slide over 512
    /// positions with base 10,000, as the fixture's README reads llama.cpp.
    #[test]
    fn five_layers_of_six_slide_with_their_own_rope_base() {
        let keys = Keys(HashMap::from([("attention.sliding_window", 512.0)]));
        for i in 0..18 {
            let s = Gemma3.attn_span(&keys, BASE, i).unwrap();
            if i % 6 == 5 {
                assert_eq!(
                    s,
                    AttnSpan {
                        window: None,
                        rope_base: 1e6
                    },
                    "layer {i}"
                );
            } else {
                assert_eq!(
                    s,
                    AttnSpan {
                        window: Some(512),
                        rope_base: 1e4
                    },
                    "layer {i}"
                );
            }
        }
        let keys = Keys(HashMap::from([
            ("attention.sliding_window", 4.0),
            ("attention.sliding_window_pattern", 2.0),
            ("rope.freq_base_swa", 500.0),
        ]));
        assert_eq!(Gemma3.attn_span(&keys, BASE, 0).unwrap().window, Some(4));
        assert_eq!(Gemma3.attn_span(&keys, BASE, 0).unwrap().rope_base, 500.0);
        assert_eq!(Gemma3.attn_span(&keys, BASE, 1).unwrap().window, None);
        // No window key: every layer global.
        let none = Keys(HashMap::new());
        assert_eq!(Gemma3.attn_span(&none, BASE, 0).unwrap().window, None);
        // A window that is not an integer is refused.
        let bad = Keys(HashMap::from([("attention.sliding_window", 0.5)]));
        assert!(Gemma3
            .attn_span(&bad, BASE, 0)
            .unwrap_err()
            .contains("sliding_window"));
    }

    #[test]
    fn soft_capping_is_refused_and_absent_or_zero_passes() {
        let capped = Keys(HashMap::from([("final_logit_softcapping", 30.0)]));
        assert!(Gemma3
            .check_keys(&capped)
            .unwrap_err()
            .contains("soft-capping"));
        assert!(Gemma3.check_keys(&Keys(HashMap::new())).is_ok());
        let zero = Keys(HashMap::from([("final_logit_softcapping", 0.0)]));
        assert!(Gemma3.check_keys(&zero).is_ok());
    }

    #[test]
    fn first_seen_follows_the_window() {
        let s = AttnSpan {
            window: Some(4),
            rope_base: 1.0,
        };
        assert_eq!(
            (
                s.first_seen(0),
                s.first_seen(3),
                s.first_seen(4),
                s.first_seen(9)
            ),
            (0, 0, 1, 6)
        );
        let g = AttnSpan {
            window: None,
            rope_base: 1.0,
        };
        assert_eq!(g.first_seen(1000), 0);
    }
}
