//! The kernel part of `sparrow calibrate`: weight throughput per format and thread count (dense
//! matrix-vector, row subsets, the down projection's row sums) and the cost of a batch, sampled in
//! rounds, and the timing helpers the other measurements share.
//!
//! Sampling: every point (format × threads × kernel) is timed once per round for a
//! [`ROUNDS`]th of the point's time, the rounds going over all points in turn, and the median of
//! its samples is kept. So a point's samples are spread over the whole kernel phase, and a burst of
//! load from elsewhere (on a shared machine, other tenants; on a phone, a background task) spoils
//! one or two of them rather than the whole point. Measured on the shared Zen 3 of 2026-11-27:
//! two calibrations an hour apart with one sample per point had Q8_0 at 19.5 and 13.6 GB/s.

use std::time::{Duration, Instant};

use kernels_neon::{Precision, QMatrix, WeightFormat};
use planner::KernelRate;

use crate::error::{CalibrateError, Result};

/// Rounds over which every kernel point is sampled (the median is kept).
pub(crate) const ROUNDS: usize = 5;

/// Bytes of the matrix each format's kernels are timed on: past the last-level cache of a phone or
/// a laptop (not of a server: see [`dram_matrix_bytes`]).
const MATRIX_BYTES: usize = 48 << 20;

/// Bytes of the matrix the dense kernel's DRAM rate ([`planner::KernelRate::dram_dense_bps`]) is
/// timed on, for a last-level cache of `llc` bytes: twice the cache, at most 1 GiB, where that is
/// more than [`MATRIX_BYTES`] (a server's or a VM's cache of hundreds of MiB, which holds
/// [`MATRIX_BYTES`] and a small model); `None` where [`MATRIX_BYTES`] already streams from DRAM or
/// the cache's size is unknown.
pub(crate) fn dram_matrix_bytes(llc: Option<u64>) -> Option<usize> {
    let twice = usize::try_from(llc?.saturating_mul(2)).ok()?.min(1 << 30);
    (twice > MATRIX_BYTES).then_some(twice)
}

/// Tokens of the batched product whose cost calibration measures (the Best-of-N size issue targets
/// use; the planner extrapolates linearly to other batch sizes).
const BATCH_TOKENS: usize = 4;

/// Runs `f` repeatedly for about `time` (at least twice, after one call to warm up) and returns
/// seconds per call.
pub(crate) fn per_call(time: Duration, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    f()?; // warm up
    let start = Instant::now();
    let mut n = 0u32;
    while n < 2 || start.elapsed() < time {
        f()?;
        n += 1;
    }
    Ok(start.elapsed().as_secs_f64() / n as f64)
}

/// A rayon pool of `threads` threads.
pub(crate) fn pool(threads: usize) -> Result<rayon::ThreadPool> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| CalibrateError::Measure(format!("thread pool: {e}")))
}

/// A kernel error as a calibration failure.
pub(crate) fn kernel_err(e: kernels_neon::KernelError) -> CalibrateError {
    CalibrateError::Measure(format!("calibration kernel: {e}"))
}

/// Deterministic noise for weights and offsets.
pub(crate) struct XorShift(pub(crate) u64);

impl XorShift {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Fills `buf` with noise.
    pub(crate) fn fill(&mut self, buf: &mut [u8]) {
        for c in buf.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
    }
}

/// The kernels timed per format and thread count.
#[derive(Clone, Copy)]
enum Kernel {
    Dense,
    Sparse,
    Axpy,
    /// [`BATCH_TOKENS`] tokens through `matvec_batch` (at the most threads only).
    Batch,
    /// The dense product over the matrix of [`dram_matrix_bytes`], larger than the cache.
    DramDense,
    /// Offloaded decode's gate/up per store unit of one neuron: one `matvec_rows_prepared` call
    /// over two adjacent rows (the unit's gate and up rows), units scattered over the matrix of
    /// [`dram_matrix_bytes`] where there is one (a neuron cache larger than the last-level cache),
    /// each thread taking its share of the units one by one.
    UnitRows,
    /// Offloaded decode's down projection per store unit of one neuron: one `axpy_rows_fixed`
    /// call over one row into the thread's fixed-point sum, units as [`Kernel::UnitRows`].
    UnitAxpy,
}

