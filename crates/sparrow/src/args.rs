//! Argument groups shared by several subcommands: the model and how it runs ([`LoadArgs`]), sparse
//! decode and flash offload on top of it ([`ModelArgs`], [`OffloadArgs`]) and a calibration corpus
//! ([`CorpusArgs`]), and their translation into the engine's settings. Each subcommand flattens only
//! the groups it uses, so its `--help` lists only options it acts on.

use std::ops::{Deref, DerefMut};
use std::path::PathBuf;

use clap::Args;

use crate::builtin::{TextSource, CALIBRATION};
use crate::parse;
use engine::{MemoryBudget, OffloadOptions, SparseSidecars};

/// The model and how it is computed: what every subcommand that loads a model takes.
#[derive(Args, Clone)]
pub struct LoadArgs {
    /// A GGUF file, an HF directory (config.json + safetensors), or a known model's name
    /// (`sparrow models`: smollm2-135m, qwen2.5-coder-0.5b, gemma3-270m), fetched into the model cache
    /// if absent.
    /// Default: smollm2-135m.
    #[arg(long, short = 'm')]
    pub model: Option<PathBuf>,
    /// Compute threads (0: one per core).
    #[arg(long, short = 't', default_value_t = 0, value_parser = parse::threads)]
    pub threads: usize,
    /// Exact mode: dequantized weights, f32 activations (slower; matches a reference implementation).
    #[arg(long, conflicts_with = "int8")]
    pub exact: bool,
    /// 8-bit activations (llama.cpp style): fastest on compute-bound cores, but logits drift
    /// (up to ~1 on SmolLM2) and greedy text can differ. The default uses 16-bit activations
    /// (8-bit ones for prompts of 32 tokens or more over Q2_K..Q6_K weights on x86, Q4_K..Q6_K on
    /// ARM with dotprod, and Q5_0/Q8_0 ones with AVX-512 or ARM's dotprod, as llama.cpp; Q4_0/Q4_1
    /// ones on AVX2 and ARM's dotprod with one scale per 16 values).
    #[arg(long)]
    pub int8: bool,
    /// llama.cpp's roundings on its CPU path (for comparisons with it, not for speed): 8-bit
    /// activations in ggml's block type of each weight format, f16 KV cache, f16 queries and
    /// softmax weights in attention, each prompt token computed as a decode step.
    #[arg(long, conflicts_with_all = ["exact", "int8"])]
    pub ggml: bool,
    /// Weight rows per parallel work item of the dense kernels (0: automatic, about four items per
    /// thread; PowerInfer-2 uses 512).
    #[arg(long, default_value_t = 0)]
    pub chunk_rows: usize,
    /// Context size in tokens (0: the model's training context) [default: 4096, or the training
    /// context if shorter; with --memory-budget over a resident file, the longest of that and its
    /// halvings, down to 256, whose KV cache takes no more of the budget than the FFN cache gets,
    /// printed on stderr].
    #[arg(long, value_parser = parse::ctx)]
    pub ctx: Option<usize>,
    /// Re-quantize the layer weights (q, k, v, o, gate, up, down) at load time: `q4_0`, `int4`
    /// (per-channel INT4), or `hybrid:<fraction>` (per-channel INT4 plus that fraction of each
    /// row as INT8 outliers, PowerInfer-2 section 7.6; e.g. `hybrid:1%`). Embedding and output
    /// projection stay as in the file.
    #[arg(long)]
    pub requant: Option<engine::Requant>,
    /// How the KV cache stores keys and values: `f32`, `f16` (2 bytes an element) or `q8_0` (34
    /// bytes per 32, ggml's blocks) [default: f16; f32 with --exact]. The cache grows with the
    /// tokens held, up to --ctx.
    #[arg(long, value_name = "f32|f16|q8_0")]
    pub cache_type: Option<engine::KvFormat>,
}

/// `--io-depth` when not given.
pub const DEFAULT_IO_DEPTH: usize = 256;

