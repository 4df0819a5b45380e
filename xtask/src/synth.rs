//! `cargo xtask synth-model`: a **synthetic** model of a realistic shape (by default 32 layers, d = 4096,
//! 14336 FFN neurons, 32 query and 8 key/value heads, a 32000-token vocabulary, Q4_0: the shape of a 7B
//! llama-family model, about 4.0 GB) with random weights whose ReLU activations follow a planted power law.
//! It is for measuring the engine (speed, memory, flash offload, predictors) at full size; it is not a
//! language model and its text is noise. The file says so: `general.name` is
//! [`GENERAL_NAME`], `sparrow.synthetic` is `true`, and `sparrow.synth.{alpha,seed,density,version}` record
//! how it was made.
//!
//! # File
//!
//! Architecture `llama` with `sparrow.ffn_activation = relu` (gated FFN `down(relu(gate·x) * (up·x))`), the
//! llama.cpp tensor names and metadata keys that `xtask/src/fixtures.rs` uses, and its byte-level vocabulary
//! (256 byte tokens, `<|im_start|>`, `<|im_end|>` = eos) padded with unused tokens `<|synth_pad_N|>` (type 5)
//! to `--vocab` entries. Every matrix, the token embedding included, is in `--format` (Q4_0, Q8_0 or F16,
//! quantized with `kernels_neon::quantize_row`, ggml's reference quantizer), or with `--format q4_k_m`
//! in llama.cpp's Q4_K_M mix (Q4_K, Q6_K for the embedding and some layers' `attn_v` and `ffn_down`,
//! Q5_0/Q8_0 where rows are not whole 256-element super-blocks; `Options::tensor_format`); the norms
//! are F32 ones; the
//! output projection is tied to the embedding (no `output.weight`). Tensors are generated row by row from
//! per-row seeds (xorshift64, seeded with splitmix64 of seed, layer, tensor and row), on every core, and
//! streamed to disk through `model_format::GgufStream`, so memory stays at a few MiB whatever the size. The
//! bytes depend only on the options (on one platform: the planted biases go through libm's `pow`, `exp` and
//! `ln`), not on the number of cores.
//!
//! # The planted power law
//!
//! Every token embedding is `κ·√d·u + n_t`: a constant component along one fixed unit direction `u` (random
//! signs) shared by all tokens, plus per-token noise `n_t ⊥ u` with unit variance per coordinate (κ =
//! [`KAPPA`]). No layer writes along `u` on average (the rows of `attn_v` and `ffn_up` are orthogonal to `u`,
//! and `attn_output`/`ffn_down` are zero-mean random), so after RMSNorm every FFN input `x` has
//! `u·x ≈ κ√d/√(κ²+V)` while its other part is token-dependent, with `V` the per-coordinate variance of the
//! residual stream off `u` (1 for the embeddings, plus [`EPS_ATTN`]² and [`EPS_FFN`]² per attention and FFN
//! block, the per-coordinate output scale the generator gives them; tracked per layer). Neuron `j`'s gate row
//! is `r_j + t_j·u` with `r_j` a random unit vector orthogonal to `u`, so over inputs
//! `gate_j·x ≈ σ·(Z + z_j)` with `Z ~ N(0,1)` and `σ = √(V/(κ²+V))`: choosing `t_j = √V·z_j/(κ√d)` with `z_j = Φ⁻¹(p_j)` makes
//! `P(gate_j·x > 0) = p_j`, the neuron's planted firing propensity.
//!
//! The propensities follow a Zipf law over a random permutation of each layer's neurons: the neuron of rank
//! `r = 1..ff` gets `p = min(P_MAX, max(P_MIN, C·r^-alpha))`, with `C` set so that the mean is [`DENSITY`]
//! (10% of neurons fire per token, 90% sparsity, as in ReLU LLMs). With alpha = 1 the 20% most frequent
//! neurons carry about 66% of the activations, 334 of 14336 fire on 90% of the tokens and the last ones on
//! 2%; alpha = 0 makes every neuron fire 10% of the time. `ffn_down` is scaled from the planted `z_j` so the FFN
//! adds [`EPS_FFN`] per coordinate. `xtask/tests/it/synth.rs` checks all of this on small models: the gate
//! pre-activations of a forward pass computed from the file's dequantized weights, and the engine's own
//! forward pass over multi-token windows.
//!
//! The bookkeeping of `V` assumes one token at a time; over longer contexts attention averages the values of
//! several positions, so the residual stream grows a little slower than planned and deep layers come out
//! slightly sparser. Measured in the engine (dense forward pass, 2 windows of 32 random tokens) on the
//! full-size default model: density 0.102 in layer 0, 0.098 in layer 31, 0.0998 over all layers, and the
//! 20% most frequent neurons of a layer carry 0.67 to 0.69 of its activations
//! (`full_size_model_runs_in_the_engine_with_the_planted_density`, an ignored test in `xtask/tests/it/synth.rs`).

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, ensure, Context, Result};
use kernels_neon::WeightFormat;
use model_format::{DType, GgufWriter, MetaValue};

