//! The kernel of Q6_K rows repacked eight at a time ([`crate::Q40x8`], the layout of
//! `q40x8/q6k.rs`), 16-bit activations ([`Precision::Fast`](crate::Precision::Fast)), AVX2, one
//! token.
//!
//! A sub-block (32 columns of 8 rows) holds four registers of nibbles as a Q4_0 group block's
//! (`q40x8.rs`: in register `k`, 32-bit lane `r` is row `r`, its low u16 the nibbles of weights
//! `8k + 2m` at bits `4m`, its high u16 those of `8k + 2m + 1`), then two registers of their high
//! two bits (register `kk`'s byte beside the nibbles' holds those of register `2 kk` at bits 0-3
//! and of `2 kk + 1` at 4-7). Per nibble register one mask, shift and `or` a byte pair put the
//! high bits above the nibbles of weights `m` = 0, 2 (and 1, 3), and a mask or a shift splits them
//! into the u16 lanes that `vpmaddwd` takes with the activation pair `8k + 2m, 8k + 2m + 1`
//! broadcast to all lanes: registers 0-1 give each row's exact sum of group `2 j` (16 columns), 2-3
//! of group `2 j + 1`, started at the activations' offset term (`q6k_corr`: the quants are taken
//! unsigned).
//!
//! Results: `q6k_i16_rows`'s (`kquant_rows.rs`) bit for bit. That kernel keeps per row one
//! accumulator whose lane `L` takes, per super-block, group `q6k_group_of(0, L)`'s sum times
//! `(d * sc) * d_x` and then group `q6k_group_of(1, L)`'s, and sums its lanes at the end (`hsum`);
//! here register `L` (lanes rows) takes the same FMAs in the same order, and the lanes' last sum is
//! `hsum`'s tree of vertical adds.

use std::arch::x86_64::*;

use super::kquant_rows::q6k_group_of;
use super::q4kx8::hsum_tree;
use crate::q40x8::q6k::{GROUP_SB, SUB, SUBS};
use crate::quant::QActs16;

/// How far ahead the kernel prefetches, bytes. Measured 2026-12-07 on the SYNTHETIC 16-layer d 1024
/// Q6_K file (`SPARROW_KERNELS=avx2 sparrow bench -t 1 -p 0 -n 32 -r 2`, alternated rounds, Intel
/// Xeon): 4096 bytes 56.9-63.2 tok/s (mean 60.3 over six rounds), 2048 (`q4kx8.rs`'s) 56.2-62.1
/// (58.8), 1024 58.3-58.6, 6144 54.4-55.8.
const AHEAD: usize = 4096;

/// Where group `G`'s offset term lies among a super-block's 16 of `q6k_corr` (half `G / 8`'s lane
/// `L` with `q6k_group_of(G / 8, L) = G`, at `8 (G / 8) + L`).
const CORR_AT: [usize; 16] = {
    let mut at = [0; 16];
    let mut i = 0;
    while i < 16 {
        at[q6k_group_of(i / 8, i % 8)] = i;
        i += 1;
    }
    at
};

/// The exact sums of one group of 16 columns of the 8 rows: nibble registers `v` (its two) with
/// their high bits `hb` (register `kk`'s whole), the activation pairs at `x` (the group's 16
/// quants), started at `corr`.
///
/// # Safety
/// AVX2 present; 16 i16 readable at `x`. Always inlined into an AVX2 function.
#[inline(always)]
unsafe fn group_sums(v: [__m256i; 2], hb: __m256i, x: *const i16, corr: i32) -> __m256i {
    // SAFETY: AVX2 present per contract; 8 i32 pairs readable at `x`.
    unsafe {
        let (nib, top, low) = (
            _mm256_set1_epi16(0x0F0F),
            _mm256_set1_epi16(0x3030),
            _mm256_set1_epi16(0x00FF),
        );
        let pair = |i: usize| _mm256_set1_epi32(std::ptr::read_unaligned((x as *const i32).add(i)));
        let mut s = _mm256_set1_epi32(corr);
        for (h, &v) in v.iter().enumerate() {
            // Register `2 kk + h`'s high bits at 0-3 of each byte pair's bytes.
            let hk = if h == 0 {
                hb
            } else {
                _mm256_srli_epi16::<4>(hb)
            };
            // Weights m = 0 and 2 (bytes 0 and 1 of each u16), then 1 and 3: 6 bits each.
            let even = _mm256_or_si256(
                _mm256_and_si256(v, nib),
                _mm256_and_si256(_mm256_slli_epi16::<4>(hk), top),
            );
            let odd = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(v), nib),
                _mm256_and_si256(_mm256_slli_epi16::<2>(hk), top),
            );
            let w = [
                _mm256_and_si256(even, low),
                _mm256_and_si256(odd, low),
                _mm256_srli_epi16::<8>(even),
                _mm256_srli_epi16::<8>(odd),
            ];
            // 0 <= q_w <= 63, |q_x| <= 32767: 16 products and the offset term below 2^26.
            let a = _mm256_add_epi32(
                _mm256_madd_epi16(w[0], pair(4 * h)),
                _mm256_madd_epi16(w[1], pair(4 * h + 1)),
            );
            let b = _mm256_add_epi32(
                _mm256_madd_epi16(w[2], pair(4 * h + 2)),
                _mm256_madd_epi16(w[3], pair(4 * h + 3)),
            );
            s = _mm256_add_epi32(s, _mm256_add_epi32(a, b));
        }
        s
    }
}

