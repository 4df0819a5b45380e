//! CPU kernels for LLM inference on weights stored in GGML block formats.
//!
//! This crate provides the compute kernels of the Sparrow engine: quantized
//! matrix-vector (decode) and matrix-matrix (prefill) products on weights in
//! llama.cpp block layouts ([`WeightFormat`]), plus the small vector
//! operations of a transformer block (RMSNorm, softmax, SiLU/ReLU gating,
//! RoPE, dot, axpy), and the sparse kernels of activation sparsity
//! (PowerInfer-2 style, see below).
//!
//! The formats, [`QMatrix`], [`Precision`] and [`Activation`] are defined in
//! the `tensor-types` crate (one table of formats for every crate) and
//! re-exported here. Weight formats: `F32`, `F16`, `BF16`; the 32-element block formats
//! `Q8_0`, `Q4_0`, `Q4_1`, `Q5_0`, `Q5_1` and the non-linear `IQ4_NL`; the K-quant super-block
//! formats `Q4_K` (144 bytes per 256 elements), `Q5_K` (176) and `Q6_K` (210), the types of
//! llama.cpp's popular `Q4_K_M` / `Q5_K_M` files, `Q2_K` (84) and `Q3_K` (110), of its `Q2_K` /
//! `Q3_K_*` files, and `IQ4_XS` (136 bytes per 256); and `I4Hybrid`, the
//! PowerInfer-2 per-channel INT4 + INT8 outlier format (see below). Every
//! entry point accepts every format; rows of a K-quant matrix must be a
//! multiple of 256 wide.
//!
//! Three implementations exist behind one safe, slice-based API:
//!
//! * a plain scalar reference (`scalar/`), also the fallback;
//! * x86_64 AVX2 + FMA + F16C, chosen at run time with
//!   `is_x86_feature_detected!` (detected once and cached);
//! * aarch64 NEON (baseline on aarch64), with the `dotprod` extension used
//!   for the integer path when `is_aarch64_feature_detected!("dotprod")` (`sdot`, the K-quants
//!   included), and `i8mm` where detected too (`smmla` in the 8-bit prompt tiles of the 32-element
//!   block formats and of the K-quants Q4_K/Q5_K/Q6_K, `smmla` and `usmmla` on split 16-bit activations in the
//!   16-bit one, [`KernelPath::NeonI8mm`]). SVE is detected and reported
//!   ([`cpu_features`]) but not used: phones' cores run it 128 bits wide, NEON's width, with the
//!   same dot-product instructions.
//!
//! Where AVX-512F, BW, VL, VNNI and BF16 are present too, the path is [`KernelPath::Avx512`]: the
//! AVX2 kernels with AVX-512 ones where they exist (the f32 and bf16 tiles of [`matmul()`], the
//! `Q4_K`, `Q5_K` and `Q6_K` integer dots).
//!
//! Setting the environment variable `SPARROW_KERNELS=scalar` (read once, on
//! first use) forces the scalar path, `SPARROW_KERNELS=avx2` the AVX2 path on a
//! machine with AVX-512, `neon-dotprod` and `neon` the lower aarch64 paths on a core with i8mm or
//! dotprod. [`arch_name`] reports the path in use.
//! Tests and benchmarks can call each path explicitly with [`matvec_with`],
//! [`matmul_with`], [`dequantize_row_with`], [`matvec_rows_with`],
//! [`axpy_rows_with`] and [`gate_up_sparse_with`] (see [`available_paths`]).
//!
//! [`matvec_many`] runs several matrices of one input vector (a decode
//! step's q/k/v, or gate/up) with one activation quantization and one
//! parallel region, bit-identical to one [`matvec`] each. [`experts_ffn`] runs the routed experts
//! of a Mixture-of-Experts layer (each over its tokens) in two parallel regions split by (expert,
//! row chunk), each expert's products those of [`matvec_gated`], [`matvec_batch`] or [`matmul()`].
//! [`experts_ffn_packed`] runs one token's experts over their [`Q40x8`] copies, bit for bit
//! [`experts_ffn`] over the originals.
//!
//! SIMD coverage: `matvec`, `matvec_many` and `matvec_rows` (all precisions), `axpy_rows`,
//! `matmul`, `dequantize_row`,
//! `dot_f32`, `axpy_f32` and the sum of squares of `rms_norm` are SIMD on both
//! architectures for every format. The 5-bit formats
//! unpack their fifth bits into the quant bytes (`Q5_0`/`Q5_1`: AVX2 `bytes_from_bits_32` as in
//! llama.cpp, NEON `vtst`; `Q5_K`: a shift of the `qh` bytes per sub-block) and then run the
//! kernels of the 4-bit formats; `IQ4_NL` looks its nibbles up in the 16-value table (`pshufb`,
//! `tbl`) and runs as `Q8_0`; `IQ4_XS` does the same lookup per 32-wide sub-block. `Q2_K` and `Q3_K`
//! unpack one 2-bit plane of 32 `qs` bytes per 32 elements (a shift and a mask; `Q3_K` adds its
//! `hmask` bit as 4 and subtracts 4) and scale each 16-wide half on its own. K-quant `Exact`
//! dequantizes a super-block into 256 f32 (AVX2 / NEON, bit-identical to the scalar
//! code), then FMAs. The K-quant integer paths ([`Precision::Fast`], [`Precision::Int8`]) take
//! several rows at once on x86_64, sharing the activation loads: AVX2 `vpmaddwd` on 16-bit
//! activations (`arch/x86_64/kquant_rows.rs`), `maddubs` on 8-bit ones with one scale per 256
//! (`kquant_super.rs`, llama.cpp's `Q8_K`), and on [`KernelPath::Avx512`] `vpdpwssd` /
//! `vpdpbusd` over two 32-element blocks an instruction (`kquant512.rs`); NEON widens to i16 and
//! multiply-adds (`smull`/`smlal`) one row at a time. Throughput per format against DRAM, and
//! against llama.cpp, is in `docs/BENCHMARKS.md` (x86_64 only: no NEON speed has been measured,
//! only its results under qemu). `softmax_inplace` and `silu_mul_inplace` take a SIMD `exp` (glibc's
//! `expf` algorithm, bit for bit libm's on x86_64); `relu_mul_inplace` and `rope_inplace` are
//! scalar (a negligible share of a decode step).
//!
//! # Hybrid INT4 + INT8 outlier format (I4Hybrid)
//!
//! PowerInfer-2 (section 7.6) quantizes weights for the NPU per channel to
//! INT4 and keeps the largest weights as INT8 outliers.
//! [`WeightFormat::I4Hybrid`]`{ outliers_per_row: k }` stores every row
//! (output channel) of `cols` elements (`cols` a multiple of 32, at most
//! 65536) in the same number of bytes, `row_bytes = 8 + cols/2 + 3k`
//! rounded up to a multiple of 4: two f32 scales `s` and `s_o`, the INT4
//! quants in `Q4_0` nibble order, `k` u16 outlier columns `c_j` and `k` i8
//! outlier values `o_j` (byte layout in [`tensor_types::hybrid`], where the
//! format is defined with the others).
//!
//! Element `i` of a row is `s * q_i` plus `s_o * o_j` for every `j` with
//! `c_j == i`, so `dot(row, x) = s·Σ q_i x_i + s_o·Σ o_j x[c_j]`. The
//! quantizer ([`quantize_row`]) makes the `k` outliers the `k` weights of
//! largest magnitude *of the row* (the outlier fraction is per row, not per
//! matrix: every row has exactly `k`), sorts them by column, writes 0 as
//! their INT4 quant, and picks `s` by a small MSE search over clipping
//! ratios of `max|rest| / 7` and `s_o = max|outlier| / 127`. The kernels do
//! not rely on that: any distinct or repeated columns `< cols` are valid,
//! and the outlier term is added to whatever the INT4 part holds.
//! [`QMatrix::new`] and [`dequantize_row`] reject columns `>= cols`
//! ([`LayoutError::OutlierOutOfRange`]). `k = 0` is plain per-channel INT4;
//! [`WeightFormat::hybrid_for`] gives the format for an outlier fraction
//! (`k = ceil(frac · cols)`). SmolLM2-135M rows at 1% outliers: 576 wide,
//! `k = 6`, 316 bytes (4.39 bits per weight); 1536 wide, `k = 16`, 824
//! bytes (4.29 bits), against 4.5 for `Q4_0` and 5.0 for `Q4_1`.
//!
//! Kernels: hybrid rows use f32 activations in every [`Precision`] (there
//! is no integer path for them yet). `matvec`/`matvec_rows`,
//! `dequantize_row` and `axpy_rows` have an AVX2 path on x86_64 and a NEON
//! path on aarch64: the INT4 part is unpacked like `Q4_0` and FMA'd (with
//! `x`, scaled by `s` once per row; `axpy_rows` FMAs by `c * s` into the
//! column range of `y` of its work item), the few outliers are a scalar
//! loop shared with the reference. `dequantize_row` is bit-identical to the
//! scalar code on both (`s * (q - 8)`, then the outliers in storage order).
//! `axpy_rows` goes row by row (no tiled kernel as for `Q4_0` on AVX2).
//! `matmul` dequantizes rows into its f32 tile as for every format.
//!
//! # Sparse kernels
//!
//! For FFNs where only the neurons predicted to fire are computed
//! (PowerInfer / PowerInfer-2), the `sparse` module provides:
//!
//! * [`matvec_rows`]: `y[i] = dot(W[rows[i]], x)` over a list of rows
//!   (`mul_mat_idx`), using the same per-row dot kernels as [`matvec`] in
//!   every [`Precision`] (bit-identical to `matvec` for all rows in order),
//!   parallel over chunks of the row list;
//! * [`axpy_rows`]: `y += Σ coeffs[i] · W_t[rows[i]]` for the transposed
//!   down projection (fused dequantize + FMA per row, parallel over column
//!   ranges of `y`);
//! * [`gate_up_sparse`]: gate rows first, then up rows only where
//!   `|act(gate)|` exceeds a threshold ([`Activation::Silu`] or
//!   [`Activation::Relu`]).
//!
//! Row lists may be unsorted; out-of-range rows are errors.
//!
//! # KV caches
//!
//! [`attend_cache`] runs one query head over a KV cache held in chunks of positions
//! ([`KvChunks`]) in a [`KvFormat`]: `F32`, `F16` or `Q8_0` (ggml's `block_q8_0`: an f16 scale and
//! 32 `i8` per 32 elements). Rows are written by [`kv_encode`] (one scalar encoder for every path)
//! and read in place: AVX2 converts f16 with F16C, NEON with `fcvtl`/`fcvtl2`, and `q8_0` quants are
//! widened to f32 and scaled once per block; the scalar reference is in `kv.rs`. An `F32` cache sums
//! in the order of [`attend`], so it gives the same bits (`tests/it/attention_cache.rs`).
//!
//! # Precision
//!
//! [`Precision`] only affects [`matvec`] on the block-quantized formats
//! (`Q8_0`, `Q4_0`, `Q4_1`, `Q5_0`, `Q5_1`, `IQ4_NL`, `Q2_K`, `Q3_K`, `Q4_K`, `Q5_K`, `Q6_K`,
//! `IQ4_XS`), and for `F16` weights: outside `Exact` their activations are rounded to f16 once per
//! call (as llama.cpp's CPU backend takes them for F16 weights), each product then exact and
//! summed in f32, on every path; where the CPU multiplies f16 (aarch64 with FEAT_FHM: `fmlal`,
//! `arch/aarch64/matvec_half.rs`) that halves a row's arithmetic, elsewhere the float kernel runs
//! on the rounded values (the same bits on aarch64). Activations past f16's range (±65504) stay
//! f32. `F32`, `BF16` and `I4Hybrid` use the exact f32 path in every precision. [`matmul()`] (a
//! prompt, `n > 1`) uses the dequantized f32 tile with a register-blocked FMA
//! microkernel in `Exact`, and in `Fast` and `Int8` an integer tile where the
//! path has one for the format, which gives each token the integer products of
//! `matvec` in `Fast` or `Int8` (x86_64: Q4_K/Q5_K/Q6_K prompts, and Q2_K/Q3_K
//! ones, take `Int8`'s 8-bit products in `Int8`, and in `Fast` from `INT_TILE_MIN_TOKENS`
//! tokens, as llama.cpp's prompts do; on AVX-512 Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/IQ4_NL/IQ4_XS ones
//! from that many tokens take the 8-bit tile in `Int8`, and in `Fast` for Q5_0 and Q8_0
//! ([`fast_prompts_int8`]: the formats whose 8-bit prompts kept a real model's
//! perplexity), the 16-bit tile in `Fast` for the others; on AVX2, and on aarch64 with dotprod,
//! Q4_0 and Q4_1 `Fast` ones take the 8-bit tile with activations of one scale per 16
//! ([`fast_prompts_halves`])). Elsewhere it takes the f32 tile, but in `Int8`
//! on the [`KernelPath::Avx512`] path with BF16, where the tile and the
//! activations are rounded to bf16 (8 significant bits, the class of `Int8`'s
//! 8-bit activations) and multiplied by `vdpbf16ps` at twice the f32 tile's
//! rate.
//!
//! * [`Precision::Exact`]: weights are dequantized to f32 block by block and
//!   multiplied with the f32 activations, accumulating in f32. Reference
//!   accuracy (f32 rounding only); the slowest when compute-bound.
//! * [`Precision::Fast`] (the default fast mode): the activation vector is
//!   quantized once per call to **16 bits** per 32-element block (f32 scale
//!   `d = amax/32639`, round to nearest with ties to even, identical on all
//!   paths, plus `s = d*sum(q)` for Q4_1's `m` term). Weight quants are
//!   widened to i16 and multiplied with integer multiply-adds into i32
//!   (AVX2 `vpmaddwd`, NEON `smull`/`smlal`), then scaled once per block by
//!   `d_w*d_x`. Each activation is off by at most `amax_block/65278`, 257
//!   times less than with 8 bits (the quants stop at 32639 = 127 · 257, not
//!   32767, so that the aarch64 kernels split each into two signed bytes:
//!   `arch/aarch64/matvec_split.rs`), which is below the f32-level noise of a
//!   transformer decode step: greedy continuations stay identical to an f32
//!   reference. Measured single-threaded on x86_64 AVX2 (SmolLM2-135M
//!   shapes, `benches/kernels.rs`): Q4_1 576×576, 1536×576, 576×1536
//!   (cache-resident) at 1.6-1.7x the throughput of `Exact` and 75-85% of
//!   `Int8`; the streaming Q8_0 49152×576 output matrix at 1.25x `Exact`
//!   (and slightly above `Int8`). Every quantized format therefore uses
//!   the integer kernel in `Fast` (none falls back to `Exact`). The NEON
//!   kernel (`smull`/`smlal`, 2 rows per iteration) is tested under qemu;
//!   its speed has not been measured on a phone yet. With `dotprod`, the
//!   32-element block formats and Q4_K/Q5_K/Q6_K take the same integer
//!   products by `sdot`/`udot` instead: each 16-bit quant split exactly
//!   into a signed high and an unsigned low byte (`x = 256 hi + lo`),
//!   the weight quants unsigned, their offsets taken back per block
//!   (`arch/aarch64/matvec_split.rs`, `kquant_split.rs`); only the f32
//!   order of each block's lanes differs.
//! * [`Precision::Int8`]: llama.cpp style 8-bit activations (scale
//!   `d = amax/127`, ties to even, `s = d*sum(q)`) and 8-bit integer dot
//!   products (`vec_dot_q4_0_q8_0` family; AVX2 `maddubs`, NEON `smull` or
//!   `sdot` with the `dotprod` extension). The fastest mode, but each
//!   activation is off by up to `amax_block/254`: on a 576-wide model
//!   (SmolLM2-135M, Q4_1) the decode logits drift by up to ~1.0 from f32,
//!   which flips greedy tokens.
//! * [`Precision::Ggml`]: llama.cpp's roundings on its CPU path, for comparisons with it: 8-bit
//!   activations in ggml's `vec_dot_type` of each format (`block_q8_0`/`block_q8_1`, the scale
//!   `amax/127` rounded to f16, for the 32-element formats; `block_q8_K`, the f32 scale
//!   `1/(127/amax)` per 256, for the K-quants and `IQ4_XS`) through `Int8`'s kernels, and [`matmul()`]
//!   as one `matvec` per token (llama.cpp quantizes a batch's rows as one). With it the engine
//!   uses [`attend_cache_span_ggml`] (f16 query and softmax weights), [`RopeAngles::new_ggml`]
//!   and [`rms_norm_ggml`]. Products equal llama.cpp's up to f32 summation order; the slowest
//!   quantized mode.
//!
//! # Example
//!
//! ```
//! use kernels_neon::{matvec, Precision, QMatrix, WeightFormat};
//!
//! // A 2 × 32 Q8_0 matrix: row 0 is all 1.0, row 1 all -0.5.
//! let mut data = Vec::new();
//! for (scale, q) in [(1.0f32, 1i8), (0.5, -1)] {
//!     data.extend_from_slice(&half::f16::from_f32(scale).to_le_bytes());
//!     data.extend(std::iter::repeat(q as u8).take(32));
//! }
//! let w = QMatrix::new(WeightFormat::Q8_0, 2, 32, &data).unwrap();
//! let x = vec![2.0f32; 32];
//! let mut y = vec![0.0f32; 2];
//! matvec(&w, &x, &mut y, Precision::Exact).unwrap();
//! assert_eq!(y, [64.0, -32.0]);
//! ```
//!
//! # Invariants
//!
//! * Every SIMD path is checked against the scalar reference (and a float64
//!   reference) by the property tests in `tests/`.
//! * No panics on caller input: every length or shape mismatch is returned as
//!   a [`KernelError`] (the vector helpers `dot_f32`, `axpy_f32`, `rms_norm`,
//!   ... work on the common prefix of their arguments instead).
//! * No `target-cpu=native`: SIMD code is compiled with `#[target_feature]`
//!   and only called after run-time detection.
//! * Every `unsafe` block carries a `// SAFETY:` comment.
//!
//! K-quants in the integer paths: activations keep their 32-element blocks.
//! A `Q4_K` or `Q5_K` sub-block (32 wide) is exactly one activation block: per block
//! the i32 sum of `q_w * q_x` is scaled by `(d*sc) * d_x`, and the min term
//! is `(dmin*m) * s_x` with `s_x = d_x * sum(q_x)`. A `Q6_K` sub-block (16
//! wide, signed scale) is half an activation block, scaled by
//! `(d*sc) * d_x` on its own, and so is a `Q3_K` sub-block (16 wide, scale
//! `d*(ls - 32)`). A `Q2_K` sub-block (16 wide) is scaled by `(d*sc) * d_x`, and its min
//! term is `(dmin*m) * d_x * Σ q_x` over its 16 activation quants (`s_x` covers 32). An
//! `IQ4_XS` sub-block (32 wide) is one activation block scaled by `d*(ls - 32) * d_x`. The error bounds of [`Precision::Fast`] and
//! [`Precision::Int8`] below hold unchanged.
//!
//! Other block formats are meant to slot in as new
//! [`WeightFormat`] variants with a scalar implementation in `scalar/` and
//! optional SIMD versions in `arch/`.