pub use super::synth_arch::SynthArch;

#[path = "synth_math.rs"]
pub(crate) mod math;
use math::{phi_cdf, phi_inv, phi_pdf};

/// `general.name` of every synthetic model.
pub const GENERAL_NAME: &str =
    "SYNTHETIC sparrow synth-model (random weights, planted power law) — not a language model";
/// Version of the generator, written as `sparrow.synth.version`: bump it when the bytes for given options change.
pub const VERSION: u32 = 1;
/// Mean firing propensity of the neurons of a layer (fraction of positive gate pre-activations).
pub const DENSITY: f64 = 0.10;
/// Largest planted propensity.
pub const P_MAX: f64 = 0.9;
/// Smallest planted propensity.
pub const P_MIN: f64 = 1e-5;
/// The component along `u` of every embedding, in units of the per-coordinate noise: `κ·√d·u`.
pub const KAPPA: f64 = 1.0;
/// Per-coordinate standard deviation an attention block adds to the residual stream (one token).
pub const EPS_ATTN: f64 = 0.05;
/// Per-coordinate standard deviation an FFN block adds to the residual stream.
pub const EPS_FFN: f64 = 0.1;
/// RMSNorm epsilon.
pub const RMS_EPS: f32 = 1e-5;
/// RoPE base.
pub const ROPE_BASE: f32 = 10_000.0;
/// Context length written to the metadata.
pub const CONTEXT: usize = 4096;

/// Byte tokens and the two chat tokens of the vocabulary; the rest is padding.
pub(crate) const BASE_VOCAB: usize = 258;

/// What to generate.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// Output file (default: `target/synth/<file_name()>` under the workspace root).
    pub out: Option<PathBuf>,
    /// Transformer blocks.
    pub layers: usize,
    /// Hidden size.
    pub d: usize,
    /// FFN neurons per layer.
    pub ff: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Vocabulary size (embedding rows).
    pub vocab: usize,
    /// Weight format: Q4_0, Q8_0 or F16 (the format of every matrix unless `q4_k_m`).
    pub format: DType,
    /// llama.cpp's Q4_K_M mix instead (`--format q4_k_m`, [`Options::tensor_format`]).
    pub q4_k_m: bool,
    /// Zipf exponent of the firing propensities.
    pub alpha: f64,
    /// Seed of every random number.
    pub seed: u64,
    /// The family written (`--arch`, `synth_arch.rs`).
    pub arch: SynthArch,
    /// Head size when it is not `d / heads` (`--head-dim`).
    pub head_dim: Option<usize>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            out: None,
            layers: 32,
            d: 4096,
            ff: 14336,
            heads: 32,
            kv_heads: 8,
            vocab: 32000,
            format: DType::Q4_0,
            q4_k_m: false,
            alpha: 1.0,
            seed: 0x5EED,
            arch: SynthArch::Llama,
            head_dim: None,
        }
    }
}

