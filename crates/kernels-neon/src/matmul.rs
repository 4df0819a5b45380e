//! The batched product of a prompt's tokens ([`matmul`]): an f32 tile of dequantized weights under
//! a register-blocked FMA microkernel, or, for quantized activations where the path has one, an
//! integer tile over the weights as stored (`arch::tile_int8`, `arch::tile_i16`).

use rayon::prelude::*;

use crate::out_rows::OutPtr;
use crate::quant::{QActs, QActs16};
use crate::{
    active_path, arch, check_path, check_tokens, matmul_chunk, matvec_batch_with, matvec_with,
    KernelError, KernelPath, Precision, QMatrix, WeightFormat,
};

/// Batched product: `x` is `n` rows of `cols` (token-major), `y` is `n` rows
/// of `rows`: `y[t*rows + r] = dot(W[r], x[t])`.
///
/// Each parallel work item dequantizes a chunk of weight rows once into an
/// f32 tile and runs a register-blocked FMA microkernel over (rows × tokens).
/// For `n == 1` this is [`matvec`](crate::matvec). Integer tiles take every token's activations
/// quantized as `matvec` quantizes them in some precision, and the weights as stored, so each
/// token's row of `y` is what `matvec` in that precision gives for it up to f32 summation order:
/// - the 8-bit tiles, `matvec`'s [`Precision::Int8`] products: Q4_K/Q5_K/Q6_K weights on the AVX2
///   path and the AVX-512 one (one activation scale per 256, llama.cpp's `Q8_K`), and Q2_K/Q3_K
///   on both (one per 32, as their `matvec_int8`), for
///   `Int8` prompts and for [`Precision::Fast`] ones from [`INT_TILE_MIN_TOKENS`] tokens; the
///   32-block formats Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/IQ4_NL (and IQ4_XS's sub-blocks of 32) on the
///   AVX-512 path and Q4_0/Q4_1/Q5_0/Q5_1 on the AVX2
///   one (one scale per 32, llama.cpp's `Q8_0`), from that many tokens, for `Int8` prompts and for `Fast` ones of Q5_0/Q8_0
///   ([`fast_prompts_int8`]); on aarch64 the K-quants' and the 32-block formats' (with dotprod
///   `sdot`, rows in the lanes; with i8mm `smmla`, and `sdot` for Q2_K/Q3_K). A prompt is bound
///   by compute, where 8 bits give twice the products per instruction of 16 (decode, bound by
///   memory, keeps `Fast`'s 16 bits). `Fast` prompts of Q4_0 and Q4_1 (and of IQ4_NL and IQ4_XS
///   on AVX-512) take the 8-bit tile with activations of one scale per 16 instead, from
///   [`halves_min_tokens`] ([`fast_prompts_halves`]);
/// - the 16-bit tile, from [`short_prompt_tokens`] tokens (16-bit activations, one scale per 32;
///   `matvec`'s `Fast`): on the AVX-512 path `Fast` prompts of Q5_1, on the AVX2 path those and
///   Q8_0's, IQ4_NL's and IQ4_XS's (no 8-bit tile for them there), on
///   [`KernelPath::NeonDotprod`] and [`KernelPath::NeonI8mm`] those and, below
///   [`INT_TILE_MIN_TOKENS`], Q5_0's, Q8_0's and those of Q2_K..Q5_K.
///
/// Below [`short_prompt_tokens`] tokens (32 on x86, 8 elsewhere), `Fast` prompts of the quantized
/// formats (and of F16 on aarch64 with FEAT_FHM) are a decode step's products
/// ([`crate::matvec_batch`], each token's `matvec` bits).
/// Elsewhere `Fast` and `Exact` prompts take the f32 tile, and `Int8` ones the bf16 tile where the
/// path has one. [`Precision::Ggml`] prompts are one `matvec` per token (llama.cpp's roundings).
pub fn matmul(
    w: &QMatrix,
    x: &[f32],
    n: usize,
    y: &mut [f32],
    precision: Precision,
) -> Result<(), KernelError> {
    matmul_with(active_path(), w, x, n, y, precision)
}

