//! Whether and how far to speculate (issue 51): a verification step of `k` drafted tokens runs
//! `k + 1` tokens in one step, which the cost model prices as a decode step at batch size `k + 1`
//! (each unit read once for the step, [`crate::Predicted`]); a step keeps on average
//! `E(k, a) = (1 - a^(k+1)) / (1 - a)` tokens when each drafted token is kept with probability `a`
//! (independently, until the first rejected one). The plan takes the source and `k` that give the
//! most tokens per unit time, `E(k, a) / (cost(k + 1) + k · draft)` in units of a one-token step,
//! and "off" when none beats 1.
//!
//! `draft` is what drafting one token costs: nothing for prompt lookup; for a self-draft a
//! one-token step that computes the cached share of the FFN and reads nothing
//! (`attention + predictors + FFN × share`). Acceptance rates are measured ones where the caller
//! has them, else the defaults stated here.

use serde::{Deserialize, Serialize};

use crate::plan::Predicted;

/// Default share of prompt-lookup drafts kept: 54% were on the code-editing prompts
/// (docs/benchmarks/speculation.md); less on prose, so a round 0.5.
pub const LOOKUP_ACCEPTANCE: f64 = 0.5;

/// A drafting source the plan may choose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SpecSource {
    /// No speculation.
    Off,
    /// Prompt lookup (`--lookup N`).
    Lookup,
    /// The model drafting from its memory part only (`--self-draft N`).
    SelfDraft,
}

/// The plan's speculation: the source, the most drafted tokens per step, and the figures it was
/// chosen on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpecChoice {
    /// Which source (`Off`: none beats plain decoding).
    pub source: SpecSource,
    /// Most drafted tokens per verification step (0 when off).
    pub max_draft: u32,
    /// Share of drafted tokens assumed kept.
    pub acceptance: f64,
    /// Whether `acceptance` was measured (else the default stated in this module).
    pub measured: bool,
    /// Predicted tokens per unit time over plain decoding (1 when off).
    pub gain: f64,
}

/// A source the planner may take, with what it assumes of it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate {
    /// The source.
    pub source: SpecSource,
    /// Share of its drafts kept.
    pub acceptance: f64,
    /// Whether `acceptance` was measured.
    pub measured: bool,
    /// Cost of drafting one token, in one-token decode steps.
    pub draft_cost: f64,
}

/// Tokens a verification step of `k` drafted tokens keeps on average, each kept with probability
/// `a` until the first rejection (the step's own chosen token included): `(1 - a^(k+1)) / (1 - a)`.
pub fn expected_tokens(k: u32, a: f64) -> f64 {
    let a = a.clamp(0.0, 1.0);
    if a >= 1.0 {
        return f64::from(k) + 1.0;
    }
    (1.0 - a.powi(k as i32 + 1)) / (1.0 - a)
}

/// The best of `candidates` for the step costs in `predicted` (batch size 1 first; a batch size
/// `b` prices a step of `b - 1` drafted tokens): the one of most tokens per unit time, `Off` when
/// none beats 1 (or no batch size above 1 was priced).
pub fn choose(predicted: &[Predicted], candidates: &[Candidate]) -> SpecChoice {
    let off = SpecChoice {
        source: SpecSource::Off,
        max_draft: 0,
        acceptance: 0.0,
        measured: false,
        gain: 1.0,
    };
    let Some(one) = predicted
        .first()
        .filter(|p| p.batch == 1 && p.decode_s > 0.0)
    else {
        return off;
    };
    let mut best = off;
    for c in candidates {
        for p in &predicted[1..] {
            let k = p.batch - 1;
            let cost = p.decode_s / one.decode_s + f64::from(k) * c.draft_cost.max(0.0);
            let gain = expected_tokens(k, c.acceptance) / cost;
            if gain.is_finite() && gain > best.gain {
                best = SpecChoice {
                    source: c.source,
                    max_draft: k,
                    acceptance: c.acceptance,
                    measured: c.measured,
                    gain,
                };
            }
        }
    }
    best
}

/// A self-draft's candidate from batch size 1's prediction: a draft token costs attention,
/// predictors and the cached share of the FFN's compute, with no read; the share of drafts kept
/// defaults to that share (measured on Qwen2.5-Coder-0.5B: 53% kept with half its FFN cached,
/// 14% with 18%; docs/benchmarks/speculation.md).
pub fn self_draft(one: &Predicted, cached_share: f64, acceptance: Option<f64>) -> Candidate {
    let share = cached_share.clamp(0.0, 1.0);
    let draft = one.attn_s + one.pred_s + one.ffn_s * share;
    let acceptance = acceptance.filter(|a| a.is_finite());
    Candidate {
        source: SpecSource::SelfDraft,
        acceptance: acceptance.map_or(share, |a| a.clamp(0.0, 1.0)),
        measured: acceptance.is_some(),
        draft_cost: if one.decode_s > 0.0 {
            draft / one.decode_s
        } else {
            f64::INFINITY
        },
    }
}

/// Prompt lookup's candidate: drafting is free.
pub fn lookup(acceptance: Option<f64>) -> Candidate {
    let acceptance = acceptance.filter(|a| a.is_finite());
    Candidate {
        source: SpecSource::Lookup,
        acceptance: acceptance.map_or(LOOKUP_ACCEPTANCE, |a| a.clamp(0.0, 1.0)),
        measured: acceptance.is_some(),
        draft_cost: 0.0,
    }
}

impl SpecChoice {
    /// The choice in words.
    pub fn describe(&self) -> String {
        let how = if self.measured { "measured" } else { "default" };
        match self.source {
            SpecSource::Off => "speculation: off (no draft length beats plain decoding)".into(),
            s => format!(
                "speculation: {} up to {} tokens a step ({:.0}% of drafts kept, {how}; {:.2}x tokens per second predicted)",
                if s == SpecSource::Lookup { "lookup" } else { "self-draft" },
                self.max_draft,
                self.acceptance * 100.0,
                self.gain
            ),
        }
    }
}
