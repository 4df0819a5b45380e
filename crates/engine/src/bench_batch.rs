//! Batched decode against sequential decode (`sparrow bench --best-of N`): the same `n_seqs`
//! continuations of one prompt decoded one sequence after another, and as one batch
//! ([`crate::Engine::forward_batch_into`]), every repetition running both back to back (alternating
//! which goes first) so that their ratio compares them on the same machine state.

use std::time::Instant;

use crate::error::{EngineError, Result};
use crate::generate::Engine;
use sampling::argmax;
use transformer::forward::{KvCache, Logits};

/// Total decode tokens per second of both ways, one per repetition.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct BatchBenchReport {
    /// Sequences.
    pub n_seqs: usize,
    /// Decode steps of each sequence.
    pub n_gen: usize,
    /// Sequences one after another: all their decode tokens over all their decode time.
    pub sequential_tok_s: Vec<f64>,
    /// One batch: all decode tokens over the batch's decode time.
    pub batched_tok_s: Vec<f64>,
}

impl BatchBenchReport {
    /// Mean and standard deviation of the per-repetition ratios batched/sequential.
    pub fn ratio(&self) -> (f64, f64) {
        let r: Vec<f64> = self
            .batched_tok_s
            .iter()
            .zip(&self.sequential_tok_s)
            .map(|(b, s)| b / s)
            .collect();
        let n = r.len().max(1) as f64;
        let mean = r.iter().sum::<f64>() / n;
        let var = r.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
        (mean, var.sqrt())
    }
}

/// Sequence `i` starts from the prompt's cache with token `first + i` (so the sequences differ) and
/// then feeds its own greedy tokens, the same in both ways.
fn first_token(i: usize, vocab: usize) -> u32 {
    ((1000 + 97 * i) % vocab) as u32
}

/// Decode seconds of `n_seqs` sequences run one after another, `n_gen` steps each.
fn sequential(eng: &Engine<'_>, prompt: &KvCache, n_seqs: usize, n_gen: usize) -> Result<f64> {
    let vocab = eng.model().config.vocab_size;
    let mut secs = 0.0;
    for i in 0..n_seqs {
        let mut cache = prompt.clone();
        let mut next = first_token(i, vocab);
        let mut logits = Vec::new();
        let t = Instant::now();
        for _ in 0..n_gen {
            eng.forward_into(&mut cache, &[next], Logits::Last, &mut logits)?;
            next = argmax(&logits);
        }
        secs += t.elapsed().as_secs_f64();
    }
    Ok(secs)
}

/// Decode seconds of `n_seqs` sequences run as one batch, `n_gen` steps.
fn batched(eng: &Engine<'_>, prompt: &KvCache, n_seqs: usize, n_gen: usize) -> Result<f64> {
    let vocab = eng.model().config.vocab_size;
    let mut caches: Vec<KvCache> = (0..n_seqs).map(|_| prompt.clone()).collect();
    let mut next: Vec<u32> = (0..n_seqs).map(|i| first_token(i, vocab)).collect();
    let mut logits = Vec::new();
    let t = Instant::now();
    for _ in 0..n_gen {
        let mut refs: Vec<&mut KvCache> = caches.iter_mut().collect();
        eng.forward_batch_into(&mut refs, &next, &mut logits)?;
        next = logits.chunks_exact(vocab).map(argmax).collect();
    }
    Ok(t.elapsed().as_secs_f64())
}

/// Measures `n_seqs` sequences of `n_gen` decode steps after `prompt`, sequential and batched,
/// `reps` times (at least once).
pub fn best_of(
    eng: &Engine<'_>,
    prompt: &[u32],
    n_seqs: usize,
    n_gen: usize,
    reps: usize,
) -> Result<BatchBenchReport> {
    if prompt.is_empty() || n_seqs == 0 || n_gen == 0 {
        return Err(EngineError::Request(
            "a batched-decode bench needs a prompt, sequences and decode steps".into(),
        ));
    }
    let mut cache = eng.new_cache();
    eng.forward(&mut cache, prompt, Logits::Last)?;
    let tokens = (n_seqs * n_gen) as f64;
    let mut r = BatchBenchReport {
        n_seqs,
        n_gen,
        ..Default::default()
    };
    for rep in 0..reps.max(1) {
        let (s, b) = if rep % 2 == 0 {
            let s = sequential(eng, &cache, n_seqs, n_gen)?;
            (s, batched(eng, &cache, n_seqs, n_gen)?)
        } else {
            let b = batched(eng, &cache, n_seqs, n_gen)?;
            (sequential(eng, &cache, n_seqs, n_gen)?, b)
        };
        r.sequential_tok_s.push(tokens / s);
        r.batched_tok_s.push(tokens / b);
    }
    Ok(r)
}
