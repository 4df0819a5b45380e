//! Mixture-of-Experts layers as the planner sees them: the units of such a layer are its routed
//! experts (one expert's gate, up and down rows are one aligned blob of the expert store, one
//! read), and its hit curve says how many of a token's selected experts are among the hottest ones
//! (from the routing profile's counts). Such a layer has no dense-or-sparse choice: the selected
//! experts are computed whole through the dense kernels of their formats, the misses are read from
//! flash one blob a read, and the solver sizes each layer's expert cache ([`ExpertPlan`]).

use serde::{Deserialize, Serialize};

use crate::device::DeviceProfile;
use crate::error::{PlannerError, Result};
use crate::model::{step_neurons, FfnLayer, ModelSummary};
use crate::tables::{dense_layer_ns, ns, STREAM_READ};

/// What a layer's units are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UnitKind {
    /// FFN neurons (rows of gate and up, columns of down): sparse or dense, with predictors.
    #[default]
    Neuron,
    /// Routed experts of an MoE layer, each computed whole where the router selects it.
    Expert,
}

/// One MoE layer's experts, as the expert store holds them.
#[derive(Debug, Clone, PartialEq)]
pub struct ExpertParts {
    /// Bytes of one expert's blob in the store (gate, up and down, 4 KiB aligned): one read, and
    /// what the cache holds per expert.
    pub blob_bytes: u64,
    /// Bytes of one expert's gate and up matrices.
    pub gate_up_bytes: u64,
    /// Bytes of one expert's down matrix.
    pub down_bytes: u64,
    /// Weight format of the gate and up matrices.
    pub format: String,
    /// Weight format of the down matrix.
    pub down_format: String,
}

impl FfnLayer {
    /// An MoE layer of `counts.len()` experts, each selected `counts[e]` times over `tokens`
    /// routed tokens (the routing profile), for the batch sizes `batch_sizes` (a batch selects the
    /// union of its tokens' experts, taken as independent), summarized over `grid` steps with the
    /// experts most selected first: `hit[bi][j]` is the expected selected experts among the hottest
    /// `j * E / grid`, `hit[0][grid]` the experts a token uses.
    pub fn from_expert_counts(
        parts: &ExpertParts,
        counts: &[u64],
        tokens: u64,
        batch_sizes: &[u32],
        grid: u32,
    ) -> Result<Self> {
        if parts.blob_bytes == 0 || tokens == 0 {
            return Err(PlannerError::Input(
                "MoE layer: zero-byte experts or no routed tokens".into(),
            ));
        }
        let mut freq: Vec<f64> = counts
            .iter()
            .map(|&c| (c as f64 / tokens as f64).clamp(0.0, 1.0))
            .collect();
        freq.sort_by(|a, b| b.total_cmp(a));
        let per_batch: Vec<Vec<f32>> = batch_sizes
            .iter()
            .map(|&b| {
                freq.iter()
                    .map(|&f| (1.0 - (1.0 - f).powi(b.max(1) as i32)) as f32)
                    .collect()
            })
            .collect();
        let mut l = FfnLayer::from_frequencies(
            parts.blob_bytes,
            &parts.format,
            parts.blob_bytes,
            1,
            &per_batch,
            grid,
        )?
        .with_parts(parts.gate_up_bytes, parts.down_bytes, &parts.down_format)
        .with_dense_down(&parts.down_format);
        l.unit = UnitKind::Expert;
        Ok(l)
    }

    /// Whether this layer's units are routed experts.
    pub fn is_experts(&self) -> bool {
        self.unit == UnitKind::Expert
    }
}

