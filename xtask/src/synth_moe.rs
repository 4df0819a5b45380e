//! `cargo xtask synth-model --arch qwen3moe|mixtral|olmoe|qwen2moe`: a **synthetic** Mixture-of-Experts
//! model of a real shape, with random weights, in the GGUF layout llama.cpp reads for that architecture
//! (`general.architecture` `qwen3moe`, `llama` with `llama.expert_count`, `olmoe`, `qwen2moe`; tensors
//! `blk.N.ffn_gate_inp` (router, F32), `blk.N.ffn_{gate,up,down}_exps` (3-D: expert `e`'s rows are one
//! contiguous block), `blk.N.ffn_{gate,up,down}_shexp` and `blk.N.ffn_gate_inp_shexp` for qwen2moe,
//! `attn_q_norm`/`attn_k_norm` per head for qwen3moe and over the whole vector for olmoe, q/k/v biases
//! for qwen2moe, `output.weight` for every arch, as the real models have). It is for measuring
//! the engine, not a language model: `general.name` is [`GENERAL_NAME`], and
//! `sparrow.synthetic`, `sparrow.synth.{version,seed,router}` say how it was made. The vocabulary,
//! the seeding (xorshift64 per row), the quantizer and the streaming writer are the dense generator's
//! (`synth.rs`).
//!
//! Defaults are the real shapes: `qwen3moe` Qwen3-30B-A3B (48 layers, d 2048, 128 experts, top-8,
//! expert width 768, 32 heads, 4 kv heads, head dim 128), `mixtral` Mixtral-8x7B (32 layers, d 4096,
//! expert width 14336, 8 experts, top-2, 32 heads, 8 kv heads), `olmoe` OLMoE-1B-7B (16 layers, d 2048,
//! 64 experts, top-8, expert width 1024, 16 heads), `qwen2moe` Qwen1.5-MoE-A2.7B (24 layers, d 2048, 60
//! experts, top-4, expert width 1408, shared expert 5632, 16 heads).
//!
//! # Routing
//!
//! `--router measured` (the default) follows a law fitted to published measurements of real MoE
//! models (uneven load per expert, reuse of experts between consecutive tokens) and `--router
//! uniform` spreads tokens evenly with no reuse beyond chance; `synth_routing.rs` states the law,
//! its sources and how the weights realise it (a context channel written only by planted,
//! distance-only attention, read by the routers).

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, ensure, Context, Result};
use model_format::{DType, GgufWriter, MetaValue};

// `super`, not `crate`: the tests (`xtask/tests/it/src.rs`) include this file in a module of their own.
use super::synth::{
    noise, project_out, stream_matrix, vocabulary, Rng, BASE_VOCAB, CONTEXT, RMS_EPS,
};
use super::synth_relu as relu;
use super::synth_routing::{self as routing, ctx_dims, LayerPlan};

/// `general.name` of every synthetic MoE model.
pub const GENERAL_NAME: &str = "SYNTHETIC sparrow synth-model --arch (random weights, synthetic routing) — not a language model";
/// Version of this generator, written as `sparrow.synth.version` (3: the fitted routing law and its
/// context channel).
pub const VERSION: u32 = 3;
/// The `--arch` values this module writes (the dense ones are `synth.rs`'s).
pub const ARCHES: [&str; 4] = ["qwen3moe", "mixtral", "olmoe", "qwen2moe"];
/// Per-coordinate standard deviation an MoE block adds to the residual stream (about).
pub const EPS_FFN: f32 = 0.1;
/// RoPE base (Qwen's 1e6; Mixtral and OLMoE use 1e6 and 1e4); the planted attention kernel is made
/// for it (`synth_routing::kernel`).
pub const ROPE_BASE: f32 = 1_000_000.0;

/// The MoE architectures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// `qwen3moe`.
    Qwen3Moe,
    /// `llama` with experts.
    Mixtral,
    /// `olmoe`.
    Olmoe,
    /// `qwen2moe`.
    Qwen2Moe,
}

