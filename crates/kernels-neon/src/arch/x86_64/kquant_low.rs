//! `Q2_K` and `Q3_K` integer dots of several rows at once, sharing the
//! activation loads between the rows (as [`super::kquant_rows`] does for
//! Q4_K..Q6_K).
//!
//! Both formats hold 2 low bits per quant in `qs` (Q3_K a third in
//! `hmask`) and one scale per 16 elements. The quants are taken unsigned
//! (Q2_K 0..=3, Q3_K `low | h << 2` in 0..=7) and one 32-block (two
//! sub-blocks) sums exactly in i32 lanes, half of them per sub-block, before
//! one convert and one FMA with the f32 factors `d * sc_j * d_x` of its two
//! sub-blocks (computed once per super-block and row, permuted into place
//! per block). What the unsigned form leaves out, Q2_K's `dmin * m` and
//! Q3_K's offset `4 * d * sc`, multiplies the activations' sums over each
//! 16 elements: [`sums16`] computes those once per call for all rows, and a
//! row pays 16 multiply-adds per super-block for them.
//!
//! 16-bit activations ([`Precision::Fast`](crate::Precision::Fast)) come in
//! [`even_odd`](super::kquant_rows::even_odd) order, so a 32-byte load of
//! `qs` read as 16 i16 lanes holds an even element (low byte) and an odd
//! one (high byte) per lane, widened with shifts and masks. 8-bit
//! activations stay in element order and go into `maddubs_epi16` with the
//! unsigned quants (as llama.cpp does), the pair sums widened by
//! `madd_epi16` with ones. In both orders lanes 0..8 of a 16-lane vector
//! belong to the 32-block's first sub-block and lanes 8..16 to its second.

use std::arch::x86_64::*;

use super::kquant_rows::prefetch_block;
use super::simd::{acts_block32, f16_at, hsum};
use crate::arch::drivers::RowDots;

/// Per 16 activations, `d_x * sum(q_x)` of its 32-block (`qs` in element
/// order, `d` one scale per 32).
pub(super) fn sums16<Q: Copy + Into<i32>>(qs: &[Q], d: &[f32]) -> Vec<f32> {
    qs.chunks_exact(16)
        .enumerate()
        .map(|(h, q)| d[h / 2] * q.iter().map(|&v| v.into()).sum::<i32>() as f32)
        .collect()
}

/// 16 i8 lanes widened to f32: lanes 0..8, lanes 8..16.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn widen(v: __m128i) -> [__m256; 2] {
    [
        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)),
        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128::<8>(v))),
    ]
}

/// The scales of a Q2_K or Q3_K super-block: the 16 sub-block scales as
/// f32 (Q3_K's `ls - 32`), the coefficients of the activation sums as f32
/// (Q2_K: the mins `m`; Q3_K: the scales again) with their factor (Q2_K
/// `dmin`, Q3_K `4 * d`), and `d`.
///
/// # Safety
/// AVX2 present; `blk` is a whole block (asserted).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn k23_scales<const Q3: bool>(
    blk: &[u8],
) -> ([__m256; 2], [__m256; 2], f32, f32) {
    if Q3 {
        assert!(blk.len() >= 110);
        let p = blk.as_ptr();
        // SAFETY: bytes 96..110 are inside `blk` (asserted). Plain reads: a closure here was not
        // inlined, and with the scales' f16 in software these took 44% of a Q3_K decode.
        let (a0, a1, t, d) = unsafe {
            (
                std::ptr::read_unaligned(p.add(96) as *const u32),
                std::ptr::read_unaligned(p.add(100) as *const u32),
                std::ptr::read_unaligned(p.add(104) as *const u32),
                f16_at(p.add(108)),
            )
        };
        // llama.cpp's kmask1/kmask2 unpacking (`scalar::q3k_scales`): low 4 bits in
        // nibble s/8 of byte s%8, high 2 bits at bit 2(s/4) of byte 8 + s%4.
        let (k1, k2) = (0x0303_0303u32, 0x0f0f_0f0fu32);
        let s = [
            (a0 & k2) | ((t & k1) << 4),
            (a1 & k2) | (((t >> 2) & k1) << 4),
            ((a0 >> 4) & k2) | (((t >> 4) & k1) << 4),
            ((a1 >> 4) & k2) | (((t >> 6) & k1) << 4),
        ];
        let raw = _mm_set_epi32(s[3] as i32, s[2] as i32, s[1] as i32, s[0] as i32);
        let sc = widen(_mm_sub_epi8(raw, _mm_set1_epi8(32)));
        (sc, sc, d, 4.0 * d)
    } else {
        assert!(blk.len() >= 84);
        // SAFETY: bytes 0..16 are inside `blk` (asserted).
        let raw = unsafe { _mm_loadu_si128(blk.as_ptr() as *const __m128i) };
        let m4 = _mm_set1_epi8(0x0F);
        let sc = widen(_mm_and_si128(raw, m4));
        let m = widen(_mm_and_si128(_mm_srli_epi16::<4>(raw), m4));
        // SAFETY: bytes 80..84 are inside `blk` (asserted).
        let (d, dmin) = unsafe { (f16_at(blk.as_ptr().add(80)), f16_at(blk.as_ptr().add(82))) };
        (sc, m, d, dmin)
    }
}