/// The usage text.
pub const USAGE: &str = "usage: cargo xtask synth-model [--arch llama|qwen3] [--out PATH] [--layers N] [--d D] [--ff F] [--heads H] [--kv-heads K] \
[--head-dim HD] [--vocab V] [--format q4_0|q8_0|q4_k_m|f16] [--alpha A] [--seed S]
  defaults (llama): 32 layers, d 4096, ff 14336, 32 heads, 8 kv heads, head dim d/heads, vocab 32000, q4_0, alpha 1.0,
  seed 0x5EED, out target/synth/synth-<layers>x<d>x<ff>-<format>.gguf (4.0 GB at the defaults);
  --arch qwen3: Qwen3-0.6B's shape (28 layers, d 1024, ff 3072, 16 heads, 8 kv heads, head dim 128, vocab 151936),
  out target/synth/synth-qwen3-<layers>x<d>x<ff>-<format>.gguf";

impl Options {
    /// Parses `--flag value` / `--flag=value` arguments (after the task name), then checks them.
    pub fn parse(args: &[String]) -> Result<Options> {
        // The family's defaults first, whatever the position of `--arch`: the size flags override them.
        let mut arch = SynthArch::Llama;
        for (i, a) in args.iter().enumerate() {
            if let Some(v) = a.strip_prefix("--arch=") {
                arch = SynthArch::parse(v)?;
            } else if a == "--arch" {
                arch = SynthArch::parse(args.get(i + 1).map_or("", |v| v.as_str()))?;
            }
        }
        let mut o = arch.defaults();
        let mut it = args.iter();
        while let Some(arg) = it.next() {
            let (flag, inline) = match arg.split_once('=') {
                Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
                _ => (arg.as_str(), None),
            };
            if matches!(flag, "-h" | "--help") {
                bail!("{USAGE}");
            }
            const FLAGS: [&str; 12] = [
                "--arch",
                "--head-dim",
                "--out",
                "--layers",
                "--d",
                "--ff",
                "--heads",
                "--kv-heads",
                "--vocab",
                "--format",
                "--alpha",
                "--seed",
            ];
            if !FLAGS.contains(&flag) {
                bail!("unknown option `{arg}`\n{USAGE}");
            }
            let value = match inline {
                Some(v) => v,
                None => it
                    .next()
                    .cloned()
                    .with_context(|| format!("{flag} needs a value\n{USAGE}"))?,
            };
            let int = |v: &str| -> Result<usize> {
                v.parse()
                    .with_context(|| format!("{flag} takes a whole number, not `{v}`"))
            };
            match flag {
                "--arch" => {}
                "--head-dim" => o.head_dim = Some(int(&value)?),
                "--out" => o.out = Some(PathBuf::from(value)),
                "--layers" => o.layers = int(&value)?,
                "--d" => o.d = int(&value)?,
                "--ff" => o.ff = int(&value)?,
                "--heads" => o.heads = int(&value)?,
                "--kv-heads" => o.kv_heads = int(&value)?,
                "--vocab" => o.vocab = int(&value)?,
                "--format" => {
                    (o.format, o.q4_k_m) = match value.to_ascii_lowercase().as_str() {
                        "q4_0" => (DType::Q4_0, false),
                        "q8_0" => (DType::Q8_0, false),
                        "q4_k_m" => (DType::Q4_K, true),
                        "f16" => (DType::F16, false),
                        _ => bail!("--format takes q4_0, q8_0, q4_k_m or f16, not `{value}`"),
                    }
                }
                "--alpha" => {
                    o.alpha = value
                        .parse()
                        .with_context(|| format!("--alpha takes a number, not `{value}`"))?
                }
                "--seed" => {
                    let parsed = match value
                        .strip_prefix("0x")
                        .or_else(|| value.strip_prefix("0X"))
                    {
                        Some(hex) => u64::from_str_radix(hex, 16),
                        None => value.parse(),
                    };
                    o.seed = parsed.with_context(|| format!("--seed takes a 64-bit unsigned number (decimal or 0x hex), not `{value}`"))?;
                }
                _ => unreachable!("{flag} is in FLAGS"),
            }
        }
        o.check()?;
        Ok(o)
    }