impl Arch {
    /// The `--arch` name.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Qwen3Moe => "qwen3moe",
            Arch::Mixtral => "mixtral",
            Arch::Olmoe => "olmoe",
            Arch::Qwen2Moe => "qwen2moe",
        }
    }

    /// `general.architecture`.
    pub fn gguf(self) -> &'static str {
        match self {
            Arch::Mixtral => "llama",
            a => a.name(),
        }
    }
}

/// How the routers spread tokens over experts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Router {
    /// The law fitted to published measurements (`synth_routing.rs`).
    Measured,
    /// Even load in expectation, no reuse beyond chance.
    Uniform,
}

/// What to generate.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// Output file (default `target/synth/<file_name()>`).
    pub out: Option<PathBuf>,
    /// The architecture.
    pub arch: Arch,
    /// Transformer blocks.
    pub layers: usize,
    /// Hidden size.
    pub d: usize,
    /// Neurons of one expert.
    pub expert_ff: usize,
    /// Neurons of the shared expert (qwen2moe only).
    pub shared_ff: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Dimension of one head.
    pub head_dim: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// Experts per layer.
    pub experts: usize,
    /// Experts per token.
    pub used: usize,
    /// Format of every matrix but the routers (F32).
    pub format: DType,
    /// The routing.
    pub router: Router,
    /// Seed of every random number.
    pub seed: u64,
    /// ReLU experts with planted neuron sparsity (`--activation relu`, `synth_relu.rs`), else SiLU.
    pub relu: bool,
}

impl Options {
    /// The real shape of `arch` (see the module doc).
    pub fn defaults(arch: Arch) -> Options {
        let base = Options {
            out: None,
            arch,
            layers: 48,
            d: 2048,
            expert_ff: 768,
            shared_ff: 0,
            heads: 32,
            kv_heads: 4,
            head_dim: 128,
            vocab: 151_936,
            experts: 128,
            used: 8,
            format: DType::Q4_0,
            router: Router::Measured,
            seed: 0x5EED,
            relu: false,
        };
        match arch {
            Arch::Qwen3Moe => base,
            Arch::Mixtral => Options {
                layers: 32,
                d: 4096,
                expert_ff: 14336,
                kv_heads: 8,
                vocab: 32000,
                experts: 8,
                used: 2,
                ..base
            },
            Arch::Olmoe => Options {
                layers: 16,
                expert_ff: 1024,
                heads: 16,
                kv_heads: 16,
                vocab: 50304,
                experts: 64,
                ..base
            },
            Arch::Qwen2Moe => Options {
                layers: 24,
                expert_ff: 1408,
                shared_ff: 5632,
                heads: 16,
                kv_heads: 16,
                experts: 60,
                used: 4,
                ..base
            },
        }
    }

