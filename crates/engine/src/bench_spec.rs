//! Speculative decoding against plain decoding (`sparrow bench --lookup N`): every prompt of a set
//! generated both ways back to back, alternating which goes first, so that their ratio compares the
//! two on the same machine state; with greedy sampling, whether the outputs were the same.

use crate::error::Result;
use crate::generate::Engine;
use crate::speculate::{Lookup, SpecOptions, SpecStats};
use sampling::{Flow, GenerateRequest};

/// What [`lookup`] measured.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct SpecBenchReport {
    /// Most tokens drafted per step.
    pub max_draft: usize,
    /// Prompts of the set.
    pub prompts: usize,
    /// Per repetition: decode tokens per second over every prompt without speculation (all their
    /// decode steps' tokens over all their decode time).
    pub plain_tok_s: Vec<f64>,
    /// Per repetition: the same with lookup (the tokens its verification steps kept).
    pub lookup_tok_s: Vec<f64>,
    /// Per repetition: tokens generated without speculation, and with (the same when greedy output
    /// is the same).
    pub plain_tokens: Vec<usize>,
    /// See `plain_tokens`.
    pub lookup_tokens: Vec<usize>,
    /// The speculation's counts over every repetition and prompt.
    pub stats: SpecStats,
    /// Prompts (of every repetition) whose generated tokens differed between the two ways.
    pub differing: usize,
}

impl SpecBenchReport {
    /// Mean and standard deviation of the per-repetition ratios lookup/plain of decode tok/s.
    pub fn ratio(&self) -> (f64, f64) {
        let r: Vec<f64> = self
            .lookup_tok_s
            .iter()
            .zip(&self.plain_tok_s)
            .map(|(l, p)| l / p)
            .collect();
        crate::bench::mean_sd(&r)
    }
}

/// Decode tokens and seconds of one way over every prompt, summed.
#[derive(Default)]
struct Sums {
    tokens: usize,
    seconds: f64,
    generated: usize,
}

impl Sums {
    fn rate(&self) -> f64 {
        if self.seconds > 0.0 {
            self.tokens as f64 / self.seconds
        } else {
            0.0
        }
    }
}

/// Generates every prompt of `prompts` with `req` without speculation and with prompt lookup of up
/// to `max_draft` tokens, `reps` times (at least once), the two ways back to back for each prompt,
/// the first of them alternating.
pub fn lookup(
    eng: &Engine<'_>,
    prompts: &[Vec<u32>],
    req: &GenerateRequest,
    max_draft: usize,
    reps: usize,
) -> Result<SpecBenchReport> {
    let mut r = SpecBenchReport {
        max_draft,
        prompts: prompts.len(),
        ..Default::default()
    };
    let opts = SpecOptions { max_draft };
    let mut turn = 0usize;
    for _ in 0..reps.max(1) {
        let (mut plain, mut spec) = (Sums::default(), Sums::default());
        for p in prompts {
            let mut ids = [Vec::new(), Vec::new()];
            for way in [turn % 2, 1 - turn % 2] {
                if way == 0 {
                    let g = eng.generate(p, req, |_| Flow::Continue)?;
                    plain.tokens += g.timings.decode_tokens;
                    plain.seconds += g.timings.decode_s;
                    plain.generated += g.generated_ids.len();
                    ids[0] = g.generated_ids;
                } else {
                    let s =
                        eng.generate_speculative(p, req, &mut Lookup::default(), opts, |_| {
                            Flow::Continue
                        })?;
                    let g = s.generation;
                    spec.tokens += g.timings.decode_tokens;
                    spec.seconds += g.timings.decode_s;
                    spec.generated += g.generated_ids.len();
                    r.stats.add(&s.stats);
                    ids[1] = g.generated_ids;
                }
            }
            turn += 1;
            r.differing += usize::from(ids[0] != ids[1]);
        }
        r.plain_tok_s.push(plain.rate());
        r.lookup_tok_s.push(spec.rate());
        r.plain_tokens.push(plain.generated);
        r.lookup_tokens.push(spec.generated);
    }
    Ok(r)
}
