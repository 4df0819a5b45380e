//! [`Precision`]: the accuracy/speed trade-off of the quantized matrix-vector kernels.

/// Accuracy/speed trade-off of `kernels_neon::matvec` (the kernels crate docs, "Precision", give the
/// error bounds and measurements).
///
/// `matvec` (and `matmul` with `n == 1`, which is `matvec`) depends on it for
/// the block-quantized formats and F16 (activations rounded to f16 outside `Exact`; `F32` and
/// `BF16` weights always use the f32 path). `matmul` of a prompt uses
/// the exact f32 tile in `Exact`, and in the others an integer tile where the kernel path has one
/// for the format, which gives each token the products of `matvec` in `Fast` or `Int8`
/// (`kernels_neon::matmul` says which: `Fast` prompts of 32 tokens or more over Q4_K/Q5_K/Q6_K take
/// `Int8`'s; `Fast` prompts of quantized weights below 32 tokens on x86, 8 elsewhere, are
/// `matvec`'s products), else the f32
/// tile (or in `Int8` a bf16 one where the path has it); in `Ggml` it is one `matvec` per token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Precision {
    /// Weights dequantized to f32, f32 activations, f32 accumulation.
    Exact,
    /// Default fast mode: 16-bit quantized activations (per 32-block scale
    /// `amax/32639`, quants within `±32639` so that each splits into two
    /// signed bytes) and integer dot products for quantized weights. The
    /// activation rounding error is 257 times smaller than [`Int8`](Self::Int8)'s,
    /// small enough to keep greedy decoding identical to f32. Long prompts over
    /// K-quant weights take `Int8`'s products, as llama.cpp's do; decode keeps 16 bits for every
    /// format (`kernels_neon::fast_decode_int8`). F16 weights take the activations rounded to f16.
    Fast,
    /// llama.cpp-style 8-bit quantized activations (per 32-block scale
    /// `amax/127`) and integer dot products for quantized weights. Fastest,
    /// least accurate.
    Int8,
    /// llama.cpp's roundings on its CPU path, for comparisons with it: 8-bit activations in
    /// ggml's block type of each weight format (`block_q8_0`, its scale rounded to f16, for the
    /// 32-element formats; `block_q8_K`, one f32 scale `1/(-127/max)` per 256, for the K-quants),
    /// every token of a prompt as a decode step quantizes it, and (in the engine) an f16 KV cache,
    /// attention products over f16 queries and f16 softmax weights, RoPE angles and RMSNorm sums
    /// (f64) as ggml computes them, GELU from an f16 table (the engine's in every mode). The
    /// slowest quantized mode; not for serving.
    Ggml,
}
