//! `sparrow`: run LLMs on phone-class hardware from the command line.
//!
//! Subcommands: `run` (generate, streaming, with speed figures), `perplexity` (score a text file),
//! `bench` (prefill/decode speed like llama-bench's pp/tg). `sparrow --help` lists the options.

use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use engine::{
    ChatMessage, Engine, EngineOptions, Flow, GenerateRequest, Generation, Logits, ModelFile,
    Overlay, Precision, SamplerConfig,
};

#[derive(Parser)]
#[command(
    name = "sparrow",
    version,
    about = "Run large language models on phone-class hardware"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt, or chat.
    Run(RunArgs),
    /// Perplexity of a model on a text file (non-overlapping windows, each scored on its own).
    Perplexity(PplArgs),
    /// Prefill and decode speed (like llama-bench's pp and tg).
    Bench(BenchArgs),
    /// Profile FFN activations over a corpus: calibrate sparsity thresholds and record per-neuron
    /// statistics (writes `<model>.sparrow-profile`).
    Profile(ProfileArgs),
    /// Train the per-layer neuron predictors from a profile (writes `<model>.sparrow-predictor`).
    TrainPredictor(TrainArgs),
    /// Split a model for flash offload: a resident file (everything but the FFN) and a neuron store
    /// (the FFN, one bundle per neuron, hot neurons first), ordered by the model's profile.
    Convert(ConvertArgs),
}

#[derive(Args)]
struct ConvertArgs {
    /// The GGUF model (default: SmolLM2-135M-Instruct, fetched if absent).
    #[arg(long, short = 'm')]
    model: Option<PathBuf>,
    /// Its profile (default: `<model>.sparrow-profile`; run `sparrow profile` first).
    #[arg(long)]
    profile: Option<PathBuf>,
    /// Its predictors, copied next to the resident file (default: `<model>.sparrow-predictor` if it exists).
    #[arg(long)]
    predictor: Option<PathBuf>,
    /// Output resident file (default: `<model stem>.resident.gguf` next to the model); the store is
    /// written next to it with the extension `.neurons`.
    #[arg(long, short = 'o')]
    out: Option<PathBuf>,
    /// One neuron per 4 KiB page instead of packing neighbours by activation frequency.
    #[arg(long)]
    no_pack: bool,
    /// Read back every page of the store and check it.
    #[arg(long)]
    verify: bool,
}

#[derive(Args, Clone)]
struct ModelArgs {
    /// A GGUF file or an HF directory (config.json + safetensors). Default: SmolLM2-135M-Instruct,
    /// fetched into the model cache if absent.
    #[arg(long, short = 'm')]
    model: Option<PathBuf>,
    /// Compute threads (0: one per core).
    #[arg(long, short = 't', default_value_t = 0)]
    threads: usize,
    /// Exact mode: dequantized weights, f32 activations (slower; matches a reference implementation).
    #[arg(long, conflicts_with = "int8")]
    exact: bool,
    /// 8-bit activations (llama.cpp style): fastest on compute-bound cores, but logits drift
    /// (up to ~1 on SmolLM2) and greedy text can differ. The default uses 16-bit activations.
    #[arg(long)]
    int8: bool,
    /// Weight rows per parallel work item of the dense kernels (0: automatic, about four items per
    /// thread; PowerInfer-2 uses 512).
    #[arg(long, default_value_t = 0)]
    chunk_rows: usize,
    /// Context size in tokens (0: the model's training context).
    #[arg(long, default_value_t = 4096)]
    ctx: usize,
    /// Sparse FFN: compute only the neurons expected to fire, with the thresholds of the model's
    /// profile (`sparrow profile`) and its predictors (`sparrow train-predictor`) when present.
    #[arg(long)]
    sparse: bool,
    /// Profile file for --sparse (default: `<model>.sparrow-profile`).
    #[arg(long, requires = "sparse")]
    profile: Option<PathBuf>,
    /// Predictor file for --sparse (default: `<model>.sparrow-predictor` if it exists).
    #[arg(long, requires = "sparse")]
    predictor: Option<PathBuf>,
    /// With --sparse, use no predictor: every gate and up row is computed and the thresholds pick
    /// the down columns.
    #[arg(long, requires = "sparse")]
    no_predictor: bool,
    /// Re-quantize the layer weights (q, k, v, o, gate, up, down) at load time: `q4_0`, `int4`
    /// (per-channel INT4), or `hybrid:<fraction>` (per-channel INT4 plus that fraction of each
    /// row as INT8 outliers, PowerInfer-2 section 7.6; e.g. `hybrid:1%`). Embedding and output
    /// projection stay as in the file.
    #[arg(long)]
    requant: Option<engine::Requant>,
    #[command(flatten)]
    offload: OffloadArgs,
}

/// Flash offload: used when the model is a resident file written by `sparrow convert` (its FFN is
/// read from the neuron store next to it).
#[derive(Args, Clone)]
struct OffloadArgs {
    /// Memory budget for the whole process, e.g. `140M`, `1.5G`: what it holds before touching weights
    /// (code, tokenizer), the resident file, the KV cache at --ctx and the predictors are counted
    /// first; the FFN neuron cache gets the rest.
    #[arg(long, value_parser = parse_size, conflicts_with = "ffn_resident")]
    memory_budget: Option<u64>,
    /// Instead of --memory-budget: the share of the FFN kept in memory (e.g. 0.5).
    #[arg(long)]
    ffn_resident: Option<f64>,
    /// Share of the FFN cache preloaded with each layer's hottest neurons (the rest is an LRU of
    /// neurons read on demand). All by default: on SmolLM2 the predicted neurons of a token cover 93%
    /// of the pages, a cyclic scan that an LRU smaller than it never hits (docs/BENCHMARKS.md).
    #[arg(long, default_value_t = 1.0)]
    hot_share: f32,
    /// Unit reads in flight on the I/O thread; the kernel gets up to this many at once (Linux AIO).
    #[arg(long, default_value_t = 256)]
    io_depth: usize,
    /// Core to pin the I/O thread to.
    #[arg(long)]
    io_core: Option<usize>,
    /// Read through the page cache instead of with direct I/O.
    #[arg(long)]
    no_direct: bool,
    /// Ablation: do not keep neurons read from flash (only the preloaded hot set is cached).
    #[arg(long, hide = true)]
    no_cold_cache: bool,
    /// Ablation: wait for all reads of a layer before computing cached neurons.
    #[arg(long, hide = true)]
    no_pipeline: bool,
    /// Two-phase loading (PowerInfer-2 4.4) where a store's units span pages: read a unit's gate page
    /// first and the rest only if a neuron fires. Saves bytes when most predicted neurons turn out
    /// inactive; costs a second read in series otherwise (off by default, see docs/BENCHMARKS.md)
    #[arg(long)]
    two_phase: bool,
    /// Issue one blocking read at a time instead of handing up to --io-depth reads to the kernel at
    /// once (Linux AIO); for comparison.
    #[arg(long)]
    io_sync: bool,
}