    /// Parses the arguments of `synth-model` that include `--arch` (flag and value, or `--flag=value`).
    pub fn parse(args: &[String]) -> Result<Options> {
        let mut pairs = Vec::new();
        let mut it = args.iter();
        while let Some(arg) = it.next() {
            let (flag, value) = match arg.split_once('=') {
                Some((f, v)) if f.starts_with("--") => (f.to_string(), v.to_string()),
                _ => {
                    let v = it
                        .next()
                        .with_context(|| format!("{arg} needs a value\n{USAGE}"))?;
                    (arg.clone(), v.clone())
                }
            };
            pairs.push((flag, value));
        }
        let arch = match pairs
            .iter()
            .find(|(f, _)| f == "--arch")
            .map(|(_, v)| v.as_str())
        {
            Some("qwen3moe") => Arch::Qwen3Moe,
            Some("mixtral") => Arch::Mixtral,
            Some("olmoe") => Arch::Olmoe,
            Some("qwen2moe") => Arch::Qwen2Moe,
            Some(v) => bail!("--arch takes qwen3moe, mixtral, olmoe or qwen2moe, not `{v}`"),
            None => bail!("--arch is required here\n{USAGE}"),
        };
        let mut o = Options::defaults(arch);
        for (flag, v) in &pairs {
            let int = || -> Result<usize> {
                v.parse()
                    .with_context(|| format!("{flag} takes a whole number, not `{v}`"))
            };
            match flag.as_str() {
                "--arch" => {}
                "--out" => o.out = Some(PathBuf::from(v)),
                "--layers" => o.layers = int()?,
                "--d" => o.d = int()?,
                "--ff" | "--expert-ff" => o.expert_ff = int()?,
                "--shared-ff" => o.shared_ff = int()?,
                "--heads" => o.heads = int()?,
                "--kv-heads" => o.kv_heads = int()?,
                "--head-dim" => o.head_dim = int()?,
                "--vocab" => o.vocab = int()?,
                "--experts" => o.experts = int()?,
                "--experts-used" => o.used = int()?,
                "--format" => {
                    o.format = match v.to_ascii_lowercase().as_str() {
                        "q4_0" => DType::Q4_0,
                        "q8_0" => DType::Q8_0,
                        "f16" => DType::F16,
                        _ => bail!("--format takes q4_0, q8_0 or f16 with --arch, not `{v}`"),
                    }
                }
                "--router" => {
                    o.router = match v.as_str() {
                        "measured" => Router::Measured,
                        "uniform" => Router::Uniform,
                        _ => bail!("--router takes measured or uniform, not `{v}`"),
                    }
                }
                "--activation" => {
                    o.relu = match v.as_str() {
                        "silu" => false,
                        "relu" => true,
                        _ => bail!("--activation takes silu or relu, not `{v}`"),
                    }
                }
                "--seed" => {
                    let parsed = match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
                        Some(hex) => u64::from_str_radix(hex, 16),
                        None => v.parse(),
                    };
                    o.seed = parsed.with_context(|| {
                        format!("--seed takes a 64-bit unsigned number, not `{v}`")
                    })?;
                }
                _ => bail!("unknown option `{flag}` with --arch\n{USAGE}"),
            }
        }
        o.check()?;
        Ok(o)
    }

    /// Checks that llama.cpp and the writer take the shape.
    pub fn check(&self) -> Result<()> {
        ensure!(
            (1..=1024).contains(&self.layers),
            "--layers must be 1..=1024, not {}",
            self.layers
        );
        let mut widths = vec![
            ("--d", self.d),
            ("--expert-ff", self.expert_ff),
            ("--head-dim * --heads", self.q_dim()),
        ];
        if self.arch == Arch::Qwen2Moe {
            widths.push(("--shared-ff", self.shared_ff));
        }
        for (name, v) in widths {
            ensure!(v >= 32 && v % 32 == 0 && v <= 1 << 20, "{name} must be a multiple of 32 in 32..=1048576 (quantization blocks are 32 wide), not {v}");
        }
        ensure!(
            self.head_dim >= 2 && self.head_dim % 2 == 0,
            "--head-dim must be even (RoPE rotates pairs), not {}",
            self.head_dim
        );
        ensure!(
            self.kv_heads >= 1 && self.heads % self.kv_heads == 0,
            "--kv-heads must divide --heads ({}), {} does not",
            self.heads,
            self.kv_heads
        );
        if matches!(self.arch, Arch::Olmoe | Arch::Qwen2Moe) {
            // llama.cpp sizes their q and output projections (and olmoe's q/k norms) by d.
            ensure!(
                self.q_dim() == self.d,
                "{}: --heads x --head-dim must equal --d ({} x {} != {})",
                self.arch.name(),
                self.heads,
                self.head_dim,
                self.d
            );
        }
        ensure!(
            !(self.relu && self.arch == Arch::Qwen2Moe),
            "--activation relu: qwen2moe's shared expert is not planted; use qwen3moe, mixtral or olmoe"
        );
        if self.arch == Arch::Olmoe {
            ensure!(
                self.kv_heads == self.heads,
                "olmoe: llama.cpp's k norm is d wide, so --kv-heads must equal --heads"
            );
        }
        ensure!(
            (2..=4096).contains(&self.experts),
            "--experts must be 2..=4096, not {}",
            self.experts
        );
        ensure!(
            (1..=self.experts).contains(&self.used),
            "--experts-used must be 1..={} (--experts), not {}",
            self.experts,
            self.used
        );
        ensure!(
            (BASE_VOCAB..=1 << 22).contains(&self.vocab),
            "--vocab must be {BASE_VOCAB}..=4194304, not {}",
            self.vocab
        );
        Ok(())
    }

    /// `synth-<arch>-<layers>x<d>-<experts>e<used>x<expert_ff>-<router>[-relu]-<format>.gguf`.
    pub fn file_name(&self) -> String {
        format!(
            "synth-{}-{}x{}-{}e{}x{}-{}{}-{}.gguf",
            self.arch.name(),
            self.layers,
            self.d,
            self.experts,
            self.used,
            self.expert_ff,
            match self.router {
                Router::Measured => "measured",
                Router::Uniform => "uniform",
            },
            if self.relu { "-relu" } else { "" },
            self.format.name().to_ascii_lowercase()
        )
    }

    /// `--out`, or `target/synth/<file_name()>` under `root`.
    pub fn out_path(&self, root: &Path) -> PathBuf {
        self.out
            .clone()
            .unwrap_or_else(|| root.join("target").join("synth").join(self.file_name()))
    }

    /// Width of all query heads.
    pub fn q_dim(&self) -> usize {
        self.heads * self.head_dim
    }

    fn kv_dim(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// Every tensor of layer `l` (name, stream, shape), norms and biases included, in file order.
    fn layer_tensors(&self, l: usize) -> Vec<(String, S, Vec<usize>)> {
        let (d, q, kv, e, ff) = (
            self.d,
            self.q_dim(),
            self.kv_dim(),
            self.experts,
            self.expert_ff,
        );
        let n = |t: &str| format!("blk.{l}.{t}");
        let mut v = vec![
            (n("attn_norm.weight"), S::Ones, vec![d]),
            (n("attn_q.weight"), S::Q, vec![q, d]),
            (n("attn_k.weight"), S::K, vec![kv, d]),
            (n("attn_v.weight"), S::V, vec![kv, d]),
        ];
        match self.arch {
            Arch::Qwen2Moe => {
                v.push((n("attn_q.bias"), S::Bias, vec![q]));
                v.push((n("attn_k.bias"), S::Bias, vec![kv]));
                v.push((n("attn_v.bias"), S::Bias, vec![kv]));
            }
            Arch::Qwen3Moe => {
                v.push((n("attn_q_norm.weight"), S::QkNorm, vec![self.head_dim]));
                v.push((n("attn_k_norm.weight"), S::QkNorm, vec![self.head_dim]));
            }
            Arch::Olmoe => {
                v.push((n("attn_q_norm.weight"), S::QkNorm, vec![q]));
                v.push((n("attn_k_norm.weight"), S::QkNorm, vec![kv]));
            }
            Arch::Mixtral => {}
        }
        v.push((n("attn_output.weight"), S::O, vec![d, q]));
        v.push((n("ffn_norm.weight"), S::Ones, vec![d]));
        v.push((n("ffn_gate_inp.weight"), S::Router, vec![e, d]));
        v.push((n("ffn_gate_exps.weight"), S::Gate, vec![e, ff, d]));
        v.push((n("ffn_up_exps.weight"), S::Up, vec![e, ff, d]));
        v.push((n("ffn_down_exps.weight"), S::Down, vec![e, d, ff]));
        if self.arch == Arch::Qwen2Moe {
            let sff = self.shared_ff;
            v.push((n("ffn_gate_inp_shexp.weight"), S::ShexpGate, vec![d]));
            v.push((n("ffn_gate_shexp.weight"), S::Gate, vec![sff, d]));
            v.push((n("ffn_up_shexp.weight"), S::Up, vec![sff, d]));
            v.push((n("ffn_down_shexp.weight"), S::Down, vec![d, sff]));
        }
        v
    }

    /// The format of a tensor of `stream` with `dims` dimensions: F32 for vectors and routers.
    fn format_of(&self, s: S, dims: usize) -> DType {
        if dims == 1 || s == S::Router {
            DType::F32
        } else {
            self.format
        }
    }

    /// Bytes of the tensor data.
    pub fn data_bytes(&self) -> u64 {
        let bytes = |s: S, shape: &[usize]| {
            let (cols, rows) = (
                shape[shape.len() - 1],
                shape[..shape.len() - 1].iter().product::<usize>(),
            );
            (rows * self.format_of(s, shape.len()).row_bytes(cols).unwrap_or(0)) as u64
        };
        let head = bytes(S::Embed, &[self.vocab, self.d]) * if self.has_output() { 2 } else { 1 }
            + 4 * self.d as u64;
        let layers: u64 = (0..self.layers)
            .flat_map(|l| self.layer_tensors(l))
            .map(|(_, s, shape)| bytes(s, &shape))
            .sum();
        head + layers
    }

    /// Whether the file holds `output.weight`: always, as the four real models do (none ties its
    /// output to the embedding; llama.cpp requires it for olmoe and qwen2moe). A tied output would
    /// also make the synthetic model predict the token it was given with a huge margin (the
    /// embedding's noise dotted with itself), perplexities too large to print (version 1 did that
    /// for qwen3moe and mixtral).
    fn has_output(&self) -> bool {
        true
    }
}

