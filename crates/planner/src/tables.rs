//! The cost model (PowerInfer-2 §6.3) as integer tables: every term of
//! `T_decode = T_attn + T_pred + max(T_ffn, T_io)` and of the memory use, for every value a decision
//! can take, in nanoseconds and bytes. The solvers (search, brute force, Z3) all read these tables, so
//! they agree on what a configuration costs and differ only in how they search.
//!
//! - `T_attn`: the weights outside the FFN that stay in memory, through the dense kernels at the
//!   chosen thread count, plus the KV cache read at DRAM bandwidth, plus the tensors left on flash
//!   (OATO: an embedding row is one small read per token).
//! - `T_pred`: the predictors (Q8_0 matrices) through the dense kernels.
//! - `T_ffn`: sparse, the expected firing neurons' bytes through the row-subset kernels (without
//!   predictors, every gate row too, and every up row under the output-norm score, through the dense
//!   kernels); dense, every neuron through the dense kernels.
//! - Each of these also pays the device's fixed cost per parallel kernel call (`call_ns`) for the
//!   calls a decode step makes: it dominates small models, whose matrices take microseconds.
//! - `T_io`: per layer, the read units holding a firing neuron (without predictors, every unit: each
//!   gate row is computed) that the cache does not hold, at the flash rate of that read size and
//!   queue depth. The cache holds each layer's hottest neurons (a prefix in the store's order), so
//!   a miss curve is the profile's hit curve read backwards.
//! - MoE layers (`crate::experts`): `T_ffn` is the selected experts, whole, through the dense
//!   kernels (no dense-or-sparse choice); `T_io` the selected experts the cache misses, one blob read
//!   each.
//!
//! A batch of `b` sequences costs `1 + batch_cost * (b - 1)` times one sequence's compute (the weights
//! are read once; `batch_cost` is measured by calibration) and fires more neurons (the profile's
//! frequencies at that batch size).

use crate::device::DeviceProfile;
use crate::error::{PlannerError, Result};
use crate::experts::{expert_io_ns, expert_layer_ns};
use crate::model::{step_neurons, FfnLayer, ModelSummary};

/// Shares of drafted tokens kept, as measured on the user's prompts (`sparrow plan
/// --measure-speculation`), per source; `None` where not measured (the defaults of
/// [`crate::speculation`] apply). Values outside `0..=1` are clamped.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SpecAcceptance {
    /// Prompt lookup's.
    pub lookup: Option<f64>,
    /// The self-draft's.
    pub self_draft: Option<f64>,
}

/// What the user asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct Constraints {
    /// Bytes the whole process may use (`None`: no limit).
    pub memory_budget: Option<u64>,
    /// Context positions the KV cache is reserved for.
    pub context: u32,
    /// Positions a typical decode step attends over (for the KV read time).
    pub attended: u32,
    /// Decode speed the plan must reach, tokens per second (`None`: any).
    pub min_tok_s: Option<f64>,
    /// Most compute threads to use (`None`: all measured).
    pub max_threads: Option<u32>,
    /// Plan hybrid decode's split for this accelerator (`cpu`, `qnn`; `None`: no accelerator). A
    /// device profile without its rate gives a plan without a split.
    pub accelerator: Option<String>,
    /// Bytes the accelerator holds in memory per neuron of its block (over a neuron store the block
    /// takes them from the neuron cache; `None`: the store's bytes per neuron).
    pub accel_neuron_bytes: Option<u64>,
    /// Measured acceptance of the draft sources (the plan's speculation; none: the defaults).
    pub spec_acceptance: SpecAcceptance,
}

impl Default for Constraints {
    fn default() -> Self {
        Constraints {
            memory_budget: None,
            context: 4096,
            attended: 512,
            min_tok_s: None,
            max_threads: None,
            accelerator: None,
            accel_neuron_bytes: None,
            spec_acceptance: SpecAcceptance::default(),
        }
    }
}

/// Fraction of a neuron's bytes that is its gate row (gate, up and down have equal element counts),
/// for layers whose parts are not given ([`crate::FfnLayer::with_parts`]).
const GATE_SHARE: f64 = 1.0 / 3.0;