/// Parses `123`, `64K`, `80M`, `1.5G` (powers of 1024).
fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let (num, mul) = match t
        .char_indices()
        .last()
        .map(|(i, c)| (i, c.to_ascii_uppercase()))
    {
        Some((i, 'K')) => (&t[..i], 1u64 << 10),
        Some((i, 'M')) => (&t[..i], 1 << 20),
        Some((i, 'G')) => (&t[..i], 1 << 30),
        _ => (t, 1),
    };
    let v: f64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a size (e.g. 80M, 1.5G)"))?;
    if !v.is_finite() || v < 0.0 {
        return Err(format!("`{s}` is not a size"));
    }
    Ok((v * mul as f64) as u64)
}

#[derive(Args)]
struct CorpusArgs {
    /// Text to profile (calibrate on the validation split, never the test split).
    #[arg(long, default_value = "../shared/data/wikitext-2/valid.txt")]
    corpus: PathBuf,
    /// Tokens per window.
    #[arg(long, default_value_t = 512)]
    window: usize,
}

#[derive(Args)]
struct ProfileArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    corpus: CorpusArgs,
    /// Windows profiled (statistics).
    #[arg(long, default_value_t = 24)]
    windows: usize,
    /// Windows used to calibrate thresholds (the first ones of the corpus).
    #[arg(long, default_value_t = 8)]
    calib_windows: usize,
    /// Target share of inactive neurons per layer.
    #[arg(long, conflicts_with = "ppl_budget")]
    sparsity: Option<f32>,
    /// Instead of --sparsity: the highest sparsity whose perplexity on held-out validation windows
    /// stays within this relative increase over dense (e.g. 0.03 for +3%).
    #[arg(long)]
    ppl_budget: Option<f32>,
    /// What thresholds apply to: `output` (|act(gate)·up|·‖down_j‖, best quality), `gate`
    /// (|act(gate)|, CATS) or `gate-norm` (|act(gate)|·‖down_j‖).
    #[arg(long, default_value = "output")]
    score: String,
    /// Output file (default: `<model>.sparrow-profile`).
    #[arg(long, short = 'o')]
    out: Option<PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct TrainArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    corpus: CorpusArgs,
    /// Windows of training samples (every token of each window is one sample per layer).
    #[arg(long, default_value_t = 32)]
    windows: usize,
    /// Recall each layer's predictor must reach on held-out samples. Misses compound over the
    /// layers: on SmolLM2, 0.95 cost +11.6% test perplexity and 0.99 +2.5% (docs/BENCHMARKS.md).
    #[arg(long, default_value_t = 0.99)]
    recall: f32,
    /// Training seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Epochs per candidate hidden size.
    #[arg(long, default_value_t = 8)]
    epochs: usize,
    /// Largest predictor size per layer, as a share of that layer's FFN bytes (PowerInfer keeps
    /// predictors small next to the weights they save; larger hidden sizes are not tried).
    #[arg(long, default_value_t = 0.10)]
    max_share: f64,
    /// Output file (default: `<model>.sparrow-predictor`).
    #[arg(long, short = 'o')]
    out: Option<PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct RunArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// The prompt (raw completion, or the first user message with --chat).
    #[arg(long, short = 'p')]
    prompt: Option<String>,
    /// Apply the model's chat template; without -p, chat interactively on standard input.
    #[arg(long)]
    chat: bool,
    /// System message for --chat (default: the template's own).
    #[arg(long)]
    system: Option<String>,
    /// Maximum number of tokens to generate.
    #[arg(long, short = 'n', default_value_t = 128)]
    n_predict: usize,
    /// Temperature (0: greedy).
    #[arg(long = "temp", default_value_t = 0.0)]
    temperature: f32,
    /// Top-k (0: off).
    #[arg(long, default_value_t = 40)]
    top_k: usize,
    /// Top-p (1: off).
    #[arg(long, default_value_t = 0.95)]
    top_p: f32,
    /// Min-p (0: off).
    #[arg(long, default_value_t = 0.05)]
    min_p: f32,
    /// Repetition penalty (1: off).
    #[arg(long, default_value_t = 1.0)]
    repeat_penalty: f32,
    /// Tokens the repetition penalty looks back at.
    #[arg(long, default_value_t = 64)]
    repeat_last_n: usize,
    /// Random seed.
    #[arg(long, short = 's', default_value_t = 0)]
    seed: u64,
    /// Stop when the text contains this string (repeatable).
    #[arg(long)]
    stop: Vec<String>,
    /// Keep generating past end-of-sequence tokens.
    #[arg(long)]
    ignore_eos: bool,
    /// Print one JSON object (ids, text, figures) instead of streaming text.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct PplArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// The text file to score.
    #[arg(long, short = 'f')]
    file: PathBuf,
    /// Tokens per window.
    #[arg(long, default_value_t = 512)]
    window: usize,
    /// Number of windows (from the start of the file).
    #[arg(long, default_value_t = 16)]
    windows: usize,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct BenchArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Prompt tokens for the prefill test (pp).
    #[arg(long, short = 'p', default_value_t = 512)]
    n_prompt: usize,
    /// Generated tokens for the decode test (tg).
    #[arg(long, short = 'n', default_value_t = 128)]
    n_gen: usize,
    /// Repetitions of each test (the report gives the mean and spread).
    #[arg(long, short = 'r', default_value_t = 3)]
    reps: usize,
    /// Take the tokens from this text file instead of pseudo-random ids (decode is then
    /// teacher-forced: the file's next token is fed whatever the model predicted). With --sparse the
    /// default is the WikiText-2 test split, since sparsity depends on what the text is.
    #[arg(long)]
    text: Option<PathBuf>,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
    /// With --sparse: also run this resident file (`sparrow convert` of the same model) over its
    /// neuron store, alternating with in-memory sparse decode, and report offloaded/in-memory ratios
    /// with per-token latency, cache misses and flash reads (the --memory-budget options apply to it).
    #[arg(long, requires = "sparse")]
    offload: Option<PathBuf>,
}

fn open_model(args: &ModelArgs, quiet: bool) -> Result<ModelFile> {
    let path = match &args.model {
        Some(p) => p.clone(),
        None => engine::fetch::ensure_default_model(|line| {
            if !quiet {
                eprintln!("sparrow: {line}");
            }
        })?,
    };
    Ok(ModelFile::open(&path)?)
}

