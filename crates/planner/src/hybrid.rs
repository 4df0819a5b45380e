//! Hybrid decode's split (PowerInfer-2: hot neurons as a dense block on the NPU, cold ones sparse on
//! the CPU cores, the split adapting to the batch size): for each layer and each batch size of the
//! accelerator's graphs ([`HYBRID_BATCHES`]), how many of the layer's hottest neurons run on the
//! accelerator. Each layer's count is the step of the cache grid that minimizes that layer's FFN
//! time at that batch size ([`hybrid_layer_ns`]); layers do not interact, so the whole step's
//! minimum is the sum of theirs. Counts never shrink as the batch grows (the engine's block holds
//! the largest set and each batch size runs a prefix of it).

use serde::{Deserialize, Serialize};

use crate::device::{AccelRate, DeviceProfile};
use crate::error::{PlannerError, Result};
use crate::model::{step_neurons, FfnLayer, ModelSummary};
use crate::tables::{ns, sparse_layer_ns, unit_extra_ns, FFN_CALLS};

/// Batch sizes of the accelerator's graphs: a step of `n` tokens takes the largest up to `n`.
pub const HYBRID_BATCHES: [u32; 4] = [1, 2, 4, 8];

/// The planned split of hybrid decode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HybridSplit {
    /// The accelerator it was planned for (`cpu`, `qnn`).
    pub accelerator: String,
    /// Per layer, the hottest neurons on the accelerator at each batch size of [`HYBRID_BATCHES`].
    pub counts: Vec<[u32; 4]>,
    /// Predicted FFN time of a step (every layer) at each batch size, ns; over a neuron store each
    /// layer's FFN work or its reads from flash, whichever is longer
    /// ([`crate::hybrid_split_over_store`]).
    pub ffn_ns: [u64; 4],
    /// The same with every neuron sparse on the CPU, ns.
    pub sparse_ns: [u64; 4],
    /// A decode step at batch size 1 with this split: the plan's attention (and what it streams),
    /// the predictors where the model has them, and [`HybridSplit::ffn_ns`]'s first; ns (0 where
    /// not made by [`crate::make_plan`]).
    #[serde(default)]
    pub decode_ns: u64,
}

impl HybridSplit {
    /// Predicted decode speed at batch size 1 with this split, tokens per second (`None`: unknown).
    pub fn tok_s(&self) -> Option<f64> {
        (self.decode_ns > 0).then(|| 1e9 / self.decode_ns as f64)
    }
}

/// Layer `l`'s FFN time (ns) at batch size `b` (its firing neurons from the profile's batch size
/// index `bi`) with its hottest `step_neurons(.., grid, j)` neurons on accelerator `acc` and the
/// others sparse on the CPU at `t` threads: the accelerator's block (its bytes at the accelerator's
/// rate, plus a call) and the CPU's sparse work over the cold neurons (selection, the rows of the
/// firing ones, the per-call cost; over a store each cold unit's own call, `unit_extra_ns`), summed
/// where both run on the same cores, else the slower one.
#[allow(clippy::too_many_arguments)]
pub fn hybrid_layer_ns(
    device: &DeviceProfile,
    model: &ModelSummary,
    l: &FfnLayer,
    acc: &AccelRate,
    t: u32,
    (bi, b): (usize, u32),
    j: u32,
) -> u64 {
    let g = model.grid;
    let hot = step_neurons(l.neurons, g, j) as f64;
    let curve = &l.hit[bi];
    let cold = l.neurons as f64 - hot;
    let cold_active = (curve[g as usize] - curve[j as usize]).max(0.0);
    // In memory without predictors, while at least half the neurons are cold ([`whole_matrix`]),
    // the CPU computes every neuron's gate and up rows and leaves the block's neurons out after:
    // selection over the whole layer, the cold firing neurons' down columns.
    let whole = whole_matrix(l.neurons as usize, l.neurons as usize - hot as usize);
    let selected = if model.predicted || model.offloaded || !whole {
        cold
    } else {
        l.neurons as f64
    };
    let cpu = if cold > 0.0 {
        sparse_layer_ns(
            device,
            model.predicted,
            model.select_up,
            l,
            t,
            b,
            selected,
            cold_active,
        ) + (FFN_CALLS as f64 * device.call_ns(t)).round() as u64
            // Over a store each cold unit is its own call.
            + if model.offloaded {
                unit_extra_ns(device, model.predicted, l, t, (cold, cold_active))
            } else {
                0
            }
    } else {
        0
    };
    let accel = if hot > 0.0 {
        let scale = 1.0 + acc.batch_cost * (b as f64 - 1.0);
        accel_block_ns(model, l, acc, hot * scale).saturating_add(acc.call_ns.round() as u64)
    } else {
        0
    };
    if acc.parallel {
        cpu.max(accel)
    } else {
        cpu.saturating_add(accel)
    }
}

