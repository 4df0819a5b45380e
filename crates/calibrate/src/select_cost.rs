//! The serial cost per candidate neuron of sparse decode's selection, for `sparrow calibrate`
//! ([`planner::DeviceProfile::select_ns`]): what a sparse step does per neuron beyond the kernels'
//! bytes (the activation, the score, the keep lists), which the planner's byte rates do not see.

use std::time::Duration;

use kernels_neon::Activation;

use crate::error::Result;
use offload::neurons::{LayerRule, Precomputed, Score, SelectScratch};

/// Candidate neurons per measured selection (Qwen2.5-0.5B's FFN width).
const NEURONS: usize = 4864;

/// Nanoseconds per candidate neuron of one sparse decode step's selection: [`LayerRule::select`]
/// under the default output-norm score with SiLU, every neuron a candidate (no predictor), half of
/// them kept, with fresh scratch and keep lists per call as `SparseFfn` uses them; timed by
/// `per_call` (seconds per call of the closure, run for about `time`) on the calling thread
/// (selection is serial).
pub(crate) fn select_ns(
    time: Duration,
    per_call: impl Fn(Duration, &mut dyn FnMut() -> Result<()>) -> Result<f64>,
) -> Result<f64> {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 40) as f32 / (1u64 << 24) as f32 * 4.0 - 2.0
    };
    let g: Vec<f32> = (0..NEURONS).map(|_| next()).collect();
    let u: Vec<f32> = (0..NEURONS).map(|_| next()).collect();
    let norms = vec![1.0f32; NEURONS];
    let mut scores: Vec<f32> = g
        .iter()
        .zip(&u)
        .map(|(&a, &b)| (Activation::Silu.apply(a) * b).abs())
        .collect();
    scores.sort_by(f32::total_cmp);
    let rule = LayerRule {
        score: Score::OutputNorm,
        threshold: scores[NEURONS / 2],
        norms: &norms,
        activation: Activation::Silu,
    };
    let rows: Vec<u32> = (0..NEURONS as u32).collect();
    // Gate and up given in advance, so that selection runs without any kernel.
    let mut src = Precomputed { g: &g, u: &u };
    let secs = per_call(time, &mut || {
        let mut keep = Vec::with_capacity(rows.len());
        let mut coeffs = Vec::with_capacity(rows.len());
        rule.select(
            &mut src,
            &rows,
            |i| rows[i] as usize,
            &mut SelectScratch::default(),
            &mut keep,
            &mut coeffs,
        )?;
        std::hint::black_box((&keep, &coeffs));
        Ok(())
    })?;
    Ok(secs * 1e9 / NEURONS as f64)
}
