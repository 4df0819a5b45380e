//! Best-of-N (PowerInfer-2's batched decode): `n` sampled continuations of one prompt decoded as one
//! batch, ranked by mean log-probability.
//!
//! The prompt is prefilled once and its KV cache copied to every sequence. Each step then runs the
//! sequences still going as one batch ([`crate::Engine::forward_batch`]): the weights are read once
//! for all of them, and each token is computed as a sequential run would compute it (same kernels),
//! so candidate `i` is the text a plain [`crate::Engine::generate`] with seed `seed + i` gives.

use std::time::Instant;

use crate::continuation::{Accepted, Continuation};
use crate::error::{EngineError, Result};
use crate::generate::Engine;
use crate::perplexity::log_sum_exp;
use sampling::{Flow, GenerateRequest, Generation, StopReason, Timings};
use sampling::{Sampler, SamplerConfig};
use transformer::forward::{KvCache, Logits};

/// One candidate of [`Engine::generate_best_of`].
#[derive(Debug, Clone, serde::Serialize)]
pub struct Candidate {
    /// The candidate's tokens and text (its `timings` are left empty: see [`BestOf::timings`]).
    #[serde(flatten)]
    pub generation: Generation,
    /// The sampling seed that gives this candidate (the request's seed plus its index).
    pub seed: u64,
    /// Mean natural-log probability of its generated tokens under the model (the raw logits'
    /// softmax, before temperature or truncation): the ranking key.
    pub mean_logprob: f64,
}

/// The result of [`Engine::generate_best_of`].
#[derive(Debug, Clone, serde::Serialize)]
pub struct BestOf {
    /// Every candidate, best (highest mean log-probability) first.
    pub candidates: Vec<Candidate>,
    /// The prompt's prefill (once), and every decode step: `decode_tokens` counts tokens of all
    /// sequences, so `decode_tok_s` is the batch's total rate.
    pub timings: Timings,
}

/// One sequence of the batch.
struct Seq<'t> {
    cont: Continuation<'t>,
    sampler: Sampler,
    cache: KvCache,
    logprob: f64,
    ended: Option<StopReason>,
    seed: u64,
}

impl Seq<'_> {
    /// Samples from `logits` (this sequence's row), scores the choice, and takes it: the token and
    /// the text that became final when the sequence goes on, `None` when it ended.
    fn step(
        &mut self,
        logits: &mut [f32],
        max_tokens: usize,
    ) -> Result<Option<(u32, usize, usize)>> {
        if self.cont.generated.len() >= max_tokens {
            self.ended = Some(StopReason::Length);
            return Ok(None);
        }
        let lse = log_sum_exp(logits);
        let raw = logits.to_vec();
        let next = self.sampler.sample(logits, &self.cont.history);
        let logit = raw
            .get(next as usize)
            .map_or(f64::NEG_INFINITY, |&v| v as f64);
        self.logprob += logit - lse;
        match self.cont.accept(next)? {
            Accepted::Ended(reason) => {
                self.ended = Some(reason);
                Ok(None)
            }
            Accepted::Going { from, to } => Ok(Some((next, from, to))),
        }
    }
}

