//! The device profile: what `sparrow calibrate` measures about a machine, in the units the cost model
//! uses (bytes per second of weights streamed through the kernels, of DRAM, of flash).

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::container;
use crate::error::{PlannerError, Result};

/// Kind word of a device-profile file's header.
pub const DEVICE_KIND: &str = "sparrow-device";
/// Version of the device-profile payload this build reads and writes.
pub const DEVICE_VERSION: u32 = 1;

/// The rate of a long prompt's batched product for one weight format.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PromptRate {
    /// Weight format name (as [`KernelRate::format`]).
    pub format: String,
    /// Floating-point operations per second (2 per multiply-add) at the most threads.
    pub flops: f64,
}

/// Weight throughput of the kernels for one weight format at one thread count.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelRate {
    /// Weight format name as `tensor_types::WeightFormat::name` spells it (`"Q4_0"`, `"Q4_K"`, ...;
    /// compared without regard to case).
    pub format: String,
    /// Compute threads.
    pub threads: u32,
    /// Bytes of weights per second through the dense matrix-vector kernel (one token).
    pub dense_bps: f64,
    /// Bytes of weights per second through the row-subset (sparse) kernels, rows picked at random.
    pub sparse_bps: f64,
    /// Bytes of weights per second through the weighted row sums of sparse decode's down projection
    /// (`axpy_rows` over transposed rows picked at random, one list per thread); 0 in profiles of
    /// older builds (then `sparse_bps`).
    #[serde(default)]
    pub axpy_bps: f64,
    /// Marginal cost of each further token of a batched decode product in this format, as a
    /// fraction of one token's (measured at the most threads; 0 where not measured: then
    /// [`DeviceProfile::batch_cost`]).
    #[serde(default)]
    pub batch_cost: f64,
    /// Bytes of weights per second through the dense kernel over a matrix several times the size
    /// of the last-level cache ([`DeviceProfile::llc_bytes`]): weights streamed from DRAM, where
    /// [`KernelRate::dense_bps`] is measured on a matrix that may sit in that cache. 0 in profiles
    /// of older builds or where the cache's size is unknown: then every rate holds for any model.
    #[serde(default)]
    pub dram_dense_bps: f64,
    /// Bytes of weights per second through offloaded decode's gate/up kernel when each call takes
    /// one store unit of one neuron (its gate and up rows: `matvec_rows_prepared` over two rows of
    /// 4096 columns), units scattered past the last-level cache where its size is known: the
    /// per-call and cache-miss costs that [`KernelRate::sparse_bps`]'s long row lists hide. 0 in
    /// profiles of older builds: then `sparse_bps`.
    #[serde(default)]
    pub unit_rows_bps: f64,
    /// As [`KernelRate::unit_rows_bps`] for the down projection: one `axpy_rows_fixed` call per
    /// unit over its one row, into a fixed-point sum (which converts every output value per call).
    /// 0 in profiles of older builds: then `axpy_bps`.
    #[serde(default)]
    pub unit_axpy_bps: f64,
}

/// Random-read throughput of flash at one read size and queue depth (direct I/O).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IoRate {
    /// Bytes per read.
    pub read_bytes: u32,
    /// Reads in flight.
    pub queue_depth: u32,
    /// Bytes per second.
    pub bps: f64,
}

