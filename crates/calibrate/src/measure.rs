//! `sparrow calibrate`: measures this machine for the planner ([`planner::DeviceProfile`]) in about a
//! minute: the kernels' weight throughput per format and thread count (dense matrix-vector and
//! row-subset products over 48 MiB matrices, and where the last-level cache is larger than that,
//! the dense product again over twice the cache, sampled in rounds: `kernels`), the size
//! of that cache, DRAM read bandwidth, the cost of a
//! batch, and flash random-read throughput by read size and queue depth with direct I/O through
//! `ufs-io` (one I/O thread, as the engine reads), plus sequential bandwidth, the fixed cost of a
//! parallel kernel call and sparse selection's serial cost per neuron (`select_cost`); and, when
//! asked, an accelerator's rate (`accel`).
//!
//! The flash figures are measured on a scratch file in the folder given (the folder the models live
//! in, so the same device), written once, read with direct I/O through `ufs-io` so the page cache is out of play,
//! and removed afterwards.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kernels_neon::{Precision, QMatrix, WeightFormat};
use planner::{CallOverhead, DeviceProfile, IoRate};
use ufs_io::{IoConfig, IoEngine, OpenOptions, ReadRequest};

use crate::accel::measure_accel;
use crate::error::{CalibrateError, Result};
use crate::kernels::{
    dram_matrix_bytes, kernel_err, measure_kernels, per_call, pool, XorShift, ROUNDS,
};
use crate::prompt::{measure_prompt, Timing, PROMPT_TOKENS};
use offload::accel::AccelKind;

/// What to measure.
#[derive(Debug, Clone)]
pub struct CalibrateOptions {
    /// Folder for the flash scratch file (on the device the models are read from).
    pub dir: PathBuf,
    /// Size of the scratch file, bytes (larger than any cache in the way).
    pub file_bytes: u64,
    /// Time spent on each measured point.
    pub point_time: Duration,
    /// Weight formats to measure.
    pub formats: Vec<WeightFormat>,
    /// Largest thread count (default: the cores).
    pub max_threads: usize,
    /// Read sizes, bytes (multiples of 4096).
    pub read_sizes: Vec<u32>,
    /// Queue depths.
    pub queue_depths: Vec<u32>,
    /// An accelerator to measure for hybrid decode (`accel`), first, so that a backend
    /// that does not open fails the run before the minute of the rest.
    pub accel: Option<AccelKind>,
}

impl CalibrateOptions {
    /// The defaults for scratch folder `dir`: about a minute on a 2-core machine.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        CalibrateOptions {
            dir: dir.into(),
            file_bytes: 512 << 20,
            point_time: Duration::from_millis(300),
            formats: vec![
                WeightFormat::Q4_0,
                WeightFormat::Q4_1,
                WeightFormat::Q8_0,
                WeightFormat::Q4_K,
                WeightFormat::Q6_K,
                WeightFormat::Q5_0,
            ],
            max_threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            // Up to the reads the I/O thread coalesces touching unit reads into (512 KiB at most).
            read_sizes: vec![4096, 16384, 65536, 262144],
            queue_depths: vec![1, 8, 32, 128],
            accel: None,
        }
    }

    /// A smaller, faster run (tests): small file, short points, two formats.
    pub fn quick(dir: impl Into<PathBuf>) -> Self {
        CalibrateOptions {
            file_bytes: 16 << 20,
            point_time: Duration::from_millis(20),
            formats: vec![WeightFormat::Q4_0, WeightFormat::Q8_0],
            read_sizes: vec![4096, 16384],
            queue_depths: vec![1, 8],
            ..CalibrateOptions::new(dir)
        }
    }

    /// Measured points, for a progress bar (one per progress message of [`calibrate`]): the kernel
    /// rounds, then kernels per format and thread count, the prompt tile, DRAM and the scratch file, flash reads per size
    /// and depth, idle then beside busy cores, then sequential reads, the call overhead and the
    /// selection cost.
    pub fn steps(&self) -> u64 {
        (ROUNDS
            + self.formats.len() * self.max_threads
            + 3
            + 2 * self.read_sizes.len() * self.queue_depths.len()
            + 3
            + usize::from(self.accel.is_some())) as u64
    }
}

