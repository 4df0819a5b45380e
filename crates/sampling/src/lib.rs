//! Token sampling and what a generation asks for and gives back. Usable alone: it knows logits and
//! token ids, not models.
//!
//! * [`Sampler`] over a [`SamplerConfig`]: greedy, temperature, top-k, top-p, min-p, repetition
//!   penalty, seeded; [`Sampler::verify`] is speculative decoding's accept test; [`argmax`].
//! * `request.rs`: [`GenerateRequest`], [`Generation`], [`StopReason`], [`Timings`] and the
//!   streaming callback's [`Flow`].
//!
//! Invariants: the same seed, configuration, logits and history give the same token; temperature 0
//! is greedy ([`argmax`]); no call fails or panics on finite logits (this crate has no error type).

mod request;

pub use request::{Flow, GenerateRequest, Generation, StopReason, Timings};

/// Sampling settings. `temperature == 0` means greedy.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct SamplerConfig {
    /// Softmax temperature; 0 picks the most likely token.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens (0: no limit).
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches `top_p` (1: no limit).
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one (0: off).
    pub min_p: f32,
    /// Divide positive logits (multiply negative ones) of recent tokens by this (1: off).
    pub repeat_penalty: f32,
    /// How many recent tokens the repetition penalty looks at.
    pub repeat_last_n: usize,
    /// Random seed: the same seed, model and prompt give the same text.
    pub seed: u64,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            temperature: 0.0,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            seed: 0,
        }
    }
}

/// SplitMix64: small, fast, and stable across versions (unlike a library RNG whose stream may change).
#[derive(Debug, Clone)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Picks the next token from logits.
#[derive(Debug, Clone)]
pub struct Sampler {
    cfg: SamplerConfig,
    rng: SplitMix64,
}

impl Sampler {
    /// A sampler with the given settings.
    pub fn new(cfg: SamplerConfig) -> Self {
        let rng = SplitMix64(cfg.seed);
        Sampler { cfg, rng }
    }

    /// The settings.
    pub fn config(&self) -> &SamplerConfig {
        &self.cfg
    }

    /// Chooses a token id from `logits`, given the tokens so far (`history`, for the repetition penalty).
    /// Logits are modified in place. Returns 0 for an empty slice.
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> u32 {
        match self.distribution(logits, history) {
            Choice::Greedy(t) => t,
            Choice::Weighted { ids, weights } => {
                if ids.is_empty() {
                    return 0;
                }
                let total: f64 = weights.iter().sum();
                self.draw(&ids, &weights, total)
            }
        }
    }