/// The dots of the 8 rows of one Q6_K group (`group`: its super-blocks) with `xq` (`c6`: its
/// `q6k_corr`).
///
/// # Safety
/// AVX2/FMA/F16C present.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q6kx8_group(group: &[u8], xq: &QActs16, c6: &[i32]) -> [f32; 8] {
    let nsb = xq.d.len() / 8;
    assert!(group.len() >= nsb * GROUP_SB && xq.qs.len() >= nsb * 256 && c6.len() >= nsb * 16);
    // Per lane `L` of the one-row kernel's accumulator, its 8 rows.
    let mut acc = [_mm256_setzero_ps(); 8];
    for sb in 0..nsb {
        // SAFETY: sb < nsb: group super-block sb, activations sb*256 .. sb*256 + 256, their
        // scales sb*8 .. sb*8 + 8 and offsets sb*16 .. sb*16 + 16 are in bounds (asserted above).
        unsafe {
            let gs = group.as_ptr().add(sb * GROUP_SB);
            let ahead = gs.wrapping_add(AHEAD);
            let d = _mm256_cvtph_ps(_mm_loadu_si128(gs as *const __m128i));
            let xp = xq.qs.as_ptr().add(sb * 256);
            let cp = c6.as_ptr().add(sb * 16);
            // Sub-block `J` (a constant, so that each group's accumulator is one register).
            macro_rules! sub {
                ($j:literal) => {{
                    // Prefetch hints (never fault; wrapping_add keeps them UB-free): the
                    // sub-block's three lines `AHEAD` bytes on, the scales' three with the first.
                    for l in 0..3 {
                        _mm_prefetch::<_MM_HINT_T1>(
                            ahead.wrapping_add(SUBS + SUB * $j + 64 * l) as _
                        );
                        if $j == 0 {
                            _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(64 * l) as _);
                        }
                    }
                    let q = gs.add(SUBS + SUB * $j);
                    let ld = |at: usize| _mm256_loadu_si256(q.add(at) as *const __m256i);
                    let dx = _mm256_set1_ps(*xq.d.get_unchecked(sb * 8 + $j));
                    for g in 0..2 {
                        let grp = 2 * $j + g;
                        let v = [ld(64 * g), ld(64 * g + 32)];
                        let corr = *cp.add(CORR_AT[grp]);
                        let s = group_sums(v, ld(128 + 32 * g), xp.add(16 * grp), corr);
                        let sc = _mm_loadl_epi64(gs.add(16 + 8 * grp) as *const __m128i);
                        let sc = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc)), d);
                        let lane = CORR_AT[grp] % 8;
                        acc[lane] = _mm256_fmadd_ps(
                            _mm256_cvtepi32_ps(s),
                            _mm256_mul_ps(sc, dx),
                            acc[lane],
                        );
                    }
                }};
            }
            sub!(0);
            sub!(1);
            sub!(2);
            sub!(3);
            sub!(4);
            sub!(5);
            sub!(6);
            sub!(7);
        }
    }
    // `hsum`'s tree over the lanes L.
    // SAFETY: the features per contract; 8 f32 written to an 8-element array.
    unsafe {
        let y = hsum_tree(&acc);
        let mut out = [0f32; 8];
        _mm256_storeu_ps(out.as_mut_ptr(), y);
        out
    }
}
