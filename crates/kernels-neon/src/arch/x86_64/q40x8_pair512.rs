//! Two groups of the nibble rows repacked eight at a time ([`crate::Q40x8`], `q40x8.rs`) against
//! two to four tokens at once on AVX-512: `q40x8.rs`'s several-token kernel with 16 rows in a
//! 512-bit register (group `g` in lanes 0..8, group `g + 1` in lanes 8..16), so that one
//! `vpdpwssd` takes 32 products of 16 rows where the 256-bit kernel takes 16 of 8.
//!
//! Each group's quants are loaded and unpacked as `q40x8.rs` does (256-bit), the two groups' weight
//! registers joined into one; each lane's integer sums and f32 operations are then those of the
//! 256-bit kernel for its row, in its order, so each row's results are its bits (and so
//! [`crate::Q40x8::run_rows`]'s, and `matvec`'s of the original rows in `Fast`).

use std::arch::x86_64::*;

use super::q40x8::{fifth_bits, fifth_of, unpack};
use super::simd::STREAM_PREFETCH as PREFETCH;
use crate::arch::tags::has_min;
use crate::q40x8::{corr_factor, group_block, quants_at};
use crate::quant::QActs16;

/// Two 256-bit registers as one 512-bit register: `lo` in lanes 0..8, `hi` in lanes 8..16.
///
/// # Safety
/// AVX-512F present. Always inlined, into callers that enable it.
#[inline(always)]
unsafe fn join(lo: __m256i, hi: __m256i) -> __m512i {
    // SAFETY: AVX-512F present per contract.
    unsafe { _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi) }
}

/// Per token, both group blocks' exact i32 sums (`q40x8.rs`'s `block_sums_t` for each group, in
/// its lanes), starting from the token's correction.
///
/// # Safety
/// AVX2 and AVX-512F/VNNI present; a group block of format `F` readable at each of `gp`, 32 i16 at
/// each `x[t]`. Always inlined, into callers that enable them.
// The token index `t` reaches several arrays at once (loops over the const `T`, unrolled).
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn block_sums<const F: u8, const T: usize>(
    gp: [*const u8; 2],
    x: [*const i16; T],
    corr: [i32; T],
) -> [__m512i; T] {
    // SAFETY: AVX2 and AVX-512F/VNNI present, 16 i32 pairs at each `x[t]` and the group blocks at
    // `gp`, per contract.
    unsafe {
        let pair = |t: usize, j: usize| {
            _mm512_set1_epi32(std::ptr::read_unaligned((x[t] as *const i32).add(j)))
        };
        let mut s = [_mm512_setzero_si512(); T];
        for t in 0..T {
            s[t] = _mm512_set1_epi32(corr[t] * corr_factor(F));
        }
        let h = [fifth_bits::<F>(gp[0]), fifth_bits::<F>(gp[1])];
        // As `block_sums_t`: no lane's sum overflows, so the order of the adds changes no bit.
        for k in 0..4 {
            let v0 = _mm256_loadu_si256(gp[0].add(quants_at(F) + 32 * k) as *const __m256i);
            let v1 = _mm256_loadu_si256(gp[1].add(quants_at(F) + 32 * k) as *const __m256i);
            let w0 = unpack::<F>(v0, fifth_of(h[0], k));
            let w1 = unpack::<F>(v1, fifth_of(h[1], k));
            let w = [0, 1, 2, 3].map(|m| join(w0[m], w1[m]));
            for t in 0..T {
                for m in 0..4 {
                    s[t] = _mm512_dpwssd_epi32(s[t], w[m], pair(t, 4 * k + m));
                }
            }
        }
        s
    }
}

