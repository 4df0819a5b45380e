//! Criterion benchmarks of the sparse kernels, plus a DRAM bandwidth
//! reference measured in the same run.
//!
//! `cargo bench -p kernels-neon --bench sparse -- --warm-up-time 1 --measurement-time 2`
//! (`BENCH_THREADS=n` for the pool size, default 2).
//!
//! * `matvec_rows/<format>/<rows>x<cols>/<pct>`: `matvec_rows` in
//!   `Precision::Fast` over a random (sorted, duplicate-free) subset of
//!   `pct`% of the rows (8 subsets per fraction and, for the large shape,
//!   4 distinct matrices, cycled per iteration). Throughput is in selected rows ("elements"), so
//!   criterion's time per element is the time per selected row; it should
//!   stay flat as the fraction shrinks.
//! * `axpy_rows/<format>/<neurons>x<cols>/<pct>`: the transposed down
//!   projection (`Q4_0` and `I4Hybrid` at 1% outliers) over the same kind of
//!   subsets and 4 distinct matrices, cycled per iteration (elements =
//!   selected rows).
//! * `dram/sum_256MiB/<threads>`: a streaming u64 sum over a 256 MiB buffer
//!   on 1 thread and on the pool (bytes/s), the memory bandwidth the kernels'
//!   weight bytes per second compare with.
#![allow(missing_docs)]

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
mod common;

use common::{pool, random_matrix, XorShift};
use kernels_neon::{axpy_rows, matvec_rows, Precision, QMatrix, WeightFormat};
use rayon::prelude::*;

/// A sorted random subset of `k` of the `n` rows (partial Fisher-Yates).
fn subset(n: usize, k: usize, seed: u64) -> Vec<u32> {
    let mut rng = XorShift(seed | 1);
    let mut all: Vec<u32> = (0..n as u32).collect();
    for i in 0..k {
        let j = i + (rng.next() % (n - i) as u64) as usize;
        all.swap(i, j);
    }
    all.truncate(k);
    all.sort_unstable();
    all
}

const PCTS: [usize; 5] = [5, 10, 25, 50, 100];

/// Subsets per fraction that iterations cycle through.
const SUBSETS: usize = 8;

/// `n` distinct random matrices (seeds 0..n) that iterations cycle through, like a decode step that
/// touches every layer once.
fn matrices(format: WeightFormat, rows: usize, cols: usize, n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|l| random_matrix(format, rows, cols, l as u64))
        .collect()
}

/// [`SUBSETS`] sorted random subsets of `pct`% of `rows` rows.
fn subsets(rows: usize, pct: usize) -> Vec<Vec<u32>> {
    let k = rows * pct / 100;
    (0..SUBSETS)
        .map(|s| subset(rows, k, (pct * 100 + s) as u64))
        .collect()
}

fn bench_matvec_rows(c: &mut Criterion) {
    let pool = pool();
    let mut g = c.benchmark_group("matvec_rows");
    // (format, rows, cols, layers): iterations cycle through `layers`
    // distinct matrices and `SUBSETS` subsets per fraction, like a decode
    // step that touches every layer once. 4 × 33 MB of Q4_0 is 4x this
    // machine's L3, so the large shape measures rows coming from DRAM; the
    // small one (SmolLM2-135M FFN, 553 KB) is cache-resident.
    for (format, rows, cols, layers) in [
        (WeightFormat::Q4_1, 1536, 576, 1),
        (WeightFormat::Q4_0, 14336, 4096, 4),
    ] {
        let datas = matrices(format, rows, cols, layers);
        let ws: Vec<QMatrix> = datas
            .iter()
            .map(|d| QMatrix::new(format, rows, cols, d).unwrap())
            .collect();
        let x: Vec<f32> = (0..cols)
            .map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.1)
            .collect();
        for pct in PCTS {
            let sels = subsets(rows, pct);
            let k = sels[0].len();
            let mut y = vec![0f32; k];
            g.throughput(Throughput::Elements(k as u64));
            let id = BenchmarkId::new(format!("{format:?}/{rows}x{cols}"), format!("{pct}%"));
            let mut it = 0usize;
            g.bench_function(id, |b| {
                pool.install(|| {
                    b.iter(|| {
                        it += 1;
                        let (w, sel) = (&ws[it % layers], &sels[it % SUBSETS]);
                        matvec_rows(w, sel, &x, &mut y, Precision::Fast).unwrap()
                    })
                })
            });
        }
    }
    g.finish();
}

fn bench_axpy_rows(c: &mut Criterion) {
    let pool = pool();
    let mut g = c.benchmark_group("axpy_rows");
    let (neurons, cols) = (14336, 4096);
    // Like `matvec_rows`' large shape: iterations cycle through `LAYERS`
    // distinct matrices (4 × 33 MB, beyond L3) and `SUBSETS` subsets per
    // fraction, so the selected rows come from DRAM at every fraction (one
    // matrix and one subset would leave a small selection cache-resident
    // between iterations and flatter the low fractions).
    const LAYERS: usize = 4;
    // Q4_0 and I4Hybrid at 1% outliers (k = 41).
    let hybrid = WeightFormat::hybrid_for(0.01, cols).unwrap();
    for format in [WeightFormat::Q4_0, hybrid] {
        let datas = matrices(format, neurons, cols, LAYERS);
        let ws: Vec<QMatrix> = datas
            .iter()
            .map(|d| QMatrix::new(format, neurons, cols, d).unwrap())
            .collect();
        for pct in PCTS {
            let sels = subsets(neurons, pct);
            let k = sels[0].len();
            let coeffs: Vec<f32> = (0..k).map(|i| (i % 7) as f32 * 0.1 + 0.05).collect();
            let mut y = vec![0f32; cols];
            g.throughput(Throughput::Elements(k as u64));
            let id = BenchmarkId::new(format!("{format:?}/{neurons}x{cols}"), format!("{pct}%"));
            let mut it = 0usize;
            g.bench_function(id, |b| {
                pool.install(|| {
                    b.iter(|| {
                        it += 1;
                        let (w, sel) = (&ws[it % LAYERS], &sels[it % SUBSETS]);
                        axpy_rows(w, sel, &coeffs, &mut y).unwrap()
                    })
                })
            });
        }
    }
    g.finish();
}

fn bench_dram(c: &mut Criterion) {
    let pool = pool();
    let mut g = c.benchmark_group("dram");
    g.sample_size(10);
    let buf: Vec<u64> = (0..(256usize << 20) / 8).map(|i| i as u64).collect();
    g.throughput(Throughput::Bytes((buf.len() * 8) as u64));
    g.bench_function(BenchmarkId::new("sum_256MiB", 1), |b| {
        b.iter(|| {
            std::hint::black_box(&buf)
                .iter()
                .fold(0u64, |a, &v| a.wrapping_add(v))
        })
    });
    g.bench_function(
        BenchmarkId::new("sum_256MiB", pool.current_num_threads()),
        |b| {
            pool.install(|| {
                b.iter(|| {
                    std::hint::black_box(&buf)
                        .par_chunks(1 << 17)
                        .map(|c| c.iter().fold(0u64, |a, &v| a.wrapping_add(v)))
                        .reduce(|| 0, u64::wrapping_add)
                })
            })
        },
    );
    g.finish();
}

criterion_group!(benches, bench_matvec_rows, bench_axpy_rows, bench_dram);
criterion_main!(benches);
