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
    /// Largest quant magnitude (`127` or `32639`); quants lie in `-MAX..=MAX`.
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
    /// `127 * 257` (`0x7F7F`), not `i16::MAX`: each quant's rounded high byte `(q + 128) >> 8`
    /// stays an i8 (`-127..=127`), so the aarch64 kernels split a quant into two signed bytes
    /// (`arch/aarch64/matvec_split.rs`'s `Split16`) and multiply signed weights by `sdot` alone.
    const MAX: f32 = 32639.0;
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
    /// Per-block scale `amax / MAX` (empty where the scales are [`d16`](Self::d16)'s).
    pub d: Vec<f32>,
    /// Per-block `d * sum(qs)`: the block's quants dequantized and summed (with halves of their
    /// own scales, `d16[2b] * sum(first 16) + d16[2b + 1] * sum(last 16)`).
    pub s: Vec<f32>,
    /// Quants, 32 per block.
    pub qs: Vec<Q>,
    /// Whether the scale is one per 256-element super-block (each repeated in `d` for its 8
    /// blocks; [`QActs::quantize_super`]) rather than one per block.
    pub per_super: bool,
    /// The sum of each 16 quants, where a kernel asked for them once per token
    /// ([`QActs::with_sums16`]: Q6_K's offset of 32 in the AVX-512 8-bit prompt tile); else empty.
    pub sum16: Vec<i32>,
    /// The scale of each 16 values, where quantized with one per 16 ([`QActs::quantize_halves`]:
    /// `d` is then empty); else empty.
    pub d16: Vec<f32>,
}

/// 8-bit activations (`Precision::Int8`).
pub(crate) type QActs = QBlocks<i8>;

impl QActs {
    /// Quantizes `x` with one scale per 256-element super-block (the last one may be shorter),
    /// llama.cpp's `Q8_K` granularity, for K-quant weights whose kernels weight their sub-blocks
    /// in integers: `d = amax / 127` over the super-block, repeated for its blocks, quants
    /// `round_ties_even(x * (127 / amax))`, `s = d * sum(q)` per block. With the path's SIMD
    /// quantizer (x86_64, aarch64), which computes the same f32 operations, so all paths produce
    /// identical quants. `x.len()` is a multiple of 32 (a trailing partial block is ignored).
    pub(crate) fn quantize_super(path: crate::KernelPath, x: &[f32]) -> Self {
        let mut out = Self::zeroed(x.len() / 32);
        out.per_super = true;
        if !crate::arch::quantize_i8_super(path, x, &mut out) {
            Self::quantize_groups(x, &mut out, 8);
        }
        out
    }

