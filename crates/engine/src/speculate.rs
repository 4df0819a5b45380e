//! Speculative decoding: a draft source guesses the next tokens, and one forward step verifies them
//! all ([`Engine::generate_speculative`]).
//!
//! Each step feeds the last chosen token and up to `k` drafted tokens as one batch of one sequence
//! (the decode kernels, the weights read once for the batch: each token's logits are those a
//! one-token step gives, bit for bit). The tokens are then chosen from those logits in order, as
//! plain decoding would choose them ([`Sampler::verify`]): a drafted token is kept while it is what
//! was chosen (greedy) or passes the rejection rule (sampling); the first token that differs ends the
//! step, and the KV cache is cut back to the tokens kept ([`crate::KvCache::truncate`]). So greedy output is
//! the output of [`Engine::generate`], and sampled output has the same distribution.
//!
//! How many tokens are drafted adapts (unless the source sizes its drafts itself, as [`crate::Lookup`]
//! does: [`DraftSource::draft_len`]): it doubles (up to the maximum) after a step that kept every
//! drafted token, and falls to one more than the tokens kept after a step that did not.
//!
//! Draft sources implement [`DraftSource`]; [`crate::Lookup`] (prompt lookup: the text so far is searched
//! for the latest tokens, and what followed them is proposed, `crate::lookup`) needs no second model;
//! [`crate::SelfDraft`] (the model from memory only) and [`crate::ModelDraft`] (a second model) run
//! one. Verification runs over every FFN executor, each token as its one-token step
//! (`Engine::verify_executor`: the executor's batch path where it is exact, else token by token).

use std::time::{Duration, Instant};

use crate::continuation::{Accepted, Continuation};
use crate::error::{EngineError, Result};
use crate::generate::Engine;
use crate::spec_stats::SpecStats;
use sampling::Sampler;
use sampling::{Flow, GenerateRequest, Generation, StopReason, Timings};
use transformer::ffn::{FfnExecutor, FfnLayer, FfnScratch, MoeStep};
use transformer::forward::{forward_verify_into, FfnMode, KvCache, Logits};

/// Proposes the tokens likely to come next.
pub trait DraftSource {
    /// Appends to `out` up to `max` tokens that may follow `history` (the prompt and the tokens
    /// generated so far, the last one not yet run through the model). Proposing none is allowed.
    fn draft(&mut self, history: &[u32], max: usize, out: &mut Vec<u32>);

    /// Called before each [`DraftSource::draft`] with the verifying model's KV cache, which then
    /// holds every token of the history but the last (a draft on the same model copies what it
    /// lacks, [`crate::SelfDraft`]). An error (one the last draft met, too) ends the generation.
    /// Default: nothing.
    fn sync(&mut self, target: &KvCache) -> Result<()> {
        let _ = target;
        Ok(())
    }

    /// How many tokens to ask for at most in the next step, given `adapted` (the length the engine
    /// adapts to what the last steps kept) and `max` ([`SpecOptions::max_draft`]). Default:
    /// `adapted`; a source that sizes its own drafts ([`crate::Lookup`]) asks for `max`.
    fn draft_len(&self, adapted: usize, max: usize) -> usize {
        let _ = max;
        adapted
    }
}

/// Settings of [`Engine::generate_speculative`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpecOptions {
    /// Most tokens drafted for one verification step (at least 1).
    pub max_draft: usize,
}

/// A generation with speculation, and what the speculation did.
#[derive(Debug, Clone)]
pub struct Speculated {
    /// Tokens, text and timings (`decode_tokens` counts the tokens the verification steps kept).
    pub generation: Generation,
    /// Steps, drafted and kept tokens.
    pub stats: SpecStats,
}

/// `source`'s draft of up to `max` tokens after `seq`'s history (whose last token `cache` does not
/// hold yet) into `draft`, within the context, and cut after a token that ends the sequence
/// (nothing follows it: verifying more would be wasted).
fn draft_into(
    source: &mut dyn DraftSource,
    cache: &KvCache,
    seq: &Continuation<'_>,
    max: usize,
    draft: &mut Vec<u32>,
) -> Result<()> {
    draft.clear();
    let room = (cache.capacity() - cache.len()).saturating_sub(1);
    source.sync(cache)?;
    source.draft(&seq.history, max.min(room), draft);
    draft.truncate(max.min(room));
    if let Some(end) = draft.iter().position(|&t| seq.ends_at(t)) {
        draft.truncate(end + 1);
    }
    Ok(())
}

/// The next draft length: doubled after a step that kept every drafted token, else one more than
/// the tokens kept.
fn next_draft_len(k: usize, drafted: usize, kept: usize, max: usize) -> usize {
    if drafted > 0 && kept == drafted {
        (k * 2).min(max)
    } else if drafted > 0 {
        (kept + 1).min(max)
    } else {
        k
    }
    .max(1)
}

