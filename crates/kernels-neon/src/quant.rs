//! Quantized activations: 8-bit ([`QActs`], llama.cpp `Q8_0` / `Q8_1`
//! style, used by [`Precision::Int8`](crate::Precision::Int8)) and 16-bit
//! ([`QActs16`], used by [`Precision::Fast`](crate::Precision::Fast)); both
//! are [`QBlocks`] with a different quant type.
//!
//! 8-bit: in-memory only (never stored): for every block of 32 activations we keep
//! `d: f32` (scale, `amax / 127`), `s: f32` (`d * sum(q)`, needed by Q4_1
//! weights for the `m` term) and 32 `i8` quants rounded to nearest (ties to
//! even, like `_mm256_round_ps` and NEON `fcvtns`), in
//! three parallel vectors so SIMD code can load the quants contiguously.
//! Quants are always in `-127..=127`, which keeps the AVX2 `maddubs`
//! sign trick free of i16 saturation.

/// An integer type activations are quantized to: its largest magnitude and
/// the SIMD quantizer of each kernel path (the scalar one is generic).
pub trait Quant: Copy + Default {
    /// Largest quant magnitude (`127` or `32767`); quants lie in `-MAX..=MAX`.
    const MAX: f32;
    /// Narrows a value already clamped to `-MAX..=MAX`.
    fn from_i32(v: i32) -> Self;
    /// Quantizes with the path's SIMD code; `false` when the path has none.
    fn quantize_simd(path: crate::KernelPath, x: &[f32], out: &mut QBlocks<Self>) -> bool;
}

impl Quant for i8 {
    const MAX: f32 = 127.0;
    fn from_i32(v: i32) -> Self {
        v as i8
    }
    fn quantize_simd(path: crate::KernelPath, x: &[f32], out: &mut QBlocks<Self>) -> bool {
        crate::arch::quantize_i8(path, x, out)
    }
}

impl Quant for i16 {
    const MAX: f32 = 32767.0;
    fn from_i32(v: i32) -> Self {
        v as i16
    }
    fn quantize_simd(path: crate::KernelPath, x: &[f32], out: &mut QBlocks<Self>) -> bool {
        crate::arch::quantize_i16(path, x, out)
    }
}

/// Quantized activation vector (one 32-element block per entry of `d`/`s`).
///
/// For every block of 32 activations: `d = amax / MAX` (f32), quants
/// `q = round_ties_even(x * (MAX / amax))` in `-MAX..=MAX` (all zero when
/// `amax == 0`, and then `d == 0`), and `s = d * sum(q)` (sum in i32) for the
/// `m` term of Q4_1 weights. Every kernel path computes exactly these f32
/// operations, so all paths produce identical quants.
///
/// Exposed (hidden from the docs) only so tests can check the quantizer
/// with [`quantize_acts_i16_with`](crate::quantize_acts_i16_with).
#[doc(hidden)]
#[derive(Debug, Clone, Default, PartialEq)]
pub struct QBlocks<Q> {
    /// Per-block scale `amax / MAX`.
    pub d: Vec<f32>,
    /// Per-block `d * sum(qs)`.
    pub s: Vec<f32>,
    /// Quants, 32 per block.
    pub qs: Vec<Q>,
}

/// 8-bit activations (`Precision::Int8`).
pub(crate) type QActs = QBlocks<i8>;
/// 16-bit activations (`Precision::Fast`).
#[doc(hidden)]
pub type QActs16 = QBlocks<i16>;

impl<Q: Quant> QBlocks<Q> {
    /// Zeroed storage for `nb` blocks.
    pub(crate) fn zeroed(nb: usize) -> Self {
        QBlocks {
            d: vec![0.0; nb],
            s: vec![0.0; nb],
            qs: vec![Q::default(); nb * 32],
        }
    }

    /// Quantizes `x` (length a multiple of 32; a trailing partial block is
    /// ignored) with the given kernel path.
    pub(crate) fn quantize(path: crate::KernelPath, x: &[f32]) -> Self {
        let mut out = Self::zeroed(x.len() / 32);
        if !Q::quantize_simd(path, x, &mut out) {
            Self::quantize_scalar(x, &mut out);
        }
        out
    }

    /// Scalar quantizer (reference).
    pub(crate) fn quantize_scalar(x: &[f32], out: &mut Self) {
        for (b, xs) in x.chunks_exact(32).enumerate() {
            let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = amax / Q::MAX;
            let id = if amax > 0.0 { Q::MAX / amax } else { 0.0 };
            let mut sum = 0i32;
            for (q, &v) in out.qs[b * 32..b * 32 + 32].iter_mut().zip(xs) {
                let r = (v * id).round_ties_even().clamp(-Q::MAX, Q::MAX) as i32;
                sum += r;
                *q = Q::from_i32(r);
            }
            out.d[b] = d;
            out.s[b] = d * sum as f32;
        }
    }
}
