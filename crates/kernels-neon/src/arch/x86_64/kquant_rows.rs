//! `Q4_K`, `Q5_K` and `Q6_K` integer dots of several rows at once, sharing
//! the activation loads between the rows (`Q2_K`/`Q3_K`: [`super::kquant_low`];
//! `IQ4_XS`: [`super::iq4xs_rows`]).
//!
//! 16-bit activations ([`Precision::Fast`](crate::Precision::Fast)) are
//! first reordered per 32-block into its 16 even then its 16 odd elements
//! ([`even_odd`], once per call, shared by all rows). A 32-byte load of
//! K-quant weight bytes read as 16 i16 lanes then holds, per lane `k`, the
//! quants of elements `2k` (low byte) and `2k + 1` (high byte): masks and
//! 16-bit shifts widen them to i16 with no shuffle (the old path spent a
//! `cvtepu8_epi16` per 16 weights, all on one port), and `madd_epi16` with
//! the even and the odd activations gives the exact i32 sums of the block.
//! Where a quant has more than 4 bits (Q5_K's fifth bit, Q6_K's two high
//! bits), both bytes of a lane are assembled first with byte masks (one
//! mask, shift and `or` per 32 quants) and split into even and odd after.
//! 8-bit activations ([`Precision::Int8`](crate::Precision::Int8)) come with one scale per
//! super-block for these formats and take [`super::kquant_super`] instead.
//!
//! Per row and super-block the scales and mins are decoded with vector
//! operations (llama.cpp's `kmask` shuffle for Q4_K/Q5_K), multiplied by the
//! 8 activation scales at once, and the min term `(dmin*m) * s_x`
//! accumulated as a vector. Q4_K/Q5_K: the 8 sub-blocks' i32 lane sums are reduced
//! together as they come (unpacks and adds, [`sum_pairs`], [`sum_quads`]) into one register
//! holding each sub-block's exact sum, converted once and FMA'd with the 8 `(d*sc) * d_x`
//! (one conversion and one FMA per super-block, against 8 of each and their broadcasts). Q5_K
//! took a conversion and an FMA per sub-block pair until 2026-12-07, when its copies
//! (`q40x8/q4k.rs`) needed this order: the SYNTHETIC 16-layer d 1024 Q5_K_M file with its copies
//! off (`SPARROW_Q40X8=off SPARROW_KERNELS=avx2 sparrow bench -t 1 -p 0 -n 32 -r 2`, three
//! alternated rounds, Intel Xeon) decoded at 53.3-56.5 tok/s before and 57.8-58.6 after.
//! Q6_K: per half super-block its 8 groups of 16 reduced together into their exact sums, the
//! quants taken unsigned and their offset of 32 added as the activations' per-16 sums times -32
//! (integers, once per call: [`q6k_corr`]), converted once and FMA'd with the 8 `(d*sc) * d_x`.
//! Both as in the scalar reference; only the f32 summation order differs.

use std::arch::x86_64::*;

use super::simd::{hsum, prefetch_distance, STREAM_PREFETCH};
use crate::arch::drivers::RowDots;
use crate::WeightFormat;

/// One token's 16-bit activations in the orders of this path's K-quant kernels ([`even_odd`],
/// the per-16 sums of [`sums16`](super::kquant_low::sums16), Q6_K's offsets [`q6k_corr`]), each
/// made on first use and shared by every work item and call that uses them (else each work item of
/// a `matvec` reorders the whole vector again).
#[derive(Default)]
pub(crate) struct K16Prep {
    eo: std::sync::OnceLock<Vec<i16>>,
    s16: std::sync::OnceLock<Vec<f32>>,
    c6: std::sync::OnceLock<Vec<i32>>,
}

impl K16Prep {
    /// [`even_odd`] of `xq`'s quants (`xq` the activations this belongs to).
    pub(super) fn even_odd(&self, xq: &crate::quant::QActs16) -> &[i16] {
        self.eo.get_or_init(|| even_odd(&xq.qs))
    }

    /// [`sums16`](super::kquant_low::sums16) of `xq` (`xq` the activations this belongs to).
    pub(super) fn sums16(&self, xq: &crate::quant::QActs16) -> &[f32] {
        self.s16
            .get_or_init(|| super::kquant_low::sums16(&xq.qs, &xq.d))
    }

