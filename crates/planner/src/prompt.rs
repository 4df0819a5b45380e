//! What a prompt costs under a plan: the time to first token from the device's prompt tile rates
//! (per weight format, [`crate::DeviceProfile::prompt_rate`], and for short prompts the measured
//! [`crate::DeviceProfile::prompt_short_flops`]), the model's multiply-adds by format, and, for an
//! offloaded model, the FFN bytes each prompt step streams from flash while it computes.

use serde::{Deserialize, Serialize};

use crate::device::DeviceProfile;
use crate::model::ModelSummary;

/// A prompt's cost model ([`PromptCost::seconds`] of `n` tokens), made by [`prompt_cost`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PromptCost {
    /// Seconds of compute per token through the layers' weights.
    pub token_s: f64,
    /// The same for a step of fewer than `tile_min_tokens` tokens (0: `token_s`).
    #[serde(default)]
    pub short_token_s: f64,
    /// Fewest tokens of a step that take `token_s` (0: every step).
    #[serde(default)]
    pub tile_min_tokens: u32,
    /// Seconds of attention per (query, key) pair, the key at or before the query.
    pub pair_s: f64,
    /// Tokens per prompt step (0: the whole prompt is one step).
    pub step_tokens: u32,
    /// Seconds of flash reads per step (the FFN bytes not in memory, at the sequential rate),
    /// overlapping the step's compute.
    pub step_io_s: f64,
    /// Seconds once per prompt: the last token's output projection (and its read, on flash).
    pub once_s: f64,
}

impl PromptCost {
    /// Predicted seconds to the first token of an `n`-token prompt: per step the larger of its
    /// compute and its reads, plus the output projection.
    pub fn seconds(&self, n: usize) -> f64 {
        let step = match self.step_tokens {
            0 => n.max(1),
            s => s as usize,
        };
        let mut t = self.once_s;
        let mut done = 0usize;
        while done < n {
            let m = step.min(n - done);
            let pairs = (m * done + m * (m + 1) / 2) as f64;
            let per = if m < self.tile_min_tokens as usize && self.short_token_s > 0.0 {
                self.short_token_s
            } else {
                self.token_s
            };
            let compute = per * m as f64 + self.pair_s * pairs;
            t += compute.max(self.step_io_s);
            done += m;
        }
        t
    }

    /// Predicted prompt tokens per second for an `n`-token prompt.
    pub fn tok_s(&self, n: usize) -> f64 {
        n as f64 / self.seconds(n).max(1e-12)
    }
}

/// The prompt cost of `model` on `device` with `ffn_cache_bytes` of its FFN in memory, the share
/// `sparse` of its layers sparse (their down rows run transposed, at `prompt_t_flops`; every
/// layer's over a store) and the
/// embedding and output on flash or not (`streamed`); `None` when the device profile has no prompt
/// rate (older profiles) or the summary no multiply-add counts.
pub fn prompt_cost(
    device: &DeviceProfile,
    model: &ModelSummary,
    ffn_cache_bytes: u64,
    sparse: f64,
    streamed: bool,
) -> Option<PromptCost> {
    let flops = device.prompt_flops;
    if !(flops > 0.0 && model.prompt_macs_per_token > 0.0) {
        return None;
    }
    let per_mac = 2.0 / flops;
    let transposed = if device.prompt_t_flops > 0.0 {
        2.0 / device.prompt_t_flops
    } else {
        per_mac
    };
    let share = if model.offloaded {
        1.0
    } else {
        sparse.clamp(0.0, 1.0)
    };
    let down = model.down_macs_per_token.min(model.prompt_macs_per_token) * share;
    let mut token_s = (model.prompt_macs_per_token - down) * per_mac + down * transposed;
    if !model.prompt_macs.is_empty() {
        // Each format at its own tile's rate; down projections run transposed where sparse.
        token_s = model
            .prompt_macs
            .iter()
            .map(|f| {
                let tile = 2.0 * f.macs / device.prompt_rate(&f.format).max(1.0);
                match f.down {
                    true => f.macs * share * transposed + tile * (1.0 - share),
                    false => tile,
                }
            })
            .sum();
    }
    // A short step's products, transposed ones too, at the one short rate.
    let short_token_s = match device.prompt_short_flops > 0.0 {
        true => 2.0 * model.prompt_macs_per_token / device.prompt_short_flops,
        false => 0.0,
    };
    let (step_tokens, step_io_s) = if model.offloaded {
        let ffn: u64 = model
            .layers
            .iter()
            .map(|l| l.neurons as u64 * l.neuron_bytes)
            .sum();
        // The step's memory is lent by the cache: what it leaves cached, the step streams.
        let (tokens, lent) = model.prompt_step(ffn_cache_bytes, ffn);
        let cold = ffn.saturating_sub(ffn_cache_bytes.saturating_sub(lent)) as f64;
        (tokens, cold / device.flash_seq_bps.max(1.0))
    } else {
        (0, 0.0)
    };
    let output_read = if streamed {
        model.output_bytes as f64 / device.flash_seq_bps.max(1.0)
    } else {
        0.0
    };
    Some(PromptCost {
        token_s,
        short_token_s,
        tile_min_tokens: device.prompt_tile_min_tokens,
        pair_s: model.attn_macs_per_pair * per_mac,
        step_tokens,
        step_io_s,
        once_s: model.output_macs * per_mac + output_read,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_take_the_larger_of_compute_and_reads() {
        let c = PromptCost {
            token_s: 1e-3,
            short_token_s: 0.0,
            tile_min_tokens: 0,
            pair_s: 0.0,
            step_tokens: 4,
            step_io_s: 2e-3,
            once_s: 0.5,
        };
        // Three steps of 4 tokens (4 ms of compute against 2 ms of reads) and one of 2 (2 ms each).
        assert!((c.seconds(14) - (0.5 + 3.0 * 4e-3 + 2e-3)).abs() < 1e-12);
        let io_bound = PromptCost {
            step_io_s: 10e-3,
            ..c
        };
        assert!((io_bound.seconds(14) - (0.5 + 4.0 * 10e-3)).abs() < 1e-12);
        // Attention: every query attends to itself and the keys before it, across steps.
        let attn = PromptCost {
            token_s: 0.0,
            short_token_s: 0.0,
            tile_min_tokens: 0,
            pair_s: 1.0,
            step_tokens: 0,
            step_io_s: 0.0,
            once_s: 0.0,
        };
        assert_eq!(attn.seconds(5), 15.0);
        let stepped = PromptCost {
            step_tokens: 2,
            ..attn
        };
        assert_eq!(stepped.seconds(5), 15.0);
        assert!((attn.tok_s(5) - 5.0 / 15.0).abs() < 1e-12);
        // Steps shorter than the integer tiles' threshold at the short rate.
        let short = PromptCost {
            short_token_s: 3e-3,
            tile_min_tokens: 4,
            ..c
        };
        // Three steps of 4 (1 ms a token), one of 2 (3 ms a token).
        assert!((short.seconds(14) - (0.5 + 12.0 * 1e-3 + 2.0 * 3e-3)).abs() < 1e-12);
    }
}
