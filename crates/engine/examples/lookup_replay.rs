//! Replays prompt lookup ([`engine::Lookup`], the engine's own policy) over recorded greedy outputs,
//! to see where a `--lookup` run's steps go and what a draft cap would give, without the model:
//! greedy output does not depend on speculation, so a step's kept drafts are the longest prefix of
//! its draft that the recorded output continues with.
//!
//! Record the outputs with `SPARROW_SPEC_TRACE=ids sparrow bench --lookup 8 ... 2> trace.txt` (each
//! generation's `spec-ids {"prompt": [...], "generated": [...]}` line), then
//!
//! `cargo run --release -p engine --example lookup_replay -- trace.txt [COST] [MAX,MAX,...] [TOKENS]`
//!
//! COST: a verification step's price per drafted token, as a share of a one-token step (measure it
//! with `examples/verify_parts.rs`'s "whole step" row; default 0.32, Qwen2.5-Coder-0.5B on the
//! AVX-512 path, 2026-12-06); MAX: the draft caps to replay (default 4,8,12,16); TOKENS: the run's
//! `-n` (default 128). Per cap it prints the steps, the steps that drafted nothing, those whose
//! draft was kept whole, in part or not at all, drafted and kept tokens, and the modelled decode
//! ratio `tokens / (steps + COST * drafted)` (a one-token step costing 1). A generation that ended
//! before TOKENS is taken to end at its last token (drafts are cut after it, as the engine cuts
//! them after an end token).

use engine::{DraftSource, Lookup};

/// One generation: its prompt's and its output's token ids.
struct Run {
    prompt: Vec<u32>,
    generated: Vec<u32>,
}

/// The numbers after `"key": [` up to the closing bracket.
fn ids_after(line: &str, key: &str) -> Option<Vec<u32>> {
    let start = line.find(&format!("\"{key}\": ["))? + key.len() + 5;
    let end = start + line[start..].find(']')?;
    line[start..end]
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.trim().parse().ok())
        .collect()
}

/// Step counts of one replay.
#[derive(Default)]
struct Tally {
    steps: usize,
    none: usize,
    whole: usize,
    part: usize,
    rejected: usize,
    drafted: usize,
    kept: usize,
    tokens: usize,
}

fn replay(runs: &[Run], max: usize, tokens: usize) -> Tally {
    let mut t = Tally::default();
    for r in runs {
        let g = &r.generated;
        let end = (g.len() < tokens).then(|| g.last().copied()).flatten();
        let mut lookup = Lookup::default();
        let mut history = r.prompt.clone();
        history.push(g[0]);
        // g[0] comes from the prompt's step; each step then feeds the last token and a draft.
        let mut i = 1;
        let mut draft = Vec::new();
        while i < g.len() {
            let left = tokens.saturating_sub(i + 1);
            draft.clear();
            lookup.draft(&history, max.min(left), &mut draft);
            draft.truncate(max.min(left));
            if let Some(e) = end.and_then(|e| draft.iter().position(|&d| d == e)) {
                draft.truncate(e + 1);
            }
            let kept = draft
                .iter()
                .zip(&g[i..])
                .take_while(|(d, o)| d == o)
                .count();
            t.steps += 1;
            t.drafted += draft.len();
            t.kept += kept;
            match (draft.len(), kept) {
                (0, _) => t.none += 1,
                (n, k) if k == n => t.whole += 1,
                (_, 0) => t.rejected += 1,
                _ => t.part += 1,
            }
            let step = (kept + 1).min(g.len() - i);
            history.extend_from_slice(&g[i..i + step]);
            t.tokens += step;
            i += step;
        }
    }
    t
}

fn main() {
    let mut args = std::env::args().skip(1);
    let file = args.next().expect("a trace file of spec-ids lines");
    let cost: f64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(0.32);
    let maxes: Vec<usize> = args
        .next()
        .unwrap_or_else(|| "4,8,12,16".into())
        .split(',')
        .filter_map(|s| s.parse().ok())
        .collect();
    let tokens: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(128);
    let text = std::fs::read_to_string(&file).expect("a readable trace file");
    let runs: Vec<Run> = text
        .lines()
        .filter(|l| l.contains("\"generated\": ["))
        .filter_map(|l| {
            Some(Run {
                prompt: ids_after(l, "prompt")?,
                generated: ids_after(l, "generated")?,
            })
        })
        .filter(|r| !r.generated.is_empty())
        .collect();
    let total: usize = runs.iter().map(|r| r.generated.len()).sum();
    println!(
        "{file}: {} generations, {total} tokens; cost of a drafted token {cost}",
        runs.len()
    );
    println!("max  steps  none  whole  part  rejected  drafted  kept  tokens/step  modelled ratio");
    for max in maxes {
        let t = replay(&runs, max, tokens);
        // Plain decoding takes a one-token step for each of the same tokens.
        let ratio = t.tokens as f64 / (t.steps as f64 + cost * t.drafted as f64);
        println!(
            "{max:>3}  {:>5}  {:>4}  {:>5}  {:>4}  {:>8}  {:>7}  {:>4}  {:>11.2}  {ratio:>14.3}",
            t.steps,
            t.none,
            t.whole,
            t.part,
            t.rejected,
            t.drafted,
            t.kept,
            t.tokens as f64 / t.steps.max(1) as f64
        );
    }
}