/// Parallel kernel calls of a decode step's attention per layer (q/k/v together, the attention
/// itself, the output projection); one more for the output layer.
const ATTN_CALLS: usize = 3;
/// Parallel kernel calls of a decode step's FFN per layer (gate/up together, then down; a predictor
/// adds one).
pub(crate) const FFN_CALLS: usize = 2;

/// The cost tables of one model on one device at one batch size.
#[derive(Debug, Clone, PartialEq)]
pub struct Tables {
    /// Thread counts to choose from.
    pub threads: Vec<u32>,
    /// Queue depths to choose from.
    pub queue_depths: Vec<u32>,
    /// Grid steps per layer (a layer's cache holds `step_neurons(n, grid, j)` neurons at step `j`).
    pub grid: u32,
    /// Whether the FFN is on flash (else every step is `grid` and no read happens).
    pub offloaded: bool,
    /// `T_attn` per thread choice, ns.
    pub attn_ns: Vec<u64>,
    /// `T_pred` per thread choice and layer, ns (a sparse layer's predictor).
    pub pred_ns: Vec<Vec<u64>>,
    /// Sparse `T_ffn` per thread choice and layer, ns.
    pub ffn_sparse_ns: Vec<Vec<u64>>,
    /// Dense `T_ffn` per thread choice and layer, ns.
    pub ffn_dense_ns: Vec<Vec<u64>>,
    /// `T_io` per queue-depth choice, layer and step, ns.
    pub io_ns: Vec<Vec<Vec<u64>>>,
    /// Cache bytes per layer and step.
    pub cache_bytes: Vec<Vec<u64>>,
    /// Tensors outside the FFN: (bytes when resident, ns per step when left on flash, offloadable).
    pub tensors: Vec<(u64, u64, bool)>,
    /// Memory that does not depend on any decision: process, KV cache at the context.
    pub fixed_bytes: u64,
    /// Memory of each layer's predictor (held where the layer is sparse).
    pub pred_bytes: Vec<u64>,
}

/// Largest read the engine's I/O thread builds from touching requests (`ufs_io::DEFAULT_CHUNK`).
const COALESCED_READ: u64 = 512 << 10;

/// Bytes per step from which a tensor left on flash is read as a sequential stream.
pub(crate) const STREAM_READ: u64 = 1 << 20;

pub(crate) fn ns(bytes: f64, bps: f64) -> u64 {
    (bytes / bps * 1e9).round() as u64
}

/// Sparse decode's FFN time for `neurons` of layer `l`'s neurons, `active` of them firing, at `t`
/// threads and batch size `b` (ns, without the per-call cost): selection's serial work per
/// candidate (every neuron without a predictor, about the firing ones with one), the rows computed
/// for every candidate (selection without predictors), each firing neuron's gate/up rows and its
/// down column (weighted row sums).
#[allow(clippy::too_many_arguments)]
pub(crate) fn sparse_layer_ns(
    device: &DeviceProfile,
    predicted: bool,
    select_up: bool,
    l: &FfnLayer,
    t: u32,
    b: u32,
    neurons: f64,
    active: f64,
) -> u64 {
    let (d_bps, s_bps) = device.kernel_rate(&l.format, t);
    let scale = device.batch_scale(&l.format, b);
    let select_scale = 1.0 + device.batch_cost.max(0.0) * (b as f64 - 1.0);
    let candidates = if predicted { active } else { neurons };
    let mut sparse = (candidates * device.select_ns * select_scale).round() as u64;
    if l.gate_up_bytes == 0 {
        let every = if predicted {
            0.0
        } else {
            l.neuron_bytes as f64 * GATE_SHARE
        };
        sparse +=
            ns(neurons * every * scale, d_bps) + ns(active * l.neuron_bytes as f64 * scale, s_bps);
    } else {
        let (gu, down) = (l.gate_up_bytes as f64, l.down_bytes as f64);
        let (every, firing) = match (predicted, select_up) {
            (true, _) => (0.0, gu),
            (false, true) => (gu, 0.0),
            (false, false) => (gu / 2.0, gu / 2.0),
        };
        sparse += ns(neurons * every * scale, d_bps)
            + ns(active * firing * scale, s_bps)
            + ns(
                active * down * scale,
                device.axpy_rate(l.sparse_down_format(), t),
            );
    }
    sparse
}

