//! `sparrow bench --lookup N` (or `--self-draft`, `--draft MODEL`): speculative decoding against
//! plain decoding over a set of prompts (the measurement is `engine::bench_spec`; this reads the
//! prompts and prints).

use anyhow::{bail, Context, Result};
use engine::{ChatMessage, Engine, GenerateRequest};

use crate::builtin::{TextSource, CODE_EDIT};
use crate::cmd::bench::BenchArgs;
use crate::spec::Drafting;

/// The prompts of a JSON-lines file (`{"prompt": "..."}` a line; blank lines skipped), each as the
/// user message of the model's chat template.
pub(crate) fn prompts(eng: &Engine<'_>, src: &TextSource) -> Result<Vec<Vec<u32>>> {
    let text = src
        .read()
        .context("give another prompt set with --prompts")?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let bad = || format!("{} line {}", src.name(), i + 1);
        let v: serde_json::Value =
            serde_json::from_str(line).with_context(|| format!("{}: not a JSON object", bad()))?;
        let Some(p) = v.get("prompt").and_then(|p| p.as_str()) else {
            bail!("{}: no string field \"prompt\"", bad());
        };
        let tok = eng.tokenizer();
        let ids = tok
            .encode_chat(&[ChatMessage::new("user", p.to_string())], true)
            .with_context(|| format!("{}: rendering the model's chat template", bad()))?;
        out.push(ids);
    }
    if out.is_empty() {
        bail!("{}: no prompt in the file", src.name());
    }
    Ok(out)
}

/// Runs the speculation `d` asks for and prints the report (text or JSON).
pub fn run(a: &BenchArgs, eng: &Engine<'_>, d: Drafting<'_, '_>) -> Result<()> {
    let n = d.max_draft();
    let src = TextSource::or_builtin(a.prompts.as_deref(), &CODE_EDIT);
    let set = prompts(eng, &src)?;
    // Greedy, up to -n tokens, stopping at the end of the answer.
    let req = GenerateRequest {
        max_tokens: a.n_gen,
        ..Default::default()
    };
    let r = engine::bench_spec::compare(eng, &set, &req, n, a.reps, &mut || d.source(eng))?;
    let (pb, sb) = (r.plain_bytes_per_token(), r.spec_bytes_per_token());
    let (ratio, sd) = r.ratio();
    let s = &r.stats;
    if a.json {
        let v = serde_json::json!({
            "model": eng.model().path(),
            "threads": eng.threads(),
            "prompts": src.name(),
            "n_gen": a.n_gen,
            "drafting": d.name(),
            "lookup": r,
            "plain_bytes_read_per_token": pb,
            "spec_bytes_read_per_token": sb,
            "acceptance_rate": s.acceptance_rate(),
            "tokens_per_step": s.tokens_per_step(),
            "ratio_mean": ratio,
            "ratio_sd": sd,
        });
        println!("{}", serde_json::to_string(&v)?);
    } else {
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
        println!(
            "{}: {} threads, {} prompts of {}, greedy, up to {} tokens each, {} repetitions",
            eng.model().path().display(),
            eng.threads(),
            set.len(),
            src.name(),
            a.n_gen,
            r.plain_tok_s.len()
        );
        let name = d.name();
        println!(
            "plain {:.2} tok/s | {name} {n} {:.2} tok/s | {name}/plain {:.2} +/- {:.2} | {:.0}% of {} drafted tokens kept, {:.2} tokens per verification step",
            mean(&r.plain_tok_s),
            mean(&r.lookup_tok_s),
            ratio,
            sd,
            100.0 * s.acceptance_rate(),
            s.drafted,
            s.tokens_per_step(),
        );
        if r.plain_bytes_read + r.spec_bytes_read > 0 {
            println!(
                "read from flash per token: plain {:.1} KiB | {name} {:.1} KiB per kept token ({:.2}x fewer)",
                pb / 1024.0,
                sb / 1024.0,
                pb / sb.max(1.0)
            );
        }
    }
    if r.differing > 0 {
        bail!(
            "{} generations differed with and without --{} (greedy output should be the same)",
            r.differing,
            d.name()
        );
    }
    Ok(())
}
