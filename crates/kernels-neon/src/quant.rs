//! 8-bit quantized activations (llama.cpp `Q8_0` / `Q8_1` style).
//!
//! In-memory only (never stored): for every block of 32 activations we keep
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
