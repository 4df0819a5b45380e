//! What a prompt costs under a plan: the time to first token from the device's prompt tile rate
//! ([`crate::DeviceProfile::prompt_flops`]), the model's multiply-adds, and, for an offloaded model,
//! the FFN bytes each prompt step streams from flash while it computes.

use serde::{Deserialize, Serialize};

use crate::device::DeviceProfile;
use crate::model::ModelSummary;

/// A prompt's cost model ([`PromptCost::seconds`] of `n` tokens), made by [`prompt_cost`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PromptCost {
    /// Seconds of compute per token through the layers' weights.
    pub token_s: f64,
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
            let compute = self.token_s * m as f64 + self.pair_s * pairs;
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

/// The prompt cost of `model` on `device` with `ffn_cache_bytes` of its FFN in memory, the FFN
/// sparse or not (`sparse`: its down rows then run transposed, at `prompt_t_flops`) and the
/// embedding and output on flash or not (`streamed`); `None` when the device profile has no prompt
/// rate (older profiles) or the summary no multiply-add counts.
pub fn prompt_cost(
    device: &DeviceProfile,
    model: &ModelSummary,
    ffn_cache_bytes: u64,
    sparse: bool,
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
    let down = if sparse || model.offloaded {
        model.down_macs_per_token.min(model.prompt_macs_per_token)
    } else {
        0.0
    };
    let (step_tokens, step_io_s) = if model.offloaded {
        let ffn: u64 = model
            .layers
            .iter()
            .map(|l| l.neurons as u64 * l.neuron_bytes)
            .sum();
        let cold = ffn.saturating_sub(ffn_cache_bytes) as f64;
        (
            model.prompt_step_tokens,
            cold / device.flash_seq_bps.max(1.0),
        )
    } else {
        (0, 0.0)
    };
    let output_read = if streamed {
        model.output_bytes as f64 / device.flash_seq_bps.max(1.0)
    } else {
        0.0
    };
    Some(PromptCost {
        token_s: (model.prompt_macs_per_token - down) * per_mac + down * transposed,
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
    }
}