    /// [`q6k_corr`] of `xq` (`xq` the activations this belongs to).
    pub(super) fn q6k_corr(&self, xq: &crate::quant::QActs16) -> &[i32] {
        self.c6.get_or_init(|| q6k_corr(&xq.qs))
    }
}

/// The 16-bit activation quants reordered per 32-block: its 16 even
/// elements, then its 16 odd ones. `qs.len()` is a multiple of 32 (as
/// `QActs16` guarantees).
pub(super) fn even_odd(qs: &[i16]) -> Vec<i16> {
    let mut out = vec![0i16; qs.len()];
    for (o, x) in out.chunks_exact_mut(32).zip(qs.chunks_exact(32)) {
        for k in 0..16 {
            o[k] = x[2 * k];
            o[16 + k] = x[2 * k + 1];
        }
    }
    out
}

/// Prefetch hints for the super-block at `p` of a kernel stepping `R` rows at a time
/// ([`prefetch_distance`] bytes ahead): every cache line of a block of `bb` bytes (never faults;
/// wrapping_add keeps it UB-free).
#[inline(always)]
pub(super) fn prefetch_block<const R: usize>(p: *const u8, bb: usize) {
    let dist = prefetch_distance::<R>();
    let mut off = 0;
    while off < bb {
        // SAFETY: a prefetch is a hint and never faults.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(dist + off) as *const i8) };
        off += 64;
    }
}

/// `(d * sc[j], dmin * m[j])` for the 8 sub-blocks of the Q4_K/Q5_K
/// super-block at `p` (the same f32 products as `scalar::q4k_scales`).
///
/// # Safety
/// AVX2/FMA/F16C present; 16 bytes readable at `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q4k_scales8(p: *const u8) -> (__m256, __m256) {
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
    // llama.cpp's kmask shuffle: scales of sub-blocks 0..4 and 4..8, mins likewise.
    let sc = u64::from(u0 & K1) | u64::from((u2 & K2) | (((u0 >> 6) & K3) << 4)) << 32;
    let mn = u64::from(u1 & K1) | u64::from(((u2 >> 4) & K2) | (((u1 >> 6) & K3) << 4)) << 32;
    let dm = _mm_cvtph_ps(_mm_cvtsi32_si128(dm));
    let d = _mm256_broadcastss_ps(dm);
    let dmin = _mm256_broadcastss_ps(_mm_movehdup_ps(dm));
    let f = |v: u64| _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(v as i64)));
    (_mm256_mul_ps(f(sc), d), _mm256_mul_ps(f(mn), dmin))
}

/// Group `G` (of 16 columns) of a Q6_K super-block whose sum lane `L` of half `n`'s register
/// holds in the Q6_K kernels of this path: `8 n + 2 (L % 4) + L / 4` (what [`sum_pairs`] and
/// [`sum_quads`] make of a half's four block sums, whose lanes 0-3 are group `2 j`'s and 4-7 group
/// `2 j + 1`'s); the repacked rows' kernel (`q6kx8.rs`) keeps this order.
pub(crate) const fn q6k_group_of(n: usize, l: usize) -> usize {
    8 * n + 2 * (l % 4) + l / 4
}

/// Per super-block of `qs` (the 16-bit activation quants, element order), its 16 groups' `-32 *
/// sum(q_x)` in the order of [`q6k_group_of`] (half 0's 8 lanes, then half 1's): the quants'
/// offset of 32, added to the exact sums as integers.
pub(crate) fn q6k_corr(qs: &[i16]) -> Vec<i32> {
    let mut out = Vec::with_capacity(qs.len() / 16);
    for sb in qs.chunks_exact(256) {
        for n in 0..2 {
            for l in 0..8 {
                let g = &sb[16 * q6k_group_of(n, l)..][..16];
                out.push(-32 * g.iter().map(|&v| i32::from(v)).sum::<i32>());
            }
        }
    }
    out
}