    /// What [`sample`](Self::sample) chooses from: the repetition penalty, then greedy or the
    /// tokens kept by top-k, min-p and top-p with their (unnormalized) weights, most likely first.
    pub(crate) fn distribution(&self, logits: &mut [f32], history: &[u32]) -> Choice {
        let c = &self.cfg;
        if c.repeat_penalty != 1.0 && c.repeat_penalty > 0.0 {
            let from = history.len().saturating_sub(c.repeat_last_n);
            let mut seen = std::collections::HashSet::new();
            for &t in &history[from..] {
                if let Some(l) = logits.get_mut(t as usize) {
                    if seen.insert(t) {
                        *l = if *l > 0.0 {
                            *l / c.repeat_penalty
                        } else {
                            *l * c.repeat_penalty
                        };
                    }
                }
            }
        }
        if c.temperature <= 0.0 || !c.temperature.is_finite() {
            return Choice::Greedy(argmax(logits));
        }
        // Candidates sorted by logit, cut by top-k.
        let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
        let k = if c.top_k == 0 {
            logits.len()
        } else {
            c.top_k.min(logits.len())
        };
        let by_logit = |a: &u32, b: &u32| logits[*b as usize].total_cmp(&logits[*a as usize]);
        if k < idx.len() && k > 0 {
            idx.select_nth_unstable_by(k - 1, by_logit);
            idx.truncate(k);
        }
        idx.sort_unstable_by(by_logit);
        if idx.is_empty() {
            return Choice::Weighted {
                ids: idx,
                weights: Vec::new(),
            };
        }
        let max = logits[idx[0] as usize];
        let mut probs: Vec<f64> = idx
            .iter()
            .map(|&i| (((logits[i as usize] - max) / c.temperature) as f64).exp())
            .collect();
        let sum: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|p| *p /= sum);
        // min-p, relative to the most likely token.
        let mut keep = probs.len();
        if c.min_p > 0.0 {
            let floor = probs[0] * c.min_p as f64;
            keep = probs.iter().take_while(|&&p| p >= floor).count().max(1);
        }
        // top-p.
        if c.top_p < 1.0 {
            let mut acc = 0.0;
            for (i, p) in probs[..keep].iter().enumerate() {
                acc += p;
                if acc >= c.top_p as f64 {
                    keep = i + 1;
                    break;
                }
            }
        }
        idx.truncate(keep);
        probs.truncate(keep);
        Choice::Weighted {
            ids: idx,
            weights: probs,
        }
    }

    /// One draw from `ids` with `weights` summing to `total` (`ids` not empty): a token of weight
    /// zero is never drawn (unless every weight is zero: then the last token).
    fn draw(&mut self, ids: &[u32], weights: &[f64], total: f64) -> u32 {
        let mut r = self.rng.next_f64() * total;
        for (i, &p) in weights.iter().enumerate() {
            if p > 0.0 {
                r -= p;
                if r <= 0.0 {
                    return ids[i];
                }
            }
        }
        // Rounding left a remainder: the last token that can be drawn.
        let last = weights.iter().rposition(|&p| p > 0.0);
        ids[last.unwrap_or(ids.len() - 1)]
    }

    /// Speculative verification of a proposed token `draft` (from a deterministic draft source,
    /// such as n-gram lookup) against the model's `logits`: returns `(token, accepted)`. The draft
    /// is accepted with the probability [`sample`](Self::sample) would give it; otherwise the token
    /// is drawn from the other tokens, their weights renormalized (the standard rejection rule with
    /// a one-hot draft distribution). So the token returned has exactly the distribution of
    /// `sample`'s, whatever the draft. Greedy: the argmax, accepted when it is the draft.
    pub fn verify(&mut self, logits: &mut [f32], history: &[u32], draft: u32) -> (u32, bool) {
        match self.distribution(logits, history) {
            Choice::Greedy(t) => (t, t == draft),
            Choice::Weighted { ids, mut weights } => {
                if ids.is_empty() {
                    return (0, draft == 0);
                }
                let total: f64 = weights.iter().sum();
                if let Some(at) = ids.iter().position(|&t| t == draft) {
                    if self.rng.next_f64() * total < weights[at] {
                        return (draft, true);
                    }
                    weights[at] = 0.0;
                    let rest: f64 = weights.iter().sum();
                    if rest <= 0.0 {
                        // Only the draft could be chosen (it was, above, unless rounding).
                        return (draft, true);
                    }
                    return (self.draw(&ids, &weights, rest), false);
                }
                (self.draw(&ids, &weights, total), false)
            }
        }
    }
}

/// What a [`Sampler`] chooses from.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Choice {
    /// The most likely token, always.
    Greedy(u32),
    /// One of `ids`, with probability proportional to its weight.
    Weighted { ids: Vec<u32>, weights: Vec<f64> },
}

