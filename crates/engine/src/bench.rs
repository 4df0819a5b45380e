//! Prefill and decode speed, measured like llama-bench's pp and tg (`sparrow bench`), as plain
//! figures for a caller to print: [`run`] returns a [`BenchReport`].
//!
//! Each repetition measures prefill (`n_prompt` tokens in one batched step, fresh KV cache) and decode
//! (`n_gen` steps of one token, fresh KV cache, every step timed). With two modes (dense and sparse,
//! or in-memory sparse and offloaded) every repetition runs both back to back, alternating which goes
//! first, so that their ratio compares them on the same machine state ([`BenchReport::tg_ratio`]).

use std::time::Instant;

use crate::error::{EngineError, Result};
use crate::generate::Engine;
use offload::sparse::SparseStats;
use offload::OffloadStats;
use transformer::forward::Logits;

/// What one column of a bench measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BenchMode {
    /// The dense FFN.
    Dense,
    /// The sparse FFN, weights in memory.
    Sparse,
    /// The sparse FFN over a neuron store (a resident file).
    Offload,
    /// Hybrid decode: hot neurons on an accelerator, the rest sparse ([`crate::HybridFfn`]).
    Hybrid,
}

/// Settings of [`run`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BenchOptions {
    /// Prompt tokens of the prefill test (0: none).
    pub n_prompt: usize,
    /// Decode steps of the decode test (0: none).
    pub n_gen: usize,
    /// Repetitions of each test (at least one is run).
    pub reps: usize,
    /// Decode is fed the next token of the given tokens whatever the model predicted (for tokens from
    /// a text); otherwise each step is fed the previous step's greedy token.
    pub teacher_forced: bool,
}

impl BenchOptions {
    /// Tokens [`run`] needs: enough for the prompt and for teacher-forced decode, at least one.
    pub fn tokens_needed(&self) -> usize {
        self.n_prompt.max(self.n_gen).max(1)
    }
}

/// One mode's measurements over all repetitions.
#[derive(Debug, Clone, Default)]
pub struct ModeRuns {
    /// Prefill tokens per second, one per repetition.
    pub pp: Vec<f64>,
    /// Decode tokens per second, one per repetition.
    pub tg: Vec<f64>,
    /// Per repetition: share of decode time in the FFN blocks.
    pub ffn_share: Vec<f64>,
    /// Sparse counters of the last repetition (sparse modes).
    pub stats: Option<SparseStats>,
    /// Seconds of every decode step of every repetition.
    pub token_s: Vec<f64>,
    /// Per repetition: share of decode time the compute threads waited for flash.
    pub wait_share: Vec<f64>,
    /// Offload counters of the last repetition's decode.
    pub offload: Option<OffloadStats>,
    /// Offload counters of the last repetition's prompt (its layers streamed from the store:
    /// [`OffloadStats::prefill_s`], [`OffloadStats::prefill_bytes_read`]).
    pub prompt_offload: Option<OffloadStats>,
    /// Expert counters of the last repetition's decode (a bundle of experts).
    pub experts: Option<crate::bench_experts::ExpertBench>,
}

/// What [`run`] measured: one [`ModeRuns`] per mode, in the order of `modes`.
#[derive(Debug, Clone)]
pub struct BenchReport {
    /// The modes measured (one or two).
    pub modes: Vec<BenchMode>,
    /// Their measurements.
    pub runs: Vec<ModeRuns>,
}

impl BenchReport {
    /// The modes [`run`] measures: with an offloaded engine, in-memory sparse and offloaded; a resident
    /// model alone, offloaded only; with a sparse FFN, dense and sparse; otherwise dense.
    pub fn modes_for(offload: bool, sparse: bool, resident: bool) -> Vec<BenchMode> {
        match (offload, sparse, resident) {
            (true, _, _) => vec![BenchMode::Sparse, BenchMode::Offload],
            (false, _, true) => vec![BenchMode::Offload],
            (false, true, false) => vec![BenchMode::Dense, BenchMode::Sparse],
            (false, false, false) => vec![BenchMode::Dense],
        }
    }