/// The usage text for `--arch`.
pub const USAGE: &str = "usage: cargo xtask synth-model --arch qwen3moe|mixtral|olmoe|qwen2moe [--out PATH] [--layers N] [--d D] \
[--expert-ff F (or --ff F)] [--shared-ff F] [--heads H] [--kv-heads K] [--head-dim H] [--vocab V] [--experts E] [--experts-used K] \
[--format q4_0|q8_0|f16] [--router measured|uniform] [--activation silu|relu] [--seed S]
  defaults: the real shape of the architecture (qwen3moe: Qwen3-30B-A3B, mixtral: Mixtral-8x7B, olmoe: OLMoE-1B-7B,
  qwen2moe: Qwen1.5-MoE-A2.7B), q4_0, --router measured, SiLU experts (--activation relu: ReLU experts whose
  neurons fire 10% of the time, power-law frequencies, TurboSparse's kind), seed 0x5EED; out target/synth/<name>.gguf";

/// The random streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum S {
    Direction = 16,
    Permutation,
    Embed,
    Output,
    Q,
    K,
    V,
    O,
    Router,
    Gate,
    Up,
    Down,
    ShexpGate,
    Bias,
    Ones,
    QkNorm,
    Neurons,
}

fn rng(o: &Options, s: S, layer: usize, row: usize) -> Rng {
    Rng::new(
        o.seed,
        ((s as u64) << 56) ^ ((layer as u64) << 36) ^ row as u64,
    )
}

