//! `sparrow run`: generate text from a prompt, streaming, or chat; then the speed figures.

use std::io::{BufRead, IsTerminal, Write};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use engine::{
    ChatMessage, Engine, Flow, GenerateRequest, Generation, SamplerConfig, SpecOptions, SpecStats,
};

use crate::args::ModelArgs;
use crate::load::{builder, report_accel_failure};
use crate::parse;
use crate::spec::{Drafting, SpecArgs};
use crate::ui::{mib, precision_name};

#[derive(Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The prompt (raw completion, or the first user message with --chat).
    #[arg(long, short = 'p')]
    pub prompt: Option<String>,
    /// Apply the model's chat template; without -p, chat interactively on standard input.
    #[arg(long)]
    pub chat: bool,
    /// System message for --chat (default: the template's own).
    #[arg(long)]
    pub system: Option<String>,
    /// Maximum number of tokens to generate.
    #[arg(long, short = 'n', default_value_t = 128, value_parser = parse::tokens)]
    pub n_predict: usize,
    /// Temperature (0: greedy).
    #[arg(long = "temp", default_value_t = 0.0, value_parser = parse::temperature)]
    pub temperature: f32,
    /// Top-k (0: off).
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    /// Top-p (1: off).
    #[arg(long, default_value_t = 0.95, value_parser = parse::unit_f32)]
    pub top_p: f32,
    /// Min-p (0: off).
    #[arg(long, default_value_t = 0.05, value_parser = parse::unit_f32)]
    pub min_p: f32,
    /// Repetition penalty (1: off).
    #[arg(long, default_value_t = 1.0, value_parser = parse::penalty)]
    pub repeat_penalty: f32,
    /// Tokens the repetition penalty looks back at.
    #[arg(long, default_value_t = 64)]
    pub repeat_last_n: usize,
    /// Random seed.
    #[arg(long, short = 's', default_value_t = 0)]
    pub seed: u64,
    /// Stop when the text contains this string (repeatable).
    #[arg(long, value_parser = parse::stop_string)]
    pub stop: Vec<String>,
    /// Keep generating past end-of-sequence tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Print one JSON object (ids, text, figures) instead of streaming text.
    #[arg(long)]
    pub json: bool,
    /// Decode N sampled continuations as one batch (seeds SEED..SEED+N-1) and print them ranked by
    /// mean log-probability, best first (needs a prompt; use --temp > 0 for different texts).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = parse::best_of)]
    pub best_of: usize,
    /// Speculative decoding by prompt lookup: draft up to N tokens (fewer while drafts are
    /// rejected) by finding the latest tokens earlier in the prompt and text, and verify them in
    /// one step. Greedy output is unchanged, sampled output keeps its distribution.
    #[arg(long, value_name = "N", value_parser = parse::lookup, conflicts_with = "best_of")]
    pub lookup: Option<usize>,
    #[command(flatten)]
    pub spec: SpecArgs,
}

