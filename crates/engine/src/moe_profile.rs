//! Measuring an MoE model's [`RoutingProfile`]: the in-memory model run over calibration tokens in
//! windows, every router's choices counted (`sparrow convert` of an MoE model carries the result).

use crate::error::Result;
use crate::generate::Engine;
use transformer::forward::Logits;
use transformer::moe::{RoutingProfile, RoutingRecorder};

/// Runs `engine` (an in-memory MoE model) over `tokens` in windows of at most `window` tokens (each
/// from an empty KV cache) and returns how its routers chose.
pub fn measure_routing(
    engine: &Engine<'_>,
    tokens: &[u32],
    window: usize,
) -> Result<RoutingProfile> {
    let model = engine.model();
    let cfg = model.config.moe.ok_or_else(|| {
        crate::error::EngineError::Request(format!(
            "{}: a routing profile needs a Mixture-of-Experts model",
            model.path().display()
        ))
    })?;
    let routers: Vec<usize> = model
        .layers
        .iter()
        .map(|l| {
            l.ffn
                .moe()
                .map_or(0, |m| m.weights.router.data().as_ptr() as usize)
        })
        .collect();
    let recorder = RoutingRecorder::start(
        routers,
        cfg.n_experts,
        transformer::fingerprint::model_fingerprint(model),
    );
    let run = || -> Result<()> {
        for w in tokens.chunks(window.max(1)) {
            let mut cache = engine.new_cache();
            engine.forward(&mut cache, w, Logits::None)?;
        }
        Ok(())
    };
    let r = run();
    let profile = recorder.finish();
    r.map(|_| profile)
}