/// The direction `u` every embedding carries (unit norm, random signs, nil on the context channel).
fn direction(o: &Options) -> Vec<f32> {
    let mut r = rng(o, S::Direction, 0, 0);
    let m = ctx_dims(o.d);
    let s = 1.0 / ((o.d - m) as f32).sqrt();
    (0..o.d)
        .map(|i| match (i < m, r.next_u64() >> 63 == 0) {
            (true, _) => 0.0,
            (false, true) => s,
            (false, false) => -s,
        })
        .collect()
}

/// The planted load factor `q_e` of every expert of `layer` (mean 1): all 1 for `--router uniform`,
/// the law's Zipf load over a random permutation of the experts for `--router measured`.
pub fn expert_load(o: &Options, layer: usize) -> Vec<f64> {
    let alpha = routing::law(o.arch, o.router).alpha;
    if alpha == 0.0 {
        return vec![1.0; o.experts];
    }
    routing::zipf_load(o.experts, alpha, &mut rng(o, S::Permutation, layer, 0))
}

/// The planted neurons of every ReLU expert of `layer` (`synth_relu.rs`).
pub fn relu_plans(o: &Options, plan: &LayerPlan, layer: usize) -> Vec<relu::ExpertPlan> {
    relu::plans(o, plan, |e| rng(o, S::Neurons, layer, e))
}

