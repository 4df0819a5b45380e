//! Criterion benchmarks: matvec throughput in GB/s of weight bytes and
//! matmul in GFLOP/s (criterion's "elements" = flops), on a 2-thread pool.
//!
//! `cargo bench -p kernels-neon --bench kernels` (set `SPARROW_KERNELS=scalar`
//! to measure the scalar fallback, `BENCH_THREADS=n` for the pool size).
//! matvec ids are `matvec/<format>/<precision>/<rows>x<cols>` with precision
//! `Exact` (f32 activations), `Fast` (16-bit activations) or `Int8`.
#![allow(missing_docs)]

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
mod common;

use common::{pool, random_matrix};
use kernels_neon::{
    add_fixed_with, available_paths, axpy_rows_fixed_with, axpy_rows_with, matmul, matvec,
    matvec_batch, set_batch_kquants, Precision, QMatrix, WeightFormat,
};

fn bench_matvec(c: &mut Criterion) {
    let pool = pool();
    let mut g = c.benchmark_group("matvec");
    let shapes = [
        (WeightFormat::Q4_1, 576, 576),
        (WeightFormat::Q4_1, 192, 576),
        (WeightFormat::Q4_1, 1536, 576),
        (WeightFormat::Q4_1, 576, 1536),
        (WeightFormat::Q8_0, 49152, 576),
        (WeightFormat::Q4_0, 1536, 576),
        (WeightFormat::F16, 1536, 576),
        // streaming reference: 56 MB of f16, far beyond the caches
        (WeightFormat::F16, 49152, 576),
        (WeightFormat::Q8_0, 1536, 576),
        // K-quants need cols % 256 == 0; Q4_1 at the same shape for comparison
        (WeightFormat::Q4_K, 1536, 1536),
        (WeightFormat::Q5_K, 1536, 1536),
        (WeightFormat::Q6_K, 1536, 1536),
        (WeightFormat::Q2_K, 1536, 1536),
        (WeightFormat::Q3_K, 1536, 1536),
        (WeightFormat::IQ4_XS, 1536, 1536),
        // Qwen2.5-0.5B's tied Q5_0 embedding/output (896 wide), Q5_1 beside it
        (WeightFormat::Q5_0, 4864, 896),
        (WeightFormat::Q5_1, 4864, 896),
        (WeightFormat::Q4_1, 1536, 1536),
        // I4Hybrid at 1% outliers (SmolLM2 up and down shapes): f32
        // activations in every precision, so only `Exact` is measured.
        (WeightFormat::hybrid_for(0.01, 576).unwrap(), 1536, 576),
        (WeightFormat::hybrid_for(0.01, 1536).unwrap(), 576, 1536),
    ];
    for (format, rows, cols) in shapes {
        let data = random_matrix(format, rows, cols, 0);
        let w = QMatrix::new(format, rows, cols, &data).unwrap();
        let x: Vec<f32> = (0..cols)
            .map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.1)
            .collect();
        let mut y = vec![0f32; rows];
        g.throughput(Throughput::Bytes(data.len() as u64));
        for precision in [Precision::Exact, Precision::Fast, Precision::Int8] {
            if format.is_hybrid() && precision != Precision::Exact {
                continue;
            }
            let id = BenchmarkId::new(
                format!("{format:?}/{precision:?}"),
                format!("{rows}x{cols}"),
            );
            g.bench_function(id, |b| {
                pool.install(|| b.iter(|| matvec(&w, &x, &mut y, precision).unwrap()))
            });
        }
    }
    g.finish();
}

fn bench_matmul(c: &mut Criterion) {
    let pool = pool();
    let mut g = c.benchmark_group("matmul");
    g.sample_size(20);
    for (format, rows, cols, n, precision) in [
        (WeightFormat::Q4_1, 1536, 576, 64, Precision::Exact),
        (WeightFormat::Q4_1, 576, 1536, 256, Precision::Exact),
        (WeightFormat::Q4_1, 576, 576, 512, Precision::Exact),
        (WeightFormat::Q5_0, 4864, 896, 512, Precision::Exact),
        (WeightFormat::Q5_0, 4864, 896, 512, Precision::Fast),
        (WeightFormat::Q5_0, 4864, 896, 512, Precision::Int8),
        (WeightFormat::Q4_K, 896, 4864, 512, Precision::Exact),
        (WeightFormat::Q4_K, 896, 4864, 512, Precision::Fast),
        (WeightFormat::Q4_K, 896, 4864, 512, Precision::Int8),
        (WeightFormat::Q4_K, 1536, 1536, 256, Precision::Exact),
        (WeightFormat::Q4_K, 1536, 1536, 256, Precision::Int8),
        (WeightFormat::Q6_K, 1536, 1536, 256, Precision::Exact),
        (WeightFormat::Q6_K, 1536, 1536, 256, Precision::Int8),
    ] {
        let data = random_matrix(format, rows, cols, 0);
        let w = QMatrix::new(format, rows, cols, &data).unwrap();
        let x: Vec<f32> = (0..cols * n)
            .map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.1)
            .collect();
        let mut y = vec![0f32; rows * n];
        // "elements" here are flops (2 per multiply-add).
        g.throughput(Throughput::Elements((2 * rows * cols * n) as u64));
        let id = BenchmarkId::new(
            format!("{format:?}/{precision:?}"),
            format!("{rows}x{cols}xn{n}"),
        );
        g.bench_function(id, |b| {
            pool.install(|| b.iter(|| matmul(&w, &x, n, &mut y, precision).unwrap()))
        });
    }
    g.finish();
}

