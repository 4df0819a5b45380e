//! `Q4_K`, `Q5_K` and `Q6_K` dots with 8-bit activations that have one scale per 256-element
//! super-block (llama.cpp's `Q8_K` granularity; [`QActs::per_super`](crate::quant::QBlocks)),
//! on AVX2: each sub-block's `maddubs` sums are weighted by its integer scale with `madd` and
//! summed in i32 over the super-block, then converted and multiplied by `d_w * d_x` once, as
//! llama.cpp's `ggml_vec_dot_q4_K_q8_K` does. The per-32 activation scales of
//! `kquant_rows.rs` need a conversion and an f32 multiply-add per sub-block instead.
//!
//! Bounds (no i16 saturation, no i32 overflow): `maddubs` pairs of quants up to 31 (Q5_K; Q6_K
//! 63) with `|q_x| <= 127` stay below 2^14 (Q6_K: its offset of 32 subtracted as
//! `maddubs(32, x)` leaves them within ±24130); `madd` with scales up to 63 (Q6_K ±128) and
//! their sums over a super-block stay below 2^27.

use std::arch::x86_64::*;

use super::kquant::{q45k_pair, q6k_half_u};
use super::kquant_rows::prefetch_block;
use super::simd::hsum;
use crate::arch::drivers::RowDots;
use crate::WeightFormat;

/// The Q4_K/Q5_K super-block at `p`: its 8 sub-block scales as i16 in both 128-bit lanes, the
/// f32 `dmin * m[j]` of its 8 mins, and `d`.
///
/// # Safety
/// AVX2/FMA/F16C present; 16 bytes readable at `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q4k_scales_int(p: *const u8) -> (__m256i, __m256, f32) {
    const K1: u32 = 0x3f3f_3f3f;
    const K2: u32 = 0x0f0f_0f0f;
    const K3: u32 = 0x0303_0303;
    // SAFETY: bytes 0..16 readable per contract.
    let (dm, u0, u1, u2) = unsafe {
        (
            std::ptr::read_unaligned(p as *const i32),
            std::ptr::read_unaligned(p.add(4) as *const u32),
            std::ptr::read_unaligned(p.add(8) as *const u32),
            std::ptr::read_unaligned(p.add(12) as *const u32),
        )
    };
    // llama.cpp's kmask shuffle, as `kquant_rows::q4k_scales8`.
    let sc = u64::from(u0 & K1) | u64::from((u2 & K2) | (((u0 >> 6) & K3) << 4)) << 32;
    let mn = u64::from(u1 & K1) | u64::from(((u2 >> 4) & K2) | (((u1 >> 6) & K3) << 4)) << 32;
    let dm = _mm_cvtph_ps(_mm_cvtsi32_si128(dm));
    let dmin = _mm256_broadcastss_ps(_mm_movehdup_ps(dm));
    let mins = _mm256_mul_ps(
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(mn as i64))),
        dmin,
    );
    let sc16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(sc as i64));
    (_mm256_broadcastsi128_si256(sc16), mins, _mm_cvtss_f32(dm))
}

/// The i16 scale of sub-block `j` (0..8) of [`q4k_scales_int`]'s vector, in every lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn sub_scale(scales: __m256i, j: usize) -> __m256i {
    let b = (2 * j) as i16;
    _mm256_shuffle_epi8(scales, _mm256_set1_epi16(b | ((b + 1) << 8)))
}

/// The Q6_K super-block at `p`: its 16 signed sub-block scales in both 128-bit lanes, and `d`.
///
/// # Safety
/// AVX2/FMA/F16C present; 210 bytes readable at `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q6k_scales_d(p: *const u8) -> (__m256i, f32) {
    // SAFETY: bytes 192..210 readable per the contract.
    unsafe {
        let sc = _mm256_broadcastsi128_si256(_mm_loadu_si128(p.add(192) as *const __m128i));
        let h = std::ptr::read_unaligned(p.add(208) as *const u16);
        (
            sc,
            _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(h)))),
        )
    }
}

/// The i16 scales of 32-element block `j` (0..8) of [`q6k_scales_d`]'s vector: sub-block `2j` in
/// the low 128 bits, `2j + 1` in the high ones. The scale byte goes into the high byte of every
/// i16 lane (the low byte zero), then is shifted down with its sign. The shuffle pattern is a
/// constant plus `2j` in every high byte: where `j` is not a constant, nothing assembles a
/// 32-byte vector byte by byte (that made `Int8` decode of Q6_K several times slower).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn q6k_block_scale(sc: __m256i, j: usize) -> __m256i {
    let base = _mm256_setr_epi8(
        -1, 0, -1, 0, -1, 0, -1, 0, -1, 0, -1, 0, -1, 0, -1, 0, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1,
        -1, 1, -1, 1, -1, 1,
    );
    let pick = _mm256_add_epi8(base, _mm256_set1_epi16(((2 * j) as i16) << 8));
    _mm256_srai_epi16::<8>(_mm256_shuffle_epi8(sc, pick))
}