/// `d * sc[G]` of the Q6_K super-block at `p`, one register a half `n`, its groups in the lanes of
/// [`q6k_group_of`].
///
/// # Safety
/// AVX2/FMA/F16C present; 210 bytes readable at `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q6k_pair_scales(p: *const u8) -> [__m256; 2] {
    // SAFETY: bytes 192..210 readable per contract.
    let (sc, d) = unsafe {
        (
            _mm_loadu_si128(p.add(192) as *const __m128i),
            std::ptr::read_unaligned(p.add(208) as *const u16),
        )
    };
    let sc = _mm_shuffle_epi8(
        sc,
        _mm_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15),
    );
    let d = _mm256_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(d))));
    [
        _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc)), d),
        _mm256_mul_ps(
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128::<8>(sc))),
            d,
        ),
    ]
}

/// The activation scales of the groups of each half of a super-block in the lanes of
/// [`q6k_group_of`]: block `4 n + L % 4`'s (`d`: the super-block's 8).
///
/// # Safety
/// AVX2 present; 8 f32 readable at `d`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q6k_half_dx(d: *const f32) -> [__m256; 2] {
    // SAFETY: 8 f32 readable per contract (unaligned loads, then broadcast from registers).
    unsafe {
        [
            _mm256_broadcast_ps(&_mm_loadu_ps(d)),
            _mm256_broadcast_ps(&_mm_loadu_ps(d.add(4))),
        ]
    }
}

/// A half's exact group sums in the lanes of [`q6k_group_of`] from its four blocks' lane sums
/// (block `j`'s lanes 0-3 parts of group `2 j`, 4-7 of group `2 j + 1`), plus `corr`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn q6k_half_sums(b: [__m256i; 4], corr: __m256i) -> __m256i {
    _mm256_add_epi32(
        sum_quads(sum_pairs(b[0], b[1]), sum_pairs(b[2], b[3])),
        corr,
    )
}

/// Q6_K: the unsigned quants (0..=63) of activation block `K` of half
/// `ql0, ql1, qh` as i16 lanes `(even, odd)` (elements `2k`, `2k + 1`).
/// Both bytes of a lane are assembled at once (low 4 bits of `ql`, bits
/// 4..6 from `qh`, one mask each), then split into the even (low byte) and
/// odd (high byte) quants.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn q6k_even_odd<const K: usize>(
    ql0: __m256i,
    ql1: __m256i,
    qh: __m256i,
) -> (__m256i, __m256i) {
    let ql = if K & 1 == 0 { ql0 } else { ql1 };
    // Low nibbles for K < 2, high for K >= 2; qh bits 2K..2K+2 to bits 4..6 of each byte.
    let lo = if K < 2 {
        ql
    } else {
        _mm256_srli_epi16::<4>(ql)
    };
    let hi = match K {
        0 => _mm256_slli_epi16::<4>(qh),
        1 => _mm256_slli_epi16::<2>(qh),
        2 => qh,
        _ => _mm256_srli_epi16::<2>(qh),
    };
    let q = _mm256_or_si256(
        _mm256_and_si256(lo, _mm256_set1_epi8(0x0F)),
        _mm256_and_si256(hi, _mm256_set1_epi8(0x30)),
    );
    (
        _mm256_and_si256(q, _mm256_set1_epi16(0xFF)),
        _mm256_srli_epi16::<8>(q),
    )
}

/// The even and odd quants of sub-blocks `2g` (low nibbles) and `2g + 1` (high nibbles) from 32
/// Q4_K quant bytes `raw` read as i16 lanes (lane `k`: byte `2k`, element `2k`, low; byte `2k + 1`
/// high): `[e0, o0, e1, o1]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn q4k_quants(raw: __m256i) -> [__m256i; 4] {
    let m4 = _mm256_set1_epi16(0x0F);
    [
        _mm256_and_si256(raw, m4),
        _mm256_and_si256(_mm256_srli_epi16::<8>(raw), m4),
        _mm256_and_si256(_mm256_srli_epi16::<4>(raw), m4),
        _mm256_srli_epi16::<12>(raw),
    ]
}

