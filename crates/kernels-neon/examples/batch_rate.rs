//! `matvec_batch`'s cost per extra token on the AVX-512 path (`AVX2=1`: the AVX2 path; `COPIES=1`:
//! on the matrix's eight-row copies, `Q40x8::matvec_batch`): for each format and shape, the best
//! time of one token's `matvec` and of `matvec_batch` over `n` tokens, and the cost of each extra
//! token relative to one token, `(T(n) - T(1)) / ((n - 1) T(1))` (what a speculative verification
//! step of `n` tokens pays). Sizes interleaved rep by rep; best of `REPS`; `THREADS` (default 1).
//!
//! `cargo run --profile ci -p kernels-neon --example batch_rate [-- q5_0,q8_0 [2,3,4,8]]`
//! (`SHAPES=4864x896,...`, default Qwen2.5-0.5B's gate and output shapes)

use kernels_neon::*;
use std::time::Instant;

fn main() {
    let env = |k: &str, d: usize| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let (threads, reps) = (env("THREADS", 1), env("REPS", 30));
    let path = if env("AVX2", 0) == 1 {
        KernelPath::Avx2Fma
    } else {
        KernelPath::Avx512
    };
    let copies = env("COPIES", 0) == 1;
    let tile = env("MATMUL", 0) == 1;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    let mut args = std::env::args().skip(1);
    let formats: Vec<WeightFormat> = args
        .next()
        .unwrap_or_else(|| "q5_0,q8_0".into())
        .split(',')
        .map(|n| {
            WeightFormat::GGML
                .into_iter()
                .find(|f| f.name().eq_ignore_ascii_case(n))
                .unwrap_or_else(|| panic!("unknown format `{n}`"))
        })
        .collect();
    let ns: Vec<usize> = args
        .next()
        .unwrap_or_else(|| "2,3,4,8".into())
        .split(',')
        .map(|s| s.parse().expect("a token count"))
        .collect();
    let shapes: Vec<(usize, usize)> = std::env::var("SHAPES")
        .unwrap_or_else(|_| "4864x896,16384x896".into())
        .split(',')
        .map(|s| {
            let (r, c) = s.split_once('x').expect("SHAPES: ROWSxCOLS,...");
            (r.parse().expect("rows"), c.parse().expect("cols"))
        })
        .collect();
    let nmax = ns.iter().copied().max().unwrap_or(1);
    for format in formats {
        for &(rows, cols) in &shapes {
            let src: Vec<f32> = (0..rows * cols)
                .map(|i| ((i * 7919) % 1013) as f32 / 1013.0 - 0.5)
                .collect();
            let data = quantize_matrix(format, &src, rows, cols).unwrap();
            let w = QMatrix::new(format, rows, cols, &data).unwrap();
            let packed = copies.then(|| Q40x8::repack(&w).expect("a format the copies take"));
            let x: Vec<f32> = (0..nmax * cols)
                .map(|i| ((i * 31) % 61) as f32 / 61.0 - 0.5)
                .collect();
            let mut y = vec![0f32; nmax * rows];
            let mut sizes = vec![1];
            sizes.extend(&ns);
            let mut best = vec![f64::MAX; sizes.len()];
            for _ in 0..reps + 2 {
                for (i, &n) in sizes.iter().enumerate() {
                    let t = Instant::now();
                    pool.install(|| {
                        let (xs, ys) = (&x[..n * cols], &mut y[..n * rows]);
                        match &packed {
                            Some(p) => p.matvec_batch_with(path, xs, n, ys),
                            None if tile => kernels_neon::matmul(&w, xs, n, ys, Precision::Fast),
                            None => matvec_batch_with(path, &w, xs, n, ys, Precision::Fast),
                        }
                        .unwrap()
                    });
                    best[i] = best[i].min(t.elapsed().as_secs_f64());
                }
            }
            let mut line = format!("{format:?} {rows}x{cols}: n=1 {:.3} ms", best[0] * 1e3);
            for (i, &n) in sizes.iter().enumerate().skip(1) {
                let extra = (best[i] - best[0]) / ((n - 1) as f64 * best[0]);
                line += &format!("  n={n} {:.3} ms (extra {extra:.3})", best[i] * 1e3);
            }
            println!("{line}");
        }
    }
}