/// One token's super-block-scaled 8-bit activations: quants `x`, scales `d` (one per super-block
/// repeated 8 times) and per-block sums `s` ([`QActs::quantize_super`](crate::quant::QBlocks)).
#[derive(Clone, Copy)]
pub(super) struct SuperActs<'a> {
    pub(super) x: &'a [i8],
    pub(super) d: &'a [f32],
    pub(super) s: &'a [f32],
}

/// Q4_K/Q5_K dots of `R` rows with `C` tokens' super-block-scaled 8-bit activations: `out[i][c]`
/// is row `i` · token `c`, each the same f32 operations in the same order whatever `R` and `C`
/// (integer sums per super-block, then one conversion and multiply-add a super-block into an
/// 8-lane accumulator, summed horizontally at the end), so a token's result does not depend on
/// the tile it was computed in.
///
/// # Safety
/// AVX2/FMA/F16C present.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q45k_tile<const Q5: bool, const R: usize, const C: usize>(
    rows: [&[u8]; R],
    xs: &[SuperActs<'_>; C],
) -> [[f32; C]; R] {
    let format = if Q5 {
        WeightFormat::Q5_K
    } else {
        WeightFormat::Q4_K
    };
    let nsb = xs.first().map_or(0, |a| a.d.len() / 8);
    let bb = if Q5 { 176 } else { 144 };
    assert!(rows.iter().all(|r| r.len() >= nsb * bb));
    assert!(xs
        .iter()
        .all(|a| a.d.len() >= nsb * 8 && a.x.len() >= nsb * 256 && a.s.len() >= nsb * 8));
    let mut acc = [[_mm256_setzero_ps(); C]; R];
    let mut mins = [[_mm256_setzero_ps(); C]; R];
    for sb in 0..nsb {
        // SAFETY: sb < nsb: super-block sb of every row, and every token's activations
        // sb*256 .. sb*256 + 256 and scales sb*8 .. sb*8 + 8, are in bounds (asserted above);
        // `q45k_pair` asserts the block length.
        unsafe {
            let mut blk: [&[u8]; R] = [&[]; R];
            for i in 0..R {
                blk[i] = &rows[i][sb * bb..(sb + 1) * bb];
            }
            let mut scales = [_mm256_setzero_si256(); R];
            let mut dd = [[0f32; C]; R];
            for i in 0..R {
                prefetch_block::<R>(blk[i].as_ptr(), bb);
                let (sc, ml, dw) = q4k_scales_int(blk[i].as_ptr());
                scales[i] = sc;
                for c in 0..C {
                    let sx = _mm256_loadu_ps(xs[c].s.as_ptr().add(sb * 8));
                    dd[i][c] = dw * *xs[c].d.get_unchecked(sb * 8);
                    mins[i][c] = _mm256_fmadd_ps(ml, sx, mins[i][c]);
                }
            }
            let mut sumi = [[_mm256_setzero_si256(); C]; R];
            for g in 0..4 {
                for i in 0..R {
                    let [q0, q1] = q45k_pair(format, blk[i], g);
                    let (s0, s1) = (sub_scale(scales[i], 2 * g), sub_scale(scales[i], 2 * g + 1));
                    for c in 0..C {
                        let xp = xs[c].x.as_ptr().add(sb * 256 + 64 * g);
                        let x0 = _mm256_loadu_si256(xp as *const __m256i);
                        let x1 = _mm256_loadu_si256(xp.add(32) as *const __m256i);
                        let p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(q0, x0), s0);
                        let p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(q1, x1), s1);
                        sumi[i][c] = _mm256_add_epi32(sumi[i][c], _mm256_add_epi32(p0, p1));
                    }
                }
            }
            for i in 0..R {
                for c in 0..C {
                    acc[i][c] = _mm256_fmadd_ps(
                        _mm256_cvtepi32_ps(sumi[i][c]),
                        _mm256_set1_ps(dd[i][c]),
                        acc[i][c],
                    );
                }
            }
        }
    }
    let mut out = [[0f32; C]; R];
    for i in 0..R {
        for c in 0..C {
            out[i][c] = hsum(acc[i][c]) - hsum(mins[i][c]);
        }
    }
    out
}