/// Offloaded decode's cost of layer `l` beyond [`sparse_layer_ns`] (ns): each store unit is its own
/// kernel call (the gate/up rows of the unit's wanted neurons, then their down rows into the
/// worker's fixed-point sum), and each such call costs what the device's one-unit rates
/// ([`DeviceProfile::unit_rates`]) measure beyond the long row lists' rates: per unit, the
/// difference for one neuron's rows. Units computed: those holding a firing neuron (of `active`
/// among the `neurons` of the layer that the CPU computes, independently), and without predictors
/// every such unit for gate/up. 0 where the one-unit rates are not measured or not slower.
pub(crate) fn unit_extra_ns(
    device: &DeviceProfile,
    predicted: bool,
    l: &FfnLayer,
    t: u32,
    (n, active): (f64, f64),
) -> u64 {
    let k = f64::from(l.neurons_per_read.max(1));
    if n <= 0.0 {
        return 0;
    }
    let p = (active / n).clamp(0.0, 1.0);
    let firing = n / k * (1.0 - (1.0 - p).powf(k));
    let gu_units = if predicted { firing } else { n / k };
    let (gu, down) = if l.gate_up_bytes == 0 {
        let gate = l.neuron_bytes as f64 * GATE_SHARE;
        (2.0 * gate, l.neuron_bytes as f64 - 2.0 * gate)
    } else {
        (l.gate_up_bytes as f64, l.down_bytes as f64)
    };
    let down_format = l.sparse_down_format();
    let extra = |bytes: f64, unit_bps: f64, bulk_bps: f64| {
        if unit_bps > 0.0 && bulk_bps > 0.0 {
            (bytes / unit_bps - bytes / bulk_bps).max(0.0)
        } else {
            0.0
        }
    };
    let gu_extra = extra(
        gu,
        device.unit_rates(&l.format, t).0,
        device.kernel_rate(&l.format, t).1,
    );
    let down_extra = extra(
        down,
        device.unit_rates(down_format, t).1,
        device.axpy_rate(down_format, t),
    );
    ((gu_units * gu_extra + firing * down_extra) * 1e9).round() as u64
}

/// Offloaded decode's flash time of layer `l` at queue depth `q` (ns): the `left` neurons past
/// what memory holds (in the store's order), `firing` of them per step, read by the unit. A unit is
/// needed where one of its neurons fires; without predictors every unit is (every gate row is
/// computed). Needed units that touch are read as one (the I/O thread coalesces them, up to
/// `COALESCED_READ`): runs of them are geometric, of mean length `1 / (1 - needed)`, so the device
/// sees reads that long.
pub(crate) fn layer_io_ns(
    device: &DeviceProfile,
    predicted: bool,
    l: &FfnLayer,
    q: u32,
    (left, firing): (f64, f64),
) -> u64 {
    if left <= 0.0 {
        return 0;
    }
    let p = match predicted {
        true => (firing / left).clamp(0.0, 1.0),
        false => 1.0,
    };
    let k = l.neurons_per_read as f64;
    let needed = 1.0 - (1.0 - p).powf(k);
    let reads = left / k * needed;
    let run =
        (1.0 / (1.0 - needed).max(1e-9)).min((COALESCED_READ / l.read_bytes.max(1)).max(1) as f64);
    let size = (l.read_bytes as f64 * run) as u64;
    ns(reads * l.read_bytes as f64, device.busy_io_rate(size, q))
}

/// Sparse and dense decode's FFN time of layer `l` at `t` threads, batch-size index `batch` (batch
/// `b`), without the per-call cost (ns). An MoE layer has no such choice: its selected experts,
/// whole, either way.
fn layer_ffn_ns(
    device: &DeviceProfile,
    model: &ModelSummary,
    l: &FfnLayer,
    (t, batch, b): (u32, usize, u32),
) -> [u64; 2] {
    if l.is_experts() {
        let e = expert_layer_ns(device, l, (t, batch, b), model.grid);
        return [e, e];
    }
    let active = l.hit[batch][model.grid as usize];
    let n = l.neurons as f64;
    let mut s = sparse_layer_ns(device, model.predicted, model.select_up, l, t, b, n, active);
    if model.offloaded {
        s += unit_extra_ns(device, model.predicted, l, t, (n, active));
    }
    [s, dense_layer_ns(device, l, t, b, n)]
}

