//! Perplexity over fixed, non-overlapping windows (the method of `shared/reference/README.md`).

use std::time::Instant;

use crate::error::{EngineError, Result};
use crate::generate::Engine;
use transformer::forward::Logits;

/// The outcome of [`Engine::perplexity`].
#[derive(Debug, Clone, serde::Serialize)]
pub struct PerplexityReport {
    /// Tokens per window.
    pub window: usize,
    /// Windows scored.
    pub windows: usize,
    /// Tokens in the whole text.
    pub tokens_in_text: usize,
    /// Mean negative log-likelihood (nats) over all predicted tokens.
    pub mean_nll: f64,
    /// `exp(mean_nll)`.
    pub ppl: f64,
    /// Mean NLL of each window.
    pub window_nll: Vec<f64>,
    /// Tokens scored per second.
    pub tokens_per_s: f64,
}

/// `log(sum(exp(x)))`, computed in f64.
pub fn log_sum_exp(x: &[f32]) -> f64 {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    max + x.iter().map(|&v| (v as f64 - max).exp()).sum::<f64>().ln()
}

impl Engine<'_> {
    /// Scores the first `windows` non-overlapping windows of `window` tokens of `tokens`, each on its
    /// own (fresh cache, no BOS): the mean NLL over the `window - 1` predicted tokens of each window.
    /// `progress(done, total)` is called after each window.
    pub fn perplexity(
        &self,
        tokens: &[u32],
        window: usize,
        windows: usize,
        progress: impl FnMut(usize, usize),
    ) -> Result<PerplexityReport> {
        let never = std::sync::atomic::AtomicBool::new(false);
        self.perplexity_until(tokens, window, windows, &never, progress)
    }

    /// [`Engine::perplexity`], stopped between two windows when `stop` becomes true: then an error
    /// ("interrupted").
    pub fn perplexity_until(
        &self,
        tokens: &[u32],
        window: usize,
        windows: usize,
        stop: &std::sync::atomic::AtomicBool,
        mut progress: impl FnMut(usize, usize),
    ) -> Result<PerplexityReport> {
        if window < 2 || windows == 0 {
            return Err(EngineError::Request(
                "perplexity needs a window of at least 2 tokens and at least one window".into(),
            ));
        }
        if tokens.len() < window * windows {
            return Err(EngineError::Request(format!(
                "the text has {} tokens, fewer than {windows} windows of {window}",
                tokens.len()
            )));
        }
        let vocab = self.model().config.vocab_size;
        let t0 = Instant::now();
        let mut window_nll = Vec::with_capacity(windows);
        for w in 0..windows {
            if stop.load(std::sync::atomic::Ordering::Relaxed) {
                return Err(EngineError::Request("interrupted".into()));
            }
            let ids = &tokens[w * window..(w + 1) * window];
            let mut cache = self.new_cache();
            let logits = self.forward(&mut cache, ids, Logits::All)?;
            let mut nll = 0.0f64;
            for i in 0..window - 1 {
                let row = &logits[i * vocab..(i + 1) * vocab];
                nll += log_sum_exp(row) - row[ids[i + 1] as usize] as f64;
            }
            window_nll.push(nll / (window - 1) as f64);
            progress(w + 1, windows);
        }
        let mean_nll = window_nll.iter().sum::<f64>() / windows as f64;
        let secs = t0.elapsed().as_secs_f64();
        Ok(PerplexityReport {
            window,
            windows,
            tokens_in_text: tokens.len(),
            mean_nll,
            ppl: mean_nll.exp(),
            window_nll,
            tokens_per_s: (window * windows) as f64 / secs.max(1e-9),
        })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn log_sum_exp_is_stable() {
        let v = super::log_sum_exp(&[1000.0, 1000.0]);
        assert!((v - (1000.0 + 2f64.ln())).abs() < 1e-9);
        assert!((super::log_sum_exp(&[0.0; 4]) - 4f64.ln()).abs() < 1e-12);
    }
}
