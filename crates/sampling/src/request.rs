//! What a generation asks for and what it gives back: [`GenerateRequest`], [`Generation`],
//! [`StopReason`], [`Timings`], and the streaming callback's [`Flow`].

use crate::SamplerConfig;

/// What to generate.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    /// Maximum number of new tokens.
    pub max_tokens: usize,
    /// Sampling settings.
    pub sampler: SamplerConfig,
    /// Generation stops when the text contains one of these (the stop string is not returned).
    pub stop_strings: Vec<String>,
    /// Stop at the model's end-of-sequence tokens.
    pub stop_at_eos: bool,
}

impl Default for GenerateRequest {
    fn default() -> Self {
        GenerateRequest {
            max_tokens: 128,
            sampler: SamplerConfig::default(),
            stop_strings: Vec::new(),
            stop_at_eos: true,
        }
    }
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// An end-of-sequence token was generated.
    Eos,
    /// A stop string appeared in the text.
    StopString,
    /// `max_tokens` were generated.
    Length,
    /// The callback asked to stop.
    Cancelled,
}

/// Timings of one generation.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Timings {
    /// Prompt tokens processed in the prefill.
    pub prefill_tokens: usize,
    /// Seconds spent in the prefill (including the first token's logits).
    pub prefill_s: f64,
    /// Tokens produced by decode steps (the first generated token comes from the prefill).
    pub decode_tokens: usize,
    /// Seconds spent in decode steps.
    pub decode_s: f64,
}

impl Timings {
    /// Prefill tokens per second.
    pub fn prefill_tok_s(&self) -> f64 {
        rate(self.prefill_tokens, self.prefill_s)
    }

    /// Decode tokens per second.
    pub fn decode_tok_s(&self) -> f64 {
        rate(self.decode_tokens, self.decode_s)
    }
}

fn rate(n: usize, s: f64) -> f64 {
    if s > 0.0 {
        n as f64 / s
    } else {
        0.0
    }
}

/// The result of the engine's `Engine::generate`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Generation {
    /// Prompt token ids.
    pub prompt_ids: Vec<u32>,
    /// Generated token ids (an end-of-sequence token, when one ended the generation, is included).
    pub generated_ids: Vec<u32>,
    /// Generated text (special tokens and any stop string left out).
    pub text: String,
    /// Why it ended.
    pub stop_reason: StopReason,
    /// Timings.
    pub timings: Timings,
}

/// Returned by the streaming callback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// Go on generating.
    Continue,
    /// Stop now.
    Stop,
}