impl Engine<'_> {
    /// Decodes `n` sampled continuations of `prompt_ids` as one batch and returns them ranked by
    /// mean log-probability (best first). Sequence `i` samples with seed `req.sampler.seed + i`
    /// and is the continuation [`Engine::generate`] gives with that seed. `on_text(i, piece)`
    /// streams sequence `i`'s text as it becomes final (as `generate`'s callback does);
    /// [`Flow::Stop`] ends every sequence still going ([`StopReason::Cancelled`]).
    pub fn generate_best_of(
        &self,
        prompt_ids: &[u32],
        req: &GenerateRequest,
        n: usize,
        mut on_text: impl FnMut(usize, &str) -> Flow,
    ) -> Result<BestOf> {
        if prompt_ids.is_empty() {
            return Err(EngineError::Request(
                "the prompt is empty: give at least one token".into(),
            ));
        }
        if n == 0 {
            return Err(EngineError::Request(
                "best-of needs at least one sequence".into(),
            ));
        }
        let mut timings = Timings {
            prefill_tokens: prompt_ids.len(),
            ..Default::default()
        };
        let t0 = Instant::now();
        let mut cache = self.new_cache();
        let first = self.forward(&mut cache, prompt_ids, Logits::Last)?;
        timings.prefill_s = t0.elapsed().as_secs_f64();

        let vocab = first.len();
        let mut seqs: Vec<Seq<'_>> = (0..n)
            .map(|i| {
                let seed = req.sampler.seed.wrapping_add(i as u64);
                Seq {
                    cont: Continuation::new(self.tokenizer(), prompt_ids, req),
                    sampler: Sampler::new(SamplerConfig {
                        seed,
                        ..req.sampler.clone()
                    }),
                    cache: cache.clone(),
                    logprob: 0.0,
                    ended: None,
                    seed,
                }
            })
            .collect();
        drop(cache);
        // Rows of logits for the sequences still going, in the order of `going`.
        let mut going: Vec<usize> = (0..n).collect();
        let mut logits: Vec<f32> = (0..n).flat_map(|_| first.iter().copied()).collect();
        let t_decode = Instant::now();
        'steps: while !going.is_empty() {
            let mut next_ids = Vec::with_capacity(going.len());
            let mut next_going = Vec::with_capacity(going.len());
            for (row, &i) in going.iter().enumerate() {
                let l = &mut logits[row * vocab..(row + 1) * vocab];
                let Some((t, from, to)) = seqs[i].step(l, req.max_tokens)? else {
                    continue;
                };
                next_ids.push(t);
                next_going.push(i);
                if to > from && on_text(i, &seqs[i].cont.text[from..to]) == Flow::Stop {
                    for s in &mut seqs {
                        if s.ended.is_none() {
                            s.ended = Some(StopReason::Cancelled);
                        }
                    }
                    break 'steps;
                }
            }
            going = next_going;
            if going.is_empty() {
                break;
            }
            let mut caches: Vec<&mut KvCache> = Vec::with_capacity(going.len());
            let mut rest: &mut [Seq<'_>] = &mut seqs;
            let mut offset = 0;
            for &i in &going {
                // `going` is increasing: split the sequences to borrow each cache once.
                let (_, tail) = std::mem::take(&mut rest).split_at_mut(i - offset);
                let (head, tail) = tail.split_first_mut().expect("index in range");
                caches.push(&mut head.cache);
                rest = tail;
                offset = i + 1;
            }
            self.forward_batch_into(&mut caches, &next_ids, &mut logits)?;
            timings.decode_tokens += next_ids.len();
        }
        timings.decode_s = t_decode.elapsed().as_secs_f64();

        let cancelled = seqs.iter().any(|s| s.ended == Some(StopReason::Cancelled));
        let mut candidates: Vec<Candidate> = seqs
            .into_iter()
            .enumerate()
            .map(|(i, mut s)| {
                let reason = s.ended.unwrap_or(StopReason::Length);
                if reason != StopReason::Cancelled {
                    let rest = s.cont.finish(reason);
                    if !rest.is_empty() && !cancelled {
                        on_text(i, rest);
                    }
                }
                let count = s.cont.generated.len().max(1) as f64;
                Candidate {
                    mean_logprob: s.logprob / count,
                    seed: s.seed,
                    generation: Generation {
                        prompt_ids: prompt_ids.to_vec(),
                        generated_ids: s.cont.generated,
                        text: s.cont.text,
                        stop_reason: reason,
                        timings: Timings::default(),
                    },
                }
            })
            .collect();
        candidates.sort_by(|a, b| b.mean_logprob.total_cmp(&a.mean_logprob));
        Ok(BestOf {
            candidates,
            timings,
        })
    }
}
