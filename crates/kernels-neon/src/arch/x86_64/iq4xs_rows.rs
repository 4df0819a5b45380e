//! `IQ4_XS` integer dots of several rows at once, sharing the activation
//! loads between the rows (as [`super::kquant_rows`] does for Q4_K..Q6_K).
//!
//! Per 32-block the nibbles are looked up in the IQ4_NL table (signed
//! values, |v| <= 127) and summed exactly in i32 with the block's
//! activations, then multiplied by `(d * (ls - 32)) * d_x` (the scalar
//! reference's factor, as `scalar::iq4xs_scales` computes it, times the
//! activation scale; eight per super-block at once).
//!
//! 16-bit activations ([`Precision::Fast`](crate::Precision::Fast)), [`iq4xs_i16_rows`]: they
//! come in [`even_odd`](super::kquant_rows::even_odd) order. One 32-byte load holds two
//! sub-blocks' nibbles; masked, the low nibbles (elements 0..16) of both are in one register
//! and the high ones (16..32) in another, and a lane permute per sub-block puts its 32 in
//! element order before the table lookup. Read as 16 i16 lanes they hold an
//! even element (low byte) and an odd one (high byte), sign-extended with shifts. The 8 scales
//! are decoded with vector shifts, and the 8 sub-blocks' i32 lane sums are reduced together as
//! they come ([`sum_pairs`], [`sum_quads`], as Q4_K): one conversion and one FMA per
//! super-block and row instead of 8 of each and their broadcasts.
//!
//! 8-bit activations ([`Precision::Int8`](crate::Precision::Int8); `Fast` decode keeps 16 bits,
//! `crate::fast_decode_int8`), [`iq4xs_rows`]: in element order, the same loads and reductions, the products by
//! `maddubs_epi16` as llama.cpp does: `|v|` unsigned, the activations carrying `v`'s sign.

use std::arch::x86_64::*;

use super::kquant_rows::{prefetch_block, sub_block_sums, sum_pairs, sum_quads};
use super::simd::hsum;
use crate::arch::drivers::RowDots;

/// IQ4_XS dot of `R` rows with 8-bit activations at `x` in element order and scales `d`: as
/// [`iq4xs_i16_rows`], two sub-blocks per load and their sums reduced together, the products by
/// `maddubs` (`|v|` unsigned, the activations carrying `v`'s sign, as llama.cpp does).
///
/// # Safety
/// AVX2/FMA/F16C present; `x` points at `x_len` readable activation quants.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq4xs_rows<const R: usize>(
    rows: [&[u8]; R],
    x: *const u8,
    x_len: usize,
    d: &[f32],
) -> [f32; R] {
    let nsb = d.len() / 8;
    let bb = 136;
    assert!(rows.iter().all(|r| r.len() >= nsb * bb) && x_len >= nsb * 256);
    // SAFETY: the table is 16 readable bytes.
    let kv = unsafe { _mm_loadu_si128(tensor_types::IQ4NL_VALUES.as_ptr() as *const __m128i) };
    let (tab, m4, ones) = (
        _mm256_broadcastsi128_si256(kv),
        _mm256_set1_epi8(0x0F),
        _mm256_set1_epi16(1),
    );
    let mut acc = [_mm256_setzero_ps(); R];
    for sb in 0..nsb {
        // SAFETY: sb < nsb: super-block sb of every row (bytes sb*bb .. (sb+1)*bb; the nibbles
        // of sub-blocks 2g, 2g + 1 are bytes 8 + 32g .. 40 + 32g <= 136), activations
        // sb*256 .. sb*256 + 256 <= x_len and scales sb*8 .. sb*8 + 8 are in bounds (asserted).
        unsafe {
            let xp = x.add(sb * 256);
            let dx = _mm256_loadu_ps(d.as_ptr().add(sb * 8));
            let blk: [*const u8; R] = std::array::from_fn(|i| rows[i].as_ptr().add(sb * bb));
            let scale: [__m256; R] = std::array::from_fn(|i| {
                prefetch_block::<R>(blk[i], bb);
                iq4xs_scales8(blk[i], dx)
            });
            let mut pairs = [[_mm256_setzero_si256(); 2]; R];
            let mut quads = [[_mm256_setzero_si256(); 2]; R];
            for g in 0..4 {
                let x0 = _mm256_loadu_si256(xp.add(64 * g) as *const __m256i);
                let x1 = _mm256_loadu_si256(xp.add(64 * g + 32) as *const __m256i);
                for i in 0..R {
                    let raw = _mm256_loadu_si256(blk[i].add(8 + 32 * g) as *const __m256i);
                    let (lo, hi) = (
                        _mm256_and_si256(raw, m4),
                        _mm256_and_si256(_mm256_srli_epi16::<4>(raw), m4),
                    );
                    let va = _mm256_shuffle_epi8(tab, _mm256_permute2x128_si256::<0x20>(lo, hi));
                    let vb = _mm256_shuffle_epi8(tab, _mm256_permute2x128_si256::<0x31>(lo, hi));
                    // |v|, |q_x| <= 127: a maddubs pair is at most 32258, below 2^15.
                    let pa =
                        _mm256_maddubs_epi16(_mm256_sign_epi8(va, va), _mm256_sign_epi8(x0, va));
                    let pb =
                        _mm256_maddubs_epi16(_mm256_sign_epi8(vb, vb), _mm256_sign_epi8(x1, vb));
                    let (pa, pb) = (_mm256_madd_epi16(pa, ones), _mm256_madd_epi16(pb, ones));
                    pairs[i][g % 2] = sum_pairs(pa, pb);
                    if g % 2 == 1 {
                        quads[i][g / 2] = sum_quads(pairs[i][0], pairs[i][1]);
                    }
                }
            }
            for i in 0..R {
                // Lane j: sub-block j's exact sum (below 2^21), times `(d * (ls_j - 32)) * d_x`.
                let isum = sub_block_sums(quads[i]);
                acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), scale[i], acc[i]);
            }
        }
    }
    std::array::from_fn(|i| hsum(acc[i]))
}