    /// A mode's name in reports: `dense`, `sparse` (`in-memory sparse` next to an offloaded mode) or
    /// `offloaded`.
    pub fn mode_name(&self, m: BenchMode) -> &'static str {
        match m {
            BenchMode::Dense => "dense",
            BenchMode::Sparse => {
                if self.modes.contains(&BenchMode::Offload) {
                    "in-memory sparse"
                } else {
                    "sparse"
                }
            }
            BenchMode::Offload => "offloaded",
            BenchMode::Hybrid => "hybrid",
        }
    }

    /// `second/first` mode names for two modes, empty otherwise.
    pub fn ratio_name(&self) -> String {
        if self.modes.len() == 2 {
            format!(
                "{}/{}",
                self.mode_name(self.modes[1]),
                self.mode_name(self.modes[0])
            )
        } else {
            String::new()
        }
    }

    /// Mean and standard deviation of the per-repetition prefill ratios second/first (two modes).
    pub fn pp_ratio(&self) -> Option<(f64, f64)> {
        self.ratio(|r| &r.pp)
    }

    /// Mean and standard deviation of the per-repetition decode ratios second/first (two modes).
    pub fn tg_ratio(&self) -> Option<(f64, f64)> {
        self.ratio(|r| &r.tg)
    }

    fn ratio(&self, f: fn(&ModeRuns) -> &Vec<f64>) -> Option<(f64, f64)> {
        let runs = &self.runs;
        (runs.len() == 2 && !f(&runs[0]).is_empty()).then(|| {
            mean_sd(
                &f(&runs[1])
                    .iter()
                    .zip(f(&runs[0]))
                    .map(|(s, d)| s / d)
                    .collect::<Vec<_>>(),
            )
        })
    }
}

/// `n` deterministic pseudo-random token ids below `vocab`, like llama-bench (content does not change
/// dense speed).
pub fn synthetic_tokens(n: usize, vocab: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 7) % vocab)
        .collect()
}

/// The first `need` token ids of `text` (tokenized without BOS); an error naming `source` when the
/// text is shorter. Only a prefix of the text is tokenized (about 16 bytes a token, cut before a
/// whitespace, doubled until it holds more than `need` tokens): tokenizing a whole corpus file costs
/// far more memory than the bench measures.
pub fn text_tokens(
    engine: &Engine<'_>,
    text: &str,
    source: &std::path::Path,
    need: usize,
) -> Result<Vec<u32>> {
    let mut len = need.saturating_mul(16).max(256);
    let ids = loop {
        if len >= text.len() {
            break engine.tokenizer().encode(text, false)?;
        }
        // Byte-level BPE tokens never span a whitespace: the tokens before the cut are those of
        // the whole text.
        let cut = text[..text.floor_char_boundary(len)]
            .rfind(char::is_whitespace)
            .unwrap_or(0);
        let ids = engine.tokenizer().encode(&text[..cut], false)?;
        if ids.len() > need {
            break ids;
        }
        len = len.saturating_mul(2);
    };
    if ids.len() < need {
        return Err(EngineError::Request(format!(
            "{}: {} tokens, the bench needs {need}",
            source.display(),
            ids.len()
        )));
    }
    Ok(ids[..need].to_vec())
}