/// One format's matrix and buffers.
struct FormatBench {
    format: WeightFormat,
    data: Vec<u8>,
    rows: usize,
    cols: usize,
    x: Vec<f32>,
    y: Vec<f32>,
    /// Three disjoint sets of 30% of the rows, taken in turn: the rows a call reads were not read
    /// by the call before (in decode they were last read a whole model ago), so they come from
    /// DRAM and not from the cache the previous call filled.
    sets: Vec<Vec<u32>>,
    per_set: usize,
    turn: usize,
}

impl FormatBench {
    fn new(format: WeightFormat) -> Result<Self> {
        let cols = 4096usize;
        let row_bytes = format
            .row_bytes(cols)
            .ok_or_else(|| CalibrateError::Measure(format!("{format}: no row size")))?;
        let rows = (MATRIX_BYTES / row_bytes).max(256) & !63;
        let mut data = vec![0u8; rows * row_bytes];
        // Scales of random bytes may be NaN or huge; the time of the arithmetic does not depend
        // on it.
        XorShift(0x9e37_79b9_7f4a_7c15).fill(&mut data);
        let x = (0..cols)
            .map(|i| ((i * 7919) % 97) as f32 / 97.0 - 0.5)
            .collect();
        let sets: Vec<Vec<u32>> = (0..3u32)
            .map(|k| (0..rows as u32).filter(|r| r % 10 / 3 == k).collect())
            .collect();
        let per_set = sets.iter().map(Vec::len).min().unwrap_or(0);
        Ok(FormatBench {
            format,
            data,
            rows,
            cols,
            x,
            y: vec![0f32; rows],
            sets,
            per_set,
            turn: 0,
        })
    }

    /// Bytes of weights one call of `kernel` reads (`dram`: the large matrix's bytes).
    fn bytes(&self, kernel: Kernel, dram: &[u8]) -> f64 {
        let all = self.data.len() as f64;
        match kernel {
            Kernel::Dense | Kernel::Batch => all,
            Kernel::Sparse | Kernel::Axpy => all * self.per_set as f64 / self.rows as f64,
            Kernel::DramDense => (self.dram_rows(dram) * self.row_bytes()) as f64,
            Kernel::UnitRows => (self.units() * 2 * self.row_bytes()) as f64,
            Kernel::UnitAxpy => (self.units() * self.row_bytes()) as f64,
        }
    }

    /// Store units one call of [`Kernel::UnitRows`] or [`Kernel::UnitAxpy`] computes: the rows of
    /// one [`Kernel::Sparse`] call, as pairs.
    fn units(&self) -> usize {
        self.per_set / 2
    }

    /// Bytes of one row of this format's matrix.
    fn row_bytes(&self) -> usize {
        self.data.len() / self.rows
    }

    /// Rows of this format in `dram` (whole multiples of 64).
    fn dram_rows(&self, dram: &[u8]) -> usize {
        (dram.len() / self.row_bytes()) & !63
    }