/// [`q4k_quants`] for Q5_K, with bit `2g` (sub-block `2g`) or `2g + 1` of every `qh` byte as bit 4:
/// both bytes of a lane at once (the nibble and its fifth bit), then split.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn q5k_quants(raw: __m256i, qh: __m256i, g: usize) -> [__m256i; 4] {
    let (m4b, b4b, low) = (
        _mm256_set1_epi8(0x0F),
        _mm256_set1_epi8(0x10),
        _mm256_set1_epi16(0xFF),
    );
    let hb = _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * g as i32));
    let q0 = _mm256_or_si256(
        _mm256_and_si256(raw, m4b),
        _mm256_and_si256(_mm256_slli_epi16::<4>(hb), b4b),
    );
    let q1 = _mm256_or_si256(
        _mm256_and_si256(_mm256_srli_epi16::<4>(raw), m4b),
        _mm256_and_si256(_mm256_slli_epi16::<3>(hb), b4b),
    );
    [
        _mm256_and_si256(q0, low),
        _mm256_srli_epi16::<8>(q0),
        _mm256_and_si256(q1, low),
        _mm256_srli_epi16::<8>(q1),
    ]
}

/// The four activation registers of sub-blocks `2g` and `2g + 1` at `xg` (even then odd elements of
/// each, [`even_odd`] order).
///
/// # Safety
/// AVX2 present; 64 i16 readable at `xg`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn acts64(xg: *const i16) -> [__m256i; 4] {
    // SAFETY: 64 i16 readable per contract.
    std::array::from_fn(|k| unsafe { _mm256_loadu_si256(xg.add(16 * k) as *const __m256i) })
}

/// The i32 lane sums of sub-blocks `2g` and `2g + 1`: quants `[e0, o0, e1, o1]` ([`q4k_quants`],
/// [`q5k_quants`]) with the activations of [`acts64`]. |q_w| <= 31, |q_x| <= 32767: each lane
/// sums 4 products, below 2^22.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn sub_pair_sums(q: &[__m256i; 4], x: &[__m256i; 4]) -> (__m256i, __m256i) {
    (
        _mm256_add_epi32(_mm256_madd_epi16(q[0], x[0]), _mm256_madd_epi16(q[1], x[1])),
        _mm256_add_epi32(_mm256_madd_epi16(q[2], x[2]), _mm256_madd_epi16(q[3], x[3])),
    )
}

/// `[a 0+2, b 0+2, a 1+3, b 1+3 | a 4+6, b 4+6, a 5+7, b 5+7]`: two vectors' i32 lanes summed
/// in pairs, the first step of reducing sub-blocks' lane sums together (single-operation unpacks).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn sum_pairs(a: __m256i, b: __m256i) -> __m256i {
    _mm256_add_epi32(_mm256_unpacklo_epi32(a, b), _mm256_unpackhi_epi32(a, b))
}

/// From [`sum_pairs`] of `(a, b)` and of `(c, d)`: `[a, b, c, d]` summed over lanes 0..4, then
/// the same over lanes 4..8.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn sum_quads(ab: __m256i, cd: __m256i) -> __m256i {
    _mm256_add_epi32(_mm256_unpacklo_epi64(ab, cd), _mm256_unpackhi_epi64(ab, cd))
}

/// From the [`sum_quads`] of a super-block's two halves: lane `j` holds sub-block `j`'s sum.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn sub_block_sums([q0, q1]: [__m256i; 2]) -> __m256i {
    _mm256_add_epi32(
        _mm256_permute2x128_si256::<0x20>(q0, q1),
        _mm256_permute2x128_si256::<0x31>(q0, q1),
    )
}

