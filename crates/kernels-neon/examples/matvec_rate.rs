//! `matvec`'s rate in GB/s of weight bytes on each x86/ARM path this machine has, per format and
//! precision, on a 7B model's matrix shapes (streamed from DRAM) and on a small one that stays in
//! the caches (the kernel's own rate): the quick A/B of a kernel change. Best of `REPS` calls after
//! a warm-up; a pool of `THREADS` threads (default 2); `SHAPES=1024x1024,...` for other shapes
//! (`ROWSxCOLS`).
//!
//! `SPARROW_KERNELS=avx2` measures the AVX2 path only, `FAST_ONLY=1` the `Fast` precision only.
//!
//! `cargo run --profile ci -p kernels-neon --example matvec_rate [-- q4_0,q4_k ...]` (`q5_k`,
//! `q2_k`, `q3_k` and `iq4_xs` take the benches' random bytes: `quantize_matrix` writes none)

use kernels_neon::*;
use std::time::Instant;

// The benches' random matrices, for the formats `quantize_matrix` does not write.
#[allow(dead_code)]
#[path = "../benches/common/mod.rs"]
mod common;

fn main() {
    let threads = std::env::var("THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let reps: usize = std::env::var("REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    let names = std::env::args().nth(1).unwrap_or_else(|| "q4_0".into());
    let formats: Vec<WeightFormat> = names
        .split(',')
        .map(|n| {
            WeightFormat::GGML
                .into_iter()
                .find(|f| f.name().eq_ignore_ascii_case(n))
                .unwrap_or_else(|| panic!("unknown format `{n}`"))
        })
        .collect();
    let paths: Vec<KernelPath> = available_paths()
        .into_iter()
        .filter(|p| *p != KernelPath::Scalar)
        // `SPARROW_KERNELS=avx2`: the AVX2 path only.
        .filter(|p| {
            *p != KernelPath::Avx512
                || !std::env::var("SPARROW_KERNELS").is_ok_and(|v| v.eq_ignore_ascii_case("avx2"))
        })
        .collect();
    let shapes: Vec<(usize, usize)> = std::env::var("SHAPES")
        .unwrap_or_else(|_| "14336x4096,4096x14336,1024x1024".into())
        .split(',')
        .map(|s| {
            let (r, c) = s.split_once('x').expect("SHAPES: ROWSxCOLS,...");
            (r.parse().expect("rows"), c.parse().expect("cols"))
        })
        .collect();
    for format in formats {
        for &(rows, cols) in &shapes {
            let src: Vec<f32> = (0..rows * cols)
                .map(|i| ((i * 7919) % 1013) as f32 / 1013.0 - 0.5)
                .collect();
            let data = quantize_matrix(format, &src, rows, cols)
                .unwrap_or_else(|_| common::random_matrix(format, rows, cols, 0));
            drop(src);
            let w = QMatrix::new(format, rows, cols, &data).unwrap();
            let x: Vec<f32> = (0..cols)
                .map(|i| ((i * 31) % 61) as f32 / 61.0 - 0.5)
                .collect();
            let mut y = vec![0f32; rows];
            // The small matrix runs many times a rep, so a rep is long enough to time.
            let inner = if rows * cols <= 1 << 20 { 200 } else { 1 };
            let mut line = format!("{format:?} {rows}x{cols}:");
            for &path in &paths {
                // `FAST_ONLY=1`: the default precision only.
                let fast_only = std::env::var("FAST_ONLY").is_ok_and(|v| v == "1");
                for precision in [Precision::Fast, Precision::Int8] {
                    if fast_only && precision != Precision::Fast {
                        continue;
                    }
                    let mut best = f64::MAX;
                    for _ in 0..reps + 2 {
                        let t = Instant::now();
                        pool.install(|| {
                            for _ in 0..inner {
                                matvec_with(path, &w, &x, &mut y, precision).unwrap();
                            }
                        });
                        best = best.min(t.elapsed().as_secs_f64() / inner as f64);
                    }
                    let gbs = data.len() as f64 / best / 1e9;
                    line += &format!("  {}/{precision:?} {gbs:.1}", path.name());
                }
            }
            println!("{line}");
        }
    }
}
