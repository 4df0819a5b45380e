//! How many of llama-completion's greedy tokens (`fixtures/gemma3-270m/completion.json`, 4 prompts
//! x 32 tokens, `-fa off`) the engine reproduces on `gemma3-270m`, per precision and KV format:
//! free-running greedy (tokens equal before the first difference, per prompt) and teacher-forced
//! top-1 (positions where llama.cpp's token is our most likely one, along llama.cpp's tokens), with
//! the first difference's gap in logits.
//!
//! `cargo run --profile ci -p engine --example gemma_agreement [-- exact/f32 ggml/f16 ... ppl=4]`
//! (`ppl=N`: also the running perplexity after each of N windows against llama-perplexity's,
//! by its method, as `tests/it/reference_gemma.rs` computes it).

use engine::{Engine, EngineOptions, GenerateRequest, KvFormat, Logits, ModelFile, Precision};

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("an array of ids")
        .iter()
        .map(|x| x.as_u64().expect("an id") as u32)
        .collect()
}

fn parse(mode: &str) -> (Precision, KvFormat) {
    let (p, k) = mode.split_once('/').unwrap_or((mode, "f16"));
    let p = match p {
        "exact" => Precision::Exact,
        "fast" => Precision::Fast,
        "int8" => Precision::Int8,
        "ggml" => Precision::Ggml,
        other => panic!("unknown precision {other}"),
    };
    let k = match k {
        "f32" => KvFormat::F32,
        "f16" => KvFormat::F16,
        other => panic!("unknown KV format {other}"),
    };
    (p, k)
}

/// `-log softmax(logits)[target]`, in f64.
fn nll(logits: &[f32], target: u32) -> f64 {
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
    let sum: f64 = logits.iter().map(|&v| (v as f64 - max).exp()).sum();
    max + sum.ln() - logits[target as usize] as f64
}

/// The running perplexity after each of the first `windows` windows of
/// `fixtures/gemma3-270m/perplexity.json`, by llama-perplexity's method (the fixture's README).
fn perplexity(eng: &Engine<'_>, windows: usize) -> Result<Vec<f64>, engine::EngineError> {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let text = std::fs::read_to_string(format!("{root}/../shared/data/wikitext-2/test.txt"))
        .expect("shared/data/wikitext-2/test.txt is readable");
    let bos = eng.tokenizer().bos_id().expect("a BOS token");
    let mut tokens = vec![bos];
    tokens.extend(eng.tokenizer().encode_text(&text)?);
    let (n_ctx, vocab) = (512, eng.model().config.vocab_size);
    let (mut sum, mut count, mut out) = (0f64, 0usize, Vec::new());
    for c in 0..windows {
        let mut chunk = tokens[c * n_ctx..(c + 1) * n_ctx].to_vec();
        chunk[0] = bos;
        let mut cache = eng.new_cache();
        eng.forward(&mut cache, &chunk[..n_ctx / 2], Logits::None)?;
        for at in (n_ctx / 2..n_ctx).step_by(64) {
            let logits = eng.forward(&mut cache, &chunk[at..at + 64], Logits::All)?;
            for (i, row) in logits.chunks_exact(vocab).enumerate() {
                if at + i + 1 < n_ctx {
                    sum += nll(row, chunk[at + i + 1]);
                    count += 1;
                }
            }
        }
        out.push((sum / count as f64).exp());
    }
    Ok(out)
}

fn main() -> Result<(), engine::EngineError> {
    let mut modes: Vec<String> = std::env::args().skip(1).collect();
    // `ppl=N`: also the running perplexity of N windows against llama-perplexity's.
    let ppl_windows = modes
        .iter()
        .find_map(|m| m.strip_prefix("ppl=").and_then(|n| n.parse::<usize>().ok()));
    modes.retain(|m| !m.starts_with("ppl="));
    if modes.is_empty() {
        modes = [
            "exact/f32",
            "exact/f16",
            "fast/f32",
            "fast/f16",
            "int8/f32",
            "int8/f16",
            "ggml/f16",
        ]
        .map(String::from)
        .to_vec();
    }
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../fixtures/gemma3-270m/completion.json"
    );
    let f: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture).expect("the fixture is readable"))
            .expect("the fixture parses");
    let ppl_fixture: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixture.replace("completion.json", "perplexity.json"))
            .expect("the perplexity fixture is readable"),
    )
    .expect("the perplexity fixture parses");
    let m = engine::fetch::known_model("gemma3-270m").expect("a known model");
    let path = engine::fetch::ensure_model(m, |l| eprintln!("{l}"))?;
    let file = ModelFile::open(path)?;
    for mode in &modes {
        let (precision, kv) = parse(mode);
        let eng = Engine::new(
            &file,
            EngineOptions {
                threads: 0,
                context: 512,
                precision,
                cache_type: Some(kv),
            },
        )?;
        let (mut free, mut forced, mut lines) = (0, 0, Vec::new());
        for p in f["prompts"].as_array().expect("prompts") {
            let prompt = ids(&p["ids"]);
            let want = ids(&p["greedy32_ids"]);
            let mut cache = eng.new_cache();
            let mut logits = eng.forward(&mut cache, &prompt, Logits::Last)?;
            let (mut hits, mut first) = (0, None);
            for (i, &w) in want.iter().enumerate() {
                let best = engine::argmax(&logits) as u32;
                if best == w {
                    hits += 1;
                } else if first.is_none() {
                    let gap = logits[best as usize] - logits[w as usize];
                    first = Some(format!("pos {i}: ours {best} over {w} by {gap:.4}"));
                }
                logits = eng.forward(&mut cache, &[w], Logits::Last)?;
            }
            let req = GenerateRequest {
                max_tokens: 32,
                stop_at_eos: false,
                ..Default::default()
            };
            let got = eng
                .generate(&prompt, &req, |_| engine::Flow::Continue)?
                .generated_ids;
            let same = got.iter().zip(&want).take_while(|(a, b)| a == b).count();
            free += same;
            forced += hits;
            lines.push(format!(
                "  {:?}: free {same}/32, forced {hits}/32, first {}",
                p["text"].as_str().unwrap_or(""),
                first.unwrap_or_else(|| "none".into())
            ));
        }
        println!(
            "{mode}: free-running {free}/128, teacher-forced top-1 {forced}/128\n{}",
            lines.join("\n")
        );
        if let Some(w) = ppl_windows {
            let want = &ppl_fixture["running_ppl"];
            for (c, p) in perplexity(&eng, w)?.iter().enumerate() {
                let l = want[c].as_f64().expect("a running perplexity");
                println!(
                    "  perplexity after window {c}: {p:.4} (llama.cpp {l:.4}, {:+.3}%)",
                    (p / l - 1.0) * 100.0
                );
            }
        }
    }
    Ok(())
}