/// The load-time re-quantization `--requant` asks for (built before the engine, which borrows it).
fn build_overlay(file: &ModelFile, args: &ModelArgs, quiet: bool) -> Result<Option<Overlay>> {
    let Some(r) = args.requant else {
        return Ok(None);
    };
    let t = Instant::now();
    let o = Overlay::build(file, r)
        .with_context(|| format!("re-quantizing {} to {r}", file.path().display()))?;
    if !quiet {
        eprintln!(
            "sparrow: re-quantized {} layer matrices to {r} in {:.1} s: {:.1} MiB, {:.3} bits per weight",
            o.len(),
            t.elapsed().as_secs_f64(),
            mib(o.bytes() as u64),
            o.bits_per_weight()
        );
    }
    Ok(Some(o))
}

fn engine_options(args: &ModelArgs) -> EngineOptions {
    // The kernels' work-item size is process-wide.
    engine::set_chunk_rows(args.chunk_rows);
    EngineOptions {
        threads: args.threads,
        precision: if args.exact {
            Precision::Exact
        } else if args.int8 {
            Precision::Int8
        } else {
            Precision::Fast
        },
        context: args.ctx,
    }
}

fn precision_name(p: Precision) -> &'static str {
    match p {
        Precision::Exact => "exact",
        Precision::Fast => "fast",
        Precision::Int8 => "int8",
    }
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Run(a) => cmd_run(a),
        Command::Perplexity(a) => cmd_perplexity(a),
        Command::Bench(a) => cmd_bench(a),
        Command::Profile(a) => cmd_profile(a),
        Command::TrainPredictor(a) => cmd_train(a),
        Command::Convert(a) => cmd_convert(a),
    }
}

fn figures_line(load_s: f64, g: &Generation) -> String {
    let t = &g.timings;
    format!(
        "load {:.2} s | prefill {} tok, {:.1} tok/s | decode {} tok, {:.1} tok/s | peak RSS {:.1} MiB",
        load_s,
        t.prefill_tokens,
        t.prefill_tok_s(),
        t.decode_tokens,
        t.decode_tok_s(),
        mib(engine::sys::peak_rss_bytes().unwrap_or(0)),
    )
}

fn cmd_run(a: RunArgs) -> Result<()> {
    let t0 = Instant::now();
    let file = open_model(&a.model, a.json)?;
    let overlay = build_overlay(&file, &a.model, a.json)?;
    let mut eng = Engine::new_with_overlay(&file, overlay.as_ref(), engine_options(&a.model))
        .with_context(|| format!("loading {}", file.path().display()))?;
    setup_sparse(&mut eng, &a.model, a.json)?;
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
        if a.json {
            bail!("--json needs a prompt (-p); interactive chat streams text");
        }
        return chat_loop(&eng, &a, &req, load_s);
    }
    let Some(user) = a.prompt.clone() else {
        bail!("give a prompt with -p \"...\", or --chat to chat interactively")
    };
    let prompt_text = if a.chat {
        let mut msgs = Vec::new();
        if let Some(s) = &a.system {
            msgs.push(ChatMessage {
                role: "system".into(),
                content: s.clone(),
            });
        }
        msgs.push(ChatMessage {
            role: "user".into(),
            content: user,
        });
        render_chat(&eng, &msgs)?
    } else {
        user
    };
    // Chat templates write their own BOS; raw prompts get one where the model asks for it.
    let ids = eng
        .tokenizer()
        .encode(&prompt_text, !a.chat && eng.tokenizer().add_bos_default())?;
    if a.json {
        let g = eng.generate(&ids, &req, |_| Flow::Continue)?;
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
        });
        println!("{}", serde_json::to_string(&out)?);
        return Ok(());
    }
    let g = stream(&eng, &ids, &req, if a.chat { "" } else { &prompt_text })?;
    eprintln!("\n{}", figures_line(load_s, &g));
    Ok(())
}

fn render_chat(eng: &Engine<'_>, msgs: &[ChatMessage]) -> Result<String> {
    let tok = eng.tokenizer();
    let piece = |id: Option<u32>| {
        id.and_then(|i| tok.id_to_piece(i))
            .unwrap_or("")
            .to_string()
    };
    let fallback = engine::ChatTemplate::chatml();
    let tpl = tok.chat_template().unwrap_or(&fallback);
    Ok(tpl.render(msgs, true, &piece(tok.bos_id()), &piece(tok.eos_id()))?)
}

