//! Perplexity of SmolLM2 against the FFN sparsity level, with thresholds calibrated on the validation
//! split: `cargo run --release -p engine --example sparsity_sweep -- <gate|gatenorm|outputnorm> [levels...]`.

use engine::sparse::Score;
use engine::{fetch, Engine, EngineOptions, ModelFile, SparseFfn};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let score = match args.next().as_deref() {
        Some("gatenorm") => Score::GateNorm,
        Some("outputnorm") => Score::OutputNorm,
        _ => Score::Gate,
    };
    let levels: Vec<f32> = args.map(|s| s.parse()).collect::<Result<_, _>>()?;
    let levels = if levels.is_empty() {
        vec![0.2, 0.3, 0.5]
    } else {
        levels
    };
    let file = ModelFile::open(fetch::ensure_default_model(|l| eprintln!("{l}"))?)?;
    let mut eng = Engine::new(
        &file,
        EngineOptions {
            threads: 2,
            ..Default::default()
        },
    )?;
    let shared =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data/wikitext-2");
    let valid = eng
        .tokenizer()
        .encode(&std::fs::read_to_string(shared.join("valid.txt"))?, false)?;
    let test = eng
        .tokenizer()
        .encode(&std::fs::read_to_string(shared.join("test.txt"))?, false)?;
    let base = eng.install(|| {
        SparseFfn::new(
            eng.model(),
            vec![0.0; eng.model().config.n_layers],
            engine::sparse::DEFAULT_DOWN_FORMAT,
        )
    })?;
    let norms: Vec<Vec<f32>> = (0..eng.model().config.n_layers)
        .map(|l| base.down_norms(l).to_vec())
        .collect();
    let mut samples = vec![Vec::new(); norms.len()];
    let stop = std::sync::atomic::AtomicBool::new(false);
    engine::profile::observe_corpus(
        &eng,
        &valid,
        512,
        8,
        &stop,
        |s| {
            let ff = s.act_gate.len() / s.n;
            for (i, (a, u)) in s.act_gate.iter().zip(s.up).enumerate().step_by(5) {
                samples[s.layer].push(score.of(*a, *u, norms[s.layer][i % ff]));
            }
        },
        |_, _| {},
    )?;
    for s in levels {
        let t = engine::sparse::thresholds_for_sparsity(&mut samples.clone(), s)?;
        let mut sp = eng.install(|| {
            SparseFfn::new(eng.model(), t.clone(), engine::sparse::DEFAULT_DOWN_FORMAT)
        })?;
        sp.score = score;
        eng.set_sparse(Some(sp));
        let r = eng.perplexity(&test, 512, 16, |_, _| {})?;
        println!("{score:?} sparsity {s:.2}: ppl {:.4}", r.ppl);
        eng.set_sparse(None);
    }
    Ok(())
}
