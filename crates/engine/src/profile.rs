//! Activation profiling over a corpus: samples for threshold calibration, per-neuron statistics and
//! predictor training pairs. The corpus is scored in windows like perplexity, so batched prefill does
//! the work.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::{EngineError, Result};
use crate::forward::{FfnSample, Logits};
use crate::generate::Engine;

/// Runs `windows` windows of `window` tokens of `tokens` through the engine (dense unless a sparse FFN
/// is set), calling `observe` with every layer's FFN activations. Stops early, returning how many
/// windows ran, when `stop` becomes true; `progress(done, total)` follows each window.
pub fn observe_corpus(
    engine: &Engine<'_>,
    tokens: &[u32],
    window: usize,
    windows: usize,
    stop: &AtomicBool,
    mut observe: impl FnMut(FfnSample<'_>) + Send,
    mut progress: impl FnMut(usize, usize),
) -> Result<usize> {
    if window == 0 || tokens.len() < window * windows {
        return Err(EngineError::Request(format!(
            "the corpus has {} tokens, fewer than {windows} windows of {window}",
            tokens.len()
        )));
    }
    for w in 0..windows {
        if stop.load(Ordering::Relaxed) {
            return Ok(w);
        }
        let mut cache = engine.new_cache();
        engine.forward_observed(&mut cache, &tokens[w * window..(w + 1) * window], Logits::Last, &mut observe)?;
        progress(w + 1, windows);
    }
    Ok(windows)
}

/// Every `stride`-th `|act(gate)|` value of each layer, for threshold calibration.
pub fn sample_abs_activations(
    engine: &Engine<'_>,
    tokens: &[u32],
    window: usize,
    windows: usize,
    stride: usize,
    progress: impl FnMut(usize, usize),
) -> Result<Vec<Vec<f32>>> {
    let n_layers = engine.model().config.n_layers;
    let stride = stride.max(1);
    let mut samples = vec![Vec::new(); n_layers];
    let stop = AtomicBool::new(false);
    observe_corpus(
        engine,
        tokens,
        window,
        windows,
        &stop,
        |s| samples[s.layer].extend(s.act_gate.iter().step_by(stride).map(|v| v.abs())),
        progress,
    )?;
    Ok(samples)
}