/// Streams generated text to stdout. When stdout is not a terminal and stderr is, a live line on
/// stderr shows tokens and tok/s while the text goes to the file or pipe.
fn stream(eng: &Engine<'_>, ids: &[u32], req: &GenerateRequest, echo: &str) -> Result<Generation> {
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
    let g = eng.generate(ids, req, |piece| {
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

fn chat_loop(eng: &Engine<'_>, a: &RunArgs, req: &GenerateRequest, load_s: f64) -> Result<()> {
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
        let ids = eng.tokenizer().encode(&render_chat(eng, &msgs)?, false)?;
        let g = stream(eng, &ids, req, "")?;
        println!();
        eprintln!("[{}]", figures_line(load_s, &g));
        msgs.push(ChatMessage {
            role: "assistant".into(),
            content: g.text,
        });
    }
    Ok(())
}

fn cmd_perplexity(a: PplArgs) -> Result<()> {
    let file = open_model(&a.model, a.json)?;
    let overlay = build_overlay(&file, &a.model, a.json)?;
    let mut eng = Engine::new_with_overlay(&file, overlay.as_ref(), engine_options(&a.model))?;
    setup_sparse(&mut eng, &a.model, a.json)?;
    let text = std::fs::read_to_string(&a.file)
        .with_context(|| format!("reading {}", a.file.display()))?;
    let tokens = eng.tokenizer().encode(&text, false)?;
    let bar = indicatif::ProgressBar::new(a.windows as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:30} {pos}/{len} windows, {elapsed} elapsed, ETA {eta}",
        )
        .expect("static template"),
    );
    if !std::io::stderr().is_terminal() {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let r = eng.perplexity(&tokens, a.window, a.windows, |done, _| {
        bar.set_position(done as u64)
    })?;
    bar.finish_and_clear();
    if a.json {
        let mut v = serde_json::to_value(&r)?;
        v["model"] = serde_json::json!(file.path());
        v["file"] = serde_json::json!(a.file);
        v["precision"] = serde_json::json!(precision_name(eng.options().precision));
        v["sparse"] = serde_json::json!(eng.sparse().is_some());
        v["requant"] = serde_json::json!(overlay.as_ref().map(|o| o.requant().to_string()));
        v["requant_bits_per_weight"] =
            serde_json::json!(overlay.as_ref().map(|o| o.bits_per_weight()));
        println!("{}", serde_json::to_string(&v)?);
    } else {
        println!(
            "perplexity {:.4} (mean NLL {:.6}) over {} windows of {} tokens of {} ({} tokens in file), {:.1} tok/s, {} mode{}",
            r.ppl,
            r.mean_nll,
            r.windows,
            r.window,
            a.file.display(),
            r.tokens_in_text,
            r.tokens_per_s,
            precision_name(eng.options().precision),
            overlay.as_ref().map(|o| format!(", layers re-quantized to {}", o.requant())).unwrap_or_default()
                + if eng.sparse().is_some() { ", sparse FFN" } else { "" }
        );
    }
    Ok(())
}

fn mean_sd(xs: &[f64]) -> (f64, f64) {
    let n = xs.len().max(1) as f64;
    let m = xs.iter().sum::<f64>() / n;
    let var = xs.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / n;
    (m, var.sqrt())
}

fn cmd_bench(a: BenchArgs) -> Result<()> {
    let file = open_model(&a.model, a.json)?;
    let overlay = build_overlay(&file, &a.model, a.json)?;
    let mut eng = Engine::new_with_overlay(&file, overlay.as_ref(), engine_options(&a.model))?;
    setup_sparse(&mut eng, &a.model, a.json)?;
    let vocab = eng.model().config.vocab_size as u32;
    let need = a.n_prompt.max(a.n_gen).max(1);
    let text = a.text.clone().or_else(|| {
        (a.model.sparse || eng.model().config.ffn_store.is_some())
            .then(|| PathBuf::from("../shared/data/wikitext-2/test.txt"))
    });
    let tokens: Vec<u32> = match &text {
        Some(path) => {
            let t = std::fs::read_to_string(path).with_context(|| {
                format!("reading {} (give another text with --text)", path.display())
            })?;
            let ids = eng.tokenizer().encode(&t, false)?;
            if ids.len() < need {
                bail!(
                    "{}: {} tokens, the bench needs {need}",
                    path.display(),
                    ids.len()
                );
            }
            ids[..need].to_vec()
        }
        // Deterministic pseudo-random tokens, like llama-bench (content does not change dense speed).
        None => (0..need as u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 7) % vocab)
            .collect(),
    };
    // With --sparse every repetition runs dense and sparse back to back (alternating which goes
    // first), so the ratio compares the two on the same machine state. With --offload the pair is
    // in-memory sparse and offloaded sparse (a second engine over the resident file). A resident
    // model alone runs only sparse (its FFN is in the store).
    let off_file = a.offload.as_ref().map(ModelFile::open).transpose()?;
    let off_eng = match &off_file {
        Some(f) => {
            let mut e = Engine::new(f, engine_options(&a.model))?;
            if e.model().config.ffn_store.is_none() {
                bail!(
                    "--offload {}: not a resident file (make one with `sparrow convert`)",
                    f.path().display()
                );
            }
            let mut margs = a.model.clone();
            margs.model = Some(f.path().to_path_buf());
            margs.profile = None;
            margs.predictor = None;
            setup_sparse(&mut e, &margs, a.json)?;
            Some(e)
        }
        None => None,
    };
    let resident = eng.model().config.ffn_store.is_some();
    let mut sparse = if resident { None } else { eng.take_sparse() };
    #[derive(Clone, Copy, PartialEq)]
    enum Mode {
        Dense,
        Sparse,
        Offload,
    }
    let modes: Vec<Mode> = match (&off_eng, sparse.is_some(), resident) {
        (Some(_), _, _) => vec![Mode::Sparse, Mode::Offload],
        (None, _, true) => vec![Mode::Offload],
        (None, true, false) => vec![Mode::Dense, Mode::Sparse],
        (None, false, false) => vec![Mode::Dense],
    };
    let mut runs: Vec<ModeRuns> = modes.iter().map(|_| ModeRuns::default()).collect();
    // Warm-up: page the weights in.
    let mut cache = eng.new_cache();
    if !resident {
        eng.forward(&mut cache, &tokens[..1], Logits::Last)?;
    }
    for rep in 0..a.reps.max(1) {
        let order: Vec<usize> = if rep % 2 == 0 {
            (0..modes.len()).collect()
        } else {
            (0..modes.len()).rev().collect()
        };
        for mi in order {
            if modes[mi] == Mode::Sparse {
                eng.set_sparse(sparse.take());
            }
            let e: &Engine<'_> = match (modes[mi], &off_eng) {
                (Mode::Offload, Some(o)) => o,
                _ => &eng,
            };
            let r = &mut runs[mi];
            if a.n_prompt > 0 {
                let mut cache = e.new_cache();
                let t = Instant::now();
                e.forward(&mut cache, &tokens[..a.n_prompt], Logits::Last)?;
                r.pp.push(a.n_prompt as f64 / t.elapsed().as_secs_f64());
            }
            if a.n_gen > 0 {
                let mut cache = e.new_cache();
                if let Some(sp) = e.sparse() {
                    sp.reset_stats();
                    if let Some(o) = sp.offload() {
                        o.reset_stats();
                    }
                }
                e.take_ffn_seconds();
                let mut tok = tokens[0];
                let t = Instant::now();
                for i in 0..a.n_gen {
                    let ti = Instant::now();
                    let logits = e.forward(&mut cache, &[tok], Logits::Last)?;
                    r.token_s.push(ti.elapsed().as_secs_f64());
                    tok = if text.is_some() {
                        tokens[(i + 1) % tokens.len()]
                    } else {
                        engine::sampling::argmax(&logits)
                    };
                }
                let secs = t.elapsed().as_secs_f64();
                r.tg.push(a.n_gen as f64 / secs);
                r.ffn_share.push(e.take_ffn_seconds() / secs);
                if let Some(sp) = e.sparse() {
                    r.stats = Some(sp.stats());
                    if let Some(o) = sp.offload() {
                        let st = o.stats();
                        r.wait_share.push(st.io_wait_s / secs);
                        r.offload = Some(st);
                    }
                }
            }
            if modes[mi] == Mode::Sparse {
                sparse = eng.take_sparse();
            }
        }
    }
    let prec = precision_name(eng.options().precision);
    let mode_name = |m: Mode| match m {
        Mode::Dense => "dense",
        Mode::Sparse => {
            if off_eng.is_some() {
                "in-memory sparse"
            } else {
                "sparse"
            }
        }
        Mode::Offload => "offloaded",
    };
    let ratio_name = if modes.len() == 2 {
        format!("{}/{}", mode_name(modes[1]), mode_name(modes[0]))
    } else {
        String::new()
    };
    let ratio = |f: fn(&ModeRuns) -> &Vec<f64>| -> Option<(f64, f64)> {
        (runs.len() == 2 && !f(&runs[0]).is_empty()).then(|| {
            mean_sd(
                &f(&runs[1])
                    .iter()
                    .zip(f(&runs[0]))
                    .map(|(s, d)| s / d)
                    .collect::<Vec<_>>(),
            )
        })
    };
    let tg_ratio = ratio(|r| &r.tg);
    let pp_ratio = ratio(|r| &r.pp);
    let offload_json = |r: &ModeRuns| {
        r.offload.as_ref().map(|o| {
            let n = o.tokens.max(1) as f64;
            serde_json::json!({
                "miss_rate": o.miss_rate(), "units_per_token": o.units as f64 / n,
                "mib_read_per_token": mib(o.bytes_read) / n, "io_wait_share": mean_sd(&r.wait_share).0,
                "rest_skipped_per_token": o.rest_skipped as f64 / n,
                "cache_resident_mib": mib(o.resident_bytes as u64),
                "token_ms_p50": 1e3 * quantile(&r.token_s, 0.5), "token_ms_p90": 1e3 * quantile(&r.token_s, 0.9),
                "token_ms_p99": 1e3 * quantile(&r.token_s, 0.99),
            })
        })
    };
    if a.json {
        let mode_json = |r: &ModeRuns| {
            let (pm, ps) = mean_sd(&r.pp);
            let (tm, ts) = mean_sd(&r.tg);
            serde_json::json!({
                "pp_tok_s": pm, "pp_tok_s_sd": ps, "tg_tok_s": tm, "tg_tok_s_sd": ts,
                "pp_runs": r.pp, "tg_runs": r.tg, "ffn_time_share": mean_sd(&r.ffn_share).0,
                "sparse_stats": r.stats.map(|s| serde_json::json!({
                    "gate_frac": s.gate_frac(), "up_frac": s.up_frac(), "down_frac": s.down_frac(),
                })),
                "offload": offload_json(r),
            })
        };
        let mut v = mode_json(&runs[0]);
        v["mode"] = serde_json::json!(mode_name(modes[0]));
        v["model"] = serde_json::json!(file.path());
        v["threads"] = serde_json::json!(eng.threads());
        v["precision"] = serde_json::json!(prec);
        v["n_prompt"] = serde_json::json!(a.n_prompt);
        v["n_gen"] = serde_json::json!(a.n_gen);
        v["reps"] = serde_json::json!(a.reps);
        v["text"] = serde_json::json!(text);
        v["weight_bytes"] = serde_json::json!(eng.model().weight_bytes);
        v["requant"] = serde_json::json!(overlay.as_ref().map(|o| o.requant().to_string()));
        v["peak_rss_bytes"] = serde_json::json!(engine::sys::peak_rss_bytes());
        if runs.len() == 2 {
            let key = if modes[1] == Mode::Offload {
                "offloaded"
            } else {
                "sparse"
            };
            v[key] = mode_json(&runs[1]);
            v[key]["tg_ratio"] = serde_json::json!(tg_ratio.map(|r| r.0));
            v[key]["pp_ratio"] = serde_json::json!(pp_ratio.map(|r| r.0));
        }
        println!("{}", serde_json::to_string(&v)?);
    } else {
        let rq = overlay
            .as_ref()
            .map(|o| format!(" | layers re-quantized to {}", o.requant()))
            .unwrap_or_default();
        let src = text
            .as_ref()
            .map(|p| format!(" | tokens from {}", p.display()))
            .unwrap_or_default();
        println!(
            "model: {} | threads {} | {} mode{rq}{src} | {:.1} MiB weights read per token (dense)",
            file.path().display(),
            eng.threads(),
            prec,
            mib(eng.model().weight_bytes as u64)
        );
        let width = modes.iter().map(|&m| mode_name(m).len()).max().unwrap_or(0);
        for (r, &m) in runs.iter().zip(&modes) {
            let name = if modes.len() == 2 || m == Mode::Offload {
                format!("{:<width$} ", mode_name(m))
            } else {
                String::new()
            };
            let (pm, ps) = mean_sd(&r.pp);
            let (tm, ts) = mean_sd(&r.tg);
            if !r.pp.is_empty() {
                println!("{name}pp{:<5} {:>8.1} ± {:.1} tok/s", a.n_prompt, pm, ps);
            }
            if !r.tg.is_empty() {
                let extra = match r.stats {
                    Some(s) => format!("  (FFN {:.0}% of time; rows computed: gate {:.0}%, up {:.0}%, down {:.0}%)", 100.0 * mean_sd(&r.ffn_share).0, 100.0 * s.gate_frac(), 100.0 * s.up_frac(), 100.0 * s.down_frac()),
                    None => format!("  ({:.2} GB/s of weights, FFN {:.0}% of time)", tm * eng.model().weight_bytes as f64 / 1e9, 100.0 * mean_sd(&r.ffn_share).0),
                };
                println!(
                    "{name}tg{:<5} {:>8.1} ± {:.1} tok/s{extra}",
                    a.n_gen, tm, ts
                );
            }
            if let Some(o) = &r.offload {
                let n = o.tokens.max(1) as f64;
                println!(
                    "{name}per token: latency P50 {:.1} / P90 {:.1} / P99 {:.1} ms | units needed {:.0} ({:.0}% hot, {:.0}% cold hits, {:.1}% misses{}) | {:.2} MiB read | waiting for flash {:.0}% of decode time | cache {:.1} MiB",
                    1e3 * quantile(&r.token_s, 0.5),
                    1e3 * quantile(&r.token_s, 0.9),
                    1e3 * quantile(&r.token_s, 0.99),
                    o.units as f64 / n,
                    100.0 * o.hot_hits as f64 / o.units.max(1) as f64,
                    100.0 * o.cold_hits as f64 / o.units.max(1) as f64,
                    100.0 * o.miss_rate(),
                    if o.rest_skipped > 0 {
                        format!(
                            ", {:.0}% of them gate page only",
                            100.0 * o.rest_skipped as f64 / o.misses.max(1) as f64
                        )
                    } else {
                        String::new()
                    },
                    mib(o.bytes_read) / n,
                    100.0 * mean_sd(&r.wait_share).0,
                    mib(o.resident_bytes as u64),
                );
            }
        }
        if let Some((m, s)) = pp_ratio {
            println!("{ratio_name} pp: {m:.3} ± {s:.3} (per-repetition ratios)");
        }
        if let Some((m, s)) = tg_ratio {
            println!("{ratio_name} tg: {m:.3} ± {s:.3} (per-repetition ratios)");
        }
        println!(
            "peak RSS {:.1} MiB",
            mib(engine::sys::peak_rss_bytes().unwrap_or(0))
        );
    }
    Ok(())
}

