//! `IQ4_XS` integer dots of several rows at once, sharing the activation
//! loads between the rows (as [`super::kquant_rows`] does for Q4_K..Q6_K).
//!
//! Per 32-block the nibbles are looked up in the IQ4_NL table (signed
//! values, |v| <= 127) and summed exactly in i32 with the block's
//! activations, then converted once and FMA'd with `(d * (ls - 32)) * d_x`
//! (the scalar reference's factor, from `scalar::iq4xs_scales`, times the
//! activation scale; eight per super-block at once). 16-bit activations
//! ([`Precision::Fast`](crate::Precision::Fast)) come in
//! [`even_odd`](super::kquant_rows::even_odd) order: the 32 values read as
//! 16 i16 lanes hold an even element (low byte) and an odd one (high byte),
//! sign-extended with shifts. 8-bit activations stay in element order and go
//! into `maddubs_epi16` as llama.cpp does: `|v|` unsigned, the activations
//! carrying `v`'s sign.

use std::arch::x86_64::*;

use super::kquant_rows::prefetch_block;
use super::simd::{acts_block32, hsum, iq4nl_values32};
use crate::arch::drivers::RowDots;

/// IQ4_XS dot of `R` rows with activations at `x` (`A8`: 8-bit in element
/// order; else 16-bit in even/odd order) and scales `d`.
///
/// # Safety
/// AVX2/FMA/F16C present; `x` points at `x_len` readable activation quants.
// `i` indexes several per-row arrays at once.
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq4xs_rows<const A8: bool, const R: usize>(
    rows: [&[u8]; R],
    x: *const u8,
    x_len: usize,
    d: &[f32],
) -> [f32; R] {
    let nsb = d.len() / 8;
    let bb = 136;
    assert!(rows.iter().all(|r| r.len() >= nsb * bb) && x_len >= nsb * 256);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    for sb in 0..nsb {
        let mut blk = [&rows[0][..0]; R];
        let mut scale = [[0f32; 8]; R];
        // SAFETY: sb < nsb: super-block sb of every row (bb bytes at sb*bb)
        // and scales sb*8 .. sb*8 + 8 are in bounds (asserted above).
        unsafe {
            let dx = _mm256_loadu_ps(d.as_ptr().add(sb * 8));
            for i in 0..R {
                blk[i] = &rows[i][sb * bb..(sb + 1) * bb];
                prefetch_block::<R>(blk[i].as_ptr(), bb);
                let dl = crate::scalar::iq4xs_scales(blk[i]);
                let f = _mm256_mul_ps(_mm256_loadu_ps(dl.as_ptr()), dx);
                _mm256_storeu_ps(scale[i].as_mut_ptr(), f);
            }
        }
        for j in 0..8 {
            let e = sb * 256 + 32 * j;
            // SAFETY: the nibbles of sub-block j are bytes 8+16j .. 24+16j
            // <= 136 = bb of each block; activation elements e .. e + 32 <=
            // nsb*256 <= x_len (asserted above).
            unsafe {
                let (x0, x1) = acts_block32::<A8>(x, e);
                for i in 0..R {
                    let v = iq4nl_values32(blk[i].as_ptr().add(8 + 16 * j));
                    let isum = if A8 {
                        // |v|, |q_x| <= 127: a maddubs pair is at most 32258, below 2^15.
                        let p = _mm256_maddubs_epi16(_mm256_abs_epi8(v), _mm256_sign_epi8(x0, v));
                        _mm256_madd_epi16(p, ones)
                    } else {
                        // Even elements in the low bytes, odd in the high, sign-extended;
                        // |v| <= 127, |q_x| <= 32767: each i32 lane sums 4 products, below 2^24.
                        let ev = _mm256_srai_epi16::<8>(_mm256_slli_epi16::<8>(v));
                        let od = _mm256_srai_epi16::<8>(v);
                        _mm256_add_epi32(_mm256_madd_epi16(ev, x0), _mm256_madd_epi16(od, x1))
                    };
                    let f = _mm256_broadcast_ss(&scale[i][j]);
                    acc[i][j & 1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), f, acc[i][j & 1]);
                }
            }
        }
    }
    std::array::from_fn(|i| hsum(_mm256_add_ps(acc[i][0], acc[i][1])))
}

/// The IQ4_XS kernel as a [`RowDots`] kernel over activation quants `x`:
/// 8-bit ones (`i8`) in element order, or 16-bit ones (`i16`) in even/odd
/// order.
pub(super) struct Iq4xsDots<'a, Q> {
    pub(super) x: &'a [Q],
    pub(super) d: &'a [f32],
}

impl<Q> RowDots for Iq4xsDots<'_, Q> {
    #[inline(always)]
    unsafe fn dots<const N: usize>(&self, rows: [&[u8]; N]) -> [f32; N] {
        let (x, len) = (self.x.as_ptr() as *const u8, self.x.len());
        // SAFETY: AVX2/FMA/F16C present per this method's contract; `x`
        // holds `len` quants of one or two bytes; the kernel asserts the
        // lengths it relies on.
        unsafe {
            if std::mem::size_of::<Q>() == 1 {
                iq4xs_rows::<true, N>(rows, x, len, self.d)
            } else {
                iq4xs_rows::<false, N>(rows, x, len, self.d)
            }
        }
    }
}