/// Compute time of an MoE layer's selected experts at batch-size index `bi` (batch `b`) and `t`
/// threads (ns, without the per-call cost): the union of the batch's experts, each computed whole
/// through the dense kernels of its formats for the tokens that selected it (a token's experts
/// over the union: their mean share of the batch).
pub(crate) fn expert_layer_ns(
    device: &DeviceProfile,
    l: &FfnLayer,
    (t, bi, b): (u32, usize, u32),
    grid: u32,
) -> u64 {
    let active = l.hit[bi][grid as usize];
    let per_token = l.hit[0][grid as usize];
    if active <= 0.0 {
        return 0;
    }
    let tokens = (b as f64 * per_token / active).round().max(1.0) as u32;
    dense_layer_ns(device, l, t, tokens, active)
}

/// Flash time of an MoE layer's misses at queue depth `q` (ns): `missing` selected experts a step
/// that the cache does not hold, one blob read each, at most twice a step's selected experts in
/// flight (a step's misses and the next layer's predicted experts). A blob of a megabyte or more
/// is read at no less than the sequential rate, as a tensor streamed from flash is
/// (`STREAM_READ`): the random rates are measured at a few KiB and do not scale up to it.
pub(crate) fn expert_io_ns(device: &DeviceProfile, l: &FfnLayer, q: u32, missing: f64) -> u64 {
    if missing <= 0.0 {
        return 0;
    }
    let in_step = 2.0 * l.hit[0].last().copied().unwrap_or(1.0);
    let depth = q.min(in_step.ceil().max(1.0) as u32).max(1);
    let random = device.busy_io_rate(l.read_bytes, depth);
    let rate = match l.read_bytes >= STREAM_READ && device.flash_seq_bps > 0.0 {
        true => random.max(device.flash_seq_bps),
        false => random,
    };
    ns(missing * l.read_bytes as f64, rate)
}

/// A plan's expert caches and what they are predicted to do (batch size 1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExpertPlan {
    /// Bytes of each layer's expert cache (the share the engine gives it).
    pub cache_bytes: Vec<u64>,
    /// Experts each layer's cache holds (its hottest, by the routing profile).
    pub cached: Vec<u32>,
    /// Predicted share of the selected experts found in the cache.
    pub hit_rate: f64,
    /// Predicted bytes read from flash per token.
    pub read_bytes_per_token: f64,
}

impl ExpertPlan {
    /// The expert caches of grid steps `steps` over `model`'s MoE layers (`None` where its layers
    /// are neurons).
    pub(crate) fn of(model: &ModelSummary, steps: &[u32]) -> Option<ExpertPlan> {
        if model.layers.is_empty() || !model.layers.iter().all(FfnLayer::is_experts) {
            return None;
        }
        let g = model.grid;
        let (mut used, mut hits, mut read) = (0.0, 0.0, 0.0);
        let mut cached = Vec::new();
        for (l, &j) in model.layers.iter().zip(steps) {
            let curve = &l.hit[0];
            let total = curve[g as usize];
            let hit = if model.offloaded {
                curve[j as usize]
            } else {
                total
            };
            used += total;
            hits += hit;
            read += (total - hit).max(0.0) * l.read_bytes as f64;
            cached.push(step_neurons(l.neurons, g, j));
        }
        Some(ExpertPlan {
            cache_bytes: model
                .layers
                .iter()
                .zip(&cached)
                .map(|(l, &n)| n as u64 * l.neuron_bytes)
                .collect(),
            cached,
            hit_rate: if used > 0.0 { hits / used } else { 1.0 },
            read_bytes_per_token: read,
        })
    }

    /// One line for [`crate::Plan::describe`].
    pub fn describe(&self) -> String {
        let mib = |b: u64| b as f64 / 1048576.0;
        let per: Vec<String> = self
            .cache_bytes
            .iter()
            .zip(&self.cached)
            .map(|(&b, &n)| format!("{n} ({:.1})", mib(b)))
            .collect();
        format!(
            "expert cache: {:.1} MiB, predicted hit rate {:.1}%, {:.2} MiB read per token; experts (MiB) per layer: {}",
            mib(self.cache_bytes.iter().sum()),
            100.0 * self.hit_rate,
            self.read_bytes_per_token / 1048576.0,
            per.join(" ")
        )
    }
}