/// The f32 factors of a row's 16 sub-blocks in one super-block, `d * sc_j
/// * d_x` (`dx2`: the 8 activation scales, each repeated for its two
/// sub-blocks), and its correction `acc + factor * sum_j coef_j * s16_j`
/// (to be subtracted; `s16` the super-block's 16 activation sums).
///
/// # Safety
/// AVX2/FMA present; `blk` a whole block (asserted); 16 floats readable at
/// `s16`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn k23_factors<const Q3: bool>(
    blk: &[u8],
    dx2: [__m256; 2],
    s16: *const f32,
    acc: __m256,
) -> ([__m256; 2], __m256) {
    // SAFETY: features present per contract; `k23_scales` asserts the block
    // length; 16 floats readable at `s16` per contract.
    unsafe {
        let (sc, coef, d, factor) = k23_scales::<Q3>(blk);
        let dd = _mm256_set1_ps(d);
        let f = [
            _mm256_mul_ps(sc[0], _mm256_mul_ps(dx2[0], dd)),
            _mm256_mul_ps(sc[1], _mm256_mul_ps(dx2[1], dd)),
        ];
        let (s0, s1) = (_mm256_loadu_ps(s16), _mm256_loadu_ps(s16.add(8)));
        let t = _mm256_fmadd_ps(coef[1], s1, _mm256_mul_ps(coef[0], s0));
        (f, _mm256_fmadd_ps(t, _mm256_set1_ps(factor), acc))
    }
}

/// The 8 activation scales at `d` each repeated for the two sub-blocks of
/// its 32-block: `[d0, d0, d1, d1, d2, d2, d3, d3]`, `[d4, d4, ..., d7, d7]`.
///
/// # Safety
/// AVX2 present; 8 floats readable at `d`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dx_pairs(d: *const f32) -> [__m256; 2] {
    // SAFETY: 8 floats readable at `d` per contract.
    let dx = unsafe { _mm256_loadu_ps(d) };
    [
        _mm256_permutevar8x32_ps(dx, _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3)),
        _mm256_permutevar8x32_ps(dx, _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7)),
    ]
}

/// The factor of 32-block `b` as 8 lanes matching `madd_epi16`'s i32 sums:
/// lanes 0..4 sub-block `2b`, lanes 4..8 sub-block `2b + 1` (from the
/// factors of [`k23_factors`]).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn block_factor(f: &[__m256; 2], b: usize) -> __m256 {
    let c = 2 * (b as i32 % 4);
    let idx = _mm256_setr_epi32(c, c, c, c, c + 1, c + 1, c + 1, c + 1);
    _mm256_permutevar8x32_ps(f[b / 4], idx)
}

/// The unsigned quants of 32-block `4n + k` of a Q2_K (`Q3 = false`, 0..=3)
/// or Q3_K (`low | h << 2`, 0..=7) super-block as 32 bytes in element
/// order, from its `qs` half `raw` (bytes `32n..32n + 32`) and Q3_K's
/// `hmask` `hm`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn k23_quants<const Q3: bool>(raw: __m256i, hm: __m256i, n: usize, k: usize) -> __m256i {
    // 16-bit shifts: the masks drop the bits shifted in from the other byte.
    let q = _mm256_and_si256(
        _mm256_srl_epi16(raw, _mm_cvtsi32_si128(2 * k as i32)),
        _mm256_set1_epi8(3),
    );
    if !Q3 {
        return q;
    }
    // Bit t = 4n + k of every hmask byte, moved to bit 2.
    let t = 4 * n + k;
    let h = if t >= 2 {
        _mm256_srl_epi16(hm, _mm_cvtsi32_si128(t as i32 - 2))
    } else {
        _mm256_sll_epi16(hm, _mm_cvtsi32_si128(2 - t as i32))
    };
    _mm256_or_si256(q, _mm256_and_si256(h, _mm256_set1_epi8(4)))
}