/// Each token's `acc[t]` plus both groups' block `b` sums times `d_w * d_x` (one FMA), or, with
/// `TAIL`, that product rounded apart and added (`q40x8.rs`'s `block_fma_t`, lane for lane).
///
/// # Safety
/// AVX2/FMA/F16C and AVX-512F/VNNI present; `b` below the blocks of both groups (of format `F`)
/// and of each token's `xq` and `corr`. Always inlined.
// The token index `t` reaches several arrays at once (loops over the const `T`, unrolled).
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn block_fma<const F: u8, const T: usize, const TAIL: bool>(
    groups: [&[u8]; 2],
    xq: [&QActs16; T],
    corr: [&[i32]; T],
    b: usize,
    acc: [__m512; T],
) -> [__m512; T] {
    // SAFETY: both groups' block b, each token's activations b*32..b*32 + 32, d[b] and corr[b]
    // are in bounds per contract.
    unsafe {
        let gp = groups.map(|g| g.as_ptr().add(b * group_block(F)));
        if !TAIL {
            // Prefetch hints (never fault; wrapping_add keeps them UB-free).
            for p in gp {
                let ahead = p.wrapping_add(PREFETCH);
                _mm_prefetch::<_MM_HINT_T1>(ahead as *const i8);
                _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(64) as *const i8);
                _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(128) as *const i8);
            }
        }
        let mut x = [std::ptr::null::<i16>(); T];
        let mut c = [0i32; T];
        for t in 0..T {
            x[t] = xq[t].qs.as_ptr().add(b * 32);
            c[t] = *corr[t].get_unchecked(b);
        }
        let isum = block_sums::<F, T>(gp, x, c);
        let halves = |at: usize| {
            _mm512_cvtph_ps(_mm256_inserti128_si256::<1>(
                _mm256_castsi128_si256(_mm_loadu_si128(gp[0].add(at) as *const __m128i)),
                _mm_loadu_si128(gp[1].add(at) as *const __m128i),
            ))
        };
        let dw = halves(0);
        let m = if has_min(F) {
            halves(16)
        } else {
            _mm512_setzero_ps()
        };
        let mut acc = acc;
        for t in 0..T {
            let f = _mm512_mul_ps(dw, _mm512_set1_ps(*xq[t].d.get_unchecked(b)));
            acc[t] = if TAIL {
                _mm512_add_ps(acc[t], _mm512_mul_ps(f, _mm512_cvtepi32_ps(isum[t])))
            } else {
                _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), f, acc[t])
            };
            if has_min(F) {
                let s = _mm512_set1_ps(*xq[t].s.get_unchecked(b));
                acc[t] = if TAIL {
                    _mm512_add_ps(acc[t], _mm512_mul_ps(m, s))
                } else {
                    _mm512_fmadd_ps(m, s, acc[t])
                };
            }
        }
        acc
    }
}

/// The dots of the 16 rows of groups `groups` (each its group blocks, format `F`) with each of
/// `T` tokens (`xq[t]`, `corr[t]`): per token, group 0's 8 rows then group 1's, each row's
/// `q40x8_group_tokens_vnni` bits.
///
/// # Safety
/// AVX2/FMA/F16C and AVX-512F/VNNI/VL present.
// The token index `t` reaches several arrays at once (loops over the const `T`, unrolled).
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vnni,avx512vl")]
pub(crate) unsafe fn q40x8_pair_tokens<const F: u8, const T: usize>(
    groups: [&[u8]; 2],
    xq: [&QActs16; T],
    corr: [&[i32]; T],
) -> [[f32; 16]; T] {
    let nb = xq.first().map_or(0, |q| q.d.len());
    assert!(
        groups.iter().all(|g| g.len() >= nb * group_block(F))
            && xq.iter().all(|q| q.d.len() == nb && q.qs.len() >= nb * 32)
            && corr.iter().all(|c| c.len() >= nb)
    );
    // SAFETY: the features per contract; every block index below is under `nb`, so in bounds
    // (asserted above); 16 f32 are written to each 16-element array.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); T]; 4];
        for q in 0..nb / 4 {
            // Block 4q + j into accumulator j, written out so that the four stay in registers.
            let [a0, a1, a2, a3] = &mut acc;
            *a0 = block_fma::<F, T, false>(groups, xq, corr, 4 * q, *a0);
            *a1 = block_fma::<F, T, false>(groups, xq, corr, 4 * q + 1, *a1);
            *a2 = block_fma::<F, T, false>(groups, xq, corr, 4 * q + 2, *a2);
            *a3 = block_fma::<F, T, false>(groups, xq, corr, 4 * q + 3, *a3);
        }
        let mut s = [_mm512_setzero_ps(); T];
        for t in 0..T {
            s[t] = _mm512_add_ps(
                _mm512_add_ps(acc[0][t], acc[1][t]),
                _mm512_add_ps(acc[2][t], acc[3][t]),
            );
        }
        if nb % 4 != 0 {
            let mut tail = [_mm512_setzero_ps(); T];
            for b in nb - nb % 4..nb {
                tail = block_fma::<F, T, true>(groups, xq, corr, b, tail);
            }
            for t in 0..T {
                s[t] = _mm512_add_ps(s[t], tail[t]);
            }
        }
        let mut y = [[0f32; 16]; T];
        for (yt, st) in y.iter_mut().zip(s) {
            _mm512_storeu_ps(yt.as_mut_ptr(), st);
        }
        y
    }
}