/// Fewest tokens for which [`matmul`] takes the 16-bit integer tile (`arch::tile_i16`) and the
/// 32-block formats' 8-bit one, and for which `Fast` prompts of the K-quants take the 8-bit one
/// (`arch::tile_int8`); below it `Fast` prompts of the quantized formats run the decode kernels on
/// x86 ([`short_prompt_tokens`], [`crate::matvec_batch`]: 2-8 tokens 3-9x the f32 tile's rate, 31
/// tokens 1.1-1.4x, every 32-block format and Q4_K/Q6_K, AVX-512 and AVX2, 2 threads, 2026-12-05,
/// `examples/batch_rate.rs` with `MATMUL=1`; the f32 tile dequantizes the whole matrix for any
/// token count):
/// - below it, repacking the rows for the 16-bit tile costs more than the tile saves (K-quant rows
///   in that tile were 0.6-0.9x of the f32 tile's rate at 2-32 tokens, 1.1-1.5x from 64, one
///   2-thread run of `examples/tile_n.rs`);
/// - the 8-bit tile is faster than the f32 one from 2 tokens (1.7x at 2-16 on AVX-512), but short
///   prompts (chat turns, the reference's prompts of 4-16 tokens) keep 16-bit products, decode's:
///   with 8-bit ones from 2 tokens one of Qwen2.5-Coder-0.5B's 32-token greedy continuations in
///   `engine/tests/it/reference_qwen.rs` changed after 27 identical tokens. Where the prompt's
///   time counts, from 32 tokens, K-quant rows take 8 bits, as llama.cpp's prompts always do
///   (Qwen2.5-Coder-0.5B's perplexity over 16 windows of 512 tokens of WikiText-2 test: 39.3977,
///   against 39.3726 with 16 bits and the reference's 39.3745; docs/BENCHMARKS.md).
#[doc(hidden)]
pub const INT_TILE_MIN_TOKENS: usize = 32;

/// Fewest tokens of a [`Precision::Fast`] prompt of quantized weights that [`matmul`] runs on a
/// tile on `path`; shorter ones are a decode step's products ([`crate::matvec_batch`]). On x86
/// [`INT_TILE_MIN_TOKENS`]; elsewhere 8: on aarch64 the decode kernels execute as many
/// instructions a token in a batch as alone, and the f32 tile's cost of dequantizing the matrix
/// is paid back from about 8 tokens (SmolLM2-135M, one thread, guest instructions under
/// `qemu-aarch64 -cpu max` beyond a 1-token prompt's, f32 tile against decode's products: 2
/// tokens 295M against 107M, 4 374M against 257M, 8 576M against 561M, 10 698M against 710M, 16
/// 980M against 1161M; `-cpu cortex-a76` alike, 2026-12-05).
#[doc(hidden)]
pub fn short_prompt_tokens(path: KernelPath) -> usize {
    match path {
        KernelPath::Avx2Fma | KernelPath::Avx512 => INT_TILE_MIN_TOKENS,
        _ => 8,
    }
}

/// Whether a [`Precision::Fast`] product of `n` tokens with weights of `format` on `path` may take
/// the 16-bit tile (`arch::tile_i16`): from [`short_prompt_tokens`] tokens, where the path has it
/// for the format ([`matmul_with`] after its 8-bit tile; an MoE prompt's expert groups too).
pub(crate) fn takes_tile_i16(path: KernelPath, format: WeightFormat, n: usize) -> bool {
    n >= short_prompt_tokens(path) && arch::has_tile_i16(path, format)
}