/// Runs the subcommand and prints its result.
pub fn run(a: RunArgs) -> Result<()> {
    let t0 = Instant::now();
    let loaded = builder(&a.model, a.json).open()?;
    let file = loaded.file();
    let eng = loaded
        .engine()
        .with_context(|| format!("loading {}", file.path().display()))?;
    let draft_file = a.spec.open_draft()?;
    let draft_eng = crate::spec::draft_engine(draft_file.as_ref(), &eng)?;
    let drafting = crate::spec::drafting_or_planned(
        a.lookup,
        &a.spec,
        draft_eng.as_ref(),
        loaded.plan(),
        &eng,
    );
    let load_s = t0.elapsed().as_secs_f64();
    let req = GenerateRequest {
        max_tokens: a.n_predict,
        sampler: SamplerConfig {
            temperature: a.temperature,
            top_k: a.top_k,
            top_p: a.top_p,
            min_p: a.min_p,
            repeat_penalty: a.repeat_penalty,
            repeat_last_n: a.repeat_last_n,
            seed: a.seed,
        },
        stop_strings: a.stop.clone(),
        stop_at_eos: !a.ignore_eos,
    };
    if a.chat && a.prompt.is_none() {
        if a.best_of > 1 {
            bail!("--best-of needs a prompt (-p); interactive chat streams one answer");
        }
        if a.json {
            bail!("--json needs a prompt (-p); interactive chat streams text");
        }
        return chat_loop(&eng, &a, &req, load_s, drafting);
    }
    let Some(user) = a.prompt.clone() else {
        bail!("give a prompt with -p \"...\", or --chat to chat interactively")
    };
    // Chat templates write their own BOS; raw prompts get one where the model asks for it.
    let ids = if a.chat {
        let mut msgs = Vec::new();
        if let Some(s) = &a.system {
            msgs.push(ChatMessage::new("system", s.clone()));
        }
        msgs.push(ChatMessage::new("user", user.clone()));
        chat_ids(&eng, &msgs)?
    } else {
        eng.tokenizer()
            .encode(&user, eng.tokenizer().add_bos_default())?
    };
    if a.best_of > 1 {
        return best_of(&eng, &a, &ids, &req, load_s, file.path());
    }
    if a.json {
        let (g, spec) = generate(&eng, &ids, &req, drafting, |_| Flow::Continue)?;
        let t = &g.timings;
        let out = serde_json::json!({
            "model": file.path(),
            "precision": precision_name(eng.options().precision),
            "threads": eng.threads(),
            "prompt_ids": g.prompt_ids,
            "generated_ids": g.generated_ids,
            "text": g.text,
            "stop_reason": g.stop_reason,
            "load_s": load_s,
            "prefill_tokens": t.prefill_tokens,
            "prefill_s": t.prefill_s,
            "prefill_tok_s": t.prefill_tok_s(),
            "decode_tokens": t.decode_tokens,
            "decode_s": t.decode_s,
            "decode_tok_s": t.decode_tok_s(),
            "peak_rss_bytes": engine::sys::peak_rss_bytes(),
            "lookup": a.lookup,
            "drafting": drafting.map(|d| d.name()),
            "max_draft": drafting.map(|d| d.max_draft()),
            "speculation": spec.map(spec_json),
        });
        println!("{}", serde_json::to_string(&out)?);
        report_accel_failure(&eng);
        return Ok(());
    }
    let (g, spec) = stream(&eng, &ids, &req, drafting, if a.chat { "" } else { &user })?;
    eprintln!("\n{}", figures_line(load_s, &g, spec.as_ref()));
    report_accel_failure(&eng);
    Ok(())
}

/// `--best-of N`: the candidates, best first, as text blocks (or one JSON object), then the batch's
/// figures.
fn best_of(
    eng: &Engine<'_>,
    a: &RunArgs,
    ids: &[u32],
    req: &GenerateRequest,
    load_s: f64,
    path: &std::path::Path,
) -> Result<()> {
    if a.temperature == 0.0 && !a.json {
        eprintln!("sparrow: note: --temp 0 is greedy, so every candidate is the same text");
    }
    let r = eng.generate_best_of(ids, req, a.best_of, |_, _| Flow::Continue)?;
    let t = &r.timings;
    if a.json {
        let out = serde_json::json!({
            "model": path,
            "precision": precision_name(eng.options().precision),
            "threads": eng.threads(),
            "best_of": a.best_of,
            "prompt_ids": ids,
            "candidates": r.candidates,
            "load_s": load_s,
            "prefill_tokens": t.prefill_tokens,
            "prefill_s": t.prefill_s,
            "prefill_tok_s": t.prefill_tok_s(),
            "decode_tokens": t.decode_tokens,
            "decode_s": t.decode_s,
            "decode_tok_s": t.decode_tok_s(),
            "peak_rss_bytes": engine::sys::peak_rss_bytes(),
        });
        println!("{}", serde_json::to_string(&out)?);
        return Ok(());
    }
    let mut out = std::io::stdout().lock();
    for (rank, c) in r.candidates.iter().enumerate() {
        writeln!(
            out,
            "--- candidate {} (seed {}, mean log-prob {:.4}, {} tokens, {:?})",
            rank + 1,
            c.seed,
            c.mean_logprob,
            c.generation.generated_ids.len(),
            c.generation.stop_reason
        )?;
        writeln!(out, "{}", c.generation.text)?;
    }
    eprintln!(
        "load {:.2} s | prefill {} tok, {:.1} tok/s | decode {} tok over {} sequences, {:.1} tok/s in all | peak RSS {:.1} MiB",
        load_s,
        t.prefill_tokens,
        t.prefill_tok_s(),
        t.decode_tokens,
        a.best_of,
        t.decode_tok_s(),
        mib(engine::sys::peak_rss_bytes().unwrap_or(0)),
    );
    report_accel_failure(eng);
    Ok(())
}

