//! Hybrid decode's split over a neuron store: the accelerator's block takes its memory from the
//! neuron cache (the engine reserves it there), so a block of `k` neurons moves their compute off
//! the CPU's sparse work and shrinks what the cache holds past them by its bytes beyond theirs.
//! Each layer's count is the grid step whose block fits the layer's share of the cache and that
//! minimizes the layer's time, its FFN work or its reads from flash, whichever is longer: the engine
//! reads a layer's misses while the layers before it compute. One count per layer serves every
//! batch size (the engine's block over a store is fixed).

use crate::device::DeviceProfile;
use crate::error::{PlannerError, Result};
use crate::hybrid::{batch_index, hybrid_layer_ns, layer_accel_rate, HybridSplit, HYBRID_BATCHES};
use crate::model::{step_neurons, FfnLayer, ModelSummary};
use crate::tables::layer_io_ns;
use crate::AccelRate;

/// The memory a split over a store works within.
#[derive(Debug, Clone, PartialEq)]
pub struct StoreMemory {
    /// Per layer, the bytes of its share of the neuron cache.
    pub cache_bytes: Vec<u64>,
    /// Bytes the accelerator holds per neuron of its block (`None`: the store's bytes per neuron).
    pub block_neuron_bytes: Option<u64>,
    /// Reads in flight.
    pub queue_depth: u32,
}

/// Layer `l`'s decode time (ns) over a store at batch size `b` (profile index `bi`) with its
/// hottest `step_neurons(.., grid, j)` neurons on accelerator `acc` and `cache` bytes for the
/// block and the neuron cache together: the longer of [`hybrid_layer_ns`] and the flash time of
/// the neurons past both. `None` where the block alone takes more than `cache`.
#[allow(clippy::too_many_arguments)]
pub fn store_layer_ns(
    device: &DeviceProfile,
    model: &ModelSummary,
    l: &FfnLayer,
    acc: &AccelRate,
    t: u32,
    (bi, b): (usize, u32),
    j: u32,
    (cache, block_neuron_bytes, q): (u64, u64, u32),
) -> Option<u64> {
    let g = model.grid;
    let k = f64::from(step_neurons(l.neurons, g, j));
    let block = k * block_neuron_bytes as f64;
    if block > cache as f64 {
        return None;
    }
    let held = ((cache as f64 - block) / l.neuron_bytes.max(1) as f64).floor();
    let end = (k + held).min(f64::from(l.neurons));
    let firing = (l.hit[bi][g as usize] - l.hit_at(bi, g, end)).max(0.0);
    let io = layer_io_ns(
        device,
        model.predicted,
        l,
        q,
        (f64::from(l.neurons) - end, firing),
    );
    Some(hybrid_layer_ns(device, model, l, acc, t, (bi, b), j).max(io))
}

/// Plans hybrid decode over the neuron store of `model` (see the module docs) on `device` with the
/// accelerator `accelerator` and `threads` compute threads, within `mem`.
pub fn hybrid_split_over_store(
    device: &DeviceProfile,
    model: &ModelSummary,
    accelerator: &str,
    threads: u32,
    mem: &StoreMemory,
) -> Result<HybridSplit> {
    device.validate()?;
    model.validate()?;
    if mem.cache_bytes.len() != model.layers.len() {
        return Err(PlannerError::Input(format!(
            "{} layers' cache shares for a model of {} layers",
            mem.cache_bytes.len(),
            model.layers.len()
        )));
    }
    let mut counts = Vec::with_capacity(model.layers.len());
    let (mut ffn_ns, mut sparse_ns) = ([0u64; 4], [0u64; 4]);
    for (l, &cache) in model.layers.iter().zip(&mem.cache_bytes) {
        let acc = layer_accel_rate(device, model, l, accelerator, threads)?;
        let per = (
            cache,
            mem.block_neuron_bytes.unwrap_or(l.neuron_bytes),
            mem.queue_depth,
        );
        let cost = |b: u32, j: u32| {
            store_layer_ns(
                device,
                model,
                l,
                &acc,
                threads,
                (batch_index(model, b), b),
                j,
                per,
            )
        };
        // The cheapest step at batch size 1 whose block fits (ties: fewer neurons); step 0 always
        // fits.
        let best = (0..=model.grid)
            .filter_map(|j| cost(1, j).map(|c| (c, j)))
            .min()
            .map_or(0, |(_, j)| j);
        counts.push([step_neurons(l.neurons, model.grid, best); 4]);
        for (k, &b) in HYBRID_BATCHES.iter().enumerate() {
            ffn_ns[k] += cost(b, best).unwrap_or(0);
            sparse_ns[k] += cost(b, 0).unwrap_or(0);
        }
    }
    Ok(HybridSplit {
        accelerator: accelerator.into(),
        counts,
        ffn_ns,
        sparse_ns,
        decode_ns: 0,
    })
}