/// DRAM read bandwidth: a sum over a buffer far larger than the caches (256 MiB, or twice a
/// larger last-level cache of `llc` bytes), one thread per core.
fn measure_dram(o: &CalibrateOptions, llc: Option<u64>) -> Result<f64> {
    let bytes = dram_matrix_bytes(llc).unwrap_or(0).max(256 << 20);
    let words = bytes / 8;
    let buf: Vec<u64> = (0..words as u64).collect();
    let p = pool(o.max_threads)?;
    let secs = per_call(o.point_time, || {
        use rayon::prelude::*;
        let s: u64 = p.install(|| {
            buf.par_chunks(1 << 16)
                .map(|c| c.iter().fold(0u64, |a, &b| a.wrapping_add(b)))
                .sum()
        });
        std::hint::black_box(s);
        Ok(())
    })?;
    Ok((words * 8) as f64 / secs)
}

/// A scratch file that removes itself.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn write_scratch(o: &CalibrateOptions) -> Result<Scratch> {
    let path = o
        .dir
        .join(format!(".sparrow-calibrate-{}.tmp", std::process::id()));
    let io = |e: std::io::Error| CalibrateError::Measure(format!("{}: {e}", path.display()));
    let scratch = Scratch(path.clone());
    let mut f = std::fs::File::create(&path).map_err(io)?;
    let mut rng = XorShift(0x2545_f491_4f6c_dd1d);
    let mut chunk = vec![0u8; 1 << 20];
    let mut left = o.file_bytes;
    while left > 0 {
        rng.fill(&mut chunk);
        let n = left.min(chunk.len() as u64) as usize;
        f.write_all(&chunk[..n]).map_err(io)?;
        left -= n as u64;
    }
    f.sync_all().map_err(io)?;
    Ok(scratch)
}

/// One thread per core computing (f32 dot products over 64 KiB, in cache) until dropped: the
/// compute threads of offloaded decode, beside which its I/O thread reads.
struct Busy {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Busy {
    fn start(threads: usize) -> Busy {
        use std::sync::atomic::{AtomicBool, Ordering};
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let threads = (0..threads)
            .map(|i| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let a: Vec<f32> = (0..8192).map(|j| (j + i) as f32 * 1e-4).collect();
                    let mut s = 0f32;
                    while !stop.load(Ordering::Relaxed) {
                        s += kernels_neon::dot_f32(&a, &a);
                    }
                    std::hint::black_box(s);
                })
            })
            .collect();
        Busy { stop, threads }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in self.threads.drain(..) {
            t.join().ok();
        }
    }
}

/// Random reads of `size` bytes at `depth` in flight for about `time`: bytes per second.
fn measure_random(
    path: &Path,
    file_bytes: u64,
    size: u32,
    depth: u32,
    time: Duration,
) -> Result<f64> {
    let eng = IoEngine::new(IoConfig {
        queue_depth: depth as usize,
        max_merge: size as usize,
        ..IoConfig::default()
    })?;
    let file = eng.open(path, OpenOptions::default())?;
    let slots = file_bytes / size as u64;
    let mut rng = XorShift(0x1234_5678_9abc_def1 ^ ((size as u64) << 8) ^ depth as u64);
    let start = Instant::now();
    let (mut sent, mut done, mut bytes) = (0u64, 0u64, 0u64);
    loop {
        let stop = start.elapsed() >= time;
        while !stop && sent - done < depth as u64 {
            let offset = rng.next() % slots * size as u64;
            eng.submit(ReadRequest {
                file,
                offset,
                len: size as usize,
                tag: sent,
            })?;
            sent += 1;
        }
        if done == sent {
            break;
        }
        let c = eng
            .completions()
            .recv()
            .map_err(|_| CalibrateError::Measure("the I/O thread stopped".into()))?;
        bytes += c.result?.len() as u64;
        done += 1;
    }
    Ok(bytes as f64 / start.elapsed().as_secs_f64())
}

