//! Measuring an MoE model's [`RoutingProfile`]: the in-memory model run over calibration tokens in
//! windows, every router's choices counted (`sparrow convert` of an MoE model carries the result).

use crate::error::Result;
use crate::generate::Engine;
use transformer::forward::Logits;
use transformer::moe::{ExpertNeuronProfile, NeuronTrace, RoutingProfile, RoutingRecorder};

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

/// [`measure_routing`], with every expert's active neurons counted in the same run (a
/// [`NeuronTrace`]; nothing counted for a model without ReLU experts): what `sparrow convert` of a
/// ReLU MoE model orders its neuron-major experts by.
pub fn measure_routing_neurons(
    engine: &Engine<'_>,
    tokens: &[u32],
    window: usize,
) -> Result<(RoutingProfile, ExpertNeuronProfile)> {
    let relu = engine.model().layers.iter().any(|l| {
        l.ffn
            .moe()
            .is_some_and(|m| m.block.activation == kernels_neon::Activation::Relu)
    });
    if !relu {
        let routing = measure_routing(engine, tokens, window)?;
        return Ok((routing, ExpertNeuronProfile::default()));
    }
    let trace = NeuronTrace::start();
    let routing = measure_routing(engine, tokens, window)?;
    let experts = engine
        .model()
        .layers
        .iter()
        .map(|l| {
            l.ffn.moe().map_or_else(Vec::new, |m| {
                let w = &m.weights.experts;
                w.iter()
                    .map(|e| trace.of(e.gate.data().as_ptr()).unwrap_or_default())
                    .collect()
            })
        })
        .collect();
    Ok((routing, ExpertNeuronProfile { experts }))
}