/// One bench mode's measurements.
#[derive(Default)]
struct ModeRuns {
    pp: Vec<f64>,
    tg: Vec<f64>,
    ffn_share: Vec<f64>,
    stats: Option<engine::SparseStats>,
    /// Seconds of every decode step of every repetition.
    token_s: Vec<f64>,
    /// Per repetition: share of decode time the compute threads waited for flash.
    wait_share: Vec<f64>,
    /// Offload counters of the last repetition.
    offload: Option<engine::OffloadStats>,
}

/// The `q` quantile (0..=1) of `xs` (nearest rank).
fn quantile(xs: &[f64], q: f64) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(
        ((v.len() as f64 * q).ceil() as usize)
            .saturating_sub(1)
            .min(v.len().saturating_sub(1)),
    )
    .copied()
    .unwrap_or(f64::NAN)
}

fn sidecar(model: &std::path::Path, ext: &str) -> PathBuf {
    let mut s = model.as_os_str().to_os_string();
    s.push(ext);
    PathBuf::from(s)
}

/// The offload settings of `args` for the resident model of `eng`: the FFN cache budget comes from
/// --ffn-resident, or from --memory-budget minus what stays resident (file, KV cache, predictors).
fn offload_options(
    eng: &Engine<'_>,
    args: &ModelArgs,
    predictor: Option<&std::path::Path>,
    quiet: bool,
) -> Result<engine::OffloadOptions> {
    let o = &args.offload;
    let model = eng.model();
    let Some(r) = &model.config.ffn_store else {
        return Ok(engine::OffloadOptions::default());
    };
    let store = model
        .path()
        .parent()
        .unwrap_or(std::path::Path::new(""))
        .join(&r.file);
    let ffn = engine::offload::store_ffn_bytes(&store)?;
    let ffn_budget = match (o.memory_budget, o.ffn_resident) {
        (Some(b), _) => {
            let len = |p: &std::path::Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
            let c = &model.config;
            let kv = (c.n_layers * c.kv_dim() * 2 * 4 * eng.options().context.max(1)) as u64;
            // What the process holds before any weight is touched (code, tokenizer, heap) counts too, so
            // that the budget bounds the whole process.
            let base = engine::sys::rss_bytes().unwrap_or(0);
            let fixed = base + len(model.path()) + kv + predictor.map_or(0, len);
            if b <= fixed {
                bail!(
                    "--memory-budget {:.1} MiB leaves nothing for the FFN: the process, the resident file, the KV cache at --ctx {} and the predictors take {:.1} MiB",
                    mib(b),
                    eng.options().context,
                    mib(fixed)
                );
            }
            if !quiet {
                eprintln!("sparrow: memory budget {:.1} MiB = {:.1} MiB resident (process, file, KV cache, predictors) + {:.1} MiB FFN cache ({:.0}% of the {:.1} MiB FFN)", mib(b), mib(fixed), mib(b - fixed), 100.0 * (b - fixed).min(ffn) as f64 / ffn as f64, mib(ffn));
            }
            (b - fixed) as usize
        }
        (None, Some(f)) => (f.clamp(0.0, 1.0) * ffn as f64) as usize,
        (None, None) => usize::MAX,
    };
    Ok(engine::OffloadOptions {
        ffn_budget,
        hot_share: o.hot_share,
        queue_depth: o.io_depth,
        pin_core: o.io_core,
        direct: !o.no_direct,
        cache_cold: !o.no_cold_cache,
        pipeline: !o.no_pipeline,
        two_phase: o.two_phase,
        async_io: !o.io_sync,
        ..Default::default()
    })
}