    /// llama.cpp's activations for weights of `format` ([`Precision::Ggml`](crate::Precision::Ggml)):
    /// ggml's `vec_dot_type` of the format. For the K-quants (`block_q8_K`, [`ggml_super`]) the
    /// quants of [`quantize_super`](Self::quantize_super) with ggml's scale `1/(127/amax)` (its
    /// `iscale = -127/max` flips the sign of both the quants and the scale, which leaves every
    /// product as it is); for the 32-element formats (`block_q8_0`, `block_q8_1`) the quants of
    /// [`quantize`](Self::quantize) (ggml's x86 quantizer also multiplies by `127/amax`) with the
    /// scale `amax/127` rounded to f16, and `s` that scale times the sum of the quants (for Q4_1
    /// and Q5_1 the f16 of the f32 scale times the sum, `block_q8_1`'s).
    pub(crate) fn quantize_ggml(
        path: crate::KernelPath,
        format: tensor_types::WeightFormat,
        x: &[f32],
    ) -> Self {
        use half::f16;
        let nb = x.len() / 32;
        let amax = |xs: &[f32]| xs.iter().fold(0f32, |m, v| m.max(v.abs()));
        let qsum = |q: &Self, b: usize| -> i32 {
            q.qs[b * 32..b * 32 + 32]
                .iter()
                .map(|&v| i32::from(v))
                .sum()
        };
        if ggml_super(format) {
            let mut q = Self::quantize_super(path, x);
            for (g, xs) in x[..nb * 32].chunks(256).enumerate() {
                let a = amax(xs);
                let d = if a > 0.0 { 1.0 / (127.0 / a) } else { 0.0 };
                for b in g * 8..(g * 8 + xs.len() / 32) {
                    q.d[b] = d;
                    q.s[b] = d * qsum(&q, b) as f32;
                }
            }
            q
        } else {
            // `s` is the f16 of ggml's `block_q8_1` where the weights have a minimum (Q4_1, Q5_1: its
            // `m · s` term); elsewhere kernels take a weight offset as `s = d · sum(q)` (ggml sums
            // the offset quants in integers, the same products).
            let q8_1 = matches!(
                format,
                tensor_types::WeightFormat::Q4_1 | tensor_types::WeightFormat::Q5_1
            );
            let mut q = Self::quantize(path, x);
            for (b, xs) in x[..nb * 32].chunks_exact(32).enumerate() {
                let d = amax(xs) / 127.0;
                let sum = qsum(&q, b) as f32;
                q.d[b] = f16::from_f32(d).to_f32();
                q.s[b] = match q8_1 {
                    true => f16::from_f32(d * sum).to_f32(),
                    false => q.d[b] * sum,
                };
            }
            q
        }
    }

    /// Quantizes `x` (a multiple of 32 long; a trailing partial block is ignored) with one scale
    /// per 16 values, in [`QBlocks::d16`] (`d` left empty): per half block `d16 = amax / 127`,
    /// quants `round_ties_even(x * (127 / amax))`, and per block `s = d16[2b] * sum(first 16) +
    /// d16[2b + 1] * sum(last 16)` (two products and a sum in f32). Half the error of one scale
    /// per 32 where one value of a block stands out (the `Fast` prompts of
    /// [`crate::fast_prompts_halves`]). With the path's SIMD quantizer (x86_64, aarch64),
    /// which computes the same f32 operations.
    pub(crate) fn quantize_halves(path: crate::KernelPath, x: &[f32]) -> Self {
        let nb = x.len() / 32;
        let mut out = Self::zeroed(nb);
        out.d = Vec::new();
        out.d16 = vec![0.0; 2 * nb];
        if !crate::arch::quantize_i8_halves(path, x, &mut out) {
            Self::quantize_halves_scalar(x, &mut out);
        }
        out
    }

    /// The scalar reference of [`quantize_halves`](Self::quantize_halves).
    pub(crate) fn quantize_halves_scalar(x: &[f32], out: &mut Self) {
        // As `quantize_groups`: rounds to an integer, ties to even.
        const MAGIC: f32 = 12_582_912.0;
        let nb = x.len() / 32;
        for (h, xs) in x[..nb * 32].chunks_exact(16).enumerate() {
            let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
            let id = if amax > 0.0 { 127.0 / amax } else { 0.0 };
            for (q, &v) in out.qs[h * 16..h * 16 + 16].iter_mut().zip(xs) {
                *q = ((v * id + MAGIC) - MAGIC).clamp(-127.0, 127.0) as i8;
            }
            out.d16[h] = amax / 127.0;
        }
        for b in 0..nb {
            let sum = |h: usize| -> f32 {
                out.qs[h * 16..h * 16 + 16]
                    .iter()
                    .map(|&v| i32::from(v))
                    .sum::<i32>() as f32
            };
            out.s[b] = out.d16[2 * b] * sum(2 * b) + out.d16[2 * b + 1] * sum(2 * b + 1);
        }
    }

    /// These activations with [`QBlocks::sum16`] filled.
    pub(crate) fn with_sums16(mut self) -> Self {
        self.sum16 = self.sums16();
        self
    }