/// What the rows of a layer's tensors need besides their stream and index.
struct RowCtx<'a> {
    u: &'a [f32],
    load: &'a [f64],
    plan: LayerPlan,
    /// The planted query and key of every head, after the q/k norm.
    head: &'a [f32],
    /// Whether the family normalises q and k (then the rows' scale does not matter).
    qk_norm: bool,
    /// The q/k norm weight that gives the planted vector its scale.
    norm_weight: f32,
    /// The planted neurons of each ReLU expert of the layer (empty for SiLU experts).
    relu: &'a [relu::ExpertPlan],
}

/// Row `i` of the tensor of stream `s` in `layer` (rows of 3-D tensors counted across experts).
fn row(o: &Options, c: &RowCtx<'_>, s: S, layer: usize, i: usize, out: &mut [f32]) {
    let mut r = rng(o, s, layer, i);
    let unit = 1.0 / (o.d as f32).sqrt();
    let m = ctx_dims(o.d);
    let (u, p) = (c.u, c.plan);
    let along_u = |out: &mut [f32], b: f32| out.iter_mut().zip(u).for_each(|(x, u)| *x = b * u);
    match s {
        S::Embed => {
            noise(&mut r, out, 1.0);
            out[..m].fill(0.0);
            project_out(out, u);
            let a = (o.d as f32).sqrt();
            out.iter_mut().zip(u).for_each(|(x, u)| *x += a * u);
        }
        S::Gate if !c.relu.is_empty() => {
            noise(&mut r, out, unit);
            let (e, j) = (i / o.expert_ff, i % o.expert_ff);
            relu::gate_row(&c.relu[e], j, m, u, out);
        }
        S::Output | S::Gate => noise(&mut r, out, unit),
        // Every head's query and key: the planted vector, read off `u`.
        S::Q | S::K => {
            let v = c.head[i % o.head_dim];
            along_u(out, if c.qk_norm { v } else { v / p.ux_attn });
        }
        S::V => {
            noise(&mut r, out, unit);
            out[..m].fill(0.0);
            project_out(out, u);
        }
        S::Up => {
            noise(&mut r, out, unit);
            project_out(out, u);
        }
        // Attention writes the context channel only.
        S::O if i < m => noise(&mut r, out, p.o_scale),
        S::O => out.fill(0.0),
        // silu(g)·u with g and u of variance 1/2 has a second moment of about 0.1; nothing on `C`.
        S::Down if i % o.d < m => out.fill(0.0),
        S::Down if !c.relu.is_empty() => noise(&mut r, out, c.relu[i / o.d].sigma_down),
        S::Down => noise(&mut r, out, EPS_FFN / (0.1 * out.len() as f32).sqrt()),
        S::Router if o.router == Router::Measured => {
            out.fill(0.0);
            noise(&mut r, &mut out[..m], p.router_ctx);
            let b = c.load[i].ln() as f32 / p.ux_ffn;
            out.iter_mut().zip(u).for_each(|(x, u)| *x += b * u);
        }
        S::Router => {
            noise(&mut r, out, p.router_noise);
            out[..m].fill(0.0);
            project_out(out, u);
        }
        S::ShexpGate => noise(&mut r, out, unit),
        S::Bias => noise(&mut r, out, 0.02),
        S::Ones => out.fill(1.0),
        S::QkNorm => out.fill(c.norm_weight),
        S::Direction | S::Permutation | S::Neurons => unreachable!("not a tensor"),
    }
}