/// Q4_K (Q5_K where `FIVE`) dot of `R` rows with even/odd-ordered 16-bit activations `x` (scales
/// `d`, sums `s`), the sub-blocks' sums reduced together (module docs).
///
/// # Safety
/// AVX2/FMA/F16C present.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4k_i16_rows<const FIVE: bool, const R: usize>(
    rows: [&[u8]; R],
    x: &[i16],
    d: &[f32],
    s: &[f32],
) -> [f32; R] {
    let nsb = d.len() / 8;
    let (bb, qoff) = if FIVE { (176, 48) } else { (144, 16) };
    assert!(rows.iter().all(|r| r.len() >= nsb * bb) && x.len() >= nsb * 256 && s.len() >= nsb * 8);
    let mut acc = [_mm256_setzero_ps(); R];
    let mut mins = [_mm256_setzero_ps(); R];
    for sb in 0..nsb {
        // SAFETY: sb < nsb: super-block sb of every row (bytes sb*bb ..
        // (sb+1)*bb), activations sb*256 .. sb*256 + 256 and scales
        // sb*8 .. sb*8 + 8 are in bounds (asserted above).
        unsafe {
            let xp = x.as_ptr().add(sb * 256);
            let dx = _mm256_loadu_ps(d.as_ptr().add(sb * 8));
            let sx = _mm256_loadu_ps(s.as_ptr().add(sb * 8));
            let blk: [*const u8; R] = std::array::from_fn(|i| rows[i].as_ptr().add(sb * bb));
            let scale: [__m256; R] = std::array::from_fn(|i| {
                prefetch_block::<R>(blk[i], bb);
                let (dl, ml) = q4k_scales8(blk[i]);
                mins[i] = _mm256_fmadd_ps(ml, sx, mins[i]);
                _mm256_mul_ps(dl, dx)
            });
            // Per row the sub-blocks' i32 lane sums, reduced as they come: `pairs[g]` from
            // sub-blocks 2g and 2g + 1, `quads[h]` from sub-blocks 4h..4h + 4.
            let mut pairs = [[_mm256_setzero_si256(); 2]; R];
            let mut quads = [[_mm256_setzero_si256(); 2]; R];
            for g in 0..4 {
                let x = acts64(xp.add(64 * g));
                for i in 0..R {
                    let raw = _mm256_loadu_si256(blk[i].add(qoff + 32 * g) as *const __m256i);
                    let q = if FIVE {
                        let qh = _mm256_loadu_si256(blk[i].add(16) as *const __m256i);
                        q5k_quants(raw, qh, g)
                    } else {
                        q4k_quants(raw)
                    };
                    let (i0, i1) = sub_pair_sums(&q, &x);
                    pairs[i][g % 2] = sum_pairs(i0, i1);
                    if g % 2 == 1 {
                        quads[i][g / 2] = sum_quads(pairs[i][0], pairs[i][1]);
                    }
                }
            }
            for i in 0..R {
                // Lane j: sub-block j's exact sum (below 2^24), times `(d * sc_j) * d_x`.
                let isum = sub_block_sums(quads[i]);
                acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), scale[i], acc[i]);
            }
        }
    }
    std::array::from_fn(|i| hsum(acc[i]) - hsum(mins[i]))
}

/// The prefetches of one dense Q6_K row, spread over its super-block's steps: at block `K` (0
/// or 2) of half `n`, line `2n + K / 2` of the super-block [`STREAM_PREFETCH`] bytes on, and
/// at the last the fifth line that a super-block of 210 bytes may reach.
#[inline(always)]
fn spread_prefetch<const K: usize>(p: *const u8, n: usize) {
    let at = p.wrapping_add(STREAM_PREFETCH + 64 * (2 * n + K / 2));
    // SAFETY: a prefetch is a hint and never faults.
    unsafe { _mm_prefetch::<_MM_HINT_T1>(at as *const i8) };
    if n == 1 && K == 2 {
        // SAFETY: as above.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(at.wrapping_add(64) as *const i8) };
    }
}