    /// The sum of each 16 quants (what [`QActs::with_sums16`] keeps).
    pub(crate) fn sums16(&self) -> Vec<i32> {
        self.qs
            .chunks_exact(16)
            .map(|c| c.iter().map(|&v| i32::from(v)).sum())
            .collect()
    }
}

/// Whether ggml quantizes the activations of weights of `format` to `block_q8_K` (one scale per
/// 256), its `vec_dot_type` of the K-quants and `IQ4_XS`; the other block formats take
/// `block_q8_0` or `block_q8_1` (one scale per 32).
pub(crate) fn ggml_super(format: tensor_types::WeightFormat) -> bool {
    use tensor_types::WeightFormat::*;
    matches!(format, Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | IQ4_XS)
}

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
            per_super: false,
            sum16: Vec::new(),
            d16: Vec::new(),
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
        Self::quantize_groups(x, out, 1);
    }

    /// Quantizes `x` with one scale per `blocks` 32-element blocks (the last group may be
    /// shorter): `d = amax / MAX` over the group, quants `round_ties_even(x * (MAX / amax))`
    /// clamped to `-MAX..=MAX`, `s = d * sum(q)` per block.
    fn quantize_groups(x: &[f32], out: &mut Self, blocks: usize) {
        // 1.5 · 2^23: adding and subtracting it rounds |v| < 2^22 (the quants are at most 32639)
        // to an integer, ties to even, as `round_ties_even` does (NaN and infinities alike), but
        // without a library call on baseline x86-64.
        const MAGIC: f32 = 12_582_912.0;
        let nb = x.len() / 32;
        for (g, xs) in x[..nb * 32].chunks(32 * blocks).enumerate() {
            let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = amax / Q::MAX;
            let id = if amax > 0.0 { Q::MAX / amax } else { 0.0 };
            for (j, blk) in xs.chunks_exact(32).enumerate() {
                let b = g * blocks + j;
                let mut sum = 0i32;
                for (q, &v) in out.qs[b * 32..b * 32 + 32].iter_mut().zip(blk) {
                    let r = ((v * id + MAGIC) - MAGIC).clamp(-Q::MAX, Q::MAX) as i32;
                    sum += r;
                    *q = Q::from_i32(r);
                }
                out.d[b] = d;
                out.s[b] = d * sum as f32;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::QActs;

    /// One scale per 256 values (an outlier in one super-block coarsens only that one), quants
    /// rounded against it, ties to even, a shorter last super-block on its own.
    #[test]
    fn super_blocks_share_one_scale() {
        let mut x: Vec<f32> = (0..320)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.01)
            .collect();
        x[3] = 12.7; // super-block 0's amax: a scale of 0.1
        x[300] = -0.635; // the short last one (64 values): a scale of 0.005
        x[10] = 0.25; // 2.5 steps: a tie, to 2
        x[11] = 0.35; // 3.5 steps: a tie, to 4
        let q = QActs::quantize_super(crate::KernelPath::Scalar, &x);
        assert!(q.per_super);
        assert_eq!(q.d.len(), 10);
        for b in 0..8 {
            assert_eq!(q.d[b], 12.7 / 127.0, "block {b}");
        }
        for b in 8..10 {
            assert_eq!(q.d[b], 0.635 / 127.0, "block {b}");
        }
        assert_eq!((q.qs[3], q.qs[10], q.qs[11], q.qs[300]), (127, 2, 4, -127));
        for (i, &v) in x.iter().enumerate() {
            let id = 127.0 / if i < 256 { 12.7f32 } else { 0.635 };
            assert_eq!(
                i32::from(q.qs[i]),
                (v * id).round_ties_even() as i32,
                "value {i}"
            );
        }
        for b in 0..10 {
            let sum: i32 = q.qs[b * 32..b * 32 + 32]
                .iter()
                .map(|&v| i32::from(v))
                .sum();
            assert_eq!(q.s[b], q.d[b] * sum as f32, "block {b}");
        }
    }
}
