//! The model as the planner sees it: sizes of the tensors outside the FFN, and per layer the FFN's
//! neurons, their bytes on flash and how often they fire (from the activation profile), summarized as a
//! hit curve over a grid of cache sizes.

use serde::{Deserialize, Serialize};

use crate::error::{PlannerError, Result};

/// A weight outside the FFN (attention, embedding, output, norms grouped as one).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TensorInfo {
    /// A name for people (`token_embd.weight`, `attention`, ...).
    pub name: String,
    /// Weight format name (`"q4_k"`, ...).
    pub format: String,
    /// Bytes in memory when resident.
    pub bytes: u64,
    /// Bytes a decode step reads from it (all of them for a matrix; one row for an embedding).
    pub touched_bytes: u64,
    /// Whether it may stay on flash and be read on demand (embedding rows; OATO placement).
    pub offloadable: bool,
    /// Whether it is computed as a matrix (its touched bytes go through the kernels) rather than
    /// looked up (an embedding row is copied).
    pub computed: bool,
}

/// One layer's FFN.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FfnLayer {
    /// Neurons (rows of gate/up, columns of down).
    pub neurons: u32,
    /// Bytes of one neuron's gate row, up row and down column.
    pub neuron_bytes: u64,
    /// Weight format of the gate/up rows (the kernels' rate is looked up by it).
    pub format: String,
    /// Bytes of one read from the neuron store (a unit).
    pub read_bytes: u64,
    /// Neurons per read unit.
    pub neurons_per_read: u32,
    /// Per batch size (as `ModelSummary::batch_sizes`): `hit[j]` is the expected number of firing
    /// neurons among the hottest `j * neurons / grid` (in the store's order), for `j` in `0..=grid`;
    /// `hit[grid]` is the expected number of firing neurons per step.
    pub hit: Vec<Vec<f64>>,
    /// Bytes of one neuron's gate row plus up row as sparse decode reads them (0: unknown, the
    /// parts are taken as a third of `neuron_bytes` each; see [`FfnLayer::with_parts`]).
    #[serde(default)]
    pub gate_up_bytes: u64,
    /// Bytes of one neuron's down column as sparse decode reads it (transposed, in the store's or
    /// sparse decode's format; 0: unknown).
    #[serde(default)]
    pub down_bytes: u64,
    /// Weight format of the down columns as sparse decode reads them (empty: `format`).
    #[serde(default)]
    pub down_format: String,
    /// Weight format of the down matrix as dense decode reads it, the file's (empty: `format`;
    /// [`FfnLayer::with_dense_down`]). Dense decode's FFN reads `gate_up_bytes` per neuron at
    /// `format`'s rate and the rest of `neuron_bytes` at this one's: a llama.cpp Q4_K_M file keeps
    /// gate and up in Q4_K (or Q5_0 where rows are not whole super-blocks) and down in Q4_K or Q6_K.
    #[serde(default)]
    pub dense_down_format: String,
    /// What the units are: neurons (summaries and plans of older builds) or routed experts
    /// ([`FfnLayer::from_expert_counts`]).
    #[serde(default)]
    pub unit: crate::experts::UnitKind,
}

impl FfnLayer {
    /// Builds a layer from per-neuron firing frequencies in the store's order (hottest first), one
    /// vector per batch size, summarized over `grid` steps.
    pub fn from_frequencies(
        neuron_bytes: u64,
        format: &str,
        read_bytes: u64,
        neurons_per_read: u32,
        freq: &[Vec<f32>],
        grid: u32,
    ) -> Result<Self> {
        let neurons = freq.first().map_or(0, |f| f.len());
        if neurons == 0 || freq.iter().any(|f| f.len() != neurons) || grid == 0 {
            return Err(PlannerError::Input(
                "FFN layer: frequencies of unequal or zero length".into(),
            ));
        }
        let hit = freq
            .iter()
            .map(|f| {
                let mut out = Vec::with_capacity(grid as usize + 1);
                let mut acc = 0.0f64;
                let mut i = 0usize;
                for j in 0..=grid as usize {
                    let end = step_neurons(neurons as u32, grid, j as u32) as usize;
                    while i < end {
                        acc += f64::from(f[i].clamp(0.0, 1.0));
                        i += 1;
                    }
                    out.push(acc);
                }
                out
            })
            .collect();
        Ok(FfnLayer {
            neurons: neurons as u32,
            neuron_bytes,
            format: format.to_string(),
            read_bytes,
            neurons_per_read: neurons_per_read.max(1),
            hit,
            gate_up_bytes: 0,
            down_bytes: 0,
            down_format: String::new(),
            dense_down_format: String::new(),
            unit: crate::experts::UnitKind::Neuron,
        })
    }

    /// The same layer with the bytes of its parts as sparse decode reads them: gate and up rows
    /// together, and the down column in `down_format` (which may differ from the file's).
    pub fn with_parts(mut self, gate_up_bytes: u64, down_bytes: u64, down_format: &str) -> Self {
        self.gate_up_bytes = gate_up_bytes;
        self.down_bytes = down_bytes;
        self.down_format = down_format.to_string();
        self
    }

