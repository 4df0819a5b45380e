//! The 8-bit prompt tile of the 32-element block formats with `smmla` (the `i8mm` extension,
//! [`KernelPath::NeonI8mm`](crate::KernelPath::NeonI8mm)), driven by `tile_mm.rs`: per block of
//! two rows and two tokens four `smmla` give the exact dots of the tokens' 8-bit activations
//! (`QActs`, one scale per 32) with the rows' quants, `matvec_int8`'s products.

use std::arch::aarch64::*;

use super::tile_mm::{
    drive, drive_blocks, interleave, k_row_pair, q6k_row_pair, smmla, token_lanes, token_pairs,
    TokenBlock,
};
use crate::quant::QActs;
use crate::{QMatrix, WeightFormat};

/// Whether [`tile_i8mm`] takes weights of `format`: the formats of 32-element blocks of integer
/// quants.
pub(crate) fn has_tile_i8mm(format: WeightFormat) -> bool {
    use WeightFormat::*;
    matches!(format, Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | IQ4_NL)
}

/// One block of a token pair's 8-bit activations, interleaved (for each 8 elements `8c..8c + 8`,
/// the first token's then the second's), with its factors.
#[derive(Clone, Copy)]
struct Tok8 {
    q: [int8x16_t; 4],
    d: float32x4_t,
    s: float32x4_t,
}

impl TokenBlock for Tok8 {
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
    #[inline(always)]
    fn d(&self) -> float32x4_t {
        self.d
    }
    #[inline(always)]
    fn s(&self) -> float32x4_t {
        self.s
    }
}

/// The blocks of tokens `a` and `b` (`b` may be `a`).
#[target_feature(enable = "neon")]
fn token_pair(a: &QActs, b: &QActs, nb: usize) -> Vec<Tok8> {
    let half = |x: &QActs, e: usize| {
        let q = &x.qs[e..e + 16];
        // SAFETY: `q` has exactly 16 readable i8 (bounds-checked above).
        unsafe { vld1q_s8(q.as_ptr()) }
    };
    (0..nb)
        .map(|blk| {
            let e = 32 * blk;
            let (pa, pb) = ((half(a, e), half(a, e + 16)), (half(b, e), half(b, e + 16)));
            Tok8 {
                q: interleave(pa, pb),
                d: token_lanes(a.d[blk], b.d[blk]),
                s: token_lanes(a.s[blk], b.s[blk]),
            }
        })
        .collect()
}

/// The 8-bit prompt tile with `smmla`: `out[t * nr + i]` = row `r0 + i` of `w` · token `t` for
/// every token of `acts` (8-bit activations with one scale per 32, `QActs::quantize`): the
/// integer products of [`matvec_int8`](super::matvec_int8), summed in another f32 order. Formats
/// other than [`has_tile_i8mm`]'s are left to the caller.
///
/// # Safety
/// The CPU must support the `i8mm` extension.
#[target_feature(enable = "neon,i8mm")]
pub(crate) unsafe fn tile_i8mm(
    w: &QMatrix<'_>,
    r0: usize,
    nr: usize,
    acts: &[QActs],
    out: &mut [f32],
) {
    let n = acts.len();
    if n == 0 || nr == 0 || !has_tile_i8mm(w.format()) {
        return;
    }
    let nb = w.cols() / 32;
    let pairs = token_pairs(acts, |a, b| token_pair(a, b, nb));
    // SAFETY: i8mm present per this function's contract.
    unsafe { drive_blocks::<Tok8>(w, (r0, nr), &pairs, n, out) }
}

/// Whether [`tile_k8mm`] takes weights of `format`: Q4_K, Q5_K and Q6_K.
pub(crate) fn has_tile_k8mm(format: WeightFormat) -> bool {
    matches!(
        format,
        WeightFormat::Q4_K | WeightFormat::Q5_K | WeightFormat::Q6_K
    )
}

/// The 8-bit prompt tile of Q4_K, Q5_K and Q6_K rows with `smmla`: `out[t * nr + i]` = row `r0 +
/// i` of `w` · token `t` for every token of `acts` (8-bit activations with one scale per 256,
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
    acts: &[QActs],
    out: &mut [f32],
) {
    let (n, format) = (acts.len(), w.format());
    if n == 0 || nr == 0 || !has_tile_k8mm(format) {
        return;
    }
    let nb = w.cols() / 32;
    let pairs = token_pairs(acts, |a, b| token_pair(a, b, nb));
    // SAFETY: i8mm present per this function's contract; Q4_K and Q5_K rows unpack by
    // `k_row_pair`, Q6_K ones by `q6k_row_pair`, into `nb` blocks of 32.
    unsafe {
        if format == WeightFormat::Q6_K {
            drive::<Tok8, false, true>(w, (r0, nr), &pairs, n, out, |a, b| q6k_row_pair(a, b))
        } else {
            drive::<Tok8, true, false>(w, (r0, nr), &pairs, n, out, |a, b| k_row_pair(format, a, b))
        }
    }
}