/// [`LoadArgs`] plus sparse decode and flash offload: the options of the subcommands that decode
/// (`run`, `perplexity`, `bench`, `serve`). Dereferences to its [`LoadArgs`], so `args.threads`
/// and the loading helpers work on either group. The commands never change these: a plan applies
/// to the engine builder's options (`load::builder`).
#[derive(Args, Clone)]
pub struct ModelArgs {
    #[command(flatten)]
    pub load: LoadArgs,
    /// Sparse FFN: compute only the neurons expected to fire, with the thresholds of the model's
    /// profile (`sparrow profile`) and its predictors (`sparrow train-predictor`) when present.
    #[arg(long)]
    pub sparse: bool,
    /// Profile file for --sparse (default: `<model>.sparrow-profile`).
    #[arg(long, requires = "sparse")]
    pub profile: Option<PathBuf>,
    /// Predictor file for --sparse (default: `<model>.sparrow-predictor` if it exists).
    #[arg(long, requires = "sparse")]
    pub predictor: Option<PathBuf>,
    /// With --sparse, use no predictor: every gate and up row is computed and the thresholds pick
    /// the down columns.
    #[arg(long, requires = "sparse")]
    pub no_predictor: bool,
    /// Apply a plan (`sparrow plan`): threads, dense or sparse, the neuron cache's size, the I/O
    /// thread's core and queue depth. Flags given explicitly win over the plan's settings.
    #[arg(long)]
    pub plan: Option<PathBuf>,
    /// Run FFN blocks on an accelerator: `qnn` (Qualcomm QNN, libQnnHtp.so then libQnnCpu.so, INT8
    /// weights), `qnn:LIBRARY`, `qnn-f32[:LIBRARY]` (f32 weights), or `cpu` (the same blocks on the
    /// CPU kernels). Alone: every layer's whole FFN. With --sparse: hybrid decode, each layer's
    /// hottest neurons (--accel-hot) there and the rest sparse on the CPU. On a resident file
    /// (`sparrow convert`): prompt steps, each layer streamed from flash onto it (NPU-centric
    /// prefill), and hybrid decode over each layer's hottest units, held by the accelerator in
    /// memory the neuron cache gives up. A library that cannot be used is a warning and the CPU.
    #[arg(long, value_name = "KIND")]
    pub accel: Option<engine::AccelKind>,
    /// With --sparse --accel: the share of each layer's neurons, most often active first (from the
    /// profile), that runs densely on the accelerator at batch size 1; larger batches take every
    /// neuron at least as likely to fire in the batch as the last of these. Default: the split of
    /// the plan (`--plan`, or the one made for `--memory-budget`) where it has one for this
    /// accelerator, else the planner's split for the device profile in the model cache folder
    /// (`sparrow calibrate`), else 0.1. On a resident file: the share of each layer's units
    /// (hottest first) at every batch size, as far as the FFN cache's budget holds them; default:
    /// the plan's split, made within the neuron cache the block takes its memory from (the plan
    /// `--memory-budget` makes from the device profile, or `--plan`), else 0.1. 0: none (sparse
    /// decode on the CPU alone; on a resident file the accelerator takes prompt steps only).
    #[arg(long, value_parser = parse::unit, requires = "accel")]
    pub accel_hot: Option<f64>,
    #[command(flatten)]
    pub offload: OffloadArgs,
}