/// Whether [`Precision::Fast`] prompts of `format` from [`INT_TILE_MIN_TOKENS`] tokens take 8-bit
/// activations (`matvec`'s `Int8` products) where the path has an 8-bit tile for it: the formats
/// for which that kept a real model's perplexity within 0.05 of the reference's (16 windows of
/// 512 tokens of WikiText-2 test; docs/BENCHMARKS.md): Q4_K, Q5_K, Q6_K, Q5_0 and Q8_0
/// (Qwen2.5-Coder-0.5B Q4_K_M: 39.3949 against the reference's 39.3745 and 39.3726 with 16 bits;
/// SmolLM2-135M's Q8_0 embedding, its output projection: 29.6336 against 29.6018 and 29.6020).
/// Not Q4_1: SmolLM2-135M's Q4_1 tensors took it to 29.6974, so Q4_1 and Q5_1 keep 16 bits (on x86
/// and aarch64 with dotprod Q4_0 and Q4_1 take 8 bits with a scale per 16: [`fast_prompts_halves`]);
/// nor
/// Q4_0: SmolLM2-135M re-quantized to it (`--requant q4_0`) measured 34.5047 with 8-bit prompts
/// against 34.4358 with 16 bits and exact mode's 34.3975 (2026-12-04); nor IQ4_NL and IQ4_XS
/// (AVX-512's 8-bit tile takes them in `Int8`, and since stop 90 in `Fast` with a scale per 16:
/// [`fast_prompts_halves`]): SmolLM2-135M and Qwen2.5-Coder-0.5B re-quantized
/// to them (`llama-quantize --allow-requantize --tensor-type ffn_down=iq4_xs --tensor-type
/// attn_v=iq4_nl ... IQ4_XS`: IQ4_NL where the columns are no multiple of 256) measured 35.8563
/// with 8-bit prompts against 35.7903 with 16 bits and exact mode's 35.7606 (SmolLM2), and 40.9685
/// against 41.0111 and 41.0316 (Qwen; 2026-12-06). Q2_K and Q3_K (an 8-bit tile on x86, and on
/// aarch64 with dotprod since stop 79) follow the other K-quants and llama.cpp, whose prompts of every K-quant take 8 bits, and were
/// measured on x86 with their `ffn_down` re-quantized to them (`--token-embedding-type f16
/// --tensor-type ffn_down=q3_k ... IQ4_NL`, whose other tensors keep 16 bits): SmolLM2-135M's Q3_K
/// 39.5002 against exact mode's 39.4576; Qwen2.5-Coder-0.5B's Q2_K 45.3051 against 45.2892
/// (SmolLM2's Q2_K, 187.2357 against 186.3798, is a broken model: 35.76 with IQ4 weights). The
/// same test of Q4_K/Q5_K/Q6_K on SmolLM2 (one activation scale per 256) misses the rule: 33.5903
/// against 33.5028, 33.6863 against 33.6223, 33.7772 against 33.6950 (2026-12-06; kept, as
/// llama.cpp's prompts take the same `Q8_K` activations: one scale per 32, as Q2_K/Q3_K's tile
/// takes, is what would be tried next).
#[doc(hidden)]
pub fn fast_prompts_int8(format: WeightFormat) -> bool {
    use WeightFormat::*;
    matches!(format, Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | Q5_0 | Q8_0)
}