/// A machine as the planner sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceProfile {
    /// A name for people (CPU model, host).
    pub name: String,
    /// Identity of the machine (CPU model and core count hashed); a plan records it.
    pub fingerprint: u64,
    /// Cores available to the process.
    pub cores: u32,
    /// DRAM read bandwidth, bytes per second.
    pub dram_bps: f64,
    /// Kernel throughput per format and thread count.
    pub kernels: Vec<KernelRate>,
    /// Flash random reads by read size and queue depth.
    pub flash_random: Vec<IoRate>,
    /// The same reads while one thread per core computes beside the I/O thread, as in offloaded
    /// decode, where the I/O thread shares the cores with the compute threads (submitting,
    /// reaping and copying cost it CPU time it gets a share of); empty in profiles of older
    /// builds: then [`Self::flash_random`].
    #[serde(default)]
    pub flash_random_busy: Vec<IoRate>,
    /// Marginal compute cost of each further sequence of a batch, as a fraction of one sequence's
    /// (a batched step reads the weights once), for formats without their own
    /// [`KernelRate::batch_cost`].
    #[serde(default = "one")]
    pub batch_cost: f64,
    /// Flash sequential read bandwidth (large reads), bytes per second.
    pub flash_seq_bps: f64,
    /// Where the flash figures were measured (a folder on the device's storage).
    pub flash_path: String,
    /// Fixed cost of one parallel kernel call (fork, join, quantizing its input) at a thread count,
    /// measured on a matrix too small for its bytes to matter (empty in profiles of older builds:
    /// no cost).
    #[serde(default)]
    pub call_overhead: Vec<CallOverhead>,
    /// Serial cost of sparse decode's selection per candidate neuron, in nanoseconds (activation,
    /// score, keep lists: what a sparse step spends per neuron beyond its kernels' bytes); 0 in
    /// profiles of older builds.
    #[serde(default)]
    pub select_ns: f64,
    /// Floating-point operations per second (2 per multiply-add) of a prompt's batched product at the
    /// most threads (`matmul` of a Q4_0 matrix in `Fast` over 64 tokens: the f32 tile, or on
    /// AVX-512 the 16-bit integer one); 0 in profiles of older builds: no prompt prediction.
    #[serde(default)]
    pub prompt_flops: f64,
    /// The same for the product with a matrix stored transposed (`matmul_t`: a sparse or offloaded
    /// FFN's down rows over a prompt); 0 in profiles of older builds: `prompt_flops`.
    #[serde(default)]
    pub prompt_t_flops: f64,
    /// Per weight format, the rate of a long prompt's batched product (`matmul` in `Fast` over a
    /// few hundred tokens: whichever tile that format takes there, 8-bit, 16-bit or f32); empty in
    /// profiles of older builds: `prompt_flops` for every format.
    #[serde(default)]
    pub prompt_rates: Vec<PromptRate>,
    /// The rate of a short prompt's product (fewer tokens than `prompt_tile_min_tokens`: on x86
    /// the decode kernels, each block read once for all tokens, elsewhere the f32 tile from 8
    /// tokens; the f32 tile in builds before 2026-12-05); 0 in profiles of older builds: the long
    /// prompts' rates.
    #[serde(default)]
    pub prompt_short_flops: f64,
    /// Fewest tokens from which a prompt's products take the integer tiles (`prompt_rates`).
    #[serde(default)]
    pub prompt_tile_min_tokens: u32,
    /// Accelerators' rates on this device (an NPU's, which `sparrow calibrate` does not measure:
    /// no NPU is reachable where it was written); the CPU stand-in (`cpu`) needs no entry: it is
    /// costed from [`Self::kernels`].
    #[serde(default)]
    pub accelerators: Vec<AccelRate>,
    /// Bytes of the last-level cache the kernel rates were measured against (0: unknown, or a
    /// profile of an older build). A decode step whose weights fill at most half of it reads them
    /// at the kernel rates; one that reads more, at rates blended towards
    /// [`KernelRate::dram_dense_bps`], reached at the cache's size
    /// ([`DeviceProfile::for_working_set`]).
    #[serde(default)]
    pub llc_bytes: u64,
}

/// Fixed cost of one parallel kernel call at one thread count.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallOverhead {
    /// Compute threads.
    pub threads: u32,
    /// Nanoseconds per call.
    pub ns: f64,
}

/// How fast an accelerator runs a layer's block of hot neurons (hybrid decode).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AccelRate {
    /// The backend's name (`qnn`, `cpu`).
    pub name: String,
    /// Whether it runs beside the CPU cores (an NPU: a step takes the slower of the two halves) or
    /// on them (the CPU stand-in: the sum).
    pub parallel: bool,
    /// Block bytes per second at batch size 1, the bytes of the model's own format (the CPU
    /// stand-in, which runs the file's rows); 0 where [`AccelRate::macs_per_s`] gives the rate.
    pub bps: f64,
    /// Multiply-adds per second at batch size 1 (a measured accelerator, whose blocks hold their
    /// own form of the weights, so that a rate in the file's bytes would depend on the file's
    /// format); 0: [`AccelRate::bps`] gives the rate. A neuron's block row costs `3 × d_model`.
    #[serde(default)]
    pub macs_per_s: f64,
    /// A batch of `b` tokens costs `1 + batch_cost * (b - 1)` times one token.
    pub batch_cost: f64,
    /// Fixed cost of one block call, ns.
    pub call_ns: f64,
}

fn one() -> f64 {
    1.0
}