/// Applies `--sparse` (profile thresholds, predictors) to the engine; a resident file (`sparrow
/// convert`) is always sparse, over its neuron store.
fn setup_sparse(eng: &mut Engine<'_>, args: &ModelArgs, quiet: bool) -> Result<()> {
    let resident = eng.model().config.ffn_store.is_some();
    if !args.sparse && !resident {
        return Ok(());
    }
    let model_path = eng.model().path().to_path_buf();
    let profile_path = args
        .profile
        .clone()
        .unwrap_or_else(|| sidecar(&model_path, ".sparrow-profile"));
    if !profile_path.exists() {
        bail!(
            "--sparse needs a profile: {} does not exist (run `sparrow profile` first, or give --profile)",
            profile_path.display()
        );
    }
    let profile = engine::Profile::load(&profile_path)?;
    let pred_path = args
        .predictor
        .clone()
        .unwrap_or_else(|| sidecar(&model_path, ".sparrow-predictor"));
    let use_pred = !args.no_predictor && (args.predictor.is_some() || pred_path.exists());
    let off = offload_options(eng, args, use_pred.then_some(pred_path.as_path()), quiet)?;
    let mut sp = engine::profile::sparse_from_profile_with(eng, &profile, &profile_path, off)?;
    let mut with_pred = false;
    if use_pred {
        let set = engine::PredictorSet::load(&pred_path)?;
        if set.model_fingerprint != engine::profile::model_fingerprint(eng.model())
            || set.layers.len() != eng.model().config.n_layers
        {
            bail!("{}: these predictors were trained for another model (run `sparrow train-predictor`)", pred_path.display());
        }
        sp = sp.with_predictor(Box::new(set));
        with_pred = true;
    }
    if !quiet {
        eprintln!(
            "sparrow: sparse FFN from {} ({:?} score{})",
            profile_path.display(),
            profile.score,
            if with_pred {
                format!(", predictors from {}", pred_path.display())
            } else {
                ", no predictor".into()
            }
        );
    }
    eng.set_sparse(Some(sp));
    Ok(())
}

fn read_corpus(eng: &Engine<'_>, c: &CorpusArgs) -> Result<Vec<u32>> {
    let text = std::fs::read_to_string(&c.corpus).with_context(|| {
        format!(
            "reading the corpus {} (give another with --corpus)",
            c.corpus.display()
        )
    })?;
    if c.corpus.to_string_lossy().contains("test") {
        eprintln!(
            "sparrow: warning: {} looks like a test split; calibrate on validation data",
            c.corpus.display()
        );
    }
    Ok(eng.tokenizer().encode(&text, false)?)
}