/// Whether [`Precision::Fast`] prompts of `format` on `path` from [`halves_min_tokens`] tokens
/// take 8-bit activations of one scale per 16 (`QActs::quantize_halves`) on the 8-bit tile, where
/// [`fast_prompts_int8`] keeps 16 bits: Q4_0 and Q4_1 on AVX2 (`tile_i8`, about as many
/// instructions a block as with one scale per 32), AVX-512 (`tile512_i8`, since stop 90) and on
/// aarch64 with dotprod or i8mm (`tile_dp`, `tile_i8mm`: each block's two halves' dots apart, two
/// conversions and multiply-adds where one scale has one; the SYNTHETIC OLMoE-shaped 4-layer Q4_0
/// file's prompt, whose attention projections take it, counted 65.61M -> 62.79M guest
/// instructions a token under `qemu-aarch64 -cpu max`, and 56.99M with its expert groups of about
/// 8 tokens on it too, from [`halves_min_tokens`]; docs/benchmarks/neon-proxy.md); IQ4_NL and
/// IQ4_XS on AVX-512 (`tile512_i8`, the table's values moved up by 128, that offset taken as `128
/// · s`; AVX2 has no 8-bit tile for them). Within that function's rule where one scale per 32 was
/// not (`sparrow perplexity --file wikitext-2/test.txt -t 2`, 2026-12-07), on the AVX2 path:
/// SmolLM2-135M re-quantized to Q4_0 (`--requant q4_0`, 96 windows of 512) 30.5460 against 16
/// bits' 30.5113 (+0.035; one scale per 32: +0.060 with `--int8`, and +0.070 on AVX-512),
/// Qwen2.5-Coder-0.5B so re-quantized (32 windows) 36.5276 against 36.4994 (+0.028),
/// SmolLM2-135M's own Q4_1 (96 windows) 26.2101 against 26.1860 (+0.024); on the AVX-512 path 30.5719
/// against 30.5381 (+0.034), 36.5434 against 36.5102 (+0.033), 26.2280 against 26.2040 (+0.024),
/// and with IQ4 layers (`llama-quantize --allow-requantize --tensor-type ffn_down=iq4_xs
/// --tensor-type attn_v=iq4_nl M out IQ4_XS` of the two PyPI files) SmolLM2-135M (96 windows)
/// 31.4734 against 31.4254 (+0.048, the rule's margin nearly spent; one scale per 32 measured
/// +0.066 on another such file at stop 77), Qwen2.5-Coder-0.5B (32 windows) 33.9142 against
/// 33.8847 (+0.029). SYNTHETIC 16x1024x2816, one thread pp128: AVX2 Q4_0 269-271 -> 337-346 tok/s,
/// SmolLM2-135M Q4_1 403-417 -> 479-480; AVX-512 Q4_0 308-316 -> 509-557, Q4_1 485-486 ->
/// 733-763; two threads pp512, AVX-512: IQ4_XS 566-567 -> 803-816 (llama.cpp 751-762), IQ4_NL
/// 561-562 -> 791-806 (docs/benchmarks/dense-vs-llama.md).
#[doc(hidden)]
pub fn fast_prompts_halves(path: KernelPath, format: WeightFormat) -> bool {
    use WeightFormat::*;
    let q4 = matches!(format, Q4_0 | Q4_1);
    match path {
        KernelPath::Avx2Fma | KernelPath::NeonDotprod | KernelPath::NeonI8mm => q4,
        KernelPath::Avx512 => q4 || matches!(format, IQ4_NL | IQ4_XS),
        _ => false,
    }
}

/// Fewest tokens of a [`Precision::Fast`] prompt for which [`fast_prompts_halves`]' formats take
/// the 8-bit tile: [`short_prompt_tokens`] on aarch64 (8, where its 16-bit tile starts too: both
/// repack a work item's rows alike, and 8 bits take half the 16-bit tile's dots), else
/// [`INT_TILE_MIN_TOKENS`].
#[doc(hidden)]
pub fn halves_min_tokens(path: KernelPath) -> usize {
    match path {
        KernelPath::NeonDotprod | KernelPath::NeonI8mm => short_prompt_tokens(path),
        _ => INT_TILE_MIN_TOKENS,
    }
}