/// Index of the largest value (the first on ties; NaN never wins; the last index when every value
/// is NaN). The maximum is found first over 16 independent lanes (which the compiler turns into
/// vector `max` instructions), then its first position: a vocabulary of 150k logits takes tens of
/// microseconds, where a scalar scan comparing with the best so far took hundreds.
pub fn argmax(x: &[f32]) -> u32 {
    const LANES: usize = 16;
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = x.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for (m, &v) in lanes.iter_mut().zip(c) {
            // `f32::max` returns the other operand when one is NaN.
            *m = m.max(v);
        }
    }
    let top = lanes
        .iter()
        .chain(tail)
        .fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    match x.iter().position(|&v| v == top) {
        Some(i) => i as u32,
        None => x.len().saturating_sub(1) as u32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scan this `argmax` replaced: the reference for its ties and NaNs.
    fn argmax_scalar(x: &[f32]) -> u32 {
        let mut best = 0usize;
        for (i, &v) in x.iter().enumerate() {
            if v > x[best] || x[best].is_nan() {
                best = i;
            }
        }
        best as u32
    }

    #[test]
    fn argmax_matches_a_scan_with_ties_nans_and_infinities() {
        let mut seed = 7u64;
        let specials = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0, 1.0];
        for len in [0, 1, 2, 15, 16, 17, 33, 100, 1000] {
            for trial in 0..50 {
                let x: Vec<f32> = (0..len)
                    .map(|_| {
                        seed = seed
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        let r = (seed >> 33) as usize;
                        if trial % 3 == 0 && r % 7 == 0 {
                            specials[r % specials.len()]
                        } else {
                            // Few distinct values: many ties.
                            (r % 5) as f32 - 2.0
                        }
                    })
                    .collect();
                assert_eq!(argmax(&x), argmax_scalar(&x), "{x:?}");
            }
        }
        assert_eq!(argmax(&[f32::NAN; 20]), 19);
        assert_eq!(argmax(&[f32::NAN, f32::NEG_INFINITY, f32::NAN]), 1);
    }

    #[test]
    fn greedy_takes_argmax() {
        let mut s = Sampler::new(SamplerConfig::default());
        assert_eq!(s.sample(&mut [0.1, 3.0, -1.0, 2.9], &[]), 1);
    }

    #[test]
    fn repetition_penalty_changes_greedy_choice() {
        let cfg = SamplerConfig {
            repeat_penalty: 2.0,
            ..Default::default()
        };
        let mut s = Sampler::new(cfg);
        assert_eq!(s.sample(&mut [0.1, 3.0, -1.0, 2.9], &[1]), 3);
    }

    #[test]
    fn same_seed_same_choices_and_top_k_respected() {
        let cfg = SamplerConfig {
            temperature: 1.0,
            top_k: 2,
            top_p: 1.0,
            min_p: 0.0,
            seed: 7,
            ..Default::default()
        };
        let logits = [1.0f32, 1.1, 0.9, 5.0, 4.9, -3.0];
        let run = |cfg: &SamplerConfig| {
            let mut s = Sampler::new(cfg.clone());
            (0..200)
                .map(|_| s.sample(&mut logits.clone(), &[]))
                .collect::<Vec<_>>()
        };
        let a = run(&cfg);
        assert_eq!(a, run(&cfg));
        assert!(
            a.iter().all(|&t| t == 3 || t == 4),
            "top-k=2 must keep only ids 3 and 4"
        );
        assert!(
            a.contains(&3) && a.contains(&4),
            "both candidates are likely enough to appear"
        );
        let other = run(&SamplerConfig {
            seed: 8,
            ..cfg.clone()
        });
        assert_ne!(a, other, "a different seed gives a different stream");
    }

    #[test]
    fn min_p_and_top_p_cut_the_tail() {
        let logits = [10.0f32, 0.0, 0.0, 0.0];
        let cfg = SamplerConfig {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.01,
            seed: 1,
            ..Default::default()
        };
        let mut s = Sampler::new(cfg);
        assert!((0..100).all(|_| s.sample(&mut logits.clone(), &[]) == 0));
        let cfg = SamplerConfig {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.4,
            min_p: 0.0,
            seed: 1,
            ..Default::default()
        };
        let mut s = Sampler::new(cfg);
        assert!((0..100).all(|_| s.sample(&mut [2.0, 1.0, 1.0, 1.0], &[]) == 0));
    }

    /// Chi-square statistic of `counts` against probabilities `p` (over `n` draws).
    fn chi2(counts: &[usize], p: &[f64], n: usize) -> f64 {
        counts
            .iter()
            .zip(p)
            .map(|(&c, &p)| {
                let e = p * n as f64;
                (c as f64 - e).powi(2) / e
            })
            .sum()
    }

    #[test]
    fn verify_keeps_the_distribution_of_sample_whatever_the_draft() {
        let logits = [2.0f32, 1.5, 1.0, 0.2, -0.5];
        let cfg = SamplerConfig {
            temperature: 0.8,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            ..Default::default()
        };
        let e: Vec<f64> = logits.iter().map(|&l| ((l / 0.8) as f64).exp()).collect();
        let sum: f64 = e.iter().sum();
        let p: Vec<f64> = e.iter().map(|x| x / sum).collect();
        let n = 20_000;
        // Draft the likeliest token, an unlikely one, and one outside the vocabulary.
        for draft in [0u32, 3, 99] {
            let mut counts = [0usize; 5];
            let mut accepted = 0usize;
            for seed in 0..n as u64 {
                let mut s = Sampler::new(SamplerConfig {
                    seed,
                    ..cfg.clone()
                });
                let (t, ok) = s.verify(&mut logits.clone(), &[], draft);
                assert!(!ok || t == draft, "an accepted token is the draft");
                accepted += usize::from(ok);
                counts[t as usize] += 1;
            }
            // 5 classes, 4 degrees of freedom: P(chi2 > 30) < 1e-5.
            let x = chi2(&counts, &p, n);
            assert!(x < 30.0, "draft {draft}: chi2 {x:.1}, counts {counts:?}");
            let want = p.get(draft as usize).copied().unwrap_or(0.0);
            let rate = accepted as f64 / n as f64;
            assert!(
                (rate - want).abs() < 0.015,
                "draft {draft}: accepted {rate:.3}, p {want:.3}"
            );
        }
        // The test can fail: always keeping the draft (no rejection rule) is far off.
        let mut biased = [0usize; 5];
        biased[3] = n / 2;
        biased[0] = n / 2;
        assert!(chi2(&biased, &p, n) > 1000.0);
    }

    #[test]
    fn verify_greedy_accepts_exactly_the_argmax() {
        let mut s = Sampler::new(SamplerConfig::default());
        assert_eq!(s.verify(&mut [0.1, 3.0, -1.0], &[], 1), (1, true));
        assert_eq!(s.verify(&mut [0.1, 3.0, -1.0], &[], 0), (1, false));
        // The repetition penalty applies before the check, as in `sample`.
        let mut s = Sampler::new(SamplerConfig {
            repeat_penalty: 2.0,
            ..Default::default()
        });
        assert_eq!(s.verify(&mut [0.1, 3.0, -1.0, 2.9], &[1], 3), (3, true));
    }

    #[test]
    fn verify_never_returns_a_token_outside_the_kept_set() {
        // top-k 2 keeps ids 3 and 4; a rejected draft among them leaves the other.
        let cfg = SamplerConfig {
            temperature: 1.0,
            top_k: 2,
            top_p: 1.0,
            min_p: 0.0,
            ..Default::default()
        };
        let logits = [1.0f32, 1.1, 0.9, 5.0, 4.9, -3.0];
        for seed in 0..500 {
            let mut s = Sampler::new(SamplerConfig {
                seed,
                ..cfg.clone()
            });
            let (t, ok) = s.verify(&mut logits.clone(), &[], 4);
            assert!(if ok { t == 4 } else { t == 3 }, "seed {seed}: {t} {ok}");
            let mut s = Sampler::new(SamplerConfig {
                seed,
                ..cfg.clone()
            });
            let (t, ok) = s.verify(&mut logits.clone(), &[], 0);
            assert!(!ok && (t == 3 || t == 4), "seed {seed}: {t} {ok}");
        }
    }

    #[test]
    fn argmax_ignores_nan() {
        assert_eq!(argmax(&[f32::NAN, 1.0, 2.0]), 2);
    }
}