    /// Checks that the shape is one the engine loads and the writer can write.
    pub fn check(&self) -> Result<()> {
        ensure!(
            (1..=1024).contains(&self.layers),
            "--layers must be 1..=1024, not {}",
            self.layers
        );
        for (name, v) in [("--d", self.d), ("--ff", self.ff)] {
            ensure!(v >= 32 && v % 32 == 0 && v <= 1 << 20, "{name} must be a multiple of 32 in 32..=1048576 (quantization blocks are 32 wide), not {v}");
        }
        ensure!(
            self.heads >= 1 && (self.head_dim.is_some() || self.d % self.heads == 0),
            "--heads must divide --d ({}), {} does not (or give --head-dim)",
            self.d,
            self.heads
        );
        let hd = self.head_dim();
        ensure!(
            hd >= 2 && hd % 2 == 0 && self.q_dim() % 32 == 0 && self.q_dim() <= 1 << 20,
            "head dimension {hd} must be even (RoPE rotates pairs) and heads x head dimension a multiple of 32"
        );
        ensure!(
            self.kv_heads >= 1 && self.heads % self.kv_heads == 0,
            "--kv-heads must divide --heads ({}), {} does not",
            self.heads,
            self.kv_heads
        );
        ensure!(
            (BASE_VOCAB..=1 << 22).contains(&self.vocab),
            "--vocab must be {BASE_VOCAB}..=4194304 (256 byte tokens + 2 chat tokens at least), not {}",
            self.vocab
        );
        ensure!(
            matches!(self.format, DType::Q4_0 | DType::Q8_0 | DType::F16) || self.q4_k_m,
            "format must be Q4_0, Q8_0 or F16 (or the Q4_K_M mix), not {}",
            self.format
        );
        ensure!(
            self.alpha.is_finite() && (0.0..=8.0).contains(&self.alpha),
            "--alpha must be a number in 0..=8, not {}",
            self.alpha
        );
        Ok(())
    }

    /// `synth-<layers>x<d>x<ff>-<format>.gguf`.
    pub fn file_name(&self) -> String {
        format!(
            "synth-{}{}x{}x{}-{}.gguf",
            match self.arch {
                SynthArch::Llama => "",
                SynthArch::Qwen3 => "qwen3-",
            },
            self.layers,
            self.d,
            self.ff,
            if self.q4_k_m {
                "q4_k_m".to_string()
            } else {
                self.format.name().to_ascii_lowercase()
            }
        )
    }

    /// The format of a matrix: `format`, or under `q4_k_m` llama.cpp's Q4_K_M choice
    /// (`llama_tensor_get_type`): Q6_K for the output projection (here the tied token embedding)
    /// and for `attn_v` and `ffn_down` of the layers `use_more_bits` picks (the first and last
    /// eighth, and every third between), Q4_K elsewhere; a matrix whose rows are not a whole
    /// number of 256-element super-blocks falls back as llama.cpp does, Q4_K to Q5_0 and Q6_K to
    /// Q8_0.
    fn tensor_format(&self, s: Stream, layer: usize, cols: usize) -> DType {
        if !self.q4_k_m {
            return self.format;
        }
        let n = self.layers;
        let more_bits = layer < n / 8 || layer >= 7 * n / 8 || (layer + 3 - n / 8 % 3) % 3 == 2;
        let k = match s {
            Stream::Embed => DType::Q6_K,
            Stream::V | Stream::Down if more_bits => DType::Q6_K,
            _ => DType::Q4_K,
        };
        match (k, cols % 256 == 0) {
            (_, true) => k,
            (DType::Q6_K, false) => DType::Q8_0,
            _ => DType::Q5_0,
        }
    }

    /// Where the file goes: `--out`, or `target/synth/<file_name()>` under `root`.
    pub fn out_path(&self, root: &Path) -> PathBuf {
        self.out
            .clone()
            .unwrap_or_else(|| root.join("target").join("synth").join(self.file_name()))
    }

    /// Dimension of one head: `--head-dim`, else `d / heads`.
    pub fn head_dim(&self) -> usize {
        self.head_dim.unwrap_or(self.d / self.heads.max(1))
    }

    /// Query width: `heads × head_dim`.
    pub fn q_dim(&self) -> usize {
        self.heads * self.head_dim()
    }

    fn kv_dim(&self) -> usize {
        self.kv_heads * self.head_dim()
    }

