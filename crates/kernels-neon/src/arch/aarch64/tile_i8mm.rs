//! The 8-bit prompt tile of the 32-element block formats with `smmla` (the `i8mm` extension,
//! [`KernelPath::NeonI8mm`](crate::KernelPath::NeonI8mm)), driven by `tile_mm.rs`: per block of
//! two rows and two tokens four `smmla` give the exact dots of the tokens' 8-bit activations
//! (`QActs`, one scale per 32) with the rows' quants, `matvec_int8`'s products; for `Fast` Q4_0
//! and Q4_1 prompts (`fast_prompts_halves`) activations of one scale per 16, each half's dots
//! weighted by its own.

use std::arch::aarch64::*;

use super::tile_mm::{drive, interleave, smmla, token_pairs, TokenPairs, TokenQuants};
use crate::quant::QActs;
use crate::{QMatrix, WeightFormat};

/// Whether [`tile_i8mm`] takes weights of `format`: the formats of 32-element blocks of integer
/// quants.
pub(crate) fn has_tile_i8mm(format: WeightFormat) -> bool {
    use WeightFormat::*;
    matches!(format, Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | IQ4_NL)
}

/// A token pair's 8-bit quants of one block, interleaved.
#[derive(Clone, Copy)]
pub(crate) struct Tok8 {
    q: [int8x16_t; 4],
}

impl TokenQuants for Tok8 {
    #[inline(always)]
    unsafe fn dots(&self, w: &[int8x16_t; 4]) -> int32x4_t {
        // SAFETY: i8mm present per this method's contract.
        unsafe {
            let s = smmla(vdupq_n_s32(0), self.q[0], w[0]);
            let s = smmla(s, self.q[1], w[1]);
            let s = smmla(s, self.q[2], w[2]);
            smmla(s, self.q[3], w[3])
        }
    }
    #[inline(always)]
    unsafe fn dots_halves(&self, w: &[int8x16_t; 4]) -> (int32x4_t, int32x4_t) {
        // SAFETY: i8mm present per this method's contract.
        unsafe {
            let zero = vdupq_n_s32(0);
            (
                smmla(smmla(zero, self.q[0], w[0]), self.q[1], w[1]),
                smmla(smmla(zero, self.q[2], w[2]), self.q[3], w[3]),
            )
        }
    }
}

/// Two tokens' 32 quants of a block (`a`, `b`) as [`Tok8`].
#[target_feature(enable = "neon")]
fn tok8(a: &[i8], b: &[i8]) -> Tok8 {
    let half = |x: &[i8], e: usize| {
        let q = &x[e..e + 16];
        // SAFETY: `q` has exactly 16 readable i8 (bounds-checked above).
        unsafe { vld1q_s8(q.as_ptr()) }
    };
    Tok8 {
        q: interleave((half(a, 0), half(a, 16)), (half(b, 0), half(b, 16))),
    }
}

/// A prompt's 8-bit activations as [`tile_i8mm`] and [`tile_k8mm`] read them (once per product).
#[target_feature(enable = "neon")]
pub(crate) fn pairs8(acts: &[QActs]) -> TokenPairs<Tok8> {
    token_pairs(acts, |a, b| tok8(a, b))
}

/// The 8-bit prompt tile with `smmla`: `out[t * nr + i]` = row `r0 + i` of `w` · token `t` for
/// every token of `toks` (8-bit activations with one scale per 32, `QActs::quantize`, by
/// [`pairs8`]): the
/// integer products of [`matvec_int8`](fn@super::matvec_int8), summed in another f32 order. Formats
/// other than [`has_tile_i8mm`]'s are left to the caller.
///
/// # Safety
/// The CPU must support the `i8mm` extension.
#[target_feature(enable = "neon,i8mm")]
pub(crate) unsafe fn tile_i8mm(
    w: &QMatrix<'_>,
    r0: usize,
    nr: usize,
    toks: &TokenPairs<Tok8>,
    out: &mut [f32],
) {
    if nr == 0 || !has_tile_i8mm(w.format()) {
        return;
    }
    // SAFETY: i8mm present per this function's contract; the format is one `row_blocks` takes.
    unsafe { drive::<Tok8>(w, (r0, nr), toks, out) }
}

/// Whether [`tile_k8mm`] takes weights of `format`: Q4_K, Q5_K and Q6_K.
pub(crate) fn has_tile_k8mm(format: WeightFormat) -> bool {
    matches!(
        format,
        WeightFormat::Q4_K | WeightFormat::Q5_K | WeightFormat::Q6_K
    )
}

/// The 8-bit prompt tile of Q4_K, Q5_K and Q6_K rows with `smmla`: `out[t * nr + i]` = row `r0 +
/// i` of `w` · token `t` for every token of `toks` (8-bit activations with one scale per 256,
/// `QActs::quantize_super`, its `d` and `s` kept per 32): Q4_K/Q5_K per sub-block of 32 the exact
/// dots of the unsigned quants, weighted by `d * sc * d_x`, less `dmin * m * s_x`; Q6_K per 32
/// the exact dots of `q - 32` of each half (16) times its integer scale, summed, weighted by `d *
/// d_x`: `matvec_int8`'s integer products, summed in another order. Formats other than
/// [`has_tile_k8mm`]'s are left to the caller.
///
/// # Safety
/// The CPU must support the `i8mm` extension.
#[target_feature(enable = "neon,i8mm")]
pub(crate) unsafe fn tile_k8mm(
    w: &QMatrix<'_>,
    r0: usize,
    nr: usize,
    toks: &TokenPairs<Tok8>,
    out: &mut [f32],
) {
    if nr == 0 || !has_tile_k8mm(w.format()) {
        return;
    }
    // SAFETY: i8mm present per this function's contract; the format is one `row_blocks` takes.
    unsafe { drive::<Tok8>(w, (r0, nr), toks, out) }
}