/// Which 8-bit activations a product of `n` tokens with weights of `format` in `precision` takes
/// to `path`'s 8-bit tile (`arch::tile_int8`), if it takes that tile: `Some(true)` for those of a
/// scale per 16 ([`fast_prompts_halves`]), `Some(false)` for `arch::tile_int8_acts`'. `Int8`
/// prompts take it where the path has it (the 32-block formats from [`INT_TILE_MIN_TOKENS`]
/// tokens, as their 16-bit tile), `Fast` ones from that many tokens where [`fast_prompts_int8`]
/// or [`fast_prompts_halves`] (as llama.cpp's prompts always do): a prompt is bound by compute,
/// where 8 bits give twice the products per instruction of 16; decode, bound by memory, keeps 16
/// bits. [`matmul_with`] and an MoE prompt's expert groups (`product.rs`) choose by it.
pub(crate) fn int8_prompt(
    path: KernelPath,
    format: WeightFormat,
    n: usize,
    precision: Precision,
) -> Option<bool> {
    let blocks = arch::tile_int8_blocks(path, format);
    let long = n >= INT_TILE_MIN_TOKENS;
    let (takes, halves) = match precision {
        Precision::Int8 => (!blocks || long, false),
        Precision::Fast if n >= halves_min_tokens(path) && fast_prompts_halves(path, format) => {
            (true, true)
        }
        Precision::Fast => (long && fast_prompts_int8(format), false),
        Precision::Exact | Precision::Ggml => (false, false),
    };
    (takes && arch::has_tile_int8(path, format)).then_some(halves)
}

/// One token's activations `x` for `path`'s 8-bit tile over weights of `format`, as
/// [`int8_prompt`] chose them (`halves`: a scale per 16).
pub(crate) fn int8_prompt_acts(
    path: KernelPath,
    format: WeightFormat,
    halves: bool,
    x: &[f32],
) -> QActs {
    match halves {
        true => QActs::quantize_halves(path, x),
        false => arch::tile_int8_acts(path, format, x),
    }
}

/// [`matmul`] on an explicit path (for tests and benchmarks).
#[doc(hidden)]
pub fn matmul_with(
    path: KernelPath,
    w: &QMatrix,
    x: &[f32],
    n: usize,
    y: &mut [f32],
    precision: Precision,
) -> Result<(), KernelError> {
    check_path(path)?;
    let (rows, cols) = (w.rows(), w.cols());
    check_tokens(["matmul x", "matmul y"], w, x, n, y)?;
    if n == 0 || rows == 0 {
        return Ok(());
    }
    if n == 1 {
        return matvec_with(path, w, x, y, precision);
    }
    if cols == 0 {
        y.fill(0.0);
        return Ok(());
    }
    if precision == Precision::Ggml {
        // Every token as a decode step computes it (llama.cpp quantizes a batch's rows as it
        // quantizes one).
        for (xt, yt) in x.chunks_exact(cols).zip(y.chunks_exact_mut(rows)).take(n) {
            matvec_with(path, w, xt, yt, precision)?;
        }
        return Ok(());
    }
    let decode_kernels =
        w.format().is_quantized() || (w.format() == WeightFormat::F16 && crate::half_kernel(path));
    if precision == Precision::Fast && n < short_prompt_tokens(path) && decode_kernels {
        // A short prompt's tokens as a decode step of as many computes them (`matvec_batch`: each
        // block read once for every token, `matvec`'s products): the f32 tile dequantizes the
        // whole matrix whatever the token count. F16 rows too where the path multiplies f16
        // (`fmlal`: a token costs half the tile's conversions of the whole matrix).
        return matvec_batch_with(path, w, x, n, y, precision);
    }
    // The 8-bit tile where `int8_prompt`; the 32-block formats' repacks its rows as the 16-bit one
    // does, so it starts at `INT_TILE_MIN_TOKENS` tokens in `Int8` too.
    if let Some(halves) = int8_prompt(path, w.format(), n, precision) {
        let quantize = |x: &[f32]| int8_prompt_acts(path, w.format(), halves, x);
        let prepare = |acts| arch::TileActs8::new(path, w.format(), acts);
        let tile = |w: &QMatrix, r0, nr, acts: &arch::TileActs8, out: &mut [f32]| {
            arch::tile_int8(path, w, r0, nr, acts, out)
        };
        matmul_int(path, w, x, n, y, (quantize, prepare), tile);
        return Ok(());
    }
    if precision == Precision::Fast && takes_tile_i16(path, w.format(), n) {
        // `Fast` prompts of the 32-block formats not in `fast_prompts_int8` (`Int8` ones took the
        // 8-bit tile above; AVX-512, AVX2, NEON with i8mm), on AVX2 also Q8_0's and IQ4_NL's (no
        // 8-bit tile there): 16-bit activations, as `matvec` quantizes them in `Fast`. With i8mm
        // from `short_prompt_tokens` (8), where `fast_prompts_int8`'s formats take it too below
        // `INT_TILE_MIN_TOKENS`: the products of decode's precision, which the f32 tile took there.
        let quantize = |x: &[f32]| QActs16::quantize(path, x);
        let prepare = |acts| arch::TileActs16::new(path, w.format(), acts);
        let tile = |w: &QMatrix, r0, nr, acts: &arch::TileActs16, out: &mut [f32]| {
            arch::tile_i16(path, w, r0, nr, acts, out)
        };
        matmul_int(path, w, x, n, y, (quantize, prepare), tile);
        return Ok(());
    }
    let chunk = matmul_chunk();
    let n_chunks = rows.div_ceil(chunk);
    let out = OutPtr(y.as_mut_ptr());
    // 8-bit-activation precision rounds to bf16 (8 significant bits) where the path has a bf16
    // tile; Exact and Fast keep the f32 tile (bf16 prompts change greedy continuations).
    let xb = match precision {
        Precision::Exact | Precision::Fast | Precision::Ggml => None,
        Precision::Int8 => arch::bf16_acts(path, x, n, cols),
    };
    let work = |ci: usize| {
        let r0 = ci * chunk;
        let nr = chunk.min(rows - r0);
        let mut local = vec![0f32; n * nr];
        arch::tile_f32(path, (w, r0, nr), xb.as_deref(), x, n, &mut local);
        // SAFETY: `y` has `n * rows` elements (checked above) and stays mutably borrowed until
        // the parallel loop ends; this work item alone writes rows `r0 .. r0 + nr`.
        unsafe { out.write_rows(&local, n, rows, r0, nr) };
    };
    if n_chunks == 1 {
        work(0);
    } else {
        (0..n_chunks).into_par_iter().for_each(work);
    }
    Ok(())
}