    /// Seconds per call of `kernel` on `threads` threads of `p`, timed for about `time` (`dram`:
    /// the bytes of [`Kernel::DramDense`]'s matrix, shared by the formats).
    fn time(
        &mut self,
        kernel: Kernel,
        threads: usize,
        p: &rayon::ThreadPool,
        time: Duration,
        dram: &[u8],
    ) -> Result<f64> {
        // The DRAM rate's kernel and the unit kernels read the large matrix where there is one.
        let (rows, data) = match kernel {
            Kernel::DramDense | Kernel::UnitRows | Kernel::UnitAxpy if !dram.is_empty() => {
                let rows = self.dram_rows(dram);
                (rows, &dram[..rows * self.row_bytes()])
            }
            _ => (self.rows, &self.data[..]),
        };
        let units = self.units();
        let w = QMatrix::new(self.format, rows, self.cols, data)
            .map_err(|e| CalibrateError::Measure(format!("calibration matrix: {e}")))?;
        let (x, y, sets, per_set) = (&self.x, &mut self.y, &self.sets, self.per_set);
        let turn = &mut self.turn;
        p.install(|| match kernel {
            Kernel::Dense => per_call(time, || {
                kernels_neon::matvec(&w, x, y, Precision::Fast).map_err(kernel_err)
            }),
            Kernel::Sparse => per_call(time, || {
                *turn += 1;
                let picked = &sets[*turn % 3][..per_set];
                kernels_neon::matvec_rows(&w, picked, x, &mut y[..per_set], Precision::Fast)
                    .map_err(kernel_err)
            }),
            Kernel::Axpy => {
                // Sparse decode's down projection: each thread sums its own share of the picked
                // rows (the matrix read as transposed rows), as the workers of a sparse FFN step do.
                let share = per_set.div_ceil(threads).max(1);
                let coeffs = vec![0.5f32; share];
                let mut acc = vec![vec![0f32; self.cols]; threads];
                per_call(time, || {
                    use rayon::prelude::*;
                    *turn += 1;
                    let picked = &sets[*turn % 3][..per_set];
                    acc.par_iter_mut()
                        .zip(picked.par_chunks(share))
                        .try_for_each(|(y, rows)| {
                            kernels_neon::axpy_rows(&w, rows, &coeffs[..rows.len()], y)
                                .map_err(kernel_err)
                        })
                })
            }
            Kernel::DramDense => {
                let mut y = vec![0f32; rows];
                per_call(time, || {
                    kernels_neon::matvec(&w, x, &mut y, Precision::Fast).map_err(kernel_err)
                })
            }
            Kernel::UnitRows | Kernel::UnitAxpy => {
                use rayon::prelude::*;
                // Unit i of a call: rows 2j and 2j + 1, j spread over the matrix and moving on with
                // each call, so that a call's rows were not read by the calls just before it.
                let pairs = (rows / 2).max(1);
                let share = units.div_ceil(threads).max(1);
                let acts = kernels_neon::prepare_acts(self.format, x, Precision::Fast);
                let cols = self.cols;
                let mut state: Vec<(Vec<i64>, Vec<f32>)> = (0..threads)
                    .map(|_| (vec![0; cols], vec![0.0; cols]))
                    .collect();
                per_call(time, || {
                    *turn += 1;
                    let start = *turn * units;
                    state
                        .par_iter_mut()
                        .enumerate()
                        .try_for_each(|(t, (acc, scratch))| {
                            let mut g = [0f32; 2];
                            for i in t * share..((t + 1) * share).min(units) {
                                let r = ((start + i) * 7919 % pairs * 2) as u32;
                                match kernel {
                                    Kernel::UnitRows => kernels_neon::matvec_rows_prepared(
                                        &acts,
                                        &w,
                                        &[r, r + 1],
                                        &mut g,
                                    ),
                                    _ => kernels_neon::axpy_rows_fixed(
                                        &w,
                                        &[r],
                                        &[0.5],
                                        scratch,
                                        acc,
                                    ),
                                }
                                .map_err(kernel_err)?;
                            }
                            Ok(())
                        })
                })
            }
            Kernel::Batch => {
                let n = BATCH_TOKENS;
                let xb: Vec<f32> = (0..n).flat_map(|_| x.iter().copied()).collect();
                let mut yb = vec![0f32; w.rows() * n];
                per_call(time, || {
                    kernels_neon::matvec_batch(&w, &xb, n, &mut yb, Precision::Fast)
                        .map_err(kernel_err)
                })
            }
        })
    }
}

