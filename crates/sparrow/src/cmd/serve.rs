//! `sparrow serve`: an OpenAI-compatible HTTP server over one model (the `server` crate does the
//! serving; this parses the flags and loads the model as `run` does).

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Args;

use crate::args::ModelArgs;
use crate::load::builder;

#[derive(Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to bind (loopback by default; `0.0.0.0` exposes the server to the network).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// TCP port (0: any free port, printed at start).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// The model's name in /v1/models and requests (default: the known model's name, e.g.
    /// `smollm2-135m`, or the model file's name without `.gguf`).
    #[arg(long)]
    pub alias: Option<String>,
    /// Requests that may wait while one is computed; more are answered 429.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub queue: u64,
    /// Largest request body, e.g. `1M` (larger: 413).
    #[arg(long, default_value = "1M", value_parser = crate::parse::size)]
    pub max_body: u64,
    /// Seconds a request may take, waiting included (then 503, or an error event when streaming).
    #[arg(long, default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..))]
    pub timeout: u64,
    /// Largest `n` (choices per request, computed one after another).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=128))]
    pub max_n: u64,
    /// Require this key on every endpoint but /health (`Authorization: Bearer KEY`; else 401).
    /// Default: the environment variable SPARROW_API_KEY (better than the flag, which other users
    /// can read in the process list). Without a key, only requests naming this server in `Host`
    /// and `Origin` are served.
    #[arg(long)]
    pub api_key: Option<String>,
    /// Turn off POST /admin/memory-budget (404).
    #[arg(long)]
    pub no_admin: bool,
    /// Open connections at most; more are answered 503 and closed.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=65536))]
    pub max_connections: u64,
    /// Seconds a connection may take to send a request's head (from its opening or its previous
    /// response: also the keep-alive idle timeout), and a body after its head; then it is closed
    /// (or answered 408).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub header_timeout: u64,
    /// Memory the requests admitted but not finished may hold together, counted from their
    /// bodies' lengths (6 bytes per body byte + 64 KiB each); more get 429. At least 6x --max-body.
    #[arg(long, default_value = "32M", value_parser = crate::parse::size)]
    pub queue_memory: u64,
    /// Speculative decoding by prompt lookup for every request of one choice (n = 1): up to N
    /// drafted tokens verified per step, as `run --lookup N`; a request's `speculative` field
    /// turns it off or limits it (docs/SERVER.md); statistics in /metrics.
    #[arg(long, value_name = "N", value_parser = crate::parse::lookup)]
    pub lookup: Option<usize>,
    /// `--self-draft[=N]` and `--draft MODEL --draft-max N` as `run` takes them, for every request
    /// of one choice that does not turn speculation off.
    #[command(flatten)]
    pub spec: crate::spec::SpecArgs,
}

/// Loads the model and serves it until the process is stopped.
pub fn run(a: ServeArgs) -> Result<()> {
    let t0 = Instant::now();
    let loaded = builder(&a.model, false).open()?;
    let file = loaded.file();
    let eng = loaded
        .engine()
        .with_context(|| format!("loading {}", file.path().display()))?;
    let model_id = a
        .alias
        .clone()
        .unwrap_or_else(|| model_name(&a.model, file.path()));
    let opts = server::ServeOptions {
        host: a.host.clone(),
        port: a.port,
        model_id: model_id.clone(),
        max_queue: a.queue as usize,
        max_body_bytes: usize::try_from(a.max_body).unwrap_or(usize::MAX),
        request_timeout: Duration::from_secs(a.timeout),
        max_n: a.max_n as usize,
        api_key: a.api_key.clone().or_else(|| {
            std::env::var("SPARROW_API_KEY")
                .ok()
                .filter(|k| !k.is_empty())
        }),
        admin: !a.no_admin,
        max_connections: a.max_connections as usize,
        header_timeout: Duration::from_secs(a.header_timeout),
        queue_memory: a.queue_memory,
    };
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
    let ctx = eng.options().context;
    let on_listen = |addr| {
        eprintln!(
            "sparrow: serving `{model_id}` (context {ctx} tokens, loaded in {load_s:.1} s) on http://{addr}"
        );
    };
    match drafting {
        Some(d) => server::serve_speculative(&eng, d, opts, on_listen)?,
        None => server::serve(&eng, opts, on_listen)?,
    }
    Ok(())
}

/// The name a model is served under: a known model's name (`sparrow models`) when it was given by
/// name or by default, else its file's name without `.gguf`.
fn model_name(args: &ModelArgs, path: &std::path::Path) -> String {
    let given = args.model.as_deref();
    let known = match given {
        None => engine::fetch::KNOWN_MODELS.first(),
        Some(p) if !p.exists() => p.to_str().and_then(engine::fetch::known_model),
        Some(_) => None,
    };
    if let Some(k) = known {
        return k.name.to_string();
    }
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    name.strip_suffix(".gguf").unwrap_or(&name).to_string()
}