/// `(d * (ls_j - 32)) * d_x[j]` for the 8 sub-blocks of the IQ4_XS super-block at `p` (the
/// scalar reference's factors, `scalar::iq4xs_scales`, times the activation scales `dx`).
///
/// # Safety
/// AVX2/FMA/F16C present; 8 bytes readable at `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq4xs_scales8(p: *const u8, dx: __m256) -> __m256 {
    // SAFETY: bytes 0..8 readable per contract.
    let (d, sh, sl) = unsafe {
        (
            std::ptr::read_unaligned(p as *const u16),
            std::ptr::read_unaligned(p.add(2) as *const u16),
            std::ptr::read_unaligned(p.add(4) as *const u32),
        )
    };
    // Sub-block j: nibble j of `sl` (low 4 bits), bits 2j..2j + 2 of `sh` (high 2).
    let lo = _mm256_srlv_epi32(
        _mm256_set1_epi32(sl as i32),
        _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28),
    );
    let hi = _mm256_srlv_epi32(
        _mm256_set1_epi32(i32::from(sh)),
        _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14),
    );
    let ls = _mm256_or_si256(
        _mm256_and_si256(lo, _mm256_set1_epi32(0xF)),
        _mm256_slli_epi32::<4>(_mm256_and_si256(hi, _mm256_set1_epi32(3))),
    );
    let ls = _mm256_cvtepi32_ps(_mm256_sub_epi32(ls, _mm256_set1_epi32(32)));
    let d = _mm256_set1_ps(_mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(d)))));
    _mm256_mul_ps(_mm256_mul_ps(ls, d), dx)
}

/// The exact i32 lane sums of the 32 signed values `v` (even elements in the low bytes, odd in
/// the high) with the even and odd activations `xe`, `xo`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn ext(v: __m256i, xe: __m256i, xo: __m256i) -> __m256i {
    let ev = _mm256_srai_epi16::<8>(_mm256_slli_epi16::<8>(v));
    let od = _mm256_srai_epi16::<8>(v);
    _mm256_add_epi32(_mm256_madd_epi16(ev, xe), _mm256_madd_epi16(od, xo))
}