/// The median of `v` (not empty).
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The kernels' rates for every format of `formats` at 1..=`max_threads` threads, sampled in
/// [`ROUNDS`] rounds of `point_time / ROUNDS` per point (see the module docs), and the batch
/// cost of the first format. `progress` hears once per round, then once per format and thread
/// count with its dense rate.
pub(crate) fn measure_kernels(
    formats: &[WeightFormat],
    max_threads: usize,
    point_time: Duration,
    llc: Option<u64>,
    progress: &mut dyn FnMut(&str),
) -> Result<(Vec<KernelRate>, f64)> {
    // The large matrix of the DRAM rates, random bytes that every format reads as its own.
    let dram = dram_matrix_bytes(llc).map_or_else(Vec::new, |n| {
        let mut v = vec![0u8; n];
        XorShift(0x6a09_e667_f3bc_c909).fill(&mut v);
        v
    });
    let mut benches = formats
        .iter()
        .map(|&f| FormatBench::new(f))
        .collect::<Result<Vec<_>>>()?;
    let pools = (1..=max_threads).map(pool).collect::<Result<Vec<_>>>()?;
    let mut kernels = vec![
        Kernel::Dense,
        Kernel::Sparse,
        Kernel::Axpy,
        Kernel::Batch,
        Kernel::UnitRows,
        Kernel::UnitAxpy,
    ];
    if !dram.is_empty() {
        kernels.push(Kernel::DramDense);
    }
    // samples[format][threads - 1][kernel]: seconds per call, one per round.
    let mut samples =
        vec![vec![vec![Vec::with_capacity(ROUNDS); kernels.len()]; max_threads]; formats.len()];
    let slice = point_time / ROUNDS as u32;
    for round in 0..ROUNDS {
        for (b, per_format) in benches.iter_mut().zip(samples.iter_mut()) {
            for (t, per_threads) in per_format.iter_mut().enumerate() {
                for (k, &kernel) in kernels.iter().enumerate() {
                    if matches!(kernel, Kernel::Batch) && t + 1 != max_threads {
                        continue;
                    }
                    per_threads[k].push(b.time(kernel, t + 1, &pools[t], slice, &dram)?);
                }
            }
        }
        progress(&format!("kernels: round {} of {ROUNDS}", round + 1));
    }
    let mut out = Vec::new();
    let mut first_batch_cost = None;
    for (b, per_format) in benches.iter().zip(samples.iter_mut()) {
        for (t, per_threads) in per_format.iter_mut().enumerate() {
            let dense = median(&mut per_threads[0]);
            let mut rate = KernelRate {
                format: b.format.name().to_string(),
                threads: (t + 1) as u32,
                dense_bps: b.bytes(Kernel::Dense, &dram) / dense,
                sparse_bps: b.bytes(Kernel::Sparse, &dram) / median(&mut per_threads[1]),
                axpy_bps: b.bytes(Kernel::Axpy, &dram) / median(&mut per_threads[2]),
                batch_cost: 0.0,
                dram_dense_bps: match per_threads.get_mut(6) {
                    Some(s) => b.bytes(Kernel::DramDense, &dram) / median(s),
                    None => 0.0,
                },
                unit_rows_bps: b.bytes(Kernel::UnitRows, &dram) / median(&mut per_threads[4]),
                unit_axpy_bps: b.bytes(Kernel::UnitAxpy, &dram) / median(&mut per_threads[5]),
            };
            let mut batch = String::new();
            if t + 1 == max_threads {
                let batched = median(&mut per_threads[3]);
                let cost = ((batched / dense - 1.0) / (BATCH_TOKENS - 1) as f64).max(0.0);
                // Never 0 (which reads as "not measured"): a batch costs at least a little more.
                rate.batch_cost = cost.max(1e-3);
                first_batch_cost.get_or_insert(cost);
                batch =
                    format!(", each further token of a batch of {BATCH_TOKENS} {cost:.2} of one");
            }
            let past_cache = if rate.dram_dense_bps > 0.0 {
                format!(" ({:.2} past the cache)", rate.dram_dense_bps / 1e9)
            } else {
                String::new()
            };
            progress(&format!(
                "{} at {} threads: {:.2} GB/s{past_cache}; one store unit a call: gate/up {:.2}, \
                 down {:.2}{batch}",
                b.format,
                t + 1,
                rate.dense_bps / 1e9,
                rate.unit_rows_bps / 1e9,
                rate.unit_axpy_bps / 1e9,
            ));
            out.push(rate);
        }
    }
    Ok((out, first_batch_cost.unwrap_or(1.0)))
}