/// [`DeviceProfile::io_rate`] from the random-read points `points` alone.
fn random_rate(points: &[IoRate], read_bytes: u64, queue_depth: u32) -> f64 {
    let at_or_below = depths(points)
        .into_iter()
        .filter(|&q| q <= queue_depth)
        .map(|q| io_rate_of(points.iter().filter(|r| r.queue_depth == q), read_bytes))
        .reduce(f64::max);
    at_or_below.unwrap_or_else(|| io_rate_of(points.iter(), read_bytes))
}

/// The queue depths of `points` (ascending, without repeats).
fn depths(points: &[IoRate]) -> Vec<u32> {
    let mut q: Vec<u32> = points.iter().map(|r| r.queue_depth).collect();
    q.sort_unstable();
    q.dedup();
    q
}

/// Throughput for reads of `read_bytes` from `points`: the point whose read size is nearest (log
/// scale), scaled linearly down for smaller reads.
fn io_rate_of<'a>(points: impl Iterator<Item = &'a IoRate>, read_bytes: u64) -> f64 {
    let size = read_bytes.max(1) as f64;
    let best = points
        .min_by(|a, b| {
            let da = (a.read_bytes as f64 / size).ln().abs();
            let db = (b.read_bytes as f64 / size).ln().abs();
            da.total_cmp(&db)
        })
        .expect("validated: at least one point");
    if size < best.read_bytes as f64 {
        best.bps * size / best.read_bytes as f64
    } else {
        best.bps
    }
}

/// A machine nobody measured (no cores, no rates: it does not validate), with the figures a profile
/// file may leave out at their defaults (`batch_cost` 1), for literals that set only what they need.
impl Default for DeviceProfile {
    fn default() -> Self {
        Self {
            name: String::new(),
            fingerprint: 0,
            cores: 0,
            dram_bps: 0.0,
            kernels: Vec::new(),
            flash_random: Vec::new(),
            flash_random_busy: Vec::new(),
            batch_cost: one(),
            flash_seq_bps: 0.0,
            flash_path: String::new(),
            accelerators: Vec::new(),
            call_overhead: Vec::new(),
            select_ns: 0.0,
            prompt_flops: 0.0,
            prompt_t_flops: 0.0,
            prompt_rates: Vec::new(),
            prompt_short_flops: 0.0,
            prompt_tile_min_tokens: 0,
            llc_bytes: 0,
        }
    }
}

impl DeviceProfile {
    /// The profile as a decode step that reads `bytes` of weights sees it: each step streams the
    /// same weights in the same order, so they stay in the last-level cache while they fill no
    /// more than half of it (the rest holds the activations, the KV cache and, on a shared
    /// machine, other programs' data), and none of them survive once they are as large as the
    /// cache (a cyclic stream larger than an LRU-like cache evicts each line before its next use).
    /// Between the two, the share read from the cache falls linearly from 1 to 0, and each
    /// kernel rate becomes the harmonic blend of its measured rate and that rate scaled by its
    /// format's `dram_dense_bps / dense_bps`. Unchanged where the cache's size or the DRAM rates
    /// are unknown. Measured on a VM with a 260 MiB cache: Qwen2.5-Coder-0.5B in memory (about
    /// 390 MB a token) was predicted within 3-15% at the DRAM rates, and 22-28% fast with
    /// `llc_bytes / bytes` of its bytes read at the cache rates.
    pub fn for_working_set(&self, bytes: u64) -> DeviceProfile {
        let mut d = self.clone();
        let half = self.llc_bytes as f64 / 2.0;
        if self.llc_bytes == 0 || bytes as f64 <= half {
            return d;
        }
        let cached = ((self.llc_bytes as f64 - bytes as f64) / half).clamp(0.0, 1.0);
        for k in &mut d.kernels {
            if !(k.dram_dense_bps > 0.0 && k.dram_dense_bps < k.dense_bps) {
                continue;
            }
            let slow = k.dense_bps / k.dram_dense_bps;
            let scale = 1.0 / (cached + (1.0 - cached) * slow);
            k.dense_bps *= scale;
            k.sparse_bps *= scale;
            k.axpy_bps *= scale;
        }
        d
    }

    /// The rate of a long prompt's product for weights of `format`: its measured rate, else
    /// [`DeviceProfile::prompt_flops`].
    pub fn prompt_rate(&self, format: &str) -> f64 {
        self.prompt_rates
            .iter()
            .find(|r| r.format.eq_ignore_ascii_case(format) && r.flops > 0.0)
            .map_or(self.prompt_flops, |r| r.flops)
    }

