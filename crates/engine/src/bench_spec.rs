//! Speculative decoding against plain decoding (`sparrow bench --lookup N`, `--self-draft`,
//! `--draft MODEL`): every prompt of a set generated both ways back to back, alternating which goes
//! first, so that their ratio compares the two on the same machine state; with greedy sampling,
//! whether the outputs were the same; over a neuron or expert store, the bytes read from flash per
//! token each way.

use crate::error::Result;
use crate::generate::Engine;
use crate::lookup::Lookup;
use crate::spec_stats::SpecStats;
use crate::speculate::{DraftSource, SpecOptions};
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
    /// Bytes read from flash by the decode steps without speculation, over every repetition and
    /// prompt (0 in memory).
    pub plain_bytes_read: u64,
    /// Bytes read from flash by the verification (and draft) steps.
    pub spec_bytes_read: u64,
    /// Decode tokens without speculation, over every repetition and prompt.
    pub plain_decode_tokens: usize,
    /// Tokens kept by the verification steps, over every repetition and prompt.
    pub spec_decode_tokens: usize,
    /// Prompts (of every repetition) whose generated tokens differed between the two ways.
    pub differing: usize,
}

impl SpecBenchReport {
    /// Bytes read from flash per decode token without speculation.
    pub fn plain_bytes_per_token(&self) -> f64 {
        self.plain_bytes_read as f64 / self.plain_decode_tokens.max(1) as f64
    }

    /// Bytes read from flash per token kept with speculation (each verification step's reads
    /// over the tokens it kept).
    pub fn spec_bytes_per_token(&self) -> f64 {
        self.spec_bytes_read as f64 / self.spec_decode_tokens.max(1) as f64
    }

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
    fn add(&mut self, g: &sampling::Generation) {
        self.tokens += g.timings.decode_tokens;
        self.seconds += g.timings.decode_s;
        self.generated += g.generated_ids.len();
    }

    fn rate(&self) -> f64 {
        if self.seconds > 0.0 {
            self.tokens as f64 / self.seconds
        } else {
            0.0
        }
    }
}

/// Bytes the engine's decode steps have read from flash so far (its neuron store's, whose prompt
/// steps count apart, or its expert store's, prompts included; 0 in memory).
pub fn decode_bytes_read(eng: &Engine<'_>) -> u64 {
    let units = eng
        .sparse()
        .and_then(|s| s.offload())
        .map_or(0, |o| o.stats().bytes_read);
    units + eng.experts().map_or(0, |x| x.counters().bytes_read)
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
    compare(eng, prompts, req, max_draft, reps, &mut || {
        Ok(Box::new(Lookup::default()))
    })
}

/// The counts of prompt lookup (up to `max_draft` tokens a step) generating every prompt of
/// `prompts` with `req`, with no run without speculation: the share of drafts kept that `sparrow
/// plan --measure-speculation` plans with.
pub fn lookup_acceptance(
    eng: &Engine<'_>,
    prompts: &[Vec<u32>],
    req: &GenerateRequest,
    max_draft: usize,
) -> Result<SpecStats> {
    let mut stats = SpecStats::default();
    for p in prompts {
        let mut src = Lookup::default();
        let s = eng.generate_speculative(p, req, &mut src, SpecOptions { max_draft }, |_| {
            Flow::Continue
        })?;
        stats.add(&s.stats);
    }
    Ok(stats)
}

/// A new draft source for each speculative generation.
pub type MakeSource<'s> = dyn FnMut() -> Result<Box<dyn DraftSource + 's>> + 's;

/// [`lookup`] with the draft source `make` gives (a new one per generation).
pub fn compare(
    eng: &Engine<'_>,
    prompts: &[Vec<u32>],
    req: &GenerateRequest,
    max_draft: usize,
    reps: usize,
    make: &mut MakeSource<'_>,
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
                let before = decode_bytes_read(eng);
                if way == 0 {
                    let g = eng.generate(p, req, |_| Flow::Continue)?;
                    r.plain_bytes_read += decode_bytes_read(eng) - before;
                    r.plain_decode_tokens += g.timings.decode_tokens;
                    plain.add(&g);
                    ids[0] = g.generated_ids;
                } else {
                    let mut src = make()?;
                    let s =
                        eng.generate_speculative(p, req, &mut *src, opts, |_| Flow::Continue)?;
                    r.stats.add(&s.stats);
                    let g = s.generation;
                    r.spec_bytes_read += decode_bytes_read(eng) - before;
                    r.spec_decode_tokens += g.timings.decode_tokens;
                    spec.add(&g);
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
