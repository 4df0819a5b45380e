//! [`Precision`]: the accuracy/speed trade-off of the quantized matrix-vector kernels.

/// Accuracy/speed trade-off of `kernels_neon::matvec` (the kernels crate docs, "Precision", give the
/// error bounds and measurements).
///
/// `matvec` (and `matmul` with `n == 1`, which is `matvec`) depends on it for
/// the block-quantized formats (float weights always use the f32 path);
/// `matmul` uses the exact f32 tile except in `Int8` where the kernel path has a
/// bf16 tile (AVX-512 BF16).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Precision {
    /// Weights dequantized to f32, f32 activations, f32 accumulation.
    Exact,
    /// Default fast mode: 16-bit quantized activations (per 32-block scale
    /// `amax/32767`) and integer dot products for quantized weights. The
    /// activation rounding error is 256 times smaller than [`Int8`](Self::Int8)'s,
    /// small enough to keep greedy decoding identical to f32.
    Fast,
    /// llama.cpp-style 8-bit quantized activations (per 32-block scale
    /// `amax/127`) and integer dot products for quantized weights. Fastest,
    /// least accurate.
    Int8,
}