/// Whether a sparse step without predictors that leaves `kept` of a layer's `candidates` neurons to
/// the CPU (the rest on an accelerator) computes every gate and up row in whole-matrix products and
/// drops the others after (at least half kept), rather than the kept rows alone: a row list with a
/// hole at every accelerator neuron is slower than the few rows it saves. The engine's sparse
/// decode in memory follows it, and [`hybrid_layer_ns`] costs it.
pub fn whole_matrix(candidates: usize, kept: usize) -> bool {
    2 * kept >= candidates
}

/// The accelerator's compute time (ns, no call) for `neurons` rows of layer `l`'s block: at its
/// multiply-add rate where it has one and the model's width is known, else at its byte rate over the
/// file's bytes of those neurons.
fn accel_block_ns(model: &ModelSummary, l: &FfnLayer, acc: &AccelRate, neurons: f64) -> u64 {
    let macs = model.neuron_macs();
    if acc.macs_per_s > 0.0 && macs > 0.0 {
        return ns(neurons * macs, acc.macs_per_s);
    }
    let block_bytes = if l.gate_up_bytes > 0 {
        l.gate_up_bytes + l.down_bytes
    } else {
        l.neuron_bytes
    } as f64;
    ns(neurons * block_bytes, acc.bps)
}

/// The profile's batch size index for a step of `size` tokens: the largest profiled size up to it.
pub(crate) fn batch_index(model: &ModelSummary, size: u32) -> usize {
    model
        .batch_sizes
        .iter()
        .enumerate()
        .filter(|&(_, &b)| b <= size)
        .max_by_key(|&(_, &b)| b)
        .map_or(0, |(i, _)| i)
}

/// The rate of `accelerator` for layer `l` at `threads` threads: a named error where the device
/// profile has none, or rates it in multiply-adds and the model summary lacks its width.
pub(crate) fn layer_accel_rate(
    device: &DeviceProfile,
    model: &ModelSummary,
    l: &FfnLayer,
    accelerator: &str,
    threads: u32,
) -> Result<AccelRate> {
    let acc = device
        .accel_rate(accelerator, &l.format, threads)
        .ok_or_else(|| {
            PlannerError::Input(format!(
                "the device profile has no rate for the accelerator '{accelerator}'"
            ))
        })?;
    if acc.bps <= 0.0 && model.neuron_macs() <= 0.0 {
        return Err(PlannerError::Input(format!(
            "the accelerator '{accelerator}' is rated in multiply-adds and the model summary \
             does not give its width (down_macs_per_token)"
        )));
    }
    Ok(acc)
}

/// Plans hybrid decode of `model` on `device` with the accelerator `accelerator` and `threads`
/// compute threads (see the module docs).
pub fn hybrid_split(
    device: &DeviceProfile,
    model: &ModelSummary,
    accelerator: &str,
    threads: u32,
) -> Result<HybridSplit> {
    device.validate()?;
    model.validate()?;
    let mut counts = Vec::with_capacity(model.layers.len());
    let (mut ffn_ns, mut sparse_ns) = ([0u64; 4], [0u64; 4]);
    for l in &model.layers {
        let acc = layer_accel_rate(device, model, l, accelerator, threads)?;
        let mut c = [0u32; 4];
        let mut prev = 0u32;
        for (k, &b) in HYBRID_BATCHES.iter().enumerate() {
            let bi = batch_index(model, b);
            let cost = |j: u32| hybrid_layer_ns(device, model, l, &acc, threads, (bi, b), j);
            // The cheapest step no smaller than the previous batch size's (ties: fewer neurons).
            let first = (0..=model.grid)
                .find(|&j| step_neurons(l.neurons, model.grid, j) >= prev)
                .unwrap_or(model.grid);
            let best = (first..=model.grid)
                .min_by_key(|&j| (cost(j), j))
                .unwrap_or(first);
            c[k] = step_neurons(l.neurons, model.grid, best);
            prev = c[k];
            ffn_ns[k] += cost(best);
            sparse_ns[k] += cost(0);
        }
        counts.push(c);
    }
    Ok(HybridSplit {
        accelerator: accelerator.into(),
        counts,
        ffn_ns,
        sparse_ns,
        decode_ns: 0,
    })
}
