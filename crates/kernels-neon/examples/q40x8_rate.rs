//! GB/s of Q4_0 weight bytes of `matvec` (the AVX2 path, `Fast`) against the same matrix repacked
//! eight rows at a time (`Q40x8`), alternating, on a 7B model's shapes (streamed from DRAM:
//! the three shapes together are 170 MiB) and on a small one that stays in the caches. Best of
//! `REPS` calls per round, `ROUNDS` rounds; a pool of `THREADS` threads (default 2).
//!
//! `cargo run --profile ci -p kernels-neon --example q40x8_rate`

use kernels_neon::*;
use std::time::Instant;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let (threads, reps, rounds) = (env("THREADS", 2), env("REPS", 10), env("ROUNDS", 3));
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    let path = KernelPath::Avx2Fma;
    if !path.is_available() {
        eprintln!("no AVX2 on this machine");
        return;
    }
    let shapes = [
        (14336usize, 4096usize),
        (4096, 14336),
        (4096, 4096),
        (512, 1024),
    ];
    let mats: Vec<(Vec<u8>, usize, usize)> = shapes
        .iter()
        .map(|&(rows, cols)| {
            let x: Vec<f32> = (0..rows * cols)
                .map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 1e-3)
                .collect();
            (
                quantize_matrix(WeightFormat::Q4_0, &x, rows, cols).unwrap(),
                rows,
                cols,
            )
        })
        .collect();
    for round in 0..rounds {
        for (data, rows, cols) in &mats {
            let w = QMatrix::new(WeightFormat::Q4_0, *rows, *cols, data).unwrap();
            let packed = Q40x8::repack(&w).unwrap();
            let x: Vec<f32> = (0..*cols).map(|i| (i as f32 * 0.37).sin()).collect();
            let mut y = vec![0f32; *rows];
            let gbs = |f: &mut dyn FnMut(&mut [f32])| {
                let mut y = vec![0f32; *rows];
                f(&mut y);
                let best = (0..reps)
                    .map(|_| {
                        let t = Instant::now();
                        f(&mut y);
                        t.elapsed().as_secs_f64()
                    })
                    .fold(f64::INFINITY, f64::min);
                data.len() as f64 / best / 1e9
            };
            let (a, b) = pool.install(|| {
                let a = gbs(&mut |y| matvec_with(path, &w, &x, y, Precision::Fast).unwrap());
                let b = gbs(&mut |y| packed.matvec_with(path, &x, y).unwrap());
                (a, b)
            });
            packed.matvec_with(path, &x, &mut y).unwrap();
            println!(
                "round {round} Q4_0 {rows}x{cols}: matvec {a:.1} GB/s, q40x8 {b:.1} GB/s ({:.2}x)",
                b / a
            );
        }
    }
}