/// Sequential reads of the whole scratch file as a streamed output projection reads its file
/// ([`transformer::stream`]): direct reads of one [`transformer::stream::OUTPUT_CHUNK`] after another into a
/// reused buffer. Bytes per second.
fn measure_sequential(path: &Path, file_bytes: u64) -> Result<f64> {
    let file = ufs_io::IoFile::open(path, OpenOptions::default())?;
    let chunk = transformer::stream::OUTPUT_CHUNK;
    let mut buf = ufs_io::AlignedBuf::new(chunk)?;
    let start = Instant::now();
    let mut off = 0u64;
    while off + chunk as u64 <= file_bytes {
        file.read_into(off, &mut buf)?;
        off += chunk as u64;
    }
    Ok(off.max(1) as f64 / start.elapsed().as_secs_f64())
}

/// A fingerprint of this machine: CPU model and core count.
pub fn device_fingerprint() -> (String, u64) {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| {
                    l.starts_with("model name")
                        || l.starts_with("Hardware")
                        || l.starts_with("CPU part")
                })
                .and_then(|l| l.split(':').nth(1))
                .map(|v| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let name = format!("{cpu}, {cores} cores");
    (name.clone(), planner::fnv1a64(name.as_bytes()))
}

/// Measures this machine; `progress` is called after each point with a line of what was measured.
pub fn calibrate(o: &CalibrateOptions, mut progress: impl FnMut(&str)) -> Result<DeviceProfile> {
    if o.max_threads == 0
        || o.formats.is_empty()
        || o.read_sizes.is_empty()
        || o.queue_depths.is_empty()
    {
        return Err(CalibrateError::Measure(
            "calibrate: nothing to measure".into(),
        ));
    }
    if o.read_sizes.iter().any(|s| s % 4096 != 0 || *s == 0) {
        return Err(CalibrateError::Measure(
            "calibrate: read sizes must be multiples of 4096".into(),
        ));
    }
    let mut accelerators = Vec::new();
    if let Some(kind) = &o.accel {
        let a = measure_accel(kind, o.point_time)?;
        progress(&format!(
            "{} accelerator: {:.2} G multiply-adds/s, {:.1} µs per call, a batch of b costs 1 + {:.2}·(b − 1) tokens",
            a.name,
            a.macs_per_s / 1e9,
            a.call_ns / 1e3,
            a.batch_cost
        ));
        accelerators.push(a);
    }
    let llc = crate::llc::last_level_cache_bytes();
    let (kernels, batch_cost) =
        measure_kernels(&o.formats, o.max_threads, o.point_time, llc, &mut progress)?;
    let prompt = measure_prompt(Timing {
        threads: o.max_threads,
        point_time: o.point_time,
    })?;
    progress(&format!(
        "prompt tile ({PROMPT_TOKENS} tokens): {:.1} GFLOP/s; long prompts: {}, transposed {:.1}; short prompts {:.1}",
        prompt.flops / 1e9,
        prompt
            .by_format
            .iter()
            .map(|r| format!("{} {:.1}", r.format, r.flops / 1e9))
            .collect::<Vec<_>>()
            .join(", "),
        prompt.t_flops / 1e9,
        prompt.short_flops / 1e9
    ));
    let dram_bps = measure_dram(o, llc)?;
    progress(&format!("DRAM: {:.1} GB/s", dram_bps / 1e9));
    let scratch = write_scratch(o)?;
    progress(&format!(
        "scratch file of {} MiB written in {}",
        o.file_bytes >> 20,
        o.dir.display()
    ));
    let flash_random = measure_flash_random(o, &scratch.0, false, &mut progress)?;
    let flash_random_busy = measure_flash_random(o, &scratch.0, true, &mut progress)?;
    let flash_seq_bps = measure_sequential(&scratch.0, o.file_bytes)?;
    progress(&format!(
        "flash sequential: {:.0} MB/s",
        flash_seq_bps / 1e6
    ));
    drop(scratch);
    let call_overhead = measure_call_overhead(o)?;
    progress(&format!(
        "fixed cost of a parallel kernel call: {}",
        call_overhead
            .iter()
            .map(|c| format!("{:.1} µs at {} thread(s)", c.ns / 1e3, c.threads))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    let select_ns = crate::select_cost::select_ns(o.point_time, |t, f| per_call(t, f))?;
    progress(&format!(
        "sparse selection: {select_ns:.1} ns per candidate neuron"
    ));
    let (name, fingerprint) = device_fingerprint();
    Ok(DeviceProfile {
        name,
        fingerprint,
        cores: o.max_threads as u32,
        dram_bps,
        batch_cost,
        kernels,
        flash_random,
        flash_random_busy,
        flash_seq_bps,
        flash_path: o.dir.display().to_string(),
        call_overhead,
        select_ns,
        prompt_flops: prompt.flops,
        prompt_t_flops: prompt.t_flops,
        prompt_rates: prompt.by_format,
        prompt_short_flops: prompt.short_flops,
        prompt_tile_min_tokens: kernels_neon::INT_TILE_MIN_TOKENS as u32,
        accelerators,
        llc_bytes: llc.unwrap_or(0),
    })
}

/// Random reads of each size at each queue depth from the scratch file at `path`; with `busy`, while
/// every core computes (as reads run during decode).
fn measure_flash_random(
    o: &CalibrateOptions,
    path: &Path,
    busy: bool,
    progress: &mut impl FnMut(&str),
) -> Result<Vec<IoRate>> {
    let mut rates = Vec::new();
    for &size in &o.read_sizes {
        for &depth in &o.queue_depths {
            let load = busy.then(|| Busy::start(o.max_threads));
            let bps = measure_random(path, o.file_bytes, size, depth, o.point_time);
            drop(load);
            let bps = bps?;
            progress(&format!(
                "flash random {} KiB reads, depth {depth}{}: {:.0} MB/s",
                size / 1024,
                if busy { ", cores busy" } else { "" },
                bps / 1e6
            ));
            rates.push(IoRate {
                read_bytes: size,
                queue_depth: depth,
                bps,
            });
        }
    }
    Ok(rates)
}

/// The fixed cost of one parallel kernel call per thread count: a matrix-vector product over a
/// 64 × 576 Q8_0 matrix (36 KiB, in cache, about a microsecond of arithmetic), so the time is the
/// call's own (splitting the rows, waking the threads, joining, quantizing the input).
fn measure_call_overhead(o: &CalibrateOptions) -> Result<Vec<CallOverhead>> {
    let (rows, cols, format) = (64usize, 576usize, WeightFormat::Q8_0);
    let rb = format
        .row_bytes(cols)
        .ok_or_else(|| CalibrateError::Measure("Q8_0: no row size".into()))?;
    let mut data = vec![0u8; rows * rb];
    XorShift(0x2545_f491_4f6c_dd1d).fill(&mut data);
    let w = QMatrix::new(format, rows, cols, &data)
        .map_err(|e| CalibrateError::Measure(format!("calibration matrix: {e}")))?;
    let x = vec![0.25f32; cols];
    let mut y = vec![0f32; rows];
    (1..=o.max_threads)
        .map(|t| {
            let p = pool(t)?;
            let secs = p.install(|| {
                per_call(o.point_time, || {
                    kernels_neon::matvec(&w, &x, &mut y, Precision::Fast).map_err(kernel_err)
                })
            })?;
            Ok(CallOverhead {
                threads: t as u32,
                ns: secs * 1e9,
            })
        })
        .collect()
}
