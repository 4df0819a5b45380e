//! Attention variants more than one family uses.

use crate::layer::{AttnStep, HeadShape};

/// Biases added to the q, k and v rows (each absent one adds nothing).
pub struct QkvBias {
    /// Query bias, `q_dim`.
    pub q: Option<Vec<f32>>,
    /// Key bias, `kv_dim`.
    pub k: Option<Vec<f32>>,
    /// Value bias, `kv_dim`.
    pub v: Option<Vec<f32>>,
}

fn add_bias(y: &mut [f32], bias: &Option<Vec<f32>>) {
    if let Some(b) = bias {
        for row in y.chunks_mut(b.len()) {
            row.iter_mut().zip(b).for_each(|(a, b)| *a += b);
        }
    }
}

impl AttnStep for QkvBias {
    fn before_rope(&self, q: &mut [f32], k: &mut [f32], v: &mut [f32], _: &HeadShape) {
        add_bias(q, &self.q);
        add_bias(k, &self.k);
        add_bias(v, &self.v);
    }
}