impl Engine<'_> {
    /// The most tokens a verification step may draft beside its first: a streamed output
    /// projection computes the logits of at most [`transformer::proxy_step::PROXY_MAX_ROWS`] rows
    /// through its proxy, as one-token steps do; more would read it whole, and differ.
    fn draft_cap(&self, max_draft: usize) -> usize {
        let m = self.model();
        let proxy = m.output_proxy_used()
            && !matches!(
                self.options().precision,
                kernels_neon::Precision::Exact | kernels_neon::Precision::Ggml
            );
        if proxy {
            max_draft.min(transformer::proxy_step::PROXY_MAX_ROWS - 1)
        } else {
            max_draft
        }
    }

    /// Generates as [`Engine::generate`] does, drafting tokens with `source` and verifying them in
    /// one forward step each (module [`crate::speculate`]). Greedy decoding gives the tokens
    /// `generate` gives; sampling, tokens of the same distribution (not the same tokens for a seed:
    /// the random draws differ).
    pub fn generate_speculative(
        &self,
        prompt_ids: &[u32],
        req: &GenerateRequest,
        source: &mut dyn DraftSource,
        opts: SpecOptions,
        mut on_text: impl FnMut(&str) -> Flow,
    ) -> Result<Speculated> {
        if prompt_ids.is_empty() {
            return Err(EngineError::Request(
                "the prompt is empty: give at least one token".into(),
            ));
        }
        if opts.max_draft == 0 {
            return Err(EngineError::Request(
                "speculative decoding needs at least one drafted token (--lookup N, N >= 1)".into(),
            ));
        }
        let opts = SpecOptions {
            max_draft: self.draft_cap(opts.max_draft),
        };
        let mut cache = self.new_cache();
        let mut sampler = Sampler::new(req.sampler.clone());
        let mut seq = Continuation::new(self.tokenizer(), prompt_ids, req);
        let mut timings = Timings {
            prefill_tokens: prompt_ids.len(),
            ..Default::default()
        };
        let mut stats = SpecStats::default();
        let t0 = Instant::now();
        let mut logits = self.forward(&mut cache, prompt_ids, Logits::Last)?;
        timings.prefill_s = t0.elapsed().as_secs_f64();
        let vocab = logits.len();
        let mut decode_time = Duration::ZERO;
        let mut k = opts.max_draft.min(2);
        let mut draft = Vec::new();
        let mut trace = crate::spec_trace::Trace::from_env(self.tokenizer());
        // `logits` row 0 is the distribution of the next token; rows 1.. follow `draft`'s tokens.
        let stop_reason = 'gen: loop {
            // Choose tokens from the rows of the last step, keeping drafted ones while they match.
            let mut kept = 0;
            let mut last = None;
            let mut end = None;
            let before = seq.generated.len();
            for row in 0..=draft.len() {
                if seq.generated.len() >= req.max_tokens {
                    end = Some(StopReason::Length);
                    break;
                }
                let l = &mut logits[row * vocab..(row + 1) * vocab];
                let (next, ok) = match draft.get(row) {
                    Some(&d) => sampler.verify(l, &seq.history, d),
                    None => (sampler.sample(l, &seq.history), false),
                };
                kept += usize::from(ok);
                match seq.accept(next)? {
                    Accepted::Ended(reason) => end = Some(reason),
                    Accepted::Going { from, to } => {
                        if to > from && on_text(&seq.text[from..to]) == Flow::Stop {
                            end = Some(StopReason::Cancelled);
                        }
                    }
                }
                if end.is_some() {
                    break;
                }
                if !ok {
                    last = Some(next);
                    break;
                }
            }
            trace.step(&draft, &seq.generated[before..]);
            if !draft.is_empty() {
                // The cache holds the previous token and every drafted one: keep those chosen.
                cache.truncate(cache.len() - (draft.len() - kept));
                stats.drafted += draft.len();
                stats.accepted += kept;
                stats.decoded += kept;
                k = next_draft_len(k, draft.len(), kept, opts.max_draft);
            }
            if let Some(reason) = end {
                break 'gen reason;
            }
            let next = last.expect("a step ends on a token that was not drafted");
            // Draft what may follow, within the context and the tokens still to generate.
            let left = req.max_tokens.saturating_sub(seq.generated.len() + 1);
            let want = source.draft_len(k, opts.max_draft);
            draft_into(source, &cache, &seq, want.min(left), &mut draft)?;
            let mut batch = Vec::with_capacity(draft.len() + 1);
            batch.push(next);
            batch.extend_from_slice(&draft);
            let t = Instant::now();
            self.verify_step(&mut cache, &batch, &mut logits)?;
            decode_time += t.elapsed();
            stats.steps += 1;
            stats.decoded += 1;
        };
        if stop_reason != StopReason::Cancelled {
            let rest = seq.finish(stop_reason);
            if !rest.is_empty() {
                on_text(rest);
            }
        }
        timings.decode_s = decode_time.as_secs_f64();
        timings.decode_tokens = stats.decoded;
        trace.finish(&stats, prompt_ids, &seq.generated);
        Ok(Speculated {
            generation: Generation {
                prompt_ids: prompt_ids.to_vec(),
                generated_ids: seq.generated,
                text: seq.text,
                stop_reason,
                timings,
            },
            stats,
        })
    }

    /// A verification step's logits (`tokens.len() × vocab`) after `cache`'s positions, for tests
    /// that compare them with one-token steps.
    #[doc(hidden)]
    pub fn verify_logits(&self, cache: &mut KvCache, tokens: &[u32]) -> Result<Vec<f32>> {
        let mut logits = Vec::new();
        self.verify_step(cache, tokens, &mut logits)?;
        Ok(logits)
    }

    /// One verification step: `tokens` continue `cache`'s sequence, every token's logits returned,
    /// each token's those of a one-token step ([`Engine::verify_executor`]).
    pub(crate) fn verify_step(
        &self,
        cache: &mut KvCache,
        tokens: &[u32],
        logits: &mut Vec<f32>,
    ) -> Result<()> {
        let (exec, per_token) = self.verify_executor();
        let wrapped = exec.filter(|_| per_token).map(PerToken);
        let mode = FfnMode {
            exec: match &wrapped {
                Some(w) => Some(w as &dyn FfnExecutor),
                None => exec,
            },
            observer: None,
            ffn_nanos: None,
        };
        let precision = self.options().precision;
        self.install(|| {
            Ok(forward_verify_into(
                self.model(),
                cache,
                tokens,
                precision,
                mode,
                logits,
            )?)
        })
    }
}