/// Weight bytes of one work item of [`matmul_int`]: its rows stay in L2 while every group of
/// tokens passes over them.
pub(crate) const INT_ITEM_BYTES: usize = 96 * 1024;

/// [`matmul`] through an integer tile (`arch::tile_int8` or `arch::tile_i16`, which the caller
/// checked the path has for `w`'s format): every token quantized once by `quantize` as `matvec`
/// quantizes it, then work items of a few rows each.
fn matmul_int<A: Send + Sync, P: Sync>(
    path: KernelPath,
    w: &QMatrix,
    x: &[f32],
    n: usize,
    y: &mut [f32],
    (quantize, prepare): (impl Fn(&[f32]) -> A + Sync + Send, impl FnOnce(Vec<A>) -> P),
    tile: impl Fn(&QMatrix, usize, usize, &P, &mut [f32]) + Sync + Send,
) {
    let (rows, cols) = (w.rows(), w.cols());
    let acts = prepare(x.par_chunks_exact(cols).take(n).map(quantize).collect());
    let row_bytes = w.row_data(0).len().max(1);
    let threads = rayon::current_num_threads().max(1);
    let chunk = match crate::chunk_rows_setting() {
        0 => (INT_ITEM_BYTES / row_bytes)
            .min(rows.div_ceil(threads * 4))
            .max(1),
        n => n,
    }
    .next_multiple_of(arch::tile_int_rows(path));
    let out = OutPtr(y.as_mut_ptr());
    (0..rows.div_ceil(chunk)).into_par_iter().for_each(|ci| {
        let r0 = ci * chunk;
        let nr = chunk.min(rows - r0);
        let mut local = vec![0f32; n * nr];
        tile(w, r0, nr, &acts, &mut local);
        // SAFETY: as in `matmul_with`: `y` has `n * rows` elements, stays mutably borrowed until
        // the parallel loop ends, and this work item alone writes rows `r0 .. r0 + nr`.
        unsafe { out.write_rows(&local, n, rows, r0, nr) };
    });
}
