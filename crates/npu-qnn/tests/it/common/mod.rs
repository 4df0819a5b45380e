//! Shared by the tests: the double's path and its controls, a deterministic generator, the f64
//! reference FFN.
#![allow(dead_code)]

use std::path::PathBuf;

/// The QNN test double built next to this test binary (dev-dependency `qnn-double`).
pub fn double() -> PathBuf {
    qnn_double::library_path().unwrap_or_else(|| {
        panic!(
            "{} not found next to {:?}: cargo builds it as a dev-dependency",
            qnn_double::library_file_name(),
            std::env::current_exe()
        )
    })
}

pub fn control() -> qnn_double::Control {
    qnn_double::Control::open(&double()).expect("the double's controls")
}

/// xorshift64*: uniform values in [-1, 1).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let x = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D);
        ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.next() * scale).collect()
    }
}

/// `out = down · (act(gate · x) ⊙ (up · x))` in f64; weights row-major (`gate`, `up`: `[d_ff, d_model]`,
/// `down`: `[d_model, d_ff]`), `silu` or ReLU.
#[allow(clippy::too_many_arguments)]
pub fn reference_ffn(
    x: &[f32],
    batch: usize,
    d_model: usize,
    d_ff: usize,
    gate: &[f64],
    up: &[f64],
    down: &[f64],
    silu: bool,
) -> Vec<f64> {
    let mut out = vec![0.0; batch * d_model];
    for b in 0..batch {
        let xr = &x[b * d_model..(b + 1) * d_model];
        let mut h = vec![0.0f64; d_ff];
        for j in 0..d_ff {
            let dot = |w: &[f64]| -> f64 {
                (0..d_model)
                    .map(|i| w[j * d_model + i] * xr[i] as f64)
                    .sum()
            };
            let g = dot(gate);
            let a = if silu {
                g / (1.0 + (-g).exp())
            } else {
                g.max(0.0)
            };
            h[j] = a * dot(up);
        }
        for o in 0..d_model {
            out[b * d_model + o] = (0..d_ff).map(|j| down[o * d_ff + j] * h[j]).sum();
        }
    }
    out
}

/// Symmetric per-row INT8 quantization of a `[rows, cols]` matrix: values, scales, and the
/// dequantized matrix in f64 (what the reference multiplies by).
pub fn quantize_rows(w: &[f32], rows: usize, cols: usize) -> (Vec<i8>, Vec<f32>, Vec<f64>) {
    let mut q = Vec::with_capacity(w.len());
    let mut scales = Vec::with_capacity(rows);
    let mut deq = Vec::with_capacity(w.len());
    for r in 0..rows {
        let row = &w[r * cols..(r + 1) * cols];
        let amax = row.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(1e-8);
        let s = amax / 127.0;
        scales.push(s);
        for &v in row {
            let qi = (v / s).round().clamp(-127.0, 127.0) as i8;
            q.push(qi);
            deq.push(qi as f64 * s as f64);
        }
    }
    (q, scales, deq)
}
