//! One `matmul` (or `matvec` for `n = 1`) of a matrix of SmolLM-like values, repeated `REPS`
//! times on one thread, for `perf stat -e task-clock` A/B runs on a machine loaded by others: the
//! CPU time a run takes does not count the time slices other processes get, where wall time does.
//! Subtract a run with `REPS = 0` (making the matrix) from one with `REPS > 0`.
//!
//! `SPARROW_KERNELS=avx2 perf stat -e task-clock target/release/examples/matmul_once q4_0 fast 128 10`
//! (format: q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q5_k, q6_k; precision: exact, fast, int8; then the
//! token count and REPS; `ROWSxCOLS` as a fifth argument, default 2816x1024).

use kernels_neon::*;

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let usage = "usage: matmul_once FORMAT exact|fast|int8 N REPS [ROWSxCOLS]";
    assert!(a.len() >= 5, "{usage}");
    let format = match a[1].to_ascii_lowercase().as_str() {
        "q4_0" => WeightFormat::Q4_0,
        "q4_1" => WeightFormat::Q4_1,
        "q5_0" => WeightFormat::Q5_0,
        "q5_1" => WeightFormat::Q5_1,
        "q8_0" => WeightFormat::Q8_0,
        "q4_k" => WeightFormat::Q4_K,
        "q5_k" => WeightFormat::Q5_K,
        "q6_k" => WeightFormat::Q6_K,
        other => panic!("format `{other}`? {usage}"),
    };
    let precision = match a[2].as_str() {
        "exact" => Precision::Exact,
        "fast" => Precision::Fast,
        "int8" => Precision::Int8,
        other => panic!("precision `{other}`? {usage}"),
    };
    let n: usize = a[3].parse().expect(usage);
    let reps: usize = a[4].parse().expect(usage);
    let (rows, cols) = a.get(5).map_or((2816, 1024), |s| {
        let (r, c) = s.split_once('x').expect(usage);
        (r.parse().expect(usage), c.parse().expect(usage))
    });
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let src: Vec<f32> = (0..rows * cols)
        .map(|i| ((i * 7919) % 1013) as f32 / 1013.0 - 0.5)
        .collect();
    let data = quantize_matrix(format, &src, rows, cols).unwrap();
    let w = QMatrix::new(format, rows, cols, &data).unwrap();
    let x: Vec<f32> = (0..n * cols)
        .map(|i| ((i * 31) % 61) as f32 / 61.0 - 0.5)
        .collect();
    let mut y = vec![0f32; n * rows];
    pool.install(|| {
        for _ in 0..reps {
            if n == 1 {
                matvec(&w, &x, &mut y, precision).unwrap();
            } else {
                matmul(&w, &x, n, &mut y, precision).unwrap();
            }
        }
    });
    // Printed so that the products are not optimized away.
    println!("{}", y.iter().sum::<f32>());
}
