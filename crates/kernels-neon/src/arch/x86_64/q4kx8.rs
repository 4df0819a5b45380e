//! The kernel of Q4_K and Q5_K rows repacked eight at a time ([`crate::Q40x8`], the layout of
//! `q40x8/q4k.rs`), 16-bit activations ([`Precision::Fast`](crate::Precision::Fast)), AVX2 (on
//! the AVX-512 path with `vpdpwssd`, [`q4kx8_group_vnni`]), one token.
//!
//! A group super-block (256 columns of 8 rows) holds the rows' f16 `d`, then their f16 `dmin` (16
//! bytes each), then the three u32 words of their packed 6-bit scales and mins (`scales[0..4]`,
//! `[4..8]`, `[8..12]` of each row; 32 bytes each, lane `r` row `r`), then per sub-block of 32 its
//! 8 rows' nibbles as a Q4_0 group block's (`q40x8.rs`), for Q5_K followed by their fifth bits as
//! a Q5_0 group block's. The scales unpack for all 8 rows at once (llama.cpp's `kmask`
//! operations on 32-bit lanes) and a sub-block's 8 exact sums come from `q40x8`'s masked kernel
//! (Q5_K: its Q5_0 form, the fifth bit above each nibble).
//!
//! Results: `q4k_i16_rows`'s (`kquant_rows.rs`, Q5_K's form too) bit for bit. That kernel keeps
//! per row one lane a sub-block index `j` of `(d * sc_j) * d_x` FMAs and one of `(dmin * m_j) *
//! s_x`, summed across the lanes at the end; here lane `r` of accumulator `j` is row `r`'s lane
//! `j`, the same products in the same order, and the lanes' last sum is its tree of vertical adds.

use std::arch::x86_64::*;

use super::q40x8::masked_sums;
use crate::arch::tags::{Q4_0, Q5_0};
use crate::q40x8::q4k::{group_sb, sub_bytes, SUBS};
use crate::quant::QActs16;

/// How far ahead the kernel prefetches, bytes: the 18 lines of the super-block this far on are
/// asked for two a sub-block (the last sub-block four), not all at the super-block's start, where
/// the burst of 18 `prefetcht0` stalled the loop (60% of its samples in `perf annotate`). Measured
/// 2026-12-06 on the SYNTHETIC 16-layer d 1024 Q4_K_M file (`SPARROW_KERNELS=avx2 sparrow bench -p
/// 0 -n 32 -r 2`, three interleaved rounds, Intel Xeon): 18 at once 4096 bytes ahead 58.3-59.4
/// tok/s with one thread and 108-110 with two; spread out 4096 ahead 59.9-60.5 / 114-115, 1024
/// ahead 57.1-57.9 / 106-109, 2048 ahead 62.5-63.0 / 119-125, 3072 ahead 62.7-63.5 / 121-123.
const AHEAD: usize = 2048;
/// Offset of the packed scales in a group super-block.
const SCALES: usize = 32;

/// `hsum`'s tree (`simd.rs`) over 8 registers whose lanes are rows, register `j` a one-row
/// kernel's lane `j`: `(v0 + v4) + (v2 + v6)`, `(v1 + v5) + (v3 + v7)`, then their sum.
///
/// # Safety
/// AVX2 present. Always inlined into AVX2 functions.
#[inline(always)]
pub(super) unsafe fn hsum_tree(v: &[__m256; 8]) -> __m256 {
    // SAFETY: AVX2 present per contract.
    unsafe {
        let t: [__m256; 4] = std::array::from_fn(|j| _mm256_add_ps(v[j], v[j + 4]));
        _mm256_add_ps(_mm256_add_ps(t[0], t[2]), _mm256_add_ps(t[1], t[3]))
    }
}

/// The dots of the 8 rows of one Q4_K group (Q5_K where `FIVE`; `group`: its super-blocks) with
/// `xq`.
///
/// # Safety
/// AVX2/FMA/F16C present.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q4kx8_group<const FIVE: bool>(group: &[u8], xq: &QActs16) -> [f32; 8] {
    // SAFETY: AVX2/FMA/F16C present per contract, enabled here.
    unsafe { group_body::<FIVE, false>(group, xq) }
}

/// [`q4kx8_group`] with AVX-512 VNNI's `vpdpwssd` (`q40x8`'s `dot_acc`): the same bits.
///
/// # Safety
/// AVX2/FMA/F16C and AVX-512 VNNI and VL present.
#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
pub(crate) unsafe fn q4kx8_group_vnni<const FIVE: bool>(group: &[u8], xq: &QActs16) -> [f32; 8] {
    // SAFETY: AVX2/FMA/F16C and AVX-512 VNNI and VL present per contract, enabled here.
    unsafe { group_body::<FIVE, true>(group, xq) }
}