/// Q2_K (`Q3 = false`) or Q3_K dot of `R` rows with activations `x` (`A8`:
/// 8-bit in element order; else 16-bit in even/odd order), scales `d`,
/// per-16 sums `s16` from [`sums16`].
///
/// # Safety
/// AVX2/FMA/F16C present; `x` points at `x_len` readable activation quants.
// `i` indexes several per-row arrays at once.
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn k23_rows<const Q3: bool, const A8: bool, const R: usize>(
    rows: [&[u8]; R],
    x: *const u8,
    x_len: usize,
    d: &[f32],
    s16: &[f32],
) -> [f32; R] {
    let nsb = d.len() / 8;
    let (bb, qoff) = if Q3 { (110, 32) } else { (84, 16) };
    assert!(rows.iter().all(|r| r.len() >= nsb * bb) && x_len >= nsb * 256);
    assert!(s16.len() >= nsb * 16);
    let low = _mm256_set1_epi16(0x00FF);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    let mut corr = [_mm256_setzero_ps(); R];
    for sb in 0..nsb {
        let mut blk = [&rows[0][..0]; R];
        let mut f = [[_mm256_setzero_ps(); 2]; R];
        // SAFETY: sb < nsb: super-block sb of every row (bb bytes at sb*bb),
        // scales sb*8 .. sb*8 + 8 and sums sb*16 .. sb*16 + 16 are in bounds
        // (asserted above).
        unsafe {
            let dx2 = dx_pairs(d.as_ptr().add(sb * 8));
            for i in 0..R {
                blk[i] = &rows[i][sb * bb..(sb + 1) * bb];
                prefetch_block::<R>(blk[i].as_ptr(), bb);
                let s16p = s16.as_ptr().add(sb * 16);
                (f[i], corr[i]) = k23_factors::<Q3>(blk[i], dx2, s16p, corr[i]);
            }
        }
        for n in 0..2 {
            // SAFETY: bytes qoff + 32n .. qoff + 32n + 32 (<= 96 for Q3_K,
            // 80 for Q2_K) and Q3_K's hmask 0..32 are inside the blocks (bb
            // bytes each); activations of block 8sb + 4n + k: elements below
            // nsb*256 <= x_len (asserted above).
            unsafe {
                // Plain loops: a closure would not inline into this function's features.
                let mut raw = [_mm256_setzero_si256(); R];
                let mut hm = [_mm256_setzero_si256(); R];
                for i in 0..R {
                    raw[i] =
                        _mm256_loadu_si256(blk[i].as_ptr().add(qoff + 32 * n) as *const __m256i);
                    if Q3 {
                        hm[i] = _mm256_loadu_si256(blk[i].as_ptr() as *const __m256i);
                    }
                }
                for k in 0..4 {
                    let b = 4 * n + k;
                    let e = sb * 256 + 32 * b;
                    let (x0, x1) = acts_block32::<A8>(x, e);
                    for i in 0..R {
                        let q = k23_quants::<Q3>(raw[i], hm[i], n, k);
                        // Lanes 0..4 of the i32 sums: sub-block 2b; 4..8: 2b + 1.
                        let isum = if A8 {
                            // u <= 7, |q_x| <= 127: maddubs pairs stay below 2^11.
                            _mm256_madd_epi16(_mm256_maddubs_epi16(q, x0), ones)
                        } else {
                            // Even elements in the low bytes, odd in the high; u <= 7 and
                            // |q_x| <= 32767: each i32 lane sums 4 products, below 2^18.
                            let ev = _mm256_and_si256(q, low);
                            let od = _mm256_srli_epi16::<8>(q);
                            _mm256_add_epi32(_mm256_madd_epi16(ev, x0), _mm256_madd_epi16(od, x1))
                        };
                        let fb = block_factor(&f[i], b);
                        acc[i][k & 1] =
                            _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), fb, acc[i][k & 1]);
                    }
                }
            }
        }
    }
    std::array::from_fn(|i| hsum(_mm256_add_ps(acc[i][0], acc[i][1])) - hsum(corr[i]))
}

/// The Q2_K/Q3_K kernels as a [`RowDots`] kernel, over 8-bit activations (`Q = i8`, in element
/// order) or 16-bit ones (`Q = i16`, in even/odd order).
pub(super) struct K23Dots<'a, Q> {
    pub(super) q3: bool,
    pub(super) x: &'a [Q],
    pub(super) d: &'a [f32],
    pub(super) s16: &'a [f32],
}

impl<Q> RowDots for K23Dots<'_, Q> {
    #[inline(always)]
    unsafe fn dots<const N: usize>(&self, rows: [&[u8]; N]) -> [f32; N] {
        let (x, len, a8) = (
            self.x.as_ptr() as *const u8,
            self.x.len(),
            std::mem::size_of::<Q>() == 1,
        );
        // SAFETY: AVX2/FMA/F16C present per this method's contract; `x` holds `len` quants of
        // one or two bytes; the kernels assert the lengths they rely on.
        unsafe {
            match (self.q3, a8) {
                (true, true) => k23_rows::<true, true, N>(rows, x, len, self.d, self.s16),
                (true, false) => k23_rows::<true, false, N>(rows, x, len, self.d, self.s16),
                (false, true) => k23_rows::<false, true, N>(rows, x, len, self.d, self.s16),
                (false, false) => k23_rows::<false, false, N>(rows, x, len, self.d, self.s16),
            }
        }
    }
}