fn bar(len: u64, what: &str) -> indicatif::ProgressBar {
    let b = indicatif::ProgressBar::new(len);
    b.set_style(
        indicatif::ProgressStyle::with_template(&format!(
            "{{bar:30}} {{pos}}/{{len}} {what}, {{elapsed}} elapsed, ETA {{eta}}"
        ))
        .expect("static template"),
    );
    if !std::io::stderr().is_terminal() {
        b.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    b
}

fn stop_flag() -> Result<std::sync::Arc<std::sync::atomic::AtomicBool>> {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let s = stop.clone();
    ctrlc::set_handler(move || {
        if s.swap(true, std::sync::atomic::Ordering::SeqCst) {
            std::process::exit(130);
        }
        eprintln!("\nsparrow: stopping after this window (Ctrl-C again to quit at once); nothing will be written");
    })?;
    Ok(stop)
}

fn cmd_profile(a: ProfileArgs) -> Result<()> {
    use engine::sparse::{thresholds_for_sparsity, Score, SparseFfn, DEFAULT_DOWN_FORMAT};
    let file = open_model(&a.model, a.json)?;
    let overlay = build_overlay(&file, &a.model, a.json)?;
    let mut eng = Engine::new_with_overlay(&file, overlay.as_ref(), engine_options(&a.model))?;
    let tokens = read_corpus(&eng, &a.corpus)?;
    let w = a.corpus.window;
    let score = match a.score.as_str() {
        "output" => Score::OutputNorm,
        "gate" => Score::Gate,
        "gate-norm" => Score::GateNorm,
        s => bail!("--score {s}: expected output, gate or gate-norm"),
    };
    let n_layers = eng.model().config.n_layers;
    let stop = stop_flag()?;
    let mut base =
        eng.install(|| SparseFfn::new(eng.model(), vec![0.0; n_layers], DEFAULT_DOWN_FORMAT))?;
    base.score = score;
    let b = bar(a.calib_windows as u64, "calibration windows");
    let samples =
        engine::profile::sample_scores(&eng, &base, &tokens, w, a.calib_windows, 3, |d, _| {
            b.set_position(d as u64)
        })?;
    b.finish_and_clear();
    let build = |eng: &Engine<'_>, s: f32| -> Result<SparseFfn> {
        let t = thresholds_for_sparsity(&mut samples.clone(), s)?;
        let mut sp = eng.install(|| SparseFfn::new(eng.model(), t, DEFAULT_DOWN_FORMAT))?;
        sp.score = score;
        Ok(sp)
    };
    let mut curve = Vec::new();
    let sparsity = match (a.sparsity, a.ppl_budget) {
        (Some(s), _) => s,
        (None, budget) => {
            let budget = budget.unwrap_or(0.03);
            // Held-out validation windows right after the calibration windows.
            let held = &tokens[(a.calib_windows * w).min(tokens.len())..];
            let n_eval = 4;
            let base_ppl = eng.perplexity(held, w, n_eval, |_, _| {})?.ppl;
            let (mut lo, mut hi) = (0.0f32, 0.95f32);
            for _ in 0..6 {
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    bail!("interrupted: nothing written");
                }
                let mid = (lo + hi) / 2.0;
                eng.set_sparse(Some(build(&eng, mid)?));
                let p = eng.perplexity(held, w, n_eval, |_, _| {})?.ppl;
                eng.set_sparse(None);
                if !a.json {
                    eprintln!("sparrow: sparsity {mid:.3}: held-out validation ppl {p:.3} (dense {base_ppl:.3}, {:+.2}%)", (p / base_ppl - 1.0) * 100.0);
                }
                curve.push((mid, p, base_ppl));
                if p <= base_ppl * (1.0 + budget as f64) {
                    lo = mid;
                } else {
                    hi = mid;
                }
            }
            lo
        }
    };
    let sp = build(&eng, sparsity)?;
    let opts = engine::profile::ProfileOptions {
        window: w,
        windows: a.windows,
        batch_sizes: vec![1, 2, 4, 8],
        corpus: a.corpus.corpus.display().to_string(),
    };
    let b = bar(a.windows as u64, "windows profiled");
    let profile = engine::profile::profile_corpus(&eng, &sp, &tokens, &opts, &stop, |d, _| {
        b.set_position(d as u64)
    })?;
    b.finish_and_clear();
    if stop.load(std::sync::atomic::Ordering::Relaxed) {
        bail!("interrupted: nothing written");
    }
    let out = a
        .out
        .clone()
        .unwrap_or_else(|| sidecar(eng.model().path(), ".sparrow-profile"));
    profile.save(&out)?;
    let layers: Vec<_> = profile
        .layers
        .iter()
        .enumerate()
        .map(|(l, lp)| {
            serde_json::json!({
                "layer": l, "threshold": lp.threshold,
                "sparsity_b1": lp.sparsity(0), "sparsity_b2": lp.sparsity(1), "sparsity_b4": lp.sparsity(2), "sparsity_b8": lp.sparsity(3),
                "share_for_80pct": lp.share_for_mass(0.8),
                "hot_overlap_b1_b8_top20": lp.overlap_top(0, 3, 0.2),
            })
        })
        .collect();
    if a.json {
        let v = serde_json::json!({"profile": out, "tokens": profile.tokens, "target_sparsity": sparsity, "score": format!("{:?}", profile.score),
            "calibration": curve.iter().map(|(s, p, b)| serde_json::json!({"sparsity": s, "ppl": p, "dense_ppl": b})).collect::<Vec<_>>(),
            "layers": layers});
        println!("{}", serde_json::to_string(&v)?);
        return Ok(());
    }
    println!(
        "profile of {} over {} tokens of {} (target sparsity {:.3}, {:?} score) -> {}",
        file.path().display(),
        profile.tokens,
        opts.corpus,
        sparsity,
        profile.score,
        out.display()
    );
    println!("layer  threshold  sparsity@1  @2     @4     @8     neurons for 80% of activations  hot-set overlap b1/b8 (top 20%)");
    for (l, lp) in profile.layers.iter().enumerate() {
        println!(
            "{l:>5}  {:>9.4}  {:>9.3}  {:>5.3}  {:>5.3}  {:>5.3}  {:>30.1}%  {:>6.3}",
            lp.threshold,
            lp.sparsity(0).unwrap_or(0.0),
            lp.sparsity(1).unwrap_or(0.0),
            lp.sparsity(2).unwrap_or(0.0),
            lp.sparsity(3).unwrap_or(0.0),
            lp.share_for_mass(0.8) * 100.0,
            lp.overlap_top(0, 3, 0.2).unwrap_or(0.0)
        );
    }
    Ok(())
}