/// The metadata of the model `o` describes.
fn metadata(o: &Options, w: &mut GgufWriter) {
    let a = o.arch.gguf();
    let u32v = |x: usize| MetaValue::U32(x as u32);
    w.metadata("general.architecture", MetaValue::String(a.into()));
    w.metadata("general.name", MetaValue::String(GENERAL_NAME.into()));
    w.metadata("general.description", MetaValue::String(format!(
        "Random weights generated by `cargo xtask synth-model --arch {}` (xtask/src/synth_moe.rs): a Mixture-of-Experts \
         model of a real shape for benchmarks of the engine; its output is noise.", o.arch.name())));
    w.metadata("sparrow.synthetic", MetaValue::Bool(true));
    w.metadata("sparrow.synth.version", MetaValue::U32(VERSION));
    w.metadata("sparrow.synth.seed", MetaValue::U64(o.seed));
    let router = if o.router == Router::Measured {
        "measured"
    } else {
        "uniform"
    };
    w.metadata("sparrow.synth.router", MetaValue::String(router.into()));
    if o.relu {
        w.metadata("sparrow.ffn_activation", MetaValue::String("relu".into()));
        w.metadata(
            "sparrow.synth.density",
            MetaValue::F32(relu::DENSITY as f32),
        );
        w.metadata("sparrow.synth.alpha", MetaValue::F32(relu::ALPHA as f32));
    }
    let ff = match o.arch {
        Arch::Mixtral | Arch::Olmoe => o.expert_ff,
        Arch::Qwen3Moe => o.expert_ff * o.used,
        Arch::Qwen2Moe => o.shared_ff,
    };
    for (k, v) in [
        ("block_count", o.layers),
        ("context_length", CONTEXT),
        ("embedding_length", o.d),
        ("feed_forward_length", ff),
        ("attention.head_count", o.heads),
        ("attention.head_count_kv", o.kv_heads),
        ("attention.key_length", o.head_dim),
        ("attention.value_length", o.head_dim),
        ("rope.dimension_count", o.head_dim),
        ("expert_count", o.experts),
        ("expert_used_count", o.used),
        ("vocab_size", o.vocab),
    ] {
        w.metadata(&format!("{a}.{k}"), u32v(v));
    }
    if matches!(o.arch, Arch::Qwen3Moe | Arch::Qwen2Moe) {
        w.metadata(
            &format!("{a}.expert_feed_forward_length"),
            u32v(o.expert_ff),
        );
    }
    if o.arch == Arch::Qwen2Moe {
        w.metadata(
            &format!("{a}.expert_shared_feed_forward_length"),
            u32v(o.shared_ff),
        );
    }
    w.metadata(
        &format!("{a}.attention.layer_norm_rms_epsilon"),
        MetaValue::F32(RMS_EPS),
    );
    w.metadata(&format!("{a}.rope.freq_base"), MetaValue::F32(ROPE_BASE));
    let (tokens, types) = vocabulary(o.vocab);
    w.metadata("tokenizer.ggml.model", MetaValue::String("gpt2".into()));
    w.metadata("tokenizer.ggml.pre", MetaValue::String("gpt-2".into()));
    w.metadata(
        "tokenizer.ggml.tokens",
        MetaValue::Array(tokens.into_iter().map(MetaValue::String).collect()),
    );
    w.metadata(
        "tokenizer.ggml.token_type",
        MetaValue::Array(types.into_iter().map(MetaValue::I32).collect()),
    );
    w.metadata("tokenizer.ggml.merges", MetaValue::Array(Vec::new()));
    w.metadata("tokenizer.ggml.eos_token_id", MetaValue::U32(257));
}