/// Q6_K dots of `R` rows with `C` tokens' super-block-scaled 8-bit activations (as
/// [`q45k_tile`]): the unsigned quants (0..=63) `maddubs` the activations, less `maddubs(32, x)`,
/// weighted by the signed scales of the two 16-element sub-blocks of each 32-element block (one
/// per 128-bit lane).
///
/// # Safety
/// AVX2/FMA/F16C present.
// `k` also picks the activation block and the scales, not only `q[i][k]`.
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6k_tile<const R: usize, const C: usize>(
    rows: [&[u8]; R],
    xs: &[SuperActs<'_>; C],
) -> [[f32; C]; R] {
    let nsb = xs.first().map_or(0, |a| a.d.len() / 8);
    let bb = 210;
    assert!(rows.iter().all(|r| r.len() >= nsb * bb));
    assert!(xs
        .iter()
        .all(|a| a.d.len() >= nsb * 8 && a.x.len() >= nsb * 256));
    let c32 = _mm256_set1_epi8(32);
    let mut acc = [[_mm256_setzero_ps(); C]; R];
    for sb in 0..nsb {
        // SAFETY: sb < nsb: super-block sb of every row, and every token's activations
        // sb*256 .. sb*256 + 256 and scale sb*8, are in bounds (asserted above); `q6k_half_u`
        // asserts the block length.
        unsafe {
            // Each row's block, its 16 signed scales in both lanes, and d.
            let mut blk: [&[u8]; R] = [&[]; R];
            let mut sc = [_mm256_setzero_si256(); R];
            let mut dw = [0f32; R];
            for i in 0..R {
                blk[i] = &rows[i][sb * bb..(sb + 1) * bb];
                let p = blk[i].as_ptr();
                prefetch_block::<R>(p, bb);
                (sc[i], dw[i]) = q6k_scales_d(p);
            }
            let mut sumi = [[_mm256_setzero_si256(); C]; R];
            for n in 0..2 {
                let mut q = [[_mm256_setzero_si256(); 4]; R];
                for i in 0..R {
                    q[i] = q6k_half_u(blk[i], n);
                }
                for k in 0..4 {
                    let j = 4 * n + k;
                    let mut scale = [_mm256_setzero_si256(); R];
                    for i in 0..R {
                        scale[i] = q6k_block_scale(sc[i], j);
                    }
                    for c in 0..C {
                        let xv = _mm256_loadu_si256(
                            xs[c].x.as_ptr().add(sb * 256 + 32 * j) as *const __m256i
                        );
                        let off = _mm256_maddubs_epi16(c32, xv);
                        for i in 0..R {
                            let p = _mm256_sub_epi16(_mm256_maddubs_epi16(q[i][k], xv), off);
                            sumi[i][c] =
                                _mm256_add_epi32(sumi[i][c], _mm256_madd_epi16(p, scale[i]));
                        }
                    }
                }
            }
            for i in 0..R {
                for c in 0..C {
                    let dd = dw[i] * *xs[c].d.get_unchecked(sb * 8);
                    acc[i][c] = _mm256_fmadd_ps(
                        _mm256_cvtepi32_ps(sumi[i][c]),
                        _mm256_set1_ps(dd),
                        acc[i][c],
                    );
                }
            }
        }
    }
    let mut out = [[0f32; C]; R];
    for i in 0..R {
        for c in 0..C {
            out[i][c] = hsum(acc[i][c]);
        }
    }
    out
}

/// [`q45k_tile`] or [`q6k_tile`] by `format` (Q4_K, Q5_K or Q6_K).
///
/// # Safety
/// AVX2/FMA/F16C present.
#[inline(always)]
pub(super) unsafe fn k_super_tile<const R: usize, const C: usize>(
    format: WeightFormat,
    rows: [&[u8]; R],
    xs: &[SuperActs<'_>; C],
) -> [[f32; C]; R] {
    // SAFETY: AVX2/FMA/F16C present per this function's contract; the kernels assert the
    // lengths they rely on.
    unsafe {
        match format {
            WeightFormat::Q4_K => q45k_tile::<false, R, C>(rows, xs),
            WeightFormat::Q5_K => q45k_tile::<true, R, C>(rows, xs),
            _ => q6k_tile::<R, C>(rows, xs),
        }
    }
}

/// The K-quant kernels with super-block-scaled 8-bit activations as a [`RowDots`] kernel:
/// `format` is Q4_K, Q5_K or Q6_K.
pub(super) struct K8SuperDots<'a> {
    pub(super) format: WeightFormat,
    pub(super) acts: SuperActs<'a>,
}

impl RowDots for K8SuperDots<'_> {
    #[inline(always)]
    unsafe fn dots<const N: usize>(&self, rows: [&[u8]; N]) -> [f32; N] {
        // SAFETY: AVX2/FMA/F16C present per this method's contract.
        let t = unsafe { k_super_tile::<N, 1>(self.format, rows, &[self.acts]) };
        t.map(|[v]| v)
    }
}