/// Measures `engine` (and `offload`, a second engine over a resident file, when given) on `tokens`
/// (at least [`BenchOptions::tokens_needed`]). The modes are [`BenchReport::modes_for`], or sparse and
/// hybrid with a hybrid FFN; the engine's sparse FFN is taken out for dense runs and put back for
/// sparse runs and at the end. The weights are
/// paged in by one warm-up step first (not for a resident model).
pub fn run(
    engine: &mut Engine<'_>,
    offload: Option<&Engine<'_>>,
    tokens: &[u32],
    opts: &BenchOptions,
) -> Result<BenchReport> {
    if tokens.len() < opts.tokens_needed() {
        return Err(EngineError::Request(format!(
            "the bench needs {} tokens, got {}",
            opts.tokens_needed(),
            tokens.len()
        )));
    }
    let resident = engine.model().config.ffn_store.is_some();
    let mut sparse = if resident { None } else { engine.take_sparse() };
    let hybrid = engine.hybrid().is_some();
    // Over a neuron store the hybrid's sparse part alone is no baseline: its cache gave the
    // accelerator its hot prefix (sparse decode with the whole cache is a run without --accel).
    let modes = if hybrid && resident {
        vec![BenchMode::Hybrid]
    } else if hybrid {
        vec![BenchMode::Sparse, BenchMode::Hybrid]
    } else {
        BenchReport::modes_for(offload.is_some(), sparse.is_some(), resident)
    };
    let mut runs: Vec<ModeRuns> = modes.iter().map(|_| ModeRuns::default()).collect();
    // Warm-up: page the weights in.
    let mut cache = engine.new_cache();
    if !resident {
        engine.forward(&mut cache, &tokens[..1], Logits::Last)?;
    }
    let result = (|| {
        for rep in 0..opts.reps.max(1) {
            let order: Vec<usize> = if rep % 2 == 0 {
                (0..modes.len()).collect()
            } else {
                (0..modes.len()).rev().collect()
            };
            for mi in order {
                if hybrid {
                    engine.set_hybrid_on(modes[mi] == BenchMode::Hybrid);
                }
                if modes[mi] == BenchMode::Sparse {
                    engine.set_sparse(sparse.take());
                }
                let measured = match (modes[mi], offload) {
                    (BenchMode::Offload, Some(o)) => measure(o, tokens, opts, &mut runs[mi]),
                    _ => measure(engine, tokens, opts, &mut runs[mi]),
                };
                if modes[mi] == BenchMode::Sparse {
                    sparse = engine.take_sparse();
                }
                measured?;
            }
        }
        Ok(())
    })();
    if sparse.is_some() {
        engine.set_sparse(sparse);
    }
    engine.set_hybrid_on(true);
    result.map(|()| BenchReport { modes, runs })
}

/// One repetition of prefill and decode on `e`, added to `r`.
fn measure(e: &Engine<'_>, tokens: &[u32], opts: &BenchOptions, r: &mut ModeRuns) -> Result<()> {
    if opts.n_prompt > 0 {
        let off = e.sparse().and_then(|sp| sp.offload());
        if let Some(o) = off {
            o.reset_stats();
        }
        let mut cache = e.new_cache();
        let t = Instant::now();
        e.forward(&mut cache, &tokens[..opts.n_prompt], Logits::Last)?;
        r.pp.push(opts.n_prompt as f64 / t.elapsed().as_secs_f64());
        r.prompt_offload = off.map(|o| o.stats());
    }
    if opts.n_gen > 0 {
        let mut cache = e.new_cache();
        if let Some(sp) = e.sparse() {
            sp.reset_stats();
            if let Some(o) = sp.offload() {
                o.reset_stats();
            }
        }
        e.take_ffn_seconds();
        let held = crate::bench_experts::start(e);
        let mut tok = tokens[0];
        let mut logits = Vec::new();
        let t = Instant::now();
        for i in 0..opts.n_gen {
            let ti = Instant::now();
            e.forward_into(&mut cache, &[tok], Logits::Last, &mut logits)?;
            r.token_s.push(ti.elapsed().as_secs_f64());
            tok = if opts.teacher_forced {
                tokens[(i + 1) % tokens.len()]
            } else {
                sampling::argmax(&logits)
            };
        }
        let secs = t.elapsed().as_secs_f64();
        r.tg.push(opts.n_gen as f64 / secs);
        r.ffn_share.push(e.take_ffn_seconds() / secs);
        r.experts = crate::bench_experts::finish(e, &held, opts.n_gen, secs).or(r.experts.take());
        if let Some(x) = &r.experts {
            r.wait_share.push(x.wait_share);
        }
        if let Some(sp) = e.sparse() {
            r.stats = Some(sp.stats());
            if let Some(o) = sp.offload() {
                let st = o.stats();
                r.wait_share.push(st.io_wait_s / secs);
                r.offload = Some(st);
            }
        }
    }
    Ok(())
}