/// [`q4kx8_group`]'s body, `V` as `q40x8`'s `dot_acc`.
///
/// # Safety
/// As [`q4kx8_group_vnni`] with `V`, [`q4kx8_group`] without; always inlined into them.
#[inline(always)]
unsafe fn group_body<const FIVE: bool, const V: bool>(group: &[u8], xq: &QActs16) -> [f32; 8] {
    let nsb = xq.d.len() / 8;
    let (gsb, sub) = (group_sb(FIVE), sub_bytes(FIVE));
    assert!(group.len() >= nsb * gsb && xq.qs.len() >= nsb * 256 && xq.s.len() >= nsb * 8);
    // SAFETY: the features per contract.
    let (k1, k2, k3, byte) = unsafe {
        (
            _mm256_set1_epi32(0x3f3f_3f3f),
            _mm256_set1_epi32(0x0f0f_0f0f),
            _mm256_set1_epi32(0x0303_0303),
            _mm256_set1_epi32(0xFF),
        )
    };
    // Per sub-block index j, lane r: row r's `(d * sc_j) * d_x` sums and `(dmin * m_j) * s_x` ones.
    // SAFETY: the features per contract.
    let (mut acc, mut mins) = unsafe { ([_mm256_setzero_ps(); 8], [_mm256_setzero_ps(); 8]) };
    for sb in 0..nsb {
        // SAFETY: sb < nsb: group super-block sb, activations sb*256..sb*256 + 256 and their
        // scales and sums sb*8..sb*8 + 8 are in bounds (asserted above).
        unsafe {
            let gp = group.as_ptr().add(sb * gsb);
            let ahead = gp.wrapping_add(AHEAD);
            let d = _mm256_cvtph_ps(_mm_loadu_si128(gp as *const __m128i));
            let dmin = _mm256_cvtph_ps(_mm_loadu_si128(gp.add(16) as *const __m128i));
            let u = |i: usize| _mm256_loadu_si256(gp.add(SCALES + 32 * i) as *const __m256i);
            let (u0, u1, u2) = (u(0), u(1), u(2));
            // llama.cpp's kmask unpacking, each row's in its lane: the bytes of `sc[0]` hold the
            // scales of sub-blocks 0..4, of `sc[1]` those of 4..8; `mn` the mins likewise.
            let high = |lo: __m256i, top: __m256i| {
                _mm256_or_si256(
                    lo,
                    _mm256_slli_epi32::<4>(_mm256_and_si256(_mm256_srli_epi32::<6>(top), k3)),
                )
            };
            let sc = [_mm256_and_si256(u0, k1), high(_mm256_and_si256(u2, k2), u0)];
            let mn = [
                _mm256_and_si256(u1, k1),
                high(_mm256_and_si256(_mm256_srli_epi32::<4>(u2), k2), u1),
            ];
            let xp = xq.qs.as_ptr().add(sb * 256);
            for j in 0..8 {
                let lane = |v: __m256i| {
                    let b = match j % 4 {
                        0 => v,
                        1 => _mm256_srli_epi32::<8>(v),
                        2 => _mm256_srli_epi32::<16>(v),
                        _ => _mm256_srli_epi32::<24>(v),
                    };
                    _mm256_cvtepi32_ps(_mm256_and_si256(b, byte))
                };
                let dx = _mm256_set1_ps(*xq.d.get_unchecked(sb * 8 + j));
                let sx = _mm256_set1_ps(*xq.s.get_unchecked(sb * 8 + j));
                let scale = _mm256_mul_ps(_mm256_mul_ps(lane(sc[j / 4]), d), dx);
                mins[j] = _mm256_fmadd_ps(_mm256_mul_ps(lane(mn[j / 4]), dmin), sx, mins[j]);
                // Prefetch hints (never fault; wrapping_add keeps them UB-free): the super-block
                // `AHEAD` bytes on, Q4_K two lines a sub-block and the last two with the last
                // one; Q5_K three lines every 176 bytes (its 1408 in 22 lines).
                if FIVE {
                    for l in 0..3 {
                        _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(176 * j + 64 * l) as _);
                    }
                } else {
                    _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(128 * j) as *const i8);
                    _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(128 * j + 64) as *const i8);
                    if j == 7 {
                        _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(1024) as *const i8);
                        _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(1088) as *const i8);
                    }
                }
                let q = gp.add(SUBS + sub * j);
                let isum = if FIVE {
                    let h = _mm256_loadu_si256(q.add(128) as *const __m256i);
                    masked_sums::<Q5_0, V>(q, h, xp.add(32 * j), 0)
                } else {
                    masked_sums::<Q4_0, V>(q, _mm256_setzero_si256(), xp.add(32 * j), 0)
                };
                acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), scale, acc[j]);
            }
        }
    }
    // SAFETY: the features per contract; 8 f32 written to an 8-element array.
    unsafe {
        let y = _mm256_sub_ps(hsum_tree(&acc), hsum_tree(&mins));
        let mut out = [0f32; 8];
        _mm256_storeu_ps(out.as_mut_ptr(), y);
        out
    }
}
