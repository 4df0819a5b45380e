//! Rotary position embeddings: [`rope_inplace`], and [`RopeAngles`] for a position's rotations
//! computed once and applied to every layer.

/// Which pairs of dimensions RoPE rotates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum RopeStyle {
    /// Pairs `(2i, 2i+1)`: llama.cpp "normal" mode, GGUF llama files.
    #[default]
    Interleaved,
    /// Pairs `(i, i + rot_dim/2)`: HF `rotate_half` / NEOX mode.
    Half,
}

/// Rotates each head of `x` (`n_heads × head_dim`, contiguous) in place for
/// position `pos`: `theta_i = pos * base^(-2i/rot_dim)` for `i < rot_dim/2`;
/// dimensions `>= rot_dim` are left untouched.
///
/// Like PyTorch, `inv_freq` is computed per call (here in f64, rounded to
/// f32), the angle is `pos as f32 * inv_freq` in f32 and cos/sin are f32.
/// `rot_dim` is clamped to `head_dim` and rounded down to even; heads beyond
/// `x.len()` are ignored. The same as [`RopeAngles::new`] then [`RopeAngles::apply`], which a
/// forward step uses to compute a position's angles once for all its layers.
pub fn rope_inplace(
    x: &mut [f32],
    n_heads: usize,
    head_dim: usize,
    rot_dim: usize,
    pos: usize,
    base: f32,
    style: RopeStyle,
) {
    RopeAngles::new(head_dim, rot_dim, pos, base).apply(x, n_heads, style);
}

/// One position's RoPE rotations (`cos`, `sin` per rotated pair), as [`rope_inplace`] computes
/// them: compute once, apply to every layer's q and k.
#[derive(Debug, Clone, PartialEq)]
pub struct RopeAngles {
    head_dim: usize,
    cs: Vec<(f32, f32)>,
}

impl RopeAngles {
    /// The rotations of position `pos` for heads of `head_dim` whose first `rot_dim` dimensions
    /// rotate (clamped and rounded as [`rope_inplace`] says).
    pub fn new(head_dim: usize, rot_dim: usize, pos: usize, base: f32) -> RopeAngles {
        let rot = rot_dim.min(head_dim) & !1;
        let p = pos as f32;
        let cs = (0..rot / 2)
            .map(|i| {
                let inv_freq = (f64::from(base)).powf(-(2.0 * i as f64) / rot as f64) as f32;
                let a = p * inv_freq;
                (a.cos(), a.sin())
            })
            .collect();
        RopeAngles { head_dim, cs }
    }

    /// The rotations as ggml's CPU `rope` computes them (`ggml_rope_cache_init` without frequency
    /// scaling): the angle starts at the position and is multiplied, in f32, by
    /// `powf(base, -2/rot)` from one pair to the next; `cos` and `sin` in f32.
    pub fn new_ggml(head_dim: usize, rot_dim: usize, pos: usize, base: f32) -> RopeAngles {
        let rot = rot_dim.min(head_dim) & !1;
        let theta_scale = base.powf(-2.0 / rot as f32);
        let mut theta = pos as f32;
        let cs = (0..rot / 2)
            .map(|_| {
                let c = (theta.cos(), theta.sin());
                theta *= theta_scale;
                c
            })
            .collect();
        RopeAngles { head_dim, cs }
    }

    /// Rotates the first `n_heads` heads of `x` (of this table's `head_dim`, contiguous).
    pub fn apply(&self, x: &mut [f32], n_heads: usize, style: RopeStyle) {
        let half = self.cs.len();
        if self.head_dim == 0 || half == 0 {
            return;
        }
        for head in x.chunks_exact_mut(self.head_dim).take(n_heads) {
            for (i, &(c, s)) in self.cs.iter().enumerate() {
                let (a, b) = match style {
                    RopeStyle::Interleaved => (2 * i, 2 * i + 1),
                    RopeStyle::Half => (i, i + half),
                };
                let (x0, x1) = (head[a], head[b]);
                head[a] = x0 * c - x1 * s;
                head[b] = x0 * s + x1 * c;
            }
        }
    }
}