/// Mean and (population) standard deviation of `xs`; `(0, 0)` for none.
pub fn mean_sd(xs: &[f64]) -> (f64, f64) {
    let n = xs.len().max(1) as f64;
    let m = xs.iter().sum::<f64>() / n;
    let var = xs.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / n;
    (m, var.sqrt())
}

/// The `q` quantile (0..=1) of `xs` (nearest rank); NaN for none.
pub fn quantile(xs: &[f64], q: f64) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(
        ((v.len() as f64 * q).ceil() as usize)
            .saturating_sub(1)
            .min(v.len().saturating_sub(1)),
    )
    .copied()
    .unwrap_or(f64::NAN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_sd_is_the_population_figure() {
        assert_eq!(mean_sd(&[]), (0.0, 0.0));
        assert_eq!(mean_sd(&[3.0]), (3.0, 0.0));
        assert_eq!(
            mean_sd(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]),
            (5.0, 2.0)
        );
    }

    #[test]
    fn quantile_is_nearest_rank() {
        assert!(quantile(&[], 0.5).is_nan());
        let xs = [5.0, 1.0, 4.0, 2.0, 3.0];
        assert_eq!(quantile(&xs, 0.0), 1.0);
        assert_eq!(quantile(&xs, 0.5), 3.0);
        assert_eq!(quantile(&xs, 0.9), 5.0);
        assert_eq!(quantile(&xs, 1.0), 5.0);
        let hundred: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&hundred, 0.5), 50.0);
        assert_eq!(quantile(&hundred, 0.99), 99.0);
    }

    #[test]
    fn modes_and_names() {
        use BenchMode::*;
        assert_eq!(BenchReport::modes_for(true, true, false), [Sparse, Offload]);
        assert_eq!(BenchReport::modes_for(false, false, true), [Offload]);
        assert_eq!(BenchReport::modes_for(false, true, false), [Dense, Sparse]);
        assert_eq!(BenchReport::modes_for(false, false, false), [Dense]);
        let report = |modes: Vec<BenchMode>| BenchReport {
            runs: modes.iter().map(|_| ModeRuns::default()).collect(),
            modes,
        };
        let r = report(vec![Sparse, Offload]);
        assert_eq!(r.ratio_name(), "offloaded/in-memory sparse");
        let r = report(vec![Dense, Sparse]);
        assert_eq!(r.ratio_name(), "sparse/dense");
        assert_eq!(report(vec![Dense]).ratio_name(), "");
    }

    #[test]
    fn ratios_pair_repetitions() {
        let mut r = BenchReport {
            modes: vec![BenchMode::Dense, BenchMode::Sparse],
            runs: vec![ModeRuns::default(), ModeRuns::default()],
        };
        assert_eq!(r.tg_ratio(), None, "no runs, no ratio");
        r.runs[0].tg = vec![10.0, 20.0];
        r.runs[1].tg = vec![20.0, 20.0];
        assert_eq!(r.tg_ratio(), Some((1.5, 0.5)));
        assert_eq!(r.pp_ratio(), None);
        r.runs.pop();
        r.modes.pop();
        assert_eq!(r.tg_ratio(), None, "one mode, no ratio");
    }

    #[test]
    fn synthetic_tokens_are_fixed_and_in_range() {
        let t = synthetic_tokens(64, 100);
        assert_eq!(t.len(), 64);
        assert!(t.iter().all(|&x| x < 100));
        assert_eq!(t, synthetic_tokens(64, 100));
        assert_eq!(&t[..3], &[0, 79, 26]);
    }
}