fn cmd_train(a: TrainArgs) -> Result<()> {
    let file = open_model(&a.model, a.json)?;
    let overlay = build_overlay(&file, &a.model, a.json)?;
    let eng = Engine::new_with_overlay(&file, overlay.as_ref(), engine_options(&a.model))?;
    let profile_path = a
        .model
        .profile
        .clone()
        .unwrap_or_else(|| sidecar(eng.model().path(), ".sparrow-profile"));
    let profile = engine::Profile::load(&profile_path).with_context(|| {
        "train-predictor needs the model's profile: run `sparrow profile` first".to_string()
    })?;
    let sp = engine::profile::sparse_from_profile(&eng, &profile, &profile_path)?;
    let tokens = read_corpus(&eng, &a.corpus)?;
    let stop = stop_flag()?;
    let b = bar(a.windows as u64, "windows of samples");
    let data = engine::profile::collect_datasets(
        &eng,
        &sp,
        &tokens,
        a.corpus.window,
        a.windows,
        &stop,
        |d, _| b.set_position(d as u64),
    )?;
    b.finish_and_clear();
    if stop.load(std::sync::atomic::Ordering::Relaxed) {
        bail!("interrupted: nothing written");
    }
    if a.max_share.is_nan() || a.max_share <= 0.0 {
        bail!("--max-share must be > 0 (got {})", a.max_share);
    }
    let ffn_bytes: usize = eng
        .model()
        .layers
        .iter()
        .map(|l| {
            [&l.gate, &l.up, &l.down]
                .iter()
                .map(|m| m.data().len())
                .sum::<usize>()
        })
        .sum();
    let max_bytes =
        (a.max_share * ffn_bytes as f64 / eng.model().layers.len().max(1) as f64) as usize;
    let cfg = engine::TrainConfig {
        seed: a.seed,
        target_recall: a.recall,
        epochs: a.epochs,
        max_bytes,
        ..Default::default()
    };
    let b = bar(data.len() as u64, "layers trained");
    let (set, reports) = engine::profile::train_predictors(&eng, &data, &cfg, |_, _| b.inc(1))?;
    b.finish_and_clear();
    if stop.load(std::sync::atomic::Ordering::Relaxed) {
        bail!("interrupted: nothing written");
    }
    let out = a
        .out
        .clone()
        .unwrap_or_else(|| sidecar(eng.model().path(), ".sparrow-predictor"));
    set.save(&out)?;
    let total: usize = reports.iter().map(|r| r.bytes).sum();
    let min_recall = reports
        .iter()
        .map(|r| r.recall)
        .fold(f32::INFINITY, f32::min);
    if a.json {
        let v = serde_json::json!({"predictor": out, "samples_per_layer": data.first().map(|d| d.len()), "total_bytes": total, "ffn_bytes": ffn_bytes,
            "layers": reports.iter().enumerate().map(|(l, r)| serde_json::json!({"layer": l, "hidden": r.hidden, "recall": r.recall, "precision": r.precision,
                "predicted_frac": r.predicted_frac, "true_frac": r.true_frac, "bytes": r.bytes})).collect::<Vec<_>>()});
        println!("{}", serde_json::to_string(&v)?);
        return Ok(());
    }
    println!("layer  hidden  recall  precision  predicted  active  bytes  (held-out samples)");
    for (l, r) in reports.iter().enumerate() {
        println!(
            "{l:>5}  {:>6}  {:>6.3}  {:>9.3}  {:>9.3}  {:>6.3}  {:>6}",
            r.hidden, r.recall, r.precision, r.predicted_frac, r.true_frac, r.bytes
        );
    }
    println!(
        "predictors: {:.2} MiB = {:.1}% of the FFN's {:.1} MiB; lowest held-out recall {:.3} -> {}",
        mib(total as u64),
        100.0 * total as f64 / ffn_bytes as f64,
        mib(ffn_bytes as u64),
        min_recall,
        out.display()
    );
    Ok(())
}

fn cmd_convert(a: ConvertArgs) -> Result<()> {
    let path = match &a.model {
        Some(p) => p.clone(),
        None => engine::fetch::ensure_default_model(|line| eprintln!("sparrow: {line}"))?,
    };
    let file = ModelFile::open(&path)?;
    let profile_path = a
        .profile
        .clone()
        .unwrap_or_else(|| sidecar(&path, ".sparrow-profile"));
    if !profile_path.exists() {
        bail!("convert orders neurons by the model's profile: {} does not exist (run `sparrow profile` first, or give --profile)", profile_path.display());
    }
    let profile = engine::Profile::load(&profile_path)?;
    let out = a.out.clone().unwrap_or_else(|| {
        let stem = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into());
        path.with_file_name(format!("{stem}.resident.gguf"))
    });
    let opts = engine::ConvertOptions {
        max_neurons_per_unit: if a.no_pack { 1 } else { usize::MAX },
        ..Default::default()
    };
    let t = Instant::now();
    let b = bar(profile.layers.len() as u64, "layers");
    let r = engine::offload::convert(&file, &profile, &out, &opts, |done, _| {
        b.set_position(done as u64)
    })
    .with_context(|| format!("converting {}", path.display()))?;
    b.finish_and_clear();
    // The profile and predictors travel with the resident file (same model fingerprint).
    std::fs::copy(&profile_path, sidecar(&out, ".sparrow-profile"))
        .with_context(|| format!("copying {}", profile_path.display()))?;
    let pred = a
        .predictor
        .clone()
        .unwrap_or_else(|| sidecar(&path, ".sparrow-predictor"));
    let copied_pred = if a.predictor.is_some() || pred.exists() {
        std::fs::copy(&pred, sidecar(&out, ".sparrow-predictor"))
            .with_context(|| format!("copying {}", pred.display()))?;
        true
    } else {
        false
    };
    if a.verify {
        engine::offload::verify(&out)
            .with_context(|| format!("verifying {}", r.store.display()))?;
    }
    let l = r.layout;
    let hot: usize = r.hot_neurons.iter().sum();
    println!(
        "resident file {} ({:.1} MiB): embeddings, attention, norms, output",
        r.resident.display(),
        mib(r.resident_bytes)
    );
    println!(
        "neuron store  {} ({:.1} MiB): {} neuron(s) of {} bytes per {}-page unit ({:.0}% of each unit used), {} hot neurons (batch-1 frequency ≥ {}) first in their layers",
        r.store.display(),
        mib(r.store_bytes),
        l.neurons,
        l.bundle_bytes(),
        l.pages,
        100.0 * (l.neurons * l.bundle_bytes()) as f64 / l.unit_bytes() as f64,
        hot,
        opts.hot_frequency
    );
    println!(
        "profile{} copied next to it; converted in {:.1} s{}",
        if copied_pred { " and predictors" } else { "" },
        t.elapsed().as_secs_f64(),
        if a.verify {
            ", every page verified"
        } else {
            ""
        }
    );
    Ok(())
}