use rayon::prelude::*;

mod act;
mod arch;
mod attention;
mod attention_block;
mod batch;
mod experts;
mod experts_packed;
mod gated;
mod half_acts;
mod kv;
mod matmul;
mod matmul_t;
mod out_rows;
mod path;
mod product;
mod q40x8;
mod q40x8_many;
mod quant;
mod quant_api;
mod quantize;
mod quantize_k;
mod requantize;
mod rope;
mod scalar;
mod sparse;
mod vector;

pub use act::{act_mul_inplace, act_value, gelu_mul_inplace, gelu_value};
pub use attention::{
    attend, attend_cache, attend_cache_span, attend_cache_span_ggml, attend_cache_span_with,
    attend_cache_with, attend_with, KvChunks, KvLayout,
};
pub use attention_block::{
    attend_cache_block_with, attend_head, attend_head_span, attend_head_span_with,
    attend_head_with, HeadCache,
};
pub use batch::{matvec_batch, matvec_batch_many};
#[doc(hidden)]
pub use batch::{matvec_batch_many_with, matvec_batch_with, set_batch_kquants};
#[doc(hidden)]
pub use experts::experts_ffn_with;
pub use experts::{experts_ffn, ExpertCopies, ExpertJob, ExpertsScratch};
#[doc(hidden)]
pub use experts_packed::experts_ffn_packed_with;
pub use experts_packed::{experts_ffn_packed, PackedExpertJob};
pub use gated::matvec_gated;
#[doc(hidden)]
pub use gated::matvec_gated_with;
pub use kv::{kv_decode, kv_encode, KvFormat, KV_Q8_BLOCK};
pub use matmul::matmul;
#[doc(hidden)]
pub use matmul::matmul_with;
#[doc(hidden)]
pub use matmul::{
    fast_prompts_halves, fast_prompts_int8, halves_min_tokens, short_prompt_tokens,
    INT_TILE_MIN_TOKENS,
};
#[doc(hidden)]
pub use matmul_t::matmul_t_with;
pub use matmul_t::{matmul_t, matmul_t_scratch_bytes};
pub use path::{active_path, arch_name, available_paths, cpu_features, set_chunk_rows, KernelPath};
pub(crate) use path::{chunk_rows_setting, matmul_chunk, matvec_chunk};
pub use q40x8::{CopiedRows, CopyBytes, Q40x8, ZeroedBytes};
#[doc(hidden)]
pub use quant_api::{
    quantize_acts_ggml_with, quantize_acts_i16_with, quantize_acts_i8_halves_with,
    quantize_acts_i8_super_with, quantize_acts_i8_with,
};
pub use quantize::{quantize_matrix, quantize_row};
pub use requantize::requantize_rows;
pub use rope::{rope_inplace, RopeAngles, RopeStyle};
pub use sparse::*;
pub use vector::*;