    /// The format of the down columns as sparse decode reads them: `down_format`, else `format`.
    pub fn sparse_down_format(&self) -> &str {
        if self.down_format.is_empty() {
            &self.format
        } else {
            &self.down_format
        }
    }

    /// The expected firing neurons per step at batch size index `bi` among the hottest `neurons`
    /// (any count, not only a grid step's): the hit curve over `grid` steps, linear between them.
    pub fn hit_at(&self, bi: usize, grid: u32, neurons: f64) -> f64 {
        let curve = &self.hit[bi];
        let n = neurons.clamp(0.0, f64::from(self.neurons));
        let j = (0..grid)
            .find(|&j| f64::from(step_neurons(self.neurons, grid, j + 1)) >= n)
            .unwrap_or(grid.saturating_sub(1));
        let (a, b) = (
            f64::from(step_neurons(self.neurons, grid, j)),
            f64::from(step_neurons(self.neurons, grid, j + 1)),
        );
        let (ya, yb) = (curve[j as usize], curve[(j + 1).min(grid) as usize]);
        if b <= a {
            return yb;
        }
        ya + (yb - ya) * ((n - a) / (b - a)).clamp(0.0, 1.0)
    }

    /// The same layer with the format of its down matrix as dense decode reads it.
    pub fn with_dense_down(mut self, format: &str) -> Self {
        self.dense_down_format = format.to_string();
        self
    }
}

/// What read-ahead holds besides the neuron cache over a store of `ffn` bytes in `layers` layers,
/// where `room` bytes would be left for the cache without it: the next layer's uncached units
/// queued during this one, twice (the I/O thread's coalesced reads, and each unit copied out of
/// them for its step). A layer's uncached part is `(ffn - cache) / layers` with the cache `room`
/// less this, so it is the fixed point `2 (ffn - room) / (layers - 2)`, at most two layers,
/// nothing when the cache holds the FFN, and at most half the room (a smaller room reads less
/// ahead: the engine reads ahead half this). (Qwen2.5-Coder-0.5B at a 211 MiB budget: 8.9 MiB;
/// the decode's peak RSS grew by 9.4 MiB with read-ahead.)
pub fn read_ahead_bytes(ffn: u64, layers: usize, room: u64) -> u64 {
    let most = (2 * ffn / layers.max(1) as u64).min(room / 2);
    if layers <= 2 {
        return most;
    }
    (2 * ffn.saturating_sub(room) / (layers as u64 - 2)).min(most)
}

/// Neurons cached at grid step `j` of `grid` for a layer of `neurons`.
pub fn step_neurons(neurons: u32, grid: u32, j: u32) -> u32 {
    ((neurons as u64 * j as u64).div_ceil(grid as u64)) as u32
}

/// Everything the planner needs to know about a model. `Default` is an empty model (no layers,
/// nothing measured) for literals that set only what they need.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ModelSummary {
    /// A name for people (the file name).
    pub name: String,
    /// The model's fingerprint (as profiles and predictors record it); a plan records it.
    pub fingerprint: u64,
    /// Weights outside the FFN.
    pub tensors: Vec<TensorInfo>,
    /// FFN layers.
    pub layers: Vec<FfnLayer>,
    /// Bytes of the predictors (0: none; sparse decode then reads every gate row, see `predicted`).
    pub predictor_bytes: u64,
    /// Whether sparse decode selects neurons with predictors (else by computing every gate row, so
    /// its cost counts the gate rows in full).
    pub predicted: bool,
    /// Whether selection without predictors also computes every up row (the output-norm score,
    /// `|act(gate) · up| · |down|`); else only the firing neurons' up rows.
    #[serde(default)]
    pub select_up: bool,
    /// Bytes of KV cache per position.
    pub kv_bytes_per_position: u64,
    /// Bytes the process holds before any weight (code, tokenizer, buffers).
    pub process_bytes: u64,
    /// Batch sizes the hit curves are given for (ascending; 1 first).
    pub batch_sizes: Vec<u32>,
    /// Grid steps of the hit curves.
    pub grid: u32,
    /// Whether the FFN lives in a neuron store (flash offload); else it is all in memory.
    pub offloaded: bool,
    /// Whether decode over the store reads each next layer's uncached units ahead (the engine
    /// does without predictors): under a memory budget, what that holds is counted beside the
    /// cache ([`read_ahead_bytes`]). False in summaries of older builds.
    #[serde(default)]
    pub reads_ahead: bool,
    /// Multiply-adds per prompt token through every layer's weight matrices (0: unknown, no prompt
    /// prediction).
    #[serde(default)]
    pub prompt_macs_per_token: f64,
    /// Of those, the FFN down projections' (run transposed by a sparse or offloaded FFN).
    #[serde(default)]
    pub down_macs_per_token: f64,
    /// Multiply-adds of attention per (query, key) pair over all layers.
    #[serde(default)]
    pub attn_macs_per_pair: f64,
    /// Multiply-adds of one token's output projection.
    #[serde(default)]
    pub output_macs: f64,
    /// Bytes of the output projection (read from flash for a prompt's last token when streamed).
    #[serde(default)]
    pub output_bytes: u64,
    /// Tokens per prompt step over a neuron store (each step streams the FFN not in memory once).
    #[serde(default)]
    pub prompt_step_tokens: u32,
    /// [`ModelSummary::prompt_macs_per_token`] by weight format (empty in summaries of older
    /// builds: every format at the device's one prompt rate).
    #[serde(default)]
    pub prompt_macs: Vec<FormatMacs>,
    /// Over a neuron store, the memory a prompt step holds at each step the engine may take, longest
    /// first (`prompt_step_tokens` halved): where the cache cannot hold the FFN the engine takes the
    /// longest step whose memory is at most half the cache (else the shortest) and lends it that
    /// memory for the step ([`ModelSummary::prompt_step`]). Empty: `prompt_step_tokens`, nothing
    /// lent.
    #[serde(default)]
    pub prompt_step_bytes: Vec<StepBytes>,
}