/// IQ4_XS dot of `R` rows with 16-bit activations at `x` in
/// [`even_odd`](super::kquant_rows::even_odd) order and scales `d`: two sub-blocks per load,
/// their sums reduced together (module docs).
///
/// # Safety
/// AVX2/FMA/F16C present; `x` points at `x_len` readable activation quants.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq4xs_i16_rows<const R: usize>(
    rows: [&[u8]; R],
    x: *const i16,
    x_len: usize,
    d: &[f32],
) -> [f32; R] {
    let nsb = d.len() / 8;
    let bb = 136;
    assert!(rows.iter().all(|r| r.len() >= nsb * bb) && x_len >= nsb * 256);
    // SAFETY: the table is 16 readable bytes.
    let kv = unsafe { _mm_loadu_si128(tensor_types::IQ4NL_VALUES.as_ptr() as *const __m128i) };
    let (tab, m4) = (_mm256_broadcastsi128_si256(kv), _mm256_set1_epi8(0x0F));
    let mut acc = [_mm256_setzero_ps(); R];
    for sb in 0..nsb {
        // SAFETY: sb < nsb: super-block sb of every row (bytes sb*bb .. (sb+1)*bb; the nibbles
        // of sub-blocks 2g, 2g + 1 are bytes 8 + 32g .. 40 + 32g <= 136), activations
        // sb*256 .. sb*256 + 256 <= x_len and scales sb*8 .. sb*8 + 8 are in bounds (asserted).
        unsafe {
            let xp = x.add(sb * 256);
            let dx = _mm256_loadu_ps(d.as_ptr().add(sb * 8));
            let blk: [*const u8; R] = std::array::from_fn(|i| rows[i].as_ptr().add(sb * bb));
            let scale: [__m256; R] = std::array::from_fn(|i| {
                prefetch_block::<R>(blk[i], bb);
                iq4xs_scales8(blk[i], dx)
            });
            let mut pairs = [[_mm256_setzero_si256(); 2]; R];
            let mut quads = [[_mm256_setzero_si256(); 2]; R];
            for g in 0..4 {
                let xg = xp.add(64 * g);
                let xe0 = _mm256_loadu_si256(xg as *const __m256i);
                let xo0 = _mm256_loadu_si256(xg.add(16) as *const __m256i);
                let xe1 = _mm256_loadu_si256(xg.add(32) as *const __m256i);
                let xo1 = _mm256_loadu_si256(xg.add(48) as *const __m256i);
                for i in 0..R {
                    let raw = _mm256_loadu_si256(blk[i].add(8 + 32 * g) as *const __m256i);
                    // Low nibbles: elements 0..16 of sub-blocks 2g (lane 0), 2g + 1 (lane 1);
                    // high nibbles: elements 16..32. Each sub-block's 32 in element order:
                    let (lo, hi) = (
                        _mm256_and_si256(raw, m4),
                        _mm256_and_si256(_mm256_srli_epi16::<4>(raw), m4),
                    );
                    let va = _mm256_shuffle_epi8(tab, _mm256_permute2x128_si256::<0x20>(lo, hi));
                    let vb = _mm256_shuffle_epi8(tab, _mm256_permute2x128_si256::<0x31>(lo, hi));
                    // Even elements in the low bytes, odd in the high, sign-extended;
                    // |v| <= 127, |q_x| <= 32767: each i32 lane sums 4 products, below 2^24.
                    pairs[i][g % 2] = sum_pairs(ext(va, xe0, xo0), ext(vb, xe1, xo1));
                    if g % 2 == 1 {
                        quads[i][g / 2] = sum_quads(pairs[i][0], pairs[i][1]);
                    }
                }
            }
            for i in 0..R {
                // Lane j: sub-block j's exact sum (below 2^27), times `(d * (ls_j - 32)) * d_x`.
                let isum = sub_block_sums(quads[i]);
                acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), scale[i], acc[i]);
            }
        }
    }
    std::array::from_fn(|i| hsum(acc[i]))
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
                iq4xs_rows::<N>(rows, x, len, self.d)
            } else {
                iq4xs_i16_rows::<N>(rows, x as *const i16, len, self.d)
            }
        }
    }
}