    /// Checks the tables are usable: positive finite rates, at least one kernel and one I/O point,
    /// thread counts within the cores.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: String| Err(PlannerError::Input(format!("device profile: {what}")));
        if self.cores == 0 || self.cores > 4096 {
            return bad(format!("{} cores", self.cores));
        }
        if !(self.dram_bps.is_finite() && self.dram_bps > 0.0) {
            return bad("DRAM bandwidth is not a positive number".into());
        }
        if !(self.flash_seq_bps.is_finite() && self.flash_seq_bps > 0.0) {
            return bad("sequential flash bandwidth is not a positive number".into());
        }
        if self.kernels.is_empty() {
            return bad("no kernel rates".into());
        }
        for k in &self.kernels {
            if k.threads == 0 || k.threads > self.cores {
                return bad(format!("kernel rate at {} threads", k.threads));
            }
            let positive = |x: f64| x.is_finite() && x > 0.0;
            let rates_ok = positive(k.dense_bps)
                && positive(k.sparse_bps)
                && k.dram_dense_bps.is_finite()
                && k.dram_dense_bps >= 0.0
                && k.axpy_bps.is_finite()
                && k.axpy_bps >= 0.0
                && [k.unit_rows_bps, k.unit_axpy_bps]
                    .iter()
                    .all(|x| x.is_finite() && *x >= 0.0);
            if !rates_ok {
                return bad(format!("kernel rate of {} is not positive", k.format));
            }
        }
        if let Some(c) = self
            .call_overhead
            .iter()
            .find(|c| !(c.ns.is_finite() && c.ns >= 0.0) || c.threads == 0)
        {
            return bad(format!("call overhead at {} threads", c.threads));
        }
        if !(self.select_ns.is_finite() && self.select_ns >= 0.0) {
            return bad("selection cost per neuron is not a number >= 0".into());
        }
        if self.flash_random.is_empty() {
            return bad("no flash read rates".into());
        }
        for r in self.flash_random.iter().chain(&self.flash_random_busy) {
            if r.read_bytes == 0 || r.queue_depth == 0 || !(r.bps.is_finite() && r.bps > 0.0) {
                return bad(format!(
                    "flash rate at {} bytes, depth {}",
                    r.read_bytes, r.queue_depth
                ));
            }
        }
        for a in &self.accelerators {
            let rate = |r: f64| r.is_finite() && r >= 0.0;
            let ok = rate(a.bps)
                && rate(a.macs_per_s)
                && (a.bps > 0.0 || a.macs_per_s > 0.0)
                && a.batch_cost.is_finite()
                && a.batch_cost >= 0.0
                && a.call_ns.is_finite()
                && a.call_ns >= 0.0;
            if !ok || a.name.is_empty() {
                return bad(format!("accelerator rate of '{}'", a.name));
            }
        }
        Ok(())
    }

    /// Throughput of sparse decode's down projection over transposed rows in `format` at `threads`
    /// (the measured `axpy_bps`, else the row-subset rate).
    pub fn axpy_rate(&self, format: &str, threads: u32) -> f64 {
        self.kernels
            .iter()
            .find(|k| k.threads == threads && k.format.eq_ignore_ascii_case(format))
            .filter(|k| k.axpy_bps > 0.0)
            .map_or_else(|| self.kernel_rate(format, threads).1, |k| k.axpy_bps)
    }

    /// Offloaded decode's per-unit rates for `format` at `threads`
    /// ([`KernelRate::unit_rows_bps`], [`KernelRate::unit_axpy_bps`]; 0 where not measured).
    pub fn unit_rates(&self, format: &str, threads: u32) -> (f64, f64) {
        self.kernels
            .iter()
            .find(|k| k.threads == threads && k.format.eq_ignore_ascii_case(format))
            .map_or((0.0, 0.0), |k| (k.unit_rows_bps, k.unit_axpy_bps))
    }

    /// Fixed nanoseconds of one parallel kernel call at `threads` (0 where not measured).
    pub fn call_ns(&self, threads: u32) -> f64 {
        self.call_overhead
            .iter()
            .find(|c| c.threads == threads)
            .map_or(0.0, |c| c.ns.max(0.0))
    }

    /// Thread counts measured (ascending, without repeats).
    pub fn thread_counts(&self) -> Vec<u32> {
        let mut t: Vec<u32> = self.kernels.iter().map(|k| k.threads).collect();
        t.sort_unstable();
        t.dedup();
        t
    }

    /// Queue depths measured (ascending, without repeats).
    pub fn queue_depths(&self) -> Vec<u32> {
        depths(&self.flash_random)
    }

    /// The accelerator `name` as the planner costs it for blocks of `format` at `threads`: its
    /// measured entry, or for `cpu` (the CPU stand-in, which runs the blocks through the batched
    /// dense kernels on the same cores) the dense kernel rate of the format. `None`: not measured.
    pub fn accel_rate(&self, name: &str, format: &str, threads: u32) -> Option<AccelRate> {
        if let Some(a) = self.accelerators.iter().find(|a| a.name == name) {
            return Some(a.clone());
        }
        (name == "cpu").then(|| AccelRate {
            name: name.into(),
            parallel: false,
            bps: self.kernel_rate(format, threads).0,
            macs_per_s: 0.0,
            batch_cost: (self.batch_scale(format, 2) - 1.0).max(0.0),
            call_ns: 3.0 * self.call_ns(threads),
        })
    }

    /// How many times one token's compute a batched product of `batch` tokens in `format` costs:
    /// `1 + c * (batch - 1)`, `c` the format's measured [`KernelRate::batch_cost`] (at the most
    /// threads measured for it), else the profile's [`DeviceProfile::batch_cost`].
    pub fn batch_scale(&self, format: &str, batch: u32) -> f64 {
        let own = self
            .kernels
            .iter()
            .filter(|k| k.format.eq_ignore_ascii_case(format) && k.batch_cost > 0.0)
            .max_by_key(|k| k.threads)
            .map(|k| k.batch_cost);
        let c = own.unwrap_or(self.batch_cost).max(0.0);
        1.0 + c * (batch.max(1) as f64 - 1.0)
    }

    /// Dense and sparse kernel throughput for `format` at `threads`: the measured entry, else the
    /// slowest measured format at that thread count (a conservative guess).
    pub fn kernel_rate(&self, format: &str, threads: u32) -> (f64, f64) {
        let at: Vec<&KernelRate> = self
            .kernels
            .iter()
            .filter(|k| k.threads == threads)
            .collect();
        if let Some(k) = at.iter().find(|k| k.format.eq_ignore_ascii_case(format)) {
            return (k.dense_bps, k.sparse_bps);
        }
        let pool = if at.is_empty() {
            self.kernels.iter().collect()
        } else {
            at
        };
        pool.iter().fold((f64::MAX, f64::MAX), |(d, s), k| {
            (d.min(k.dense_bps), s.min(k.sparse_bps))
        })
    }

    /// Flash throughput for reads of `read_bytes` at `queue_depth`: the best of the measured depths up
    /// to `queue_depth` (an upper envelope: more reads in flight never read slower, so noise in a
    /// calibration, a shallow depth measured faster than deeper ones, does not make a deeper queue
    /// look slower), each depth's figure its point whose read size is nearest (log scale) to
    /// `read_bytes`, scaled linearly down for smaller reads (a read of half the size moves half the
    /// bytes per I/O). Below every measured depth, the nearest point of any depth. Never above the
    /// sequential rate (`flash_seq_bps`, when measured): reads at random offsets are not faster than
    /// reading the file in order, whatever a noisy calibration of large random reads gave.
    pub fn io_rate(&self, read_bytes: u64, queue_depth: u32) -> f64 {
        self.capped(random_rate(&self.flash_random, read_bytes, queue_depth))
    }

    /// [`DeviceProfile::io_rate`] while the compute threads run beside the I/O thread (offloaded
    /// decode's misses): from [`Self::flash_random_busy`] where measured.
    pub fn busy_io_rate(&self, read_bytes: u64, queue_depth: u32) -> f64 {
        if self.flash_random_busy.is_empty() {
            return self.io_rate(read_bytes, queue_depth);
        }
        self.capped(random_rate(
            &self.flash_random_busy,
            read_bytes,
            queue_depth,
        ))
    }

    /// `random` no faster than the sequential rate, where measured.
    fn capped(&self, random: f64) -> f64 {
        if self.flash_seq_bps > 0.0 {
            random.min(self.flash_seq_bps)
        } else {
            random
        }
    }

    /// Saves the profile to `path` (whole or not at all).
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        container::save(path.as_ref(), DEVICE_KIND, DEVICE_VERSION, self)
    }

    /// Loads and validates a profile.
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let d: DeviceProfile = container::load(path, DEVICE_KIND, DEVICE_VERSION)?;
        d.validate().map_err(|e| PlannerError::Corrupt {
            path: path.to_path_buf(),
            what: e.to_string(),
        })?;
        Ok(d)
    }
}
