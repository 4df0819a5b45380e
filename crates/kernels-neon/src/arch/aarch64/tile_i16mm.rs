//! The 16-bit prompt tile with `i8mm` ([`KernelPath::NeonI8mm`](crate::KernelPath::NeonI8mm)),
//! driven by `tile_mm.rs`: [`Precision::Fast`](crate::Precision) prompts of the 32-element block
//! formats (those of `fast_prompts_int8`, Q5_0 and Q8_0, only below `INT_TILE_MIN_TOKENS`, where
//! they keep 16 bits) and of IQ4_XS (its sub-blocks of 32 are IQ4_NL blocks with the scale `d *
//! (ls - 32)`), and below that many tokens of Q4_K and Q5_K (sub-blocks of 32 as blocks,
//! `row_blocks`). Without it these prompts took the f32 tile of dequantized weights:
//! 32 `fmla` per 128 products against 8 matrix multiplies here.
//!
//! Each 16-bit activation is split into its high byte, signed, and its low byte, unsigned: `x =
//! 256 * hi + lo`, exactly. Per 32-element block, two weight rows by two tokens: four `smmla` sum
//! the high bytes' products (signed by signed), the sums are shifted up by 8, and four `usmmla`
//! add the low bytes' (unsigned activations by signed weights) on top. The i32 lanes are then the
//! block's exact dots `sum(q_w * q_x)`, the integer products of `matvec_i16` (|q_w| <= 128, |q_x|
//! <= 32767: a block's sum below 2^28); only the f32 summation order differs from `matvec`'s.

use std::arch::aarch64::*;

use super::tile_mm::{drive, smmla, token_pairs, TokenPairs, TokenQuants};
use crate::quant::QActs16;
use crate::{QMatrix, WeightFormat};

/// Whether [`tile_i16mm`] takes weights of `format`: the formats of 32-element blocks of integer
/// quants, IQ4_XS, and Q4_K and Q5_K (whose `Fast` prompts take 8 bits from
/// `INT_TILE_MIN_TOKENS`: this tile serves their shorter ones). Not Q6_K: the sum of a block's
/// two halves, each times its scale, could pass 2^31 with 16-bit activations.
pub(crate) fn has_tile_i16mm(format: WeightFormat) -> bool {
    use WeightFormat::*;
    matches!(
        format,
        Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | IQ4_NL | IQ4_XS | Q4_K | Q5_K
    )
}

super::simd::acc_insn!(
    /// `acc += a · bᵀ` for `a` a 2×8 u8 matrix and `b` a 2×8 i8 matrix (row-major in the 16
    /// lanes): lanes `[a0·b0, a0·b1, a1·b0, a1·b1]`.
    usmmla, "usmmla", uint8x16_t, int8x16_t, "neon,i8mm"
);

/// A token pair's 16-bit quants of one block, split and interleaved.
#[derive(Clone, Copy)]
pub(crate) struct Tok16 {
    /// The high bytes (signed).
    hi: [int8x16_t; 4],
    /// The low bytes (unsigned).
    lo: [uint8x16_t; 4],
}

impl TokenQuants for Tok16 {
    #[inline(always)]
    unsafe fn dots(&self, w: &[int8x16_t; 4]) -> int32x4_t {
        // SAFETY: i8mm present per this method's contract.
        unsafe {
            let h = smmla(vdupq_n_s32(0), self.hi[0], w[0]);
            let h = smmla(h, self.hi[1], w[1]);
            let h = smmla(h, self.hi[2], w[2]);
            let h = smmla(h, self.hi[3], w[3]);
            let s = usmmla(vshlq_n_s32::<8>(h), self.lo[0], w[0]);
            let s = usmmla(s, self.lo[1], w[1]);
            let s = usmmla(s, self.lo[2], w[2]);
            usmmla(s, self.lo[3], w[3])
        }
    }
    #[inline(always)]
    unsafe fn dots_halves(&self, w: &[int8x16_t; 4]) -> (int32x4_t, int32x4_t) {
        // SAFETY: i8mm present per this method's contract.
        unsafe {
            let half = |c: usize| {
                let h = smmla(vdupq_n_s32(0), self.hi[c], w[c]);
                let h = smmla(h, self.hi[c + 1], w[c + 1]);
                let s = usmmla(vshlq_n_s32::<8>(h), self.lo[c], w[c]);
                usmmla(s, self.lo[c + 1], w[c + 1])
            };
            (half(0), half(2))
        }
    }
}

/// Two tokens' 32 quants of a block (`a`, `b`) split as [`Tok16`].
#[target_feature(enable = "neon")]
fn tok16(a: &[i16], b: &[i16]) -> Tok16 {
    let eight = |x: &[i16], e: usize| {
        let q = &x[e..e + 8];
        // SAFETY: `q` has exactly 8 readable i16 (bounds-checked above).
        unsafe { vld1q_s16(q.as_ptr()) }
    };
    let mut t = Tok16 {
        hi: [vdupq_n_s8(0); 4],
        lo: [vdupq_n_u8(0); 4],
    };
    for c in 0..4 {
        let (p, q) = (eight(a, 8 * c), eight(b, 8 * c));
        t.hi[c] = vcombine_s8(vshrn_n_s16::<8>(p), vshrn_n_s16::<8>(q));
        t.lo[c] = vcombine_u8(
            vmovn_u16(vreinterpretq_u16_s16(p)),
            vmovn_u16(vreinterpretq_u16_s16(q)),
        );
    }
    t
}

/// A prompt's 16-bit activations as [`tile_i16mm`] reads them (once per product).
#[target_feature(enable = "neon")]
pub(crate) fn pairs16(acts: &[QActs16]) -> TokenPairs<Tok16> {
    token_pairs(acts, |a, b| tok16(a, b))
}

/// The 16-bit prompt tile with `i8mm`: `out[t * nr + i]` = row `r0 + i` of `w` · token `t` for
/// every token of `toks` (16-bit activations with one scale per 32, as `matvec` quantizes them in
/// `Fast`, by [`pairs16`]): the integer products of `matvec_i16`, summed in another f32 order.
/// Formats other than [`has_tile_i16mm`]'s are left to the caller.
///
/// # Safety
/// The CPU must support the `i8mm` extension.
#[target_feature(enable = "neon,i8mm")]
pub(crate) unsafe fn tile_i16mm(
    w: &QMatrix<'_>,
    r0: usize,
    nr: usize,
    toks: &TokenPairs<Tok16>,
    out: &mut [f32],
) {
    if nr == 0 || !has_tile_i16mm(w.format()) {
        return;
    }
    // SAFETY: i8mm present per this function's contract; the format is one `row_blocks` takes.
    unsafe { drive::<Tok16>(w, (r0, nr), toks, out) }
}