/// Memory that does not depend on any decision: the process, the KV cache at the context and,
/// under a budget, what the engine's read-ahead holds there ([`crate::read_ahead_bytes`], with
/// the room the budget leaves beside the tensors that must stay in memory).
fn fixed_bytes(model: &ModelSummary, c: &Constraints) -> u64 {
    let fixed = model.process_bytes + model.kv_bytes_per_position * c.context as u64;
    let Some(budget) = c
        .memory_budget
        .filter(|_| model.offloaded && model.reads_ahead)
    else {
        return fixed;
    };
    let kept: u64 = model
        .tensors
        .iter()
        .filter(|x| !x.offloadable)
        .map(|x| x.bytes)
        .sum();
    let room = budget.saturating_sub(fixed + kept);
    fixed + crate::read_ahead_bytes(model.ffn_bytes(), model.layers.len(), room)
}

/// Dense decode's FFN time for the `neurons` of layer `l` at `t` threads and batch size `b` (ns,
/// without the per-call cost): the gate and up rows at their format's rate, the down matrix at its
/// own (the whole neuron at `format`'s where the parts or the down format are not given).
pub(crate) fn dense_layer_ns(
    device: &DeviceProfile,
    l: &FfnLayer,
    t: u32,
    b: u32,
    neurons: f64,
) -> u64 {
    let at = |bytes: f64, format: &str| {
        ns(
            neurons * bytes * device.batch_scale(format, b),
            device.kernel_rate(format, t).0,
        )
    };
    let whole = l.neuron_bytes as f64;
    if l.gate_up_bytes == 0 || l.dense_down_format.is_empty() || l.gate_up_bytes > l.neuron_bytes {
        return at(whole, &l.format);
    }
    let gu = l.gate_up_bytes as f64;
    at(gu, &l.format) + at(whole - gu, &l.dense_down_format)
}

/// Flash read time of each layer's missing neurons, per queue depth and cache step `j` of `0..=grid`
/// (zero when nothing is offloaded).
fn io_table(
    device: &DeviceProfile,
    model: &ModelSummary,
    batch: usize,
    queue_depths: &[u32],
) -> Vec<Vec<Vec<u64>>> {
    let g = model.grid;
    queue_depths
        .iter()
        .map(|&q| {
            model
                .layers
                .iter()
                .map(|l| {
                    let curve = &l.hit[batch];
                    let total = curve[g as usize];
                    (0..=g)
                        .map(|j| {
                            if !model.offloaded {
                                return 0;
                            }
                            let cached = step_neurons(l.neurons, g, j) as f64;
                            let firing = (total - curve[j as usize]).max(0.0);
                            if l.is_experts() {
                                return expert_io_ns(device, l, q, firing);
                            }
                            layer_io_ns(
                                device,
                                model.predicted,
                                l,
                                q,
                                (l.neurons as f64 - cached, firing),
                            )
                        })
                        .collect()
                })
                .collect()
        })
        .collect()
}

/// Bytes of each layer's neuron cache at each cache step `j` of `0..=grid`.
fn cache_table(model: &ModelSummary) -> Vec<Vec<u64>> {
    let g = model.grid;
    model
        .layers
        .iter()
        .map(|l| {
            (0..=g)
                .map(|j| step_neurons(l.neurons, g, j) as u64 * l.neuron_bytes)
                .collect()
        })
        .collect()
}

/// Each tensor's bytes, its read time from flash and whether it may live there.
fn tensor_table(device: &DeviceProfile, model: &ModelSummary) -> Vec<(u64, u64, bool)> {
    model
        .tensors
        .iter()
        .map(|x| {
            // A step reading a small part (an embedding row) makes a random read; one reading
            // a whole matrix, or megabytes of it, streams it sequentially.
            let on_flash = if x.touched_bytes < x.bytes.min(STREAM_READ) {
                ns(x.touched_bytes as f64, device.io_rate(x.touched_bytes, 1))
            } else {
                ns(x.touched_bytes as f64, device.flash_seq_bps)
            };
            (x.bytes, on_flash, x.offloadable && model.offloaded)
        })
        .collect()
}