/// An executor whose steps of several tokens run each token through its one-token `decode`.
struct PerToken<'e>(&'e dyn FfnExecutor);

impl FfnExecutor for PerToken<'_> {
    fn decode(
        &self,
        l: FfnLayer<'_, '_>,
        x: &[f32],
        out: &mut [f32],
        scratch: &mut FfnScratch,
    ) -> transformer::Result<()> {
        self.0.decode(l, x, out, scratch)
    }

    fn batch(
        &self,
        l: FfnLayer<'_, '_>,
        x: &[f32],
        n: usize,
        out: &mut [f32],
        scratch: &mut FfnScratch,
    ) -> transformer::Result<()> {
        let d = x.len() / n.max(1);
        for (xt, ot) in x.chunks(d).zip(out.chunks_mut(d)).take(n) {
            self.0.decode(l, xt, ot, scratch)?;
        }
        Ok(())
    }

    fn mask(
        &self,
        layer: usize,
        x: &[f32],
        n: usize,
        act: &mut [f32],
        up: &[f32],
    ) -> transformer::Result<()> {
        self.0.mask(layer, x, n, act, up)
    }

    fn owns_weights(&self) -> bool {
        self.0.owns_weights()
    }

    fn moe_step(
        &self,
        step: MoeStep<'_, '_>,
        x: &[f32],
        n: usize,
        out: &mut [f32],
    ) -> Option<transformer::Result<()>> {
        let d = x.len() / n.max(1);
        for (xt, ot) in x.chunks(d).zip(out.chunks_mut(d)).take(n) {
            match self.0.moe_step(step, xt, 1, ot)? {
                Ok(()) => {}
                Err(e) => return Some(Err(e)),
            }
        }
        Some(Ok(()))
    }

    fn runs_experts(&self) -> bool {
        self.0.runs_experts()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_verification_step_gives_the_logits_of_one_token_steps_bit_for_bit() {
        use crate::{EngineOptions, KvFormat, ModelFile, Precision};
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures");
        for name in [
            "tiny-llama-silu-q4_0.gguf",
            "tiny-llama-relu-q8_0.gguf",
            "tiny-qwen2-q4_1.gguf",
            "tiny-llama-f16.gguf",
        ] {
            let file = ModelFile::open(dir.join(name)).unwrap();
            for precision in [Precision::Exact, Precision::Fast, Precision::Int8] {
                let opts = EngineOptions {
                    threads: 2,
                    precision,
                    context: 64,
                    cache_type: Some(KvFormat::F16),
                };
                let eng = Engine::new(&file, opts).unwrap();
                let mut cache = eng.new_cache();
                eng.forward(&mut cache, &[5, 9, 77, 3], Logits::Last)
                    .unwrap();
                let tokens = [11u32, 200, 7, 7, 150];
                let mut one = cache.clone();
                let mut want = Vec::new();
                for &t in &tokens {
                    want.extend(eng.forward(&mut one, &[t], Logits::Last).unwrap());
                }
                let mut got = Vec::new();
                eng.verify_step(&mut cache, &tokens, &mut got).unwrap();
                assert_eq!(cache.len(), one.len());
                let same = got
                    .iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same && got.len() == want.len(), "{name} {precision:?}");
            }
        }
    }

    #[test]
    fn draft_length_adapts_to_what_was_kept() {
        assert_eq!(next_draft_len(2, 2, 2, 8), 4);
        assert_eq!(next_draft_len(8, 8, 8, 8), 8);
        assert_eq!(next_draft_len(8, 8, 3, 8), 4);
        assert_eq!(next_draft_len(4, 4, 0, 8), 1);
        assert_eq!(next_draft_len(4, 0, 0, 8), 4);
        assert_eq!(next_draft_len(2, 1, 1, 1), 1);
    }
}