    /// Bytes of the tensor data (the header adds the vocabulary, under a MiB).
    pub fn data_bytes(&self) -> u64 {
        let bytes = |s: Stream, l: usize, rows: usize, cols: usize| {
            let f = self.tensor_format(s, l, cols);
            (rows * f.row_bytes(cols).unwrap_or(0)) as u64
        };
        let (d, ff, kv, q) = (self.d, self.ff, self.kv_dim(), self.q_dim());
        let layer = |l: usize| {
            bytes(Stream::Q, l, q, d)
                + bytes(Stream::K, l, kv, d)
                + bytes(Stream::V, l, kv, d)
                + bytes(Stream::O, l, d, q)
                + bytes(Stream::Gate, l, ff, d)
                + bytes(Stream::Up, l, ff, d)
                + bytes(Stream::Down, l, d, ff)
                + 2 * 4 * d as u64
                + self.arch.layer_bytes(self)
        };
        bytes(Stream::Embed, 0, self.vocab, d)
            + 4 * d as u64
            + (0..self.layers).map(layer).sum::<u64>()
    }
}

/// Runs the task: parses `args`, writes the model, prints a line per layer and a summary to stderr.
pub fn main(args: &[String], root: &Path) -> Result<()> {
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
        return Ok(());
    }
    let o = Options::parse(args)?;
    let path = o.out_path(root);
    if let Some(dir) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    eprintln!(
        "xtask synth-model: SYNTHETIC model (random weights, planted power law alpha {}, density {DENSITY}, seed {:#x}): \
         {} layers, d {}, ff {}, {} heads ({} kv), vocab {}, {} -> {} ({:.2} GiB)",
        o.alpha,
        o.seed,
        o.layers,
        o.d,
        o.ff,
        o.heads,
        o.kv_heads,
        o.vocab,
        if o.q4_k_m { "Q4_K_M mix".to_string() } else { o.format.to_string() },
        path.display(),
        o.data_bytes() as f64 / (1u64 << 30) as f64
    );
    let t0 = Instant::now();
    write_model(&o, &path, |layer, bytes| {
        eprintln!(
            "xtask synth-model: layer {}/{} written ({:.2} GiB, {:.1} s)",
            layer + 1,
            o.layers,
            bytes as f64 / (1u64 << 30) as f64,
            t0.elapsed().as_secs_f64()
        )
    })?;
    let size = std::fs::metadata(&path)
        .with_context(|| format!("reading the size of {}", path.display()))?
        .len();
    eprintln!(
        "xtask synth-model: wrote {} ({size} bytes) in {:.1} s",
        path.display(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Deterministic pseudo-random numbers (xorshift64).
pub(crate) struct Rng(u64);

impl Rng {
    /// A generator for one stream, named by `tag`, of the model seeded with `seed`.
    pub(crate) fn new(seed: u64, tag: u64) -> Rng {
        Rng(splitmix64(seed ^ splitmix64(tag)) | 1)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Mean 0, variance 1: the sum of two uniforms (triangular on ±√6), from the two halves of one draw.
    pub(crate) fn tri(&mut self) -> f32 {
        let x = self.next_u64();
        let s = (x >> 32) as u32 as i32 as f32 + x as u32 as i32 as f32;
        s * (6f32.sqrt() / 4_294_967_296.0)
    }

    /// Uniform in `0..n`.
    pub(crate) fn below(&mut self, n: usize) -> usize {
        ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * n as f64) as usize
    }
}

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The random streams of the generator.
#[derive(Clone, Copy)]
enum Stream {
    Direction = 0,
    Permutation,
    Embed,
    Q,
    K,
    V,
    O,
    Gate,
    Up,
    Down,
}

fn rng(o: &Options, stream: Stream, layer: usize, row: usize) -> Rng {
    Rng::new(
        o.seed,
        ((stream as u64) << 56) ^ ((layer as u64) << 36) ^ row as u64,
    )
}

/// The planted propensity of each rank `1..=ff`: `min(P_MAX, max(P_MIN, C·r^-alpha))` with mean [`DENSITY`].
pub fn zipf_propensities(ff: usize, alpha: f64) -> Vec<f64> {
    let at = |c: f64| (1..=ff).map(move |r| (c * (r as f64).powf(-alpha)).clamp(P_MIN, P_MAX));
    let mean = |c: f64| at(c).sum::<f64>() / ff as f64;
    // The mean grows with C: bisect log C.
    let (mut lo, mut hi) = (-60.0f64, 60.0f64);
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if mean(mid.exp()) < DENSITY {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    at((0.5 * (lo + hi)).exp()).collect()
}

/// The planted firing propensity of every neuron (by index) of `layer`: the Zipf law over a random permutation.
pub fn propensities(o: &Options, layer: usize) -> Vec<f64> {
    let by_rank = zipf_propensities(o.ff, o.alpha);
    let mut perm: Vec<usize> = (0..o.ff).collect();
    let mut r = rng(o, Stream::Permutation, layer, 0);
    for i in (1..o.ff).rev() {
        perm.swap(i, r.below(i + 1));
    }
    let mut p = vec![0.0; o.ff];
    for (rank, &neuron) in perm.iter().enumerate() {
        p[neuron] = by_rank[rank];
    }
    p
}

/// The fixed direction `u` (unit norm, random signs) that every embedding carries.
fn direction(o: &Options) -> Vec<f32> {
    let mut r = rng(o, Stream::Direction, 0, 0);
    let s = 1.0 / (o.d as f32).sqrt();
    (0..o.d)
        .map(|_| if r.next_u64() >> 63 == 0 { s } else { -s })
        .collect()
}

/// Removes the component of `x` along the unit vector `u`.
pub(crate) fn project_out(x: &mut [f32], u: &[f32]) {
    let c: f32 = x.iter().zip(u).map(|(a, b)| a * b).sum();
    x.iter_mut().zip(u).for_each(|(a, b)| *a -= c * b);
}

/// Fills `row` with unit-variance noise from `r`, times `scale`.
pub(crate) fn noise(r: &mut Rng, row: &mut [f32], scale: f32) {
    row.iter_mut().for_each(|x| *x = r.tri() * scale);
}

/// What the rows of one layer need.
struct LayerPlan {
    /// Per-neuron `t_j`: the gate row's component along `u`.
    gate_u: Vec<f32>,
    /// Standard deviation of the `attn_output` and `ffn_down` entries.
    sigma_o: f32,
    sigma_down: f32,
}

fn plan(o: &Options, layer: usize) -> LayerPlan {
    let k2 = KAPPA * KAPPA;
    // Per-coordinate variance of the residual stream off `u` at the attention input and at the FFN input.
    let v_attn = 1.0 + layer as f64 * (EPS_ATTN * EPS_ATTN + EPS_FFN * EPS_FFN);
    let v_ffn = v_attn + EPS_ATTN * EPS_ATTN;
    let z: Vec<f64> = propensities(o, layer).into_iter().map(phi_inv).collect();
    let gate_u = z
        .iter()
        .map(|z| ((v_ffn.sqrt() * z) / (KAPPA * (o.d as f64).sqrt())) as f32)
        .collect();
    // One token: attention's output is v (variance V/(κ²+V) per entry), repeated over the query heads.
    let sigma_o = EPS_ATTN / (o.d as f64 * v_attn / (k2 + v_attn)).sqrt();
    // E[relu(σ(Z+z))²·(up)²] = σ⁴·M(z), M(z) = (z²+1)Φ(z) + zφ(z), σ² = V/(κ²+V).
    let s2 = v_ffn / (k2 + v_ffn);
    let m: f64 = z
        .iter()
        .map(|&z| ((z * z + 1.0) * phi_cdf(z) + z * phi_pdf(z)).max(0.0))
        .sum();
    let sigma_down = EPS_FFN / (s2 * m.max(1e-12).sqrt());
    LayerPlan {
        gate_u,
        sigma_o: sigma_o as f32,
        sigma_down: sigma_down as f32,
    }
}

/// Row `t` of the token embedding: `κ·√d·u + n`, `n ⊥ u` with unit variance per coordinate.
fn embed_row(o: &Options, u: &[f32], t: usize, row: &mut [f32]) {
    noise(&mut rng(o, Stream::Embed, 0, t), row, 1.0);
    project_out(row, u);
    let a = (KAPPA * (o.d as f64).sqrt()) as f32;
    row.iter_mut().zip(u).for_each(|(x, u)| *x += a * u);
}

/// Row `i` of a layer matrix.
fn layer_row(
    o: &Options,
    u: &[f32],
    p: &LayerPlan,
    layer: usize,
    s: Stream,
    i: usize,
    row: &mut [f32],
) {
    let mut r = rng(o, s, layer, i);
    let unit = 1.0 / (o.d as f32).sqrt();
    match s {
        Stream::Q | Stream::K => noise(&mut r, row, unit),
        Stream::V | Stream::Up => {
            noise(&mut r, row, unit);
            project_out(row, u);
        }
        Stream::O => noise(&mut r, row, p.sigma_o),
        Stream::Down => noise(&mut r, row, p.sigma_down),
        Stream::Gate => {
            noise(&mut r, row, unit);
            project_out(row, u);
            let norm = row
                .iter()
                .map(|x| x * x)
                .sum::<f32>()
                .sqrt()
                .max(f32::MIN_POSITIVE);
            let t = p.gate_u[i];
            row.iter_mut()
                .zip(u)
                .for_each(|(x, u)| *x = *x / norm + t * u);
        }
        Stream::Direction | Stream::Permutation | Stream::Embed => {
            unreachable!("not a layer matrix")
        }
    }
}

/// Generates `rows` rows of `cols` with `gen` on every core, quantizes them and streams them out.
pub(crate) fn stream_matrix(
    out: &mut model_format::GgufStream<'_>,
    format: WeightFormat,
    rows: usize,
    cols: usize,
    gen: &(dyn Fn(usize, &mut [f32]) + Sync),
) -> Result<()> {
    let rb = format
        .row_bytes(cols)
        .context("row length is a whole number of blocks")?;
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let batch = (8 << 20) / rb.max(1);
    let batch = batch.clamp(threads, rows.max(threads));
    let mut buf = vec![0u8; batch.min(rows) * rb];
    let mut start = 0;
    while start < rows {
        let n = batch.min(rows - start);
        let chunk = &mut buf[..n * rb];
        let per = n.div_ceil(threads);
        std::thread::scope(|s| -> Result<()> {
            let handles: Vec<_> = chunk
                .chunks_mut(per * rb)
                .enumerate()
                .map(|(ti, part)| {
                    s.spawn(move || -> Result<()> {
                        let mut row = vec![0.0f32; cols];
                        for (k, dst) in part.chunks_mut(rb).enumerate() {
                            gen(start + ti * per + k, &mut row);
                            kernels_neon::quantize_row(format, &row, dst)
                                .context("quantizing a generated row")?;
                        }
                        Ok(())
                    })
                })
                .collect();
            handles.into_iter().try_for_each(|h| {
                h.join()
                    .map_err(|_| anyhow::anyhow!("a generator thread panicked"))?
            })
        })?;
        out.write_data(chunk)?;
        start += n;
    }
    Ok(())
}

/// The vocabulary: byte tokens, `<|im_start|>`, `<|im_end|>`, then unused padding; with token types.
pub(crate) fn vocabulary(vocab: usize) -> (Vec<String>, Vec<i32>) {
    // `super`, not `crate`: the tests (`xtask/tests/it/main.rs`) include this file in a module of their own.
    let mut tokens = super::fixtures::byte_tokens();
    tokens.push("<|im_start|>".into());
    tokens.push("<|im_end|>".into());
    let mut types = vec![1i32; 256];
    types.extend([3, 3]);
    for i in BASE_VOCAB..vocab {
        tokens.push(format!("<|synth_pad_{i}|>"));
        types.push(5);
    }
    (tokens, types)
}

/// Writes the model described by `o` to `path` (through `path.tmp`), calling `progress(layer, bytes so far)`
/// after each layer.
pub fn write_model(o: &Options, path: &Path, mut progress: impl FnMut(usize, u64)) -> Result<()> {
    o.check()?;
    let (d, ff, qd, kvd) = (o.d, o.ff, o.q_dim(), o.kv_dim());
    let mut w = GgufWriter::new();
    let a = o.arch.name();
    let u32v = |x: usize| MetaValue::U32(x as u32);
    w.metadata("general.architecture", MetaValue::String(a.into()));
    w.metadata("general.name", MetaValue::String(GENERAL_NAME.into()));
    w.metadata("general.description", MetaValue::String(
        "Random weights generated by `cargo xtask synth-model` (xtask/src/synth.rs): ReLU FFN neurons fire with Zipf-distributed \
         propensities planted through a direction every embedding carries. For benchmarks of the engine; its output is noise."
            .into(),
    ));
    w.metadata("sparrow.synthetic", MetaValue::Bool(true));
    w.metadata("sparrow.synth.version", MetaValue::U32(VERSION));
    w.metadata("sparrow.synth.alpha", MetaValue::F32(o.alpha as f32));
    w.metadata("sparrow.synth.seed", MetaValue::U64(o.seed));
    w.metadata("sparrow.synth.density", MetaValue::F32(DENSITY as f32));
    w.metadata(&format!("{a}.block_count"), u32v(o.layers));
    w.metadata(&format!("{a}.embedding_length"), u32v(d));
    w.metadata(&format!("{a}.feed_forward_length"), u32v(ff));
    w.metadata(&format!("{a}.attention.head_count"), u32v(o.heads));
    w.metadata(&format!("{a}.attention.head_count_kv"), u32v(o.kv_heads));
    w.metadata(
        &format!("{a}.attention.layer_norm_rms_epsilon"),
        MetaValue::F32(RMS_EPS),
    );
    w.metadata(&format!("{a}.rope.freq_base"), MetaValue::F32(ROPE_BASE));
    w.metadata(&format!("{a}.context_length"), u32v(CONTEXT));
    w.metadata(&format!("{a}.vocab_size"), u32v(o.vocab));
    o.arch.metadata(&mut w, o);
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

    let ones = |n: usize| {
        (0..n)
            .flat_map(|_| 1.0f32.to_le_bytes())
            .collect::<Vec<u8>>()
    };
    let embed_fmt = o.tensor_format(Stream::Embed, 0, d);
    w.declare_tensor("token_embd.weight", embed_fmt, &[o.vocab, d])?;
    let out_norm = o.arch.output_norm(d).to_le_bytes();
    let out_norm = out_norm.iter().copied().cycle().take(4 * d).collect();
    w.tensor("output_norm.weight", DType::F32, &[d], out_norm)?;
    let matrices = |l: usize| {
        [
            (format!("blk.{l}.attn_q.weight"), Stream::Q, qd, d),
            (format!("blk.{l}.attn_k.weight"), Stream::K, kvd, d),
            (format!("blk.{l}.attn_v.weight"), Stream::V, kvd, d),
            (format!("blk.{l}.attn_output.weight"), Stream::O, d, qd),
            (format!("blk.{l}.ffn_gate.weight"), Stream::Gate, ff, d),
            (format!("blk.{l}.ffn_up.weight"), Stream::Up, ff, d),
            (format!("blk.{l}.ffn_down.weight"), Stream::Down, d, ff),
        ]
    };
    for l in 0..o.layers {
        w.tensor(
            &format!("blk.{l}.attn_norm.weight"),
            DType::F32,
            &[d],
            ones(d),
        )?;
        o.arch.layer_tensors(&mut w, o, l)?;
        for (i, (name, s, rows, cols)) in matrices(l).into_iter().enumerate() {
            if i == 4 {
                w.tensor(
                    &format!("blk.{l}.ffn_norm.weight"),
                    DType::F32,
                    &[d],
                    ones(d),
                )?;
            }
            w.declare_tensor(&name, o.tensor_format(s, l, cols), &[rows, cols])?;
        }
    }

    let u = direction(o);
    let mut out = w.stream(path)?;
    stream_matrix(&mut out, embed_fmt, o.vocab, d, &|t, row| {
        embed_row(o, &u, t, row)
    })?;
    let mut bytes = o.vocab as u64 * embed_fmt.row_bytes(d).unwrap_or(0) as u64;
    for l in 0..o.layers {
        let p = plan(o, l);
        for (name, s, rows, cols) in matrices(l) {
            debug_assert_eq!(out.next_tensor(), Some(name.as_str()));
            let fmt = o.tensor_format(s, l, cols);
            stream_matrix(&mut out, fmt, rows, cols, &|i, row| {
                layer_row(o, &u, &p, l, s, i, row)
            })?;
            bytes += (rows * fmt.row_bytes(cols).unwrap_or(0)) as u64;
        }
        progress(l, bytes);
    }
    out.finish()?;
    Ok(())
}