impl Tables {
    /// Builds the tables for batch-size index `batch` of `model` on `device` under `c`.
    pub fn build(
        device: &DeviceProfile,
        model: &ModelSummary,
        c: &Constraints,
        batch: usize,
    ) -> Result<Tables> {
        device.validate()?;
        model.validate()?;
        // What a step reads from memory: the whole model, or no more than the budget holds.
        let in_memory = model
            .decode_weight_bytes()
            .min(c.memory_budget.unwrap_or(u64::MAX));
        let device = &device.for_working_set(in_memory);
        let b = *model
            .batch_sizes
            .get(batch)
            .ok_or_else(|| PlannerError::Input(format!("no batch size index {batch}")))?;
        // Batched compute per format (selection's serial work: the profile's figure).
        let scale = |format: &str| device.batch_scale(format, b);
        let threads: Vec<u32> = device
            .thread_counts()
            .into_iter()
            .filter(|&t| c.max_threads.is_none_or(|m| t <= m))
            .collect();
        if threads.is_empty() {
            return Err(PlannerError::Input(
                "no measured thread count within --threads".into(),
            ));
        }
        let queue_depths = if model.offloaded {
            device.queue_depths()
        } else {
            vec![device.queue_depths()[0]]
        };
        let kv_read = ns(
            model.kv_bytes_per_position as f64 * c.attended as f64 * b as f64,
            device.dram_bps,
        );
        // The predictors' bytes, layer by layer (an even share each; the sum exact).
        let n_layers = model.layers.len() as u64;
        let total = if model.predicted {
            model.predictor_bytes
        } else {
            0
        };
        let pred_bytes: Vec<u64> = (0..n_layers)
            .map(|l| total * (l + 1) / n_layers - total * l / n_layers)
            .collect();
        let mut attn_ns = Vec::new();
        let mut pred_ns = Vec::new();
        let mut ffn_sparse_ns = Vec::new();
        let mut ffn_dense_ns = Vec::new();
        for &t in &threads {
            let attn: u64 = model
                .tensors
                .iter()
                .filter(|x| x.computed)
                .map(|x| {
                    ns(
                        x.touched_bytes as f64 * scale(&x.format),
                        device.kernel_rate(&x.format, t).0,
                    )
                })
                .sum();
            let call = device.call_ns(t);
            let calls = |n: usize| (n as f64 * call).round() as u64;
            let layers = model.layers.len();
            attn_ns.push(attn + kv_read + calls(ATTN_CALLS * layers + 1));
            let pred_rate = device.kernel_rate("q8_0", t).0;
            pred_ns.push(
                pred_bytes
                    .iter()
                    .map(|&bytes| {
                        ns(bytes as f64 * scale("q8_0"), pred_rate)
                            + calls(model.predicted as usize)
                    })
                    .collect(),
            );
            let per_layer = model.layers.iter().map(|l| {
                let call = calls(FFN_CALLS);
                layer_ffn_ns(device, model, l, (t, batch, b)).map(|x| x + call)
            });
            let (sparse, dense): (Vec<u64>, Vec<u64>) = per_layer.map(|[s, d]| (s, d)).unzip();
            ffn_sparse_ns.push(sparse);
            ffn_dense_ns.push(dense);
        }
        let g = model.grid;
        let io_ns = io_table(device, model, batch, &queue_depths);
        let cache_bytes = cache_table(model);
        let tensors = tensor_table(device, model);
        Ok(Tables {
            threads,
            queue_depths,
            grid: g,
            offloaded: model.offloaded,
            attn_ns,
            pred_ns,
            ffn_sparse_ns,
            ffn_dense_ns,
            io_ns,
            cache_bytes,
            tensors,
            fixed_bytes: fixed_bytes(model, c),
            pred_bytes,
        })
    }

    /// Layers.
    pub fn layers(&self) -> usize {
        self.cache_bytes.len()
    }

    /// Dense `T_ffn` of every layer at thread choice `ti`, ns.
    pub fn dense_ffn_ns(&self, ti: usize) -> u64 {
        self.ffn_dense_ns[ti].iter().sum()
    }

    /// Sparse `T_ffn` of every layer at thread choice `ti`, ns.
    pub fn sparse_ffn_ns(&self, ti: usize) -> u64 {
        self.ffn_sparse_ns[ti].iter().sum()
    }

    /// `T_pred` of every layer at thread choice `ti`, ns.
    pub fn all_pred_ns(&self, ti: usize) -> u64 {
        self.pred_ns[ti].iter().sum()
    }

    /// Memory of every layer's predictor.
    pub fn all_pred_bytes(&self) -> u64 {
        self.pred_bytes.iter().sum()
    }
}
