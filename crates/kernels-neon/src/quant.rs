//! Quantized activations: 8-bit ([`QActs`], llama.cpp `Q8_0` / `Q8_1`
//! style, used by [`Precision::Int8`](crate::Precision::Int8)) and 16-bit
//! ([`QActs16`], used by [`Precision::Fast`](crate::Precision::Fast)).
//!
//! 8-bit: in-memory only (never stored): for every block of 32 activations we keep
//! `d: f32` (scale, `amax / 127`), `s: f32` (`d * sum(q)`, needed by Q4_1
//! weights for the `m` term) and 32 `i8` quants rounded to nearest (ties to
//! even, like `_mm256_round_ps` and NEON `fcvtns`), in
//! three parallel vectors so SIMD code can load the quants contiguously.
//! Quants are always in `-127..=127`, which keeps the AVX2 `maddubs`
//! sign trick free of i16 saturation.

/// Quantized activation vector (one 32-element block per entry of `d`/`s`).
#[derive(Debug, Clone, Default)]
pub(crate) struct QActs {
    /// Per-block scale.
    pub d: Vec<f32>,
    /// Per-block `d * sum(qs)`.
    pub s: Vec<f32>,
    /// Quants, 32 per block.
    pub qs: Vec<i8>,
}

impl QActs {
    /// Zeroed storage for `nb` blocks.
    pub(crate) fn zeroed(nb: usize) -> Self {
        QActs {
            d: vec![0.0; nb],
            s: vec![0.0; nb],
            qs: vec![0; nb * 32],
        }
    }

    /// Quantizes `x` (length a multiple of 32) with the given kernel path.
    /// All paths round half to even, so they produce identical quants.
    pub(crate) fn quantize(path: crate::KernelPath, x: &[f32]) -> Self {
        let mut out = Self::zeroed(x.len() / 32);
        match path {
            #[cfg(target_arch = "x86_64")]
            crate::KernelPath::Avx2Fma => {
                // SAFETY: the path was checked available, so AVX2/FMA/F16C are present.
                unsafe { crate::arch::quantize_avx2(x, &mut out) }
            }
            _ => Self::quantize_scalar(x, &mut out),
        }
        out
    }

    /// Scalar quantizer (reference).
    pub(crate) fn quantize_scalar(x: &[f32], out: &mut QActs) {
        for (b, xs) in x.chunks_exact(32).enumerate() {
            let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = amax / 127.0;
            let id = if amax > 0.0 { 127.0 / amax } else { 0.0 };
            let mut sum = 0i32;
            for (q, &v) in out.qs[b * 32..b * 32 + 32].iter_mut().zip(xs) {
                let r = (v * id).round_ties_even().clamp(-127.0, 127.0) as i32;
                sum += r;
                *q = r as i8;
            }
            out.d[b] = d;
            out.s[b] = d * sum as f32;
        }
    }
}

/// 16-bit quantized activation vector (one 32-element block per entry of
/// `d`/`s`), used by [`Precision::Fast`](crate::Precision::Fast).
///
/// For every block of 32 activations: `d = amax / 32767` (f32), quants
/// `q = round_ties_even(x * (32767 / amax))` in `-32767..=32767` (all zero
/// when `amax == 0`, and then `d == 0`), and `s = d * sum(q)` (sum in i32)
/// for the `m` term of Q4_1 weights. Every kernel path computes exactly
/// these f32 operations, so all paths produce identical quants.
///
/// Exposed (hidden from the docs) only so tests can check the quantizer
/// with [`quantize_acts_i16_with`](crate::quantize_acts_i16_with).
#[doc(hidden)]
#[derive(Debug, Clone, Default, PartialEq)]
pub struct QActs16 {
    /// Per-block scale `amax / 32767`.
    pub d: Vec<f32>,
    /// Per-block `d * sum(qs)`.
    pub s: Vec<f32>,
    /// Quants, 32 per block.
    pub qs: Vec<i16>,
}

impl QActs16 {
    /// Zeroed storage for `nb` blocks.
    pub(crate) fn zeroed(nb: usize) -> Self {
        QActs16 {
            d: vec![0.0; nb],
            s: vec![0.0; nb],
            qs: vec![0; nb * 32],
        }
    }

    /// Quantizes `x` (length a multiple of 32; a trailing partial block is
    /// ignored) with the given kernel path.
    pub(crate) fn quantize(path: crate::KernelPath, x: &[f32]) -> Self {
        let mut out = Self::zeroed(x.len() / 32);
        match path {
            #[cfg(target_arch = "x86_64")]
            crate::KernelPath::Avx2Fma => {
                // SAFETY: the path was checked available, so AVX2/FMA/F16C are present.
                unsafe { crate::arch::quantize16_avx2(x, &mut out) }
            }
            _ => Self::quantize_scalar(x, &mut out),
        }
        out
    }

    /// Scalar quantizer (reference).
    pub(crate) fn quantize_scalar(x: &[f32], out: &mut QActs16) {
        for (b, xs) in x.chunks_exact(32).enumerate() {
            let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = amax / 32767.0;
            let id = if amax > 0.0 { 32767.0 / amax } else { 0.0 };
            let mut sum = 0i32;
            for (q, &v) in out.qs[b * 32..b * 32 + 32].iter_mut().zip(xs) {
                let r = (v * id).round_ties_even().clamp(-32767.0, 32767.0) as i32;
                sum += r;
                *q = r as i16;
            }
            out.d[b] = d;
            out.s[b] = d * sum as f32;
        }
    }
}