/// Batched decode products (`matvec_batch`, Best-of-N, speculation's verification step): weight
/// bytes per second for `n` tokens at once; ids `matvec_batch/<format>/<rows>x<cols>/<n>`. The
/// K-quants (Qwen2.5-Coder-0.5B's `ffn_down` shape) also as each token's `matvec` kernel over a row
/// chunk in turn, as before their batch kernels (`set_batch_kquants(false)`), ids
/// `matvec_batch/<format>/<rows>x<cols>/loop/<n>`, in the same run.
fn bench_matvec_batch(c: &mut Criterion) {
    let pool = pool();
    let mut g = c.benchmark_group("matvec_batch");
    for (format, rows, cols) in [
        (WeightFormat::Q4_1, 1536, 576),
        (WeightFormat::Q4_1, 576, 1536),
        (WeightFormat::Q4_1, 576, 576),
        (WeightFormat::Q8_0, 49152, 576),
        (WeightFormat::Q4_K, 896, 4864),
        (WeightFormat::Q6_K, 896, 4864),
    ] {
        let data = random_matrix(format, rows, cols, 0);
        let w = QMatrix::new(format, rows, cols, &data).unwrap();
        g.throughput(Throughput::Bytes(data.len() as u64));
        let kernels: &[bool] = if format.is_k_quant() {
            &[true, false]
        } else {
            &[true]
        };
        for n in [1, 2, 4, 8] {
            let x: Vec<f32> = (0..n * cols)
                .map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.1)
                .collect();
            let mut y = vec![0f32; n * rows];
            for &batched in kernels {
                let shape = format!("{format:?}/{rows}x{cols}");
                let id = if batched {
                    BenchmarkId::new(shape, n)
                } else {
                    BenchmarkId::new(format!("{shape}/loop"), n)
                };
                g.bench_function(id, |b| {
                    set_batch_kquants(batched);
                    pool.install(|| {
                        b.iter(|| matvec_batch(&w, &x, n, &mut y, Precision::Fast).unwrap())
                    });
                    set_batch_kquants(true);
                });
            }
        }
    }
    g.finish();
}

/// A unit's sum added into offloaded decode's fixed-point accumulator (`add_fixed`), one call over
/// `d_model` values (SmolLM2 576, Qwen2.5-0.5B 896, the 7B shape 4096), on every available path;
/// ids `add_fixed/<path>/<n>`, elements = values.
fn bench_add_fixed(c: &mut Criterion) {
    let mut g = c.benchmark_group("add_fixed");
    for n in [576, 896, 4096] {
        g.throughput(Throughput::Elements(n as u64));
        for path in available_paths() {
            let mut acc = vec![0i64; n];
            let mut x: Vec<f32> = (0..n).map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.01).collect();
            let id = BenchmarkId::new(format!("{path:?}"), n);
            // The first call clears `x`; later ones add zeros, the same work for every value below
            // the fast paths' limit.
            g.bench_function(id, |b| {
                b.iter(|| add_fixed_with(path, &mut acc, &mut x).unwrap())
            });
        }
    }
    g.finish();
}

/// A one-neuron store unit's down column (a 4096-wide Q5_0 row, the 7B shape's) added into the
/// fixed-point accumulator: `axpy_rows` into a zeroed vector then `add_fixed` (ids
/// `unit_down/two-step/<path>`) against the fused `axpy_rows_fixed` (`unit_down/fused/<path>`).
fn bench_unit_down(c: &mut Criterion) {
    let mut g = c.benchmark_group("unit_down");
    let (rows, n) = (64, 4096);
    let format = WeightFormat::Q5_0;
    let data = random_matrix(format, rows, n, 3);
    let w = QMatrix::new(format, rows, n, &data).unwrap();
    g.throughput(Throughput::Elements(n as u64));
    for path in available_paths() {
        let (mut acc, mut y) = (vec![0i64; n], vec![0f32; n]);
        let mut r = 0u32;
        g.bench_function(BenchmarkId::new("two-step", format!("{path:?}")), |b| {
            b.iter(|| {
                r = (r + 1) % rows as u32;
                axpy_rows_with(path, &w, &[r], &[0.5], &mut y).unwrap();
                add_fixed_with(path, &mut acc, &mut y).unwrap();
            })
        });
        g.bench_function(BenchmarkId::new("fused", format!("{path:?}")), |b| {
            b.iter(|| {
                r = (r + 1) % rows as u32;
                axpy_rows_fixed_with(path, &w, &[r], &[0.5], &mut y, &mut acc).unwrap();
            })
        });
    }
    g.finish();
}

criterion_group!(
    benches,
    bench_matvec,
    bench_matmul,
    bench_matvec_batch,
    bench_add_fixed,
    bench_unit_down
);
criterion_main!(benches);
