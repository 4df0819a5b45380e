//! `matmul`'s rate in each precision against the token count, in GFLOP/s on a 2-thread pool: where
//! the integer prompt tiles overtake the f32 one (`INT_TILE_MIN_TOKENS`). Matrices of Qwen2.5-0.5B's
//! FFN shapes, quantized from smooth values; best of three rounds.
//!
//! `cargo run --release -p kernels-neon --example tile_n`

use kernels_neon::*;
use std::time::Instant;
fn main() {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    for (format, rows, cols) in [
        (WeightFormat::Q5_0, 4864usize, 896usize),
        (WeightFormat::Q4_K, 896, 4864),
        (WeightFormat::Q6_K, 896, 4864),
    ] {
        let src: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 7919) % 1013) as f32 / 1013.0 - 0.5)
            .collect();
        let data = quantize_matrix(format, &src, rows, cols).unwrap();
        let w = QMatrix::new(format, rows, cols, &data).unwrap();
        for n in [2usize, 4, 8, 16, 32, 64, 512] {
            let x: Vec<f32> = (0..n * cols)
                .map(|i| ((i * 31) % 61) as f32 / 61.0 - 0.5)
                .collect();
            let mut y = vec![0f32; n * rows];
            let mut line = format!("{format:?} n={n}:");
            for p in [Precision::Exact, Precision::Fast, Precision::Int8] {
                let reps = (2048 / n).max(3);
                let best = pool.install(|| {
                    let mut best = f64::MAX;
                    for _ in 0..3 {
                        let t = Instant::now();
                        for _ in 0..reps {
                            matmul(&w, &x, n, &mut y, p).unwrap();
                        }
                        best = best.min(t.elapsed().as_secs_f64() / reps as f64);
                    }
                    best
                });
                line += &format!(
                    " {p:?} {:.1} GF/s",
                    2.0 * (rows * cols * n) as f64 / best / 1e9
                );
            }
            println!("{line}");
        }
    }
}
