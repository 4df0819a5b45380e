//! Greedy-decodes a prompt in exact mode and, at every step, reports how far fast-mode logits are from
//! exact ones and the exact top-2 margin (a step whose margin is below the drift can flip in fast mode).
//!
//! `cargo run --release -p engine --example drift -- "The capital of France is" 32 [MODEL.gguf]`
//! (the default model unless a GGUF file is given).

use engine::{Engine, EngineOptions, Logits, ModelFile, Precision};

fn main() -> Result<(), engine::EngineError> {
    let mut args = std::env::args().skip(1);
    let prompt = args
        .next()
        .unwrap_or_else(|| "The capital of France is".into());
    let n: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(32);
    let path = match args.next() {
        Some(p) => p.into(),
        None => engine::fetch::ensure_default_model(|l| eprintln!("{l}"))?,
    };
    let file = ModelFile::open(path)?;
    let opts = |precision| EngineOptions {
        threads: 0,
        precision,
        context: 1024,
        ..Default::default()
    };
    let exact = Engine::new(&file, opts(Precision::Exact))?;
    let fast = Engine::new(&file, opts(Precision::Fast))?;
    let mut ids = exact.tokenizer().encode(&prompt, false)?;
    let (mut ce, mut cf) = (exact.new_cache(), fast.new_cache());
    let mut le = exact.forward(&mut ce, &ids, Logits::Last)?;
    let mut lf = fast.forward(&mut cf, &ids, Logits::Last)?;
    for step in 0..n {
        let te = engine::argmax(&le);
        let tf = engine::argmax(&lf);
        let mut sorted = le.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        let drift = le
            .iter()
            .zip(&lf)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        println!(
            "step {step:2}: exact {te:6} fast {tf:6} {} margin {:.4} max drift {:.4}",
            if te == tf { "  " } else { "!!" },
            sorted[0] - sorted[1],
            drift
        );
        ids.push(te);
        le = exact.forward(&mut ce, &[te], Logits::Last)?;
        lf = fast.forward(&mut cf, &[te], Logits::Last)?;
    }
    Ok(())
}