fn figures_line(load_s: f64, g: &Generation, spec: Option<&SpecStats>) -> String {
    let t = &g.timings;
    let spec = spec.map_or(String::new(), |s| {
        format!(
            " | speculation: {} of {} drafted tokens kept ({:.0}%), {:.2} tok/step",
            s.accepted,
            s.drafted,
            100.0 * s.acceptance_rate(),
            s.tokens_per_step()
        )
    });
    format!(
        "load {:.2} s | prefill {} tok, {:.1} tok/s | decode {} tok, {:.1} tok/s{spec} | peak RSS {:.1} MiB",
        load_s,
        t.prefill_tokens,
        t.prefill_tok_s(),
        t.decode_tokens,
        t.decode_tok_s(),
        mib(engine::sys::peak_rss_bytes().unwrap_or(0)),
    )
}

/// Generates with speculative decoding (`Some`: its draft source) or without.
fn generate(
    eng: &Engine<'_>,
    ids: &[u32],
    req: &GenerateRequest,
    drafting: Option<Drafting<'_, '_>>,
    on_text: impl FnMut(&str) -> Flow,
) -> Result<(Generation, Option<SpecStats>)> {
    Ok(match drafting {
        None => (eng.generate(ids, req, on_text)?, None),
        Some(d) => {
            let opts = SpecOptions {
                max_draft: d.max_draft(),
            };
            let mut src = d.source(eng)?;
            let s = eng.generate_speculative(ids, req, &mut *src, opts, on_text)?;
            (s.generation, Some(s.stats))
        }
    })
}

/// The speculation's counts in `run --json`.
fn spec_json(s: SpecStats) -> serde_json::Value {
    serde_json::json!({
        "steps": s.steps,
        "drafted": s.drafted,
        "accepted": s.accepted,
        "acceptance_rate": s.acceptance_rate(),
        "tokens_per_step": s.tokens_per_step(),
    })
}

/// The conversation's prompt ids: the model's chat template (ChatML when it has none), special
/// tokens from the template only (a message's `<|im_end|>` is text), no BOS added.
fn chat_ids(eng: &Engine<'_>, msgs: &[ChatMessage]) -> Result<Vec<u32>> {
    let tok = eng.tokenizer();
    if let Some(e) = tok.chat_template_error() {
        bail!("the model's chat template does not compile: {e}");
    }
    tok.encode_chat(msgs, true)
        .context("rendering the model's chat template")
}

/// Streams generated text to stdout. When stdout is not a terminal and stderr is, a live line on
/// stderr shows tokens and tok/s while the text goes to the file or pipe.
fn stream(
    eng: &Engine<'_>,
    ids: &[u32],
    req: &GenerateRequest,
    drafting: Option<Drafting<'_, '_>>,
    echo: &str,
) -> Result<(Generation, Option<SpecStats>)> {
    let mut out = std::io::stdout().lock();
    write!(out, "{echo}")?;
    out.flush()?;
    let live = !std::io::stdout().is_terminal() && std::io::stderr().is_terminal();
    let bar = if live {
        let b = indicatif::ProgressBar::new_spinner();
        b.set_style(
            indicatif::ProgressStyle::with_template("{spinner} {pos} tokens, {per_sec}")
                .expect("static template"),
        );
        Some(b)
    } else {
        None
    };
    let g = generate(eng, ids, req, drafting, |piece| {
        if let Some(b) = &bar {
            b.inc(1);
        }
        if write!(out, "{piece}").and_then(|_| out.flush()).is_err() {
            return Flow::Stop; // stdout closed (e.g. `| head`): stop quietly
        }
        Flow::Continue
    })?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    Ok(g)
}

fn chat_loop(
    eng: &Engine<'_>,
    a: &RunArgs,
    req: &GenerateRequest,
    load_s: f64,
    drafting: Option<Drafting<'_, '_>>,
) -> Result<()> {
    let mut msgs: Vec<ChatMessage> = Vec::new();
    if let Some(s) = &a.system {
        msgs.push(ChatMessage {
            role: "system".into(),
            content: s.clone(),
        });
    }
    eprintln!(
        "sparrow: chatting with {} (empty line or Ctrl-D to quit)",
        eng.model().path().display()
    );
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        eprint!("> ");
        std::io::stderr().flush()?;
        let Some(line) = lines.next() else { break };
        let line = line?;
        if line.trim().is_empty() {
            break;
        }
        msgs.push(ChatMessage {
            role: "user".into(),
            content: line,
        });
        let ids = chat_ids(eng, &msgs)?;
        let (g, spec) = stream(eng, &ids, req, drafting, "")?;
        println!();
        eprintln!("[{}]", figures_line(load_s, &g, spec.as_ref()));
        msgs.push(ChatMessage {
            role: "assistant".into(),
            content: g.text,
        });
    }
    Ok(())
}