pub(crate) use half_acts::HalfActs;
use quant::QActs;
#[doc(hidden)]
pub use quant::{QActs16, QBlocks};

/// Bytes before the nibbles of an [`WeightFormat::I4Hybrid`] row (two f32 scales).
pub(crate) use tensor_types::hybrid::HEADER as HYBRID_HEADER;
pub use tensor_types::{Activation, LayoutError, Precision, QMatrix, WeightFormat};

/// Errors of the kernel API (shape and length mismatches).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KernelError {
    /// Bytes or shapes that do not fit the weight format (`tensor_types::LayoutError`: ragged columns,
    /// wrong byte length, size overflow, a hybrid outlier outside its row).
    #[error(transparent)]
    Layout(#[from] LayoutError),
    /// An f32 slice has the wrong number of elements.
    #[error("{what}: expected {expected} elements, got {actual}")]
    LengthMismatch {
        /// Which argument.
        what: &'static str,
        /// Expected element count.
        expected: usize,
        /// Actual element count.
        actual: usize,
    },
    /// A row index of a sparse kernel's row list is out of range.
    #[error("{what}: row {row} out of range (matrix has {rows} rows)")]
    RowOutOfRange {
        /// Which argument.
        what: &'static str,
        /// Offending row index.
        row: usize,
        /// Number of rows of the matrix.
        rows: usize,
    },
    /// The requested kernel path is not available on this machine.
    #[error("kernel path {0:?} is not available on this machine")]
    PathUnavailable(KernelPath),
    /// An operation does not support this weight format.
    #[error("{what}: format {format:?} is not supported")]
    Unsupported {
        /// Which operation.
        what: &'static str,
        /// The format asked for.
        format: WeightFormat,
    },
    /// An input holds a NaN or an infinity where a finite value is needed.
    #[error("{what}: element {index} is not finite")]
    NonFinite {
        /// Which argument.
        what: &'static str,
        /// Index of the first non-finite element.
        index: usize,
    },
}