/// Writes the model described by `o` to `path` (whole or not at all), calling `progress(layer, bytes)`.
pub fn write_model(o: &Options, path: &Path, mut progress: impl FnMut(usize, u64)) -> Result<()> {
    o.check()?;
    let mut w = GgufWriter::new();
    metadata(o, &mut w);
    let mut all = vec![(
        "token_embd.weight".to_string(),
        S::Embed,
        vec![o.vocab, o.d],
    )];
    all.push(("output_norm.weight".into(), S::Ones, vec![o.d]));
    if o.has_output() {
        all.push(("output.weight".into(), S::Output, vec![o.vocab, o.d]));
    }
    let head_len = all.len();
    for l in 0..o.layers {
        all.extend(o.layer_tensors(l));
    }
    for (name, s, shape) in &all {
        w.declare_tensor(name, o.format_of(*s, shape.len()), shape)?;
    }
    let u = direction(o);
    let half_split = o.arch != Arch::Mixtral;
    let kernel = routing::kernel(o.head_dim, ROPE_BASE as f64, routing::RHO);
    let head = kernel.head_vector(o.head_dim, half_split);
    let mut out = w.stream(path)?;
    let mut bytes = 0u64;
    let per_layer = (all.len() - head_len) / o.layers.max(1);
    for (i, (name, s, shape)) in all.iter().enumerate() {
        let layer = if i < head_len {
            0
        } else {
            (i - head_len) / per_layer
        };
        let load = if *s == S::Router {
            expert_load(o, layer)
        } else {
            Vec::new()
        };
        let plan = routing::layer_plan(o, &kernel, layer, EPS_FFN as f64);
        let relu = match s {
            S::Gate | S::Down if o.relu && i >= head_len => relu_plans(o, &plan, layer),
            _ => Vec::new(),
        };
        let c = RowCtx {
            u: &u,
            load: &load,
            relu: &relu,
            plan,
            head: &head,
            qk_norm: matches!(o.arch, Arch::Qwen3Moe | Arch::Olmoe),
            norm_weight: kernel.norm_weight(o.head_dim),
        };
        let cols = shape[shape.len() - 1];
        let rows: usize = shape[..shape.len() - 1].iter().product();
        let fmt = o.format_of(*s, shape.len());
        debug_assert_eq!(out.next_tensor(), Some(name.as_str()));
        stream_matrix(&mut out, fmt, rows, cols, &|r, buf| {
            row(o, &c, *s, layer, r, buf)
        })?;
        bytes += (rows * fmt.row_bytes(cols).unwrap_or(0)) as u64;
        let last_of_layer = i >= head_len && (i - head_len + 1) % per_layer == 0;
        if last_of_layer {
            progress(layer, bytes);
        }
    }
    out.finish()?;
    Ok(())
}

/// Runs the task (`synth-model` with `--arch`).
pub fn main(args: &[String], root: &Path) -> Result<()> {
    let o = Options::parse(args)?;
    let path = o.out_path(root);
    if let Some(dir) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    eprintln!(
        "xtask synth-model: SYNTHETIC {} MoE model (random weights, router {:?}, seed {:#x}): {} layers, d {}, {} experts \
         (top-{}) of {} neurons, {} heads ({} kv) of {}, vocab {}, {} -> {} ({:.2} GiB)",
        o.arch.name(), o.router, o.seed, o.layers, o.d, o.experts, o.used, o.expert_ff, o.heads, o.kv_heads,
        o.head_dim, o.vocab, o.format, path.display(), o.data_bytes() as f64 / (1u64 << 30) as f64
    );
    let law = routing::law(o.arch, o.router);
    let st = routing::measure(
        &routing::simulate(law, (o.experts, o.used), (16, 512), o.seed),
        o.experts,
    );
    let ((f, share), repeat) = routing::targets(o.arch);
    eprintln!(
        "xtask synth-model: routing law alpha {}, rho {}: repeat {:.3} (chance {:.3}), busiest {:.0}% of experts take {:.3} \
         (16 prompts of 512 tokens); the measured router's cited targets: repeat {repeat}, {share} (synth_routing.rs)",
        law.alpha, law.rho, st.repeat, st.chance, 100.0 * f, st.top(f)
    );
    let t0 = Instant::now();
    write_model(&o, &path, |l, b| {
        eprintln!(
            "xtask synth-model: layer {}/{} written ({:.2} GiB, {:.1} s)",
            l + 1,
            o.layers,
            b as f64 / (1u64 << 30) as f64,
            t0.elapsed().as_secs_f64()
        )
    })?;
    eprintln!(
        "xtask synth-model: wrote {} in {:.1} s",
        path.display(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}
