//! `sparrow convert` of a Mixture-of-Experts model: the routing of the in-memory model is measured on
//! calibration text, then the resident file and the expert store are written as one transaction.

use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result};
use engine::{Engine, EngineOptions, ModelFile};

use super::convert::ConvertArgs;
use crate::builtin::{TextSource, CALIBRATION};
use crate::ui::{bar, mib};

/// Converts the MoE model `file` at `path` into the bundle `out`.
pub fn run(a: &ConvertArgs, path: &Path, file: &ModelFile, out: &Path) -> Result<()> {
    let src = TextSource::or_builtin(a.corpus.as_deref(), &CALIBRATION);
    let mut inputs = vec![path.to_path_buf()];
    inputs.extend(src.file().map(Path::to_path_buf));
    engine::outputs::guard(&[(out, engine::outputs::OutputKind::Gguf)], &inputs)?;
    let t = Instant::now();
    let eng = Engine::new(file, EngineOptions::default())?;
    let text = src
        .read()
        .context("reading the calibration text (give another with --corpus)")?;
    let mut tokens = eng.tokenizer().encode(&text, false)?;
    tokens.truncate(a.routing_tokens.max(1));
    let (routing, neurons) = engine::measure_routing_neurons(&eng, &tokens, 256)
        .with_context(|| format!("measuring the routing of {}", path.display()))?;
    drop(eng);
    let relu = engine::offload::ReluExperts {
        profile: Some(&neurons),
        recall: a.expert_recall,
    };
    let opts = engine::ConvertOptions {
        verify: a.verify,
        keep: inputs,
        ..Default::default()
    };
    let b = bar(routing.counts.len() as u64, "layers");
    let r = engine::offload::convert_moe_with(file, &routing, &relu, out, &opts, |done, _| {
        b.set_position(done as u64)
    })
    .with_context(|| format!("converting {}", path.display()))?;
    b.finish_and_clear();
    println!(
        "resident file {} ({:.1} MiB): embeddings, attention, norms, routers, shared experts, output",
        r.resident.display(),
        mib(r.resident_bytes)
    );
    let layers = r.experts.iter().filter(|&&n| n > 0).count();
    println!(
        "expert store  {} ({:.1} MiB, {:.2}x the {:.1} MiB of routed experts in the model): {} experts in {layers} layers, one read of {:.1} KiB each",
        r.store.display(),
        mib(r.store_bytes),
        r.store_bytes as f64 / r.source_expert_bytes.max(1) as f64,
        mib(r.source_expert_bytes),
        r.experts.iter().sum::<usize>(),
        r.blob_bytes.iter().copied().max().unwrap_or(0) as f64 / 1024.0
    );
    if r.neuron_major {
        let (mut share, mut n) = (0.0, 0);
        for (l, layer) in neurons.experts.iter().enumerate() {
            for (e, x) in layer.iter().enumerate() {
                let ff = x.active.len().max(1);
                share += neurons.prefix(l, e, ff, a.expert_recall) as f64 / ff as f64;
                n += 1;
            }
        }
        println!(
            "ReLU experts stored neuron-major (one neuron-store layer each, most active neurons first); each expert's read is the prefix carrying {:.0}% of its activations on the routed tokens: {:.1}% of its neurons on average (density {:.3})",
            100.0 * a.expert_recall,
            100.0 * share / n.max(1) as f64,
            neurons.experts.iter().flatten().map(|x| x.density()).sum::<f64>() / n.max(1) as f64
        );
    }
    let reuse: u64 = routing.reused.iter().sum();
    let picks: u64 = routing.counts.iter().flatten().sum();
    println!(
        "routing profile of {} tokens of {} ({:.0}% of a token's experts were the previous token's too), manifest {}",
        routing.tokens,
        src.name(),
        100.0 * reuse as f64 / picks.max(1) as f64,
        r.parts.manifest.display()
    );
    for p in &r.removed {
        println!("removed {} (part of the bundle it replaced)", p.display());
    }
    println!(
        "converted in {:.1} s{}",
        t.elapsed().as_secs_f64(),
        if a.verify {
            ", every expert verified"
        } else {
            ""
        }
    );
    Ok(())
}