fn check_len(what: &'static str, expected: usize, actual: usize) -> Result<(), KernelError> {
    if expected == actual {
        Ok(())
    } else {
        Err(KernelError::LengthMismatch {
            what,
            expected,
            actual,
        })
    }
}

/// `x` holds `n` rows of `w.cols()` and `y` `n` rows of `w.rows()` (token-major), without overflow.
fn check_tokens(
    what: [&'static str; 2],
    w: &QMatrix,
    x: &[f32],
    n: usize,
    y: &[f32],
) -> Result<(), KernelError> {
    let (rows, cols) = (w.rows(), w.cols());
    let x_len = n
        .checked_mul(cols)
        .ok_or(KernelError::Layout(LayoutError::Overflow { rows: n, cols }))?;
    let y_len = n
        .checked_mul(rows)
        .ok_or(KernelError::Layout(LayoutError::Overflow {
            rows: n,
            cols: rows,
        }))?;
    check_len(what[0], x_len, x.len())?;
    check_len(what[1], y_len, y.len())
}

fn check_path(path: KernelPath) -> Result<(), KernelError> {
    if path.is_available() {
        Ok(())
    } else {
        Err(KernelError::PathUnavailable(path))
    }
}

/// Dequantizes one row: `dst.len()` elements from `src`, which must hold
/// exactly `format.row_bytes(dst.len())` bytes.
pub fn dequantize_row(
    format: WeightFormat,
    src: &[u8],
    dst: &mut [f32],
) -> Result<(), KernelError> {
    dequantize_row_with(active_path(), format, src, dst)
}

/// [`dequantize_row`] on an explicit path (for tests and benchmarks).
#[doc(hidden)]
pub fn dequantize_row_with(
    path: KernelPath,
    format: WeightFormat,
    src: &[u8],
    dst: &mut [f32],
) -> Result<(), KernelError> {
    check_path(path)?;
    let expected =
        format
            .row_bytes(dst.len())
            .ok_or(KernelError::Layout(LayoutError::RaggedCols {
                format,
                cols: dst.len(),
                block_len: format.block_len(),
            }))?;
    if src.len() != expected {
        return Err(KernelError::Layout(LayoutError::DataLength {
            what: "dequantize_row src",
            expected,
            actual: src.len(),
        }));
    }
    scalar::hybrid_check(format, dst.len(), src)?;
    arch::dequant_row(path, format, src, dst);
    Ok(())
}

/// `y[r] = dot(W[r], x)` for all rows. `x.len() == cols`, `y.len() == rows`.
///
/// Parallel over row chunks with rayon, in whatever pool the caller runs in.
pub fn matvec(
    w: &QMatrix,
    x: &[f32],
    y: &mut [f32],
    precision: Precision,
) -> Result<(), KernelError> {
    matvec_with(active_path(), w, x, y, precision)
}

/// [`matvec`] on an explicit path (for tests and benchmarks).
#[doc(hidden)]
pub fn matvec_with(
    path: KernelPath,
    w: &QMatrix,
    x: &[f32],
    y: &mut [f32],
    precision: Precision,
) -> Result<(), KernelError> {
    check_path(path)?;
    check_len("matvec x", w.cols(), x.len())?;
    check_len("matvec y", w.rows(), y.len())?;
    if w.cols() == 0 {
        y.fill(0.0);
        return Ok(());
    }
    let acts = Acts::new(path, w.format(), x, precision);
    let chunk = matvec_chunk(w.rows());
    if w.rows() <= chunk {
        acts.run(path, w, arch::Rows::From(0), x, y);
    } else {
        y.par_chunks_mut(chunk)
            .enumerate()
            .for_each(|(i, ys)| acts.run(path, w, arch::Rows::From(i * chunk), x, ys));
    }
    Ok(())
}

/// Several products of one vector: `ys[i][r] = dot(ws[i][r], x)`, the
/// same as one [`matvec`] per matrix (bit for bit) but with `x` quantized
/// once per activation form and a single parallel region over the rows of
/// all matrices. A decode step uses it for the q/k/v projections and for
/// gate/up, which read the same normed vector: fewer fork-joins per token.
/// Every matrix must have `x.len()` columns and `ys[i].len() == ws[i].rows()`.
pub fn matvec_many(
    ws: &[&QMatrix],
    x: &[f32],
    ys: &mut [&mut [f32]],
    precision: Precision,
) -> Result<(), KernelError> {
    matvec_many_with(active_path(), ws, x, ys, precision)
}

/// [`matvec_many`] on an explicit path (for tests and benchmarks).
#[doc(hidden)]
pub fn matvec_many_with(
    path: KernelPath,
    ws: &[&QMatrix],
    x: &[f32],
    ys: &mut [&mut [f32]],
    precision: Precision,
) -> Result<(), KernelError> {
    check_path(path)?;
    check_len("matvec_many outputs", ws.len(), ys.len())?;
    for (w, y) in ws.iter().zip(ys.iter()) {
        check_len("matvec_many x", w.cols(), x.len())?;
        check_len("matvec_many y", w.rows(), y.len())?;
    }
    // One set of activations per distinct form (usually one for all).
    let mut acts: Vec<Acts> = Vec::new();
    let mut which = Vec::with_capacity(ws.len());
    for w in ws {
        match acts
            .iter()
            .position(|a| a.fits(path, w.format(), precision))
        {
            Some(i) => which.push(i),
            None => {
                which.push(acts.len());
                acts.push(Acts::new(path, w.format(), x, precision));
            }
        }
    }
    let total: usize = ws.iter().map(|w| w.rows()).sum();
    let chunk = matvec_chunk(total);
    let mut items: Vec<(usize, usize, &mut [f32])> = Vec::new();
    for (i, y) in ys.iter_mut().enumerate() {
        for (c, ys) in y.chunks_mut(chunk).enumerate() {
            items.push((i, c * chunk, ys));
        }
    }
    let run = |(i, r0, ys): (usize, usize, &mut [f32])| {
        let w = ws[i];
        if w.cols() == 0 {
            ys.fill(0.0);
        } else {
            acts[which[i]].run(path, w, arch::Rows::From(r0), x, ys);
        }
    };
    if items.len() <= 1 {
        items.into_iter().for_each(run);
    } else {
        items.into_par_iter().for_each(run);
    }
    Ok(())
}

/// Whether 8-bit activations for weights of `format` take one scale per 256-element super-block
/// ([`QActs::quantize_super`], llama.cpp's `Q8_K` granularity): the K-quants whose kernels weight
/// each sub-block's integer sum by its integer scale (`arch/x86_64/kquant_super.rs` on AVX2; the
/// other paths' kernels take any per-block scales).
fn super_scaled(format: WeightFormat) -> bool {
    matches!(
        format,
        WeightFormat::Q4_K | WeightFormat::Q5_K | WeightFormat::Q6_K
    )
}

/// Whether [`Precision::Fast`] decode (`matvec`, and so `matvec_batch`, whose tokens each get
/// `matvec`'s bits) of `format` takes `Int8`'s 8-bit activations on `path`: on no path and for no
/// format now. `Fast` promises exact mode's greedy text, and every format tried with 8 bits in
/// `Fast` decode lost it where 16 bits keep it, on SmolLM2-135M-Instruct re-quantized by
/// `llama-quantize --allow-requantize` (7 prompts, AVX2 unless said): Q3_K (the `ffn_down` of the
/// `Q2_K` mix, whose other tensors fall back to Q4_0: 576 columns are no multiple of 256) 3 of 7
/// with 8 bits, 7 with 16 (max |dlogit| against exact mode 0.15-0.59 against 0.004-0.011 over 24
/// steps); Q2_K (`--tensor-type ffn_down=q2_k`) 3 of 7 against 7; IQ4_XS 5 of 7 against 7;
/// Q4_K/Q5_K/Q6_K one of Qwen2.5-Coder-0.5B Q4_K_M's 8 reference continuations changed; Q4_0 on
/// AVX-512 (`--requant q4_0`) 4 of 7 against 7. Eight bits for the FFN's gate and up alone (their
/// input is RMS-normed; down kept 16 bits) lost it too (2026-12-04, 9 prompts, 48 tokens: SmolLM2
/// Q4_1 7 of 9 on AVX-512 and 6 of 9 on AVX2, `--requant q4_0` 6 of 9, against 9 and 8 of 9 with 16
/// bits), so no per-matrix split either. The 8-bit kernels were faster for Q2_K/Q3_K on
/// AVX2 (1.5x less decode time on SYNTHETIC files) and Q4_0 on AVX-512 (1.3x on the SYNTHETIC
/// OLMoE-shaped model; docs/benchmarks/dense-vs-llama.md and moe.md, 2026-12-03); `--int8` takes
/// them. Kept as the one place a format would be switched back.
#[doc(hidden)]
pub fn fast_decode_int8(_path: KernelPath, _format: WeightFormat) -> bool {
    false
}

/// The precision of `matvec`'s products for weights of `format` on `path` in `precision`:
/// `Int8` for the `Fast` ones of [`fast_decode_int8`], else `precision`.
#[doc(hidden)]
pub fn matvec_precision(path: KernelPath, format: WeightFormat, precision: Precision) -> Precision {
    match precision {
        Precision::Fast if fast_decode_int8(path, format) => Precision::Int8,
        p => p,
    }
}

/// Whether `path` multiplies f16 activations directly ([`HalfActs`]'s bits): the aarch64 paths
/// where the CPU has FEAT_FHM.
pub(crate) fn half_kernel(path: KernelPath) -> bool {
    matches!(
        path,
        KernelPath::Neon | KernelPath::NeonDotprod | KernelPath::NeonI8mm
    ) && arch::has_fhm()
}

/// Activations of one `matvec` call in the form its kernel needs.
pub(crate) enum Acts {
    /// f32 as given (exact path, and float weight formats).
    F32,
    /// Rounded to f16, for F16 weights outside [`Precision::Exact`] (`None`: some value past
    /// f16's range, the f32 as given instead).
    F16(Option<HalfActs>),
    /// 16-bit quantized ([`Precision::Fast`]), and what the path derives from them once
    /// (`arch::Prep16`).
    I16(QActs16, arch::Prep16),
    /// 8-bit quantized ([`Precision::Int8`]), and what the path derives from them once
    /// (`arch::Prep8`).
    I8(QActs, arch::Prep8),
}

impl Acts {
    /// Quantizes `x` (once per call) as `precision` requires for `format`.
    pub(crate) fn new(
        path: KernelPath,
        format: WeightFormat,
        x: &[f32],
        precision: Precision,
    ) -> Self {
        match matvec_precision(path, format, precision) {
            Precision::Exact => Acts::F32,
            _ if format == WeightFormat::F16 => Acts::F16(HalfActs::new(x, half_kernel(path))),
            // Hybrid rows take the f32 path in every precision (see the
            // crate docs).
            _ if !format.is_quantized() || format.is_hybrid() => Acts::F32,
            Precision::Fast => Acts::I16(QActs16::quantize(path, x), arch::Prep16::default()),
            Precision::Int8 if super_scaled(format) => {
                Acts::I8(QActs::quantize_super(path, x), arch::Prep8::default())
            }
            Precision::Int8 => Acts::I8(QActs::quantize(path, x), arch::Prep8::default()),
            Precision::Ggml => Acts::I8(
                QActs::quantize_ggml(path, format, x),
                arch::Prep8::default(),
            ),
        }
    }

    /// Whether these activations suit weights of `format` in `precision`
    /// (so a second matrix can reuse them).
    pub(crate) fn fits(
        &self,
        path: KernelPath,
        format: WeightFormat,
        precision: Precision,
    ) -> bool {
        let precision = matvec_precision(path, format, precision);
        if format == WeightFormat::F16 && precision != Precision::Exact {
            return matches!(self, Acts::F16(_));
        }
        matches!(
            (
                self,
                format.is_quantized() && !format.is_hybrid(),
                precision
            ),
            (Acts::F32, false, _)
                | (Acts::F32, true, Precision::Exact)
                | (Acts::I16(..), true, Precision::Fast)
                | (Acts::I8(..), true, Precision::Int8 | Precision::Ggml)
        ) && match self {
            Acts::I8(q, _) if precision == Precision::Ggml => {
                q.per_super == quant::ggml_super(format)
            }
            Acts::I8(q, _) => q.per_super == super_scaled(format),
            _ => true,
        }
    }

    /// `ys[i] = dot(W[sel.get(i)], x)` with the per-row kernel of `path`.
    pub(crate) fn run(
        &self,
        path: KernelPath,
        w: &QMatrix,
        sel: arch::Rows<'_>,
        x: &[f32],
        ys: &mut [f32],
    ) {
        match self {
            Acts::F32 | Acts::F16(None) => arch::matvec_exact(path, w, sel, x, ys),
            Acts::F16(Some(h)) => arch::matvec_half(path, w, sel, h, ys),
            Acts::I16(q, prep) => arch::matvec_i16(path, w, sel, q, prep, ys),
            Acts::I8(q, prep) => arch::matvec_int8(path, w, sel, q, prep, ys),
        }
    }

    /// `outs[t][i] = dot(W[r0 + i], x_t)` for the tokens' activations `acts` (`x` their f32
    /// activations, token-major): the path's 8-bit batch kernel where it has one for `w`
    /// (`arch::matvec_int8_batch`, each token bit for bit [`Acts::run`]'s), else `run` per token.
    pub(crate) fn run_tokens(
        acts: &[Acts],
        path: KernelPath,
        w: &QMatrix,
        r0: usize,
        x: &[f32],
        outs: &mut [&mut [f32]],
    ) {
        let i8s: Option<Vec<(&QActs, &arch::Prep8)>> = acts
            .iter()
            .map(|a| match a {
                Acts::I8(q, p) => Some((q, p)),
                _ => None,
            })
            .collect();
        if let Some(q) = i8s.filter(|q| q.len() > 1) {
            if arch::matvec_int8_batch(path, w, r0, &q, outs) {
                return;
            }
        }
        let cols = w.cols();
        for (t, (a, ys)) in acts.iter().zip(outs.iter_mut()).enumerate() {
            a.run(
                path,
                w,
                arch::Rows::From(r0),
                &x[t * cols..(t + 1) * cols],
                ys,
            );
        }
    }
}