/// The memory a prompt step of `tokens` tokens holds over a neuron store.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct StepBytes {
    /// Tokens of the step.
    pub tokens: u32,
    /// Bytes it holds besides the caches.
    pub bytes: u64,
}

/// Multiply-adds per prompt token through the layers' matrices of one weight format.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FormatMacs {
    /// Weight format name (as [`TensorInfo::format`]).
    pub format: String,
    /// Multiply-adds per token.
    pub macs: f64,
    /// Whether these are FFN down projections (run transposed by a sparse or offloaded FFN, at the
    /// device's transposed rate).
    pub down: bool,
}

impl ModelSummary {
    /// Tokens per prompt step over a store with a neuron cache of `cache` bytes of an FFN of `ffn`,
    /// and the bytes the cache lends the step (see [`ModelSummary::prompt_step_bytes`]).
    pub fn prompt_step(&self, cache: u64, ffn: u64) -> (u32, u64) {
        if cache >= ffn {
            return (self.prompt_step_tokens, 0);
        }
        let mut pick = (self.prompt_step_tokens, 0);
        for s in &self.prompt_step_bytes {
            pick = (s.tokens, s.bytes);
            if s.bytes <= cache / 2 {
                break;
            }
        }
        pick
    }

    /// Bytes of weights a dense decode step reads: the computed tensors' touched bytes, every FFN
    /// neuron and the predictors (the working set [`crate::DeviceProfile::for_working_set`] takes).
    pub fn decode_weight_bytes(&self) -> u64 {
        let tensors: u64 = self
            .tensors
            .iter()
            .filter(|x| x.computed)
            .map(|x| x.touched_bytes)
            .sum();
        let ffn = self.ffn_bytes();
        let predictors = if self.predicted {
            self.predictor_bytes
        } else {
            0
        };
        tensors + ffn + predictors
    }

    /// Multiply-adds of one FFN neuron for one token (its gate and up rows and its down column,
    /// `3 × d_model`), from [`ModelSummary::down_macs_per_token`] over every layer's neurons; 0 when
    /// unknown.
    pub fn neuron_macs(&self) -> f64 {
        let neurons: f64 = self.layers.iter().map(|l| l.neurons as f64).sum();
        if neurons > 0.0 {
            3.0 * self.down_macs_per_token / neurons
        } else {
            0.0
        }
    }

    /// Checks shapes: every layer has one hit curve per batch size of `grid + 1` non-decreasing points.
    pub fn validate(&self) -> Result<()> {
        let bad = |w: String| Err(PlannerError::Input(format!("model summary: {w}")));
        if self.layers.is_empty() {
            return bad("no FFN layers".into());
        }
        if self.batch_sizes.is_empty() || self.batch_sizes[0] != 1 {
            return bad("batch sizes must start at 1".into());
        }
        if self.grid == 0 || self.grid > 4096 {
            return bad(format!("grid of {} steps", self.grid));
        }
        for (l, layer) in self.layers.iter().enumerate() {
            if layer.hit.len() != self.batch_sizes.len() {
                return bad(format!(
                    "layer {l}: hit curves do not match the batch sizes"
                ));
            }
            for h in &layer.hit {
                if h.len() != self.grid as usize + 1
                    || h.windows(2).any(|w| w[1] < w[0])
                    || h.iter().any(|x| !x.is_finite())
                {
                    return bad(format!(
                        "layer {l}: hit curve is not a non-decreasing curve"
                    ));
                }
            }
            if layer.neuron_bytes == 0 || layer.read_bytes == 0 {
                return bad(format!("layer {l}: zero-byte neurons"));
            }
        }
        Ok(())
    }

    /// Bytes of the whole FFN.
    pub fn ffn_bytes(&self) -> u64 {
        self.layers
            .iter()
            .map(|l| l.neurons as u64 * l.neuron_bytes)
            .sum()
    }

    /// Bytes of the weights outside the FFN.
    pub fn other_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.bytes).sum()
    }
}