/// Flash offload: used when the model is a resident file written by `sparrow convert` (its FFN is
/// read from the neuron store next to it).
#[derive(Args, Clone)]
pub struct OffloadArgs {
    /// Memory budget for the whole process, e.g. `140M`, `1.5G`: what it holds before touching weights
    /// (code, tokenizer), the resident file, the KV cache at the whole --ctx and --cache-type and the
    /// predictors are counted first; the FFN neuron cache gets the rest. Without --ctx, the context
    /// is sized to what the budget leaves (see --ctx).
    #[arg(long, value_parser = parse::size, conflicts_with = "ffn_resident")]
    pub memory_budget: Option<u64>,
    /// Instead of --memory-budget: the share of the FFN kept in memory (e.g. 0.5).
    #[arg(long, value_parser = parse::share)]
    pub ffn_resident: Option<f64>,
    /// Share of the FFN cache preloaded with each layer's hottest neurons (the rest is an LRU of
    /// neurons read on demand). All by default: on SmolLM2 the predicted neurons of a token cover 93%
    /// of the pages, a cyclic scan that an LRU smaller than it never hits (docs/BENCHMARKS.md).
    #[arg(long, default_value_t = 1.0, value_parser = parse::unit_f32)]
    pub hot_share: f32,
    /// Unit reads in flight on the I/O thread; the kernel gets up to this many at once (Linux AIO).
    /// An MoE bundle's expert reads: 32 when not given (fewer for experts so large that 32 would pass
    /// 96 MiB), else this many up to that.
    #[arg(long, default_value_t = DEFAULT_IO_DEPTH, value_parser = parse::io_depth)]
    pub io_depth: usize,
    /// Core to pin the I/O thread to.
    #[arg(long)]
    pub io_core: Option<usize>,
    /// Read through the page cache instead of with direct I/O.
    #[arg(long)]
    pub no_direct: bool,
    /// Ablation: do not keep neurons read from flash (only the preloaded hot set is cached).
    #[arg(long, hide = true)]
    pub no_cold_cache: bool,
    /// Ablation: wait for all reads of a layer before computing cached neurons.
    #[arg(long, hide = true)]
    pub no_pipeline: bool,
    /// Ablation: start each layer's reads with its decode step (without a predictor they are
    /// otherwise queued during the layer before).
    #[arg(long, hide = true)]
    pub no_read_ahead: bool,
    /// Two-phase loading (PowerInfer-2 4.4) where a store's units span pages: read a unit's gate page
    /// first and the rest only if a neuron fires. Saves bytes when most predicted neurons turn out
    /// inactive; costs a second read in series otherwise (off by default, see docs/BENCHMARKS.md)
    #[arg(long)]
    pub two_phase: bool,
    /// Issue one blocking read at a time instead of handing up to --io-depth reads to the kernel at
    /// once (Linux AIO); for comparison.
    #[arg(long)]
    pub io_sync: bool,
    /// Where the output projection stays on flash, read it whole for every token instead of its
    /// 2-bit proxy and the rows the proxy ranks highest (`sparrow convert` writes the proxy into
    /// the resident file; see docs/ARCHITECTURE.md, `output_proxy`).
    #[arg(long)]
    pub full_output: bool,
}

#[derive(Args)]
pub struct CorpusArgs {
    /// Text to profile (calibrate on a validation split, never a test split) [default: a built-in
    /// calibration text, 72 KB of Shakespeare].
    #[arg(long)]
    pub corpus: Option<PathBuf>,
    /// Tokens per window.
    #[arg(long, default_value_t = 512)]
    pub window: usize,
}

impl Deref for ModelArgs {
    type Target = LoadArgs;
    fn deref(&self) -> &LoadArgs {
        &self.load
    }
}

impl DerefMut for ModelArgs {
    fn deref_mut(&mut self) -> &mut LoadArgs {
        &mut self.load
    }
}

impl CorpusArgs {
    /// The text to read: `--corpus`, or the built-in calibration text.
    pub fn source(&self) -> TextSource {
        TextSource::or_builtin(self.corpus.as_deref(), &CALIBRATION)
    }
}

impl ModelArgs {
    /// The sidecars `--profile`, `--predictor` and `--no-predictor` choose.
    pub fn sidecars(&self) -> SparseSidecars {
        SparseSidecars {
            profile: self.profile.clone(),
            predictor: self.predictor.clone(),
            no_predictor: self.no_predictor,
        }
    }
}

impl OffloadArgs {
    /// The memory budget `--memory-budget` or `--ffn-resident` gives.
    pub fn budget(&self) -> MemoryBudget {
        match (self.memory_budget, self.ffn_resident) {
            (Some(b), _) => MemoryBudget::Process(b),
            (None, Some(f)) => MemoryBudget::Share(f),
            (None, None) => MemoryBudget::All,
        }
    }

    /// The offload settings of the other flags (the FFN budget is worked out by the engine).
    pub fn options(&self) -> OffloadOptions {
        OffloadOptions {
            hot_share: self.hot_share,
            queue_depth: self.io_depth,
            pin_core: self.io_core,
            direct: !self.no_direct,
            cache_cold: !self.no_cold_cache,
            pipeline: !self.no_pipeline,
            read_ahead: !self.no_read_ahead,
            two_phase: self.two_phase,
            async_io: !self.io_sync,
            ..Default::default()
        }
    }
}