/// Q6_K dot of `R` rows with even/odd-ordered 16-bit activations `x` (scales `d`; `c6`:
/// [`q6k_corr`] of the activations). The quants are taken unsigned (0..=63); per half
/// super-block the four blocks' lane sums are reduced together into its 8 groups' exact sums
/// ([`q6k_half_sums`], the offset of 32 added there as `c6`), converted once and FMA'd with the 8
/// `(d * sc) * d_x` into one accumulator a row: two conversions and two FMAs a super-block, where
/// one a block of 32 took a conversion, a permutation and an FMA until 2026-12-07, when the rows'
/// copies (`q6kx8.rs`) needed an order of whole groups.
///
/// # Safety
/// AVX2/FMA/F16C present.
// `n` also picks the half's loads and activation blocks, not only `sc[i][n]`.
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6k_i16_rows<const R: usize>(
    rows: [&[u8]; R],
    x: &[i16],
    d: &[f32],
    c6: &[i32],
) -> [f32; R] {
    let nsb = d.len() / 8;
    let bb = 210;
    assert!(
        rows.iter().all(|r| r.len() >= nsb * bb) && x.len() >= nsb * 256 && c6.len() >= nsb * 16
    );
    let mut acc = [_mm256_setzero_ps(); R];
    for sb in 0..nsb {
        // SAFETY: sb < nsb: super-block sb of every row (210 bytes at sb*210), activations sb*256
        // .. sb*256 + 256, scales sb*8 .. sb*8 + 8 and corrections sb*16 .. sb*16 + 16 are in
        // bounds (asserted above).
        unsafe {
            let xp = x.as_ptr().add(sb * 256);
            let dx = q6k_half_dx(d.as_ptr().add(sb * 8));
            let cp = c6.as_ptr().add(sb * 16);
            let blk: [*const u8; R] = std::array::from_fn(|i| rows[i].as_ptr().add(sb * bb));
            let sc: [[__m256; 2]; R] = std::array::from_fn(|i| {
                if R > 1 {
                    prefetch_block::<R>(blk[i], bb);
                }
                let [s0, s1] = q6k_pair_scales(blk[i]);
                [_mm256_mul_ps(s0, dx[0]), _mm256_mul_ps(s1, dx[1])]
            });
            for n in 0..2 {
                let corr = _mm256_loadu_si256(cp.add(8 * n) as *const __m256i);
                let ql: [[__m256i; 3]; R] = std::array::from_fn(|i| {
                    let p = blk[i];
                    [
                        _mm256_loadu_si256(p.add(64 * n) as *const __m256i),
                        _mm256_loadu_si256(p.add(64 * n + 32) as *const __m256i),
                        _mm256_loadu_si256(p.add(128 + 32 * n) as *const __m256i),
                    ]
                });
                let mut sums = [[_mm256_setzero_si256(); 4]; R];
                macro_rules! block {
                    ($k:literal) => {{
                        let j = 4 * n + $k;
                        let xe = _mm256_loadu_si256(xp.add(32 * j) as *const __m256i);
                        let xo = _mm256_loadu_si256(xp.add(32 * j + 16) as *const __m256i);
                        if R == 1 && $k % 2 == 0 {
                            // One line ahead every other block (see `spread_prefetch`).
                            spread_prefetch::<$k>(blk[0], n);
                        }
                        for i in 0..R {
                            let [l0, l1, h] = ql[i];
                            let (e, o) = q6k_even_odd::<$k>(l0, l1, h);
                            // 0 <= q_w <= 63, |q_x| <= 32767: each lane below 2^23, a group's
                            // sum (16 products) below 2^25.
                            sums[i][$k] = _mm256_add_epi32(
                                _mm256_madd_epi16(e, xe),
                                _mm256_madd_epi16(o, xo),
                            );
                        }
                    }};
                }
                block!(0);
                block!(1);
                block!(2);
                block!(3);
                for i in 0..R {
                    let g = _mm256_cvtepi32_ps(q6k_half_sums(sums[i], corr));
                    acc[i] = _mm256_fmadd_ps(g, sc[i][n], acc[i]);
                }
            }
        }
    }
    std::array::from_fn(|i| hsum(acc[i]))
}

/// The multi-row K-quant kernels with 16-bit activations as a [`RowDots`]
/// kernel: `format` is Q4_K, Q5_K or Q6_K, `x` the activations in
/// [`even_odd`] order.
pub(super) struct K16Dots<'a> {
    pub(super) format: WeightFormat,
    pub(super) x: &'a [i16],
    pub(super) d: &'a [f32],
    pub(super) s: &'a [f32],
    /// Q6_K: [`q6k_corr`] of the activations; empty for the others.
    pub(super) c6: &'a [i32],
}

impl RowDots for K16Dots<'_> {
    #[inline(always)]
    unsafe fn dots<const N: usize>(&self, rows: [&[u8]; N]) -> [f32; N] {
        // SAFETY: AVX2/FMA/F16C present per this method's contract; the
        // kernels assert the lengths they rely on.
        unsafe {
            match self.format {
                WeightFormat::Q4_K => q4k_i16_rows::<false, N>(rows, self.x, self.d, self.s),
                WeightFormat::Q5_K => q4k_i16_rows::<true, N>(rows, self.x, self.d, self.s),
                _ => q6k_i16_rows::<N>(rows, self.x, self.d, self.c6),
            }
        }
    }
}
