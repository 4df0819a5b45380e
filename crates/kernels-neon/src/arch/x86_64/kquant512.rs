//! `Q4_K`, `Q5_K` and `Q6_K` integer dots on 512-bit registers (AVX-512BW and VNNI), for
//! [`KernelPath::Avx512`](crate::KernelPath::Avx512): with 16-bit activations (`vpdpwssd`) and
//! with 8-bit ones (`vpdpbusd`: unsigned quants times signed activations, four products per
//! lane, in one instruction where AVX2 takes `maddubs` then `madd`; Q6_K's offset of 32 is
//! subtracted as `32 * sum(x)`, computed once per activation pair for all rows).
//!
//! The same arithmetic as the AVX2 kernels of [`kquant_rows`](super::kquant_rows): one 64-byte
//! load of weight bytes read as 32 i16 lanes holds the quants of two 32-element blocks, widened
//! by masks and 16-bit shifts; `madd` then `dpwssd` give each block's exact i32 sums, which are
//! converted and FMA'd with the block's `(d*sc) * d_x`. Two blocks per instruction halve the
//! instruction count of the AVX2 kernels, which are compute-bound on this machine (their
//! throughput is the same from L2 as from DRAM). The activations are reordered once per call
//! ([`pairs512`]) so that each 512-bit activation load matches the two blocks of a weight load.
//! Only the f32 summation order differs from the AVX2 kernels (and the scalar reference).

use std::arch::x86_64::*;

use super::kquant_rows::{prefetch_block, q4k_scales8};
use super::simd::{hsum, STREAM_PREFETCH};
use crate::arch::drivers::RowDots;
use crate::WeightFormat;

/// The 16-bit activation quants reordered per 128 elements (blocks `b0`, `b1`, `b2`, `b3` of 32),
/// as the 512-bit kernel of `format` pairs its blocks: `Q6_K` pairs `(b0, b1)` and `(b2, b3)` (one
/// `ql` load holds both halves' low, then high nibbles), `Q4_K` and `Q5_K` pair `(b0, b2)` and
/// `(b1, b3)` (one load holds two groups' bytes, whose low nibbles are `b0`, `b2`). Each pair
/// `(a, b)` is stored as `a`'s 16 even elements, `b`'s even ones, `a`'s odd ones, then `b`'s odd
/// ones. `qs.len()` must be a multiple of 128 (asserted; K-quant rows are multiples of 256).
pub(super) fn pairs512(qs: &[i16], format: WeightFormat) -> Vec<i16> {
    assert_eq!(qs.len() % 128, 0, "activations in whole 128-element groups");
    let pairs: [(usize, usize); 2] = if format == WeightFormat::Q6_K {
        [(0, 1), (2, 3)]
    } else {
        [(0, 2), (1, 3)]
    };
    let mut out = vec![0i16; qs.len()];
    for (o, x) in out.chunks_exact_mut(128).zip(qs.chunks_exact(128)) {
        for (p, &(a, b)) in pairs.iter().enumerate() {
            let o = &mut o[64 * p..64 * p + 64];
            for k in 0..16 {
                o[k] = x[32 * a + 2 * k];
                o[16 + k] = x[32 * b + 2 * k];
                o[32 + k] = x[32 * a + 2 * k + 1];
                o[48 + k] = x[32 * b + 2 * k + 1];
            }
        }
    }
    out
}

/// The 8-bit activation quants reordered per 128 elements for the 512-bit `Q4_K`/`Q5_K` kernel:
/// blocks `b0, b2, b1, b3` (the low nibbles of one 64-byte weight load are `b0` and `b2`, the high
/// ones `b1` and `b3`). `Q6_K` takes the activations in element order. `qs.len()` must be a
/// multiple of 128 (asserted).
pub(super) fn pairs512_i8(qs: &[i8]) -> Vec<i8> {
    assert_eq!(qs.len() % 128, 0, "activations in whole 128-element groups");
    let mut out = vec![0i8; qs.len()];
    for (o, x) in out.chunks_exact_mut(128).zip(qs.chunks_exact(128)) {
        for (slot, b) in [0, 2, 1, 3].into_iter().enumerate() {
            o[32 * slot..32 * slot + 32].copy_from_slice(&x[32 * b..32 * b + 32]);
        }
    }
    out
}

/// Lane indices broadcasting scale `a` to lanes 0..8 and `b` to lanes 8..16.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(super) fn halves(a: i32, b: i32) -> __m512i {
    _mm512_inserti64x4::<1>(
        _mm512_castsi256_si512(_mm256_set1_epi32(a)),
        _mm256_set1_epi32(b),
    )
}

/// Lane indices broadcasting scales `a, a+1, a+2, a+3` to lanes 0..4, 4..8, 8..12, 12..16.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(super) fn quarters(a: i32) -> __m512i {
    _mm512_setr_epi32(
        a,
        a,
        a,
        a,
        a + 1,
        a + 1,
        a + 1,
        a + 1,
        a + 2,
        a + 2,
        a + 2,
        a + 2,
        a + 3,
        a + 3,
        a + 3,
        a + 3,
    )
}

/// The Q4_K/Q5_K super-block at `blk`: its 8 sub-block scales times the activation scales `dx`
/// (lanes 0..8 of the result, for `permutexvar`), and its min term `(dmin*m) * sx` added to `mins`.
///
/// # Safety
/// AVX-512F and AVX2/FMA/F16C present; 16 bytes readable at `blk`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn q4k_scale(blk: *const u8, dx: __m256, sx: __m256, mins: &mut __m256) -> __m512 {
    // SAFETY: 16 bytes readable at `blk` per contract.
    let (dl, ml) = unsafe { q4k_scales8(blk) };
    q4k_token_scale(dl, ml, dx, sx, mins)
}

/// One token's part of [`q4k_scale`] from the super-block's `(d * sc, dmin * m)` (`dl`, `ml`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(super) fn q4k_token_scale(
    dl: __m256,
    ml: __m256,
    dx: __m256,
    sx: __m256,
    mins: &mut __m256,
) -> __m512 {
    *mins = _mm256_fmadd_ps(ml, sx, *mins);
    _mm512_castps256_ps512(_mm256_mul_ps(dl, dx))
}

/// The 16-bit quants of group pair `p` of the Q4_K (or, with `Q5`, Q5_K) super-block at `blk`,
/// as the [`pairs512`]-ordered activations take them: `[e0, o0, e1, o1]`, the even and odd
/// elements of sub-blocks `4p` (lanes 0..16) and `4p + 2` (lanes 16..32), then of `4p + 1` and
/// `4p + 3`.
///
/// # Safety
/// AVX-512F/BW and AVX2 present; a whole super-block readable at `blk`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn q4k_quants16<const Q5: bool>(blk: *const u8, p: usize) -> [__m512i; 4] {
    let qoff = if Q5 { 48 } else { 16 };
    let m4 = _mm512_set1_epi16(0x0F);
    // Lanes 0..16: group 2p's bytes (low nibbles sub-block 4p, high 4p + 1); lanes 16..32: group
    // 2p + 1's (4p + 2, 4p + 3). Lane k holds elements 2k (low byte) and 2k + 1 (high byte).
    // SAFETY: bytes qoff + 64p .. qoff + 64p + 64 (p < 2) lie in the super-block (contract).
    let raw = unsafe { _mm512_loadu_si512(blk.add(qoff + 64 * p) as *const __m512i) };
    let mut e0 = _mm512_and_si512(raw, m4);
    let mut o0 = _mm512_and_si512(_mm512_srli_epi16::<8>(raw), m4);
    let mut e1 = _mm512_and_si512(_mm512_srli_epi16::<4>(raw), m4);
    let mut o1 = _mm512_srli_epi16::<12>(raw);
    if Q5 {
        // Each lane's two bytes take their element's bit to bit 4 (AVX2's `q45k_i16_rows`, on
        // both groups of the pair at once).
        // SAFETY: a Q5_K super-block per contract.
        let hq = unsafe { q5k_high(blk, p) };
        let b4 = _mm512_set1_epi16(0x10);
        e0 = _mm512_or_si512(e0, _mm512_and_si512(_mm512_slli_epi16::<4>(hq), b4));
        e1 = _mm512_or_si512(e1, _mm512_and_si512(_mm512_slli_epi16::<3>(hq), b4));
        o0 = _mm512_or_si512(o0, _mm512_and_si512(_mm512_srli_epi16::<4>(hq), b4));
        o1 = _mm512_or_si512(o1, _mm512_and_si512(_mm512_srli_epi16::<5>(hq), b4));
    }
    [e0, o0, e1, o1]
}

/// The 16-bit quants (offset by -32) of half `n` of the Q6_K super-block at `blk`, as the
/// [`pairs512`]-ordered activations take them: `[e0, o0, e1, o1]`, the even and odd elements of
/// blocks `4n` (lanes 0..16) and `4n + 1`, then of `4n + 2` and `4n + 3`.
///
/// # Safety
/// AVX-512F/BW and AVX2 present; 210 bytes readable at `blk`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn q6k_quants16(blk: *const u8, n: usize) -> [__m512i; 4] {
    let m4 = _mm512_set1_epi16(0x0F);
    let m30 = _mm512_set1_epi16(0x30);
    let c32 = _mm512_set1_epi16(32);
    // ql bytes 64n..64n+64: low nibbles are blocks 4n (lanes 0..16) and 4n + 1, high nibbles
    // 4n + 2 and 4n + 3. Their high bits are qh's bit pairs 0, 1, 2, 3 (bytes 128 + 32n ..):
    // `qh2` holds qh in lanes 0..16 and qh >> 2 in lanes 16..32, so that one shift serves both
    // blocks of a pair.
    // SAFETY: bytes 64n..64n + 64 and 128 + 32n..160 + 32n (n < 2) lie in the block (contract).
    let (ql, qh) = unsafe {
        (
            _mm512_loadu_si512(blk.add(64 * n) as *const __m512i),
            _mm256_loadu_si256(blk.add(128 + 32 * n) as *const __m256i),
        )
    };
    let qh2 = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(qh), _mm256_srli_epi16::<2>(qh));
    let w = |lo: __m512i, h: __m512i| {
        _mm512_sub_epi16(_mm512_or_si512(lo, _mm512_and_si512(h, m30)), c32)
    };
    let e0 = w(_mm512_and_si512(ql, m4), _mm512_slli_epi16::<4>(qh2));
    let o0 = w(
        _mm512_and_si512(_mm512_srli_epi16::<8>(ql), m4),
        _mm512_srli_epi16::<4>(qh2),
    );
    let e1 = w(_mm512_and_si512(_mm512_srli_epi16::<4>(ql), m4), qh2);
    let o1 = w(_mm512_srli_epi16::<12>(ql), _mm512_srli_epi16::<8>(qh2));
    [e0, o0, e1, o1]
}

/// One pair's step of the 16-bit K-quant kernels: the exact i32 sums of the weights `w` and the
/// activations `x` (both `[e0, o0, e1, o1]`), converted and FMA'd with the sub-block scales `s`
/// into `acc`. |q_w| <= 32, |q_x| <= 32767: each i32 lane sums 4 products, below 2^22.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(super) fn acc_pair(acc: &mut [__m512; 2], w: [__m512i; 4], x: [__m512i; 4], s: [__m512; 2]) {
    let i0 = _mm512_dpwssd_epi32(_mm512_madd_epi16(w[0], x[0]), w[1], x[1]);
    let i1 = _mm512_dpwssd_epi32(_mm512_madd_epi16(w[2], x[2]), w[3], x[3]);
    acc[0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i0), s[0], acc[0]);
    acc[1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i1), s[1], acc[1]);
}

/// A Q4_K/Q5_K dot from its accumulators and min terms.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(super) fn q4k_total(acc: [__m512; 2], mins: __m256) -> f32 {
    _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1])) - hsum(mins)
}

/// A Q6_K dot from its accumulators.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(super) fn q6k_total(acc: [__m512; 2]) -> f32 {
    _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1]))
}

/// Q5_K's fifth bits for group pair `p` of the super-block at `blk` (bit `2g` of `qh` byte `j` is
/// element `j` of sub-block `2g`, bit `2g + 1` of sub-block `2g + 1`): `qh >> 4p` (group `2p`) in
/// the low 256 bits, `qh >> (4p + 2)` (group `2p + 1`) in the high ones; 16-bit shifts, so callers
/// mask per byte.
///
/// # Safety
/// AVX-512F and AVX2 present; a Q5_K super-block (its `qh` at bytes 16..48) readable at `blk`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn q5k_high(blk: *const u8, p: usize) -> __m512i {
    // SAFETY: bytes 16..48 readable per contract.
    let qh = unsafe { _mm256_loadu_si256(blk.add(16) as *const __m256i) };
    let shift = |n: usize| _mm256_srl_epi16(qh, _mm_cvtsi32_si128(n as i32));
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(shift(4 * p)), shift(4 * p + 2))
}

/// The 16 sub-block scales of the Q6_K super-block at `blk` as `d * sc` (the kernels multiply
/// them by [`q6k_dxd`]'s activation scales).
///
/// # Safety
/// AVX-512F and AVX2/F16C present; 210 bytes readable at `blk`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn q6k_scale_w(blk: *const u8) -> __m512 {
    // SAFETY: bytes 192..210 readable per contract.
    let (q, dw) = unsafe {
        (
            _mm_loadu_si128(blk.add(192) as *const __m128i),
            std::ptr::read_unaligned(blk.add(208) as *const u16),
        )
    };
    let dw = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(dw))));
    let s = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q));
    _mm512_mul_ps(s, _mm512_set1_ps(dw))
}

/// The 8 activation scales at `d` each twice (one per Q6_K sub-block of 16).
///
/// # Safety
/// AVX-512F and AVX2 present; 8 floats readable at `d`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn q6k_dxd(d: *const f32) -> __m512 {
    let dup = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    // SAFETY: 8 floats readable per contract.
    _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(unsafe { _mm256_loadu_ps(d) }))
}

/// `Q4_K` (or, with `Q5`, `Q5_K`) dot of `R` rows with [`pairs512`]-ordered 16-bit activations
/// `x` (block scales `d`, block sums `s`).
///
/// # Safety
/// AVX-512F/BW/VNNI and AVX2/FMA/F16C present.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn q4k_rows<const Q5: bool, const R: usize>(
    rows: [&[u8]; R],
    x: &[i16],
    d: &[f32],
    s: &[f32],
) -> [f32; R] {
    let nsb = d.len() / 8;
    let bb = if Q5 { 176 } else { 144 };
    assert!(rows.iter().all(|r| r.len() >= nsb * bb) && x.len() >= nsb * 256 && s.len() >= nsb * 8);
    // Pair p's first sums are sub-blocks 4p (lanes 0..8) and 4p + 2, its second 4p + 1 and 4p + 3.
    let idx = [halves(0, 2), halves(1, 3), halves(4, 6), halves(5, 7)];
    let mut acc = [[_mm512_setzero_ps(); 2]; R];
    let mut mins = [_mm256_setzero_ps(); R];
    for sb in 0..nsb {
        // SAFETY: sb < nsb: super-block sb of every row (bytes sb*bb .. sb*bb + bb: the quants
        // at qoff..bb, Q5_K's qh at 16..48), activations sb*256 .. sb*256 + 256 and scales
        // sb*8 .. sb*8 + 8 are in bounds (asserted above).
        unsafe {
            let xp = x.as_ptr().add(sb * 256);
            let dx = _mm256_loadu_ps(d.as_ptr().add(sb * 8));
            let sx = _mm256_loadu_ps(s.as_ptr().add(sb * 8));
            let blk: [*const u8; R] = std::array::from_fn(|i| rows[i].as_ptr().add(sb * bb));
            // A loop, not `array::from_fn`: a closure here was measured not inlined (decode 45 ->
            // 35 tok/s on the 1.5B-shaped file).
            let mut scale = [_mm512_setzero_ps(); R];
            for i in 0..R {
                prefetch_block::<R>(blk[i], bb);
                scale[i] = q4k_scale(blk[i], dx, sx, &mut mins[i]);
            }
            for p in 0..2 {
                let xq = xp.add(128 * p);
                let xe0 = _mm512_loadu_si512(xq as *const __m512i);
                let xo0 = _mm512_loadu_si512(xq.add(32) as *const __m512i);
                let xe1 = _mm512_loadu_si512(xq.add(64) as *const __m512i);
                let xo1 = _mm512_loadu_si512(xq.add(96) as *const __m512i);
                let xs = [xe0, xo0, xe1, xo1];
                for i in 0..R {
                    let wq = q4k_quants16::<Q5>(blk[i], p);
                    let s0 = _mm512_permutexvar_ps(idx[2 * p], scale[i]);
                    let s1 = _mm512_permutexvar_ps(idx[2 * p + 1], scale[i]);
                    acc_pair(&mut acc[i], wq, xs, [s0, s1]);
                }
            }
        }
    }
    std::array::from_fn(|i| q4k_total(acc[i], mins[i]))
}

/// `Q6_K` dot of `R` rows with [`pairs512`]-ordered 16-bit activations `x` (block scales `d`).
///
/// # Safety
/// AVX-512F/BW/VNNI and AVX2/FMA/F16C present.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn q6k_rows<const R: usize>(rows: [&[u8]; R], x: &[i16], d: &[f32]) -> [f32; R] {
    let nsb = d.len() / 8;
    let bb = 210;
    assert!(rows.iter().all(|r| r.len() >= nsb * bb) && x.len() >= nsb * 256);
    // Pair q's sums are sub-blocks 4q..4q + 4.
    let idx = [quarters(0), quarters(4), quarters(8), quarters(12)];
    let mut acc = [[_mm512_setzero_ps(); 2]; R];
    for sb in 0..nsb {
        // SAFETY: sb < nsb: super-block sb of every row (210 bytes at sb*210: ql 0..128, qh
        // 128..192, scales 192..208, d 208..210), activations sb*256 .. sb*256 + 256 and scales
        // sb*8 .. sb*8 + 8 are in bounds (asserted above).
        unsafe {
            let xp = x.as_ptr().add(sb * 256);
            let dxd = q6k_dxd(d.as_ptr().add(sb * 8));
            let blk: [*const u8; R] = std::array::from_fn(|i| rows[i].as_ptr().add(sb * bb));
            let mut sc = [_mm512_setzero_ps(); R];
            for i in 0..R {
                if R > 1 {
                    prefetch_block::<R>(blk[i], bb);
                }
                sc[i] = _mm512_mul_ps(q6k_scale_w(blk[i]), dxd);
            }
            for n in 0..2 {
                if R == 1 {
                    // One row: its lines `STREAM_PREFETCH` bytes on, two a half (the fifth line a
                    // 210-byte super-block may reach with the second), not all at the start.
                    let ahead = blk[0].wrapping_add(STREAM_PREFETCH + 128 * n);
                    _mm_prefetch::<_MM_HINT_T1>(ahead as *const i8);
                    _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(64) as *const i8);
                    if n == 1 {
                        _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(128) as *const i8);
                    }
                }
                let xn = xp.add(128 * n);
                let xe0 = _mm512_loadu_si512(xn as *const __m512i);
                let xo0 = _mm512_loadu_si512(xn.add(32) as *const __m512i);
                let xe1 = _mm512_loadu_si512(xn.add(64) as *const __m512i);
                let xo1 = _mm512_loadu_si512(xn.add(96) as *const __m512i);
                let xs = [xe0, xo0, xe1, xo1];
                for i in 0..R {
                    let wq = q6k_quants16(blk[i], n);
                    let s0 = _mm512_permutexvar_ps(idx[2 * n], sc[i]);
                    let s1 = _mm512_permutexvar_ps(idx[2 * n + 1], sc[i]);
                    acc_pair(&mut acc[i], wq, xs, [s0, s1]);
                }
            }
        }
    }
    std::array::from_fn(|i| q6k_total(acc[i]))
}

/// `Q4_K` (or, with `Q5`, `Q5_K`) dot of `R` rows with [`pairs512_i8`]-ordered 8-bit activations
/// `x` (block scales `d`, block sums `s`).
///
/// # Safety
/// AVX-512F/BW/VNNI and AVX2/FMA/F16C present.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn q4k_rows_i8<const Q5: bool, const R: usize>(
    rows: [&[u8]; R],
    x: &[i8],
    d: &[f32],
    s: &[f32],
) -> [f32; R] {
    let nsb = d.len() / 8;
    let (bb, qoff) = if Q5 { (176, 48) } else { (144, 16) };
    let b4 = _mm512_set1_epi8(0x10);
    assert!(rows.iter().all(|r| r.len() >= nsb * bb) && x.len() >= nsb * 256 && s.len() >= nsb * 8);
    let m4 = _mm512_set1_epi8(0x0F);
    let idx = [halves(0, 2), halves(1, 3), halves(4, 6), halves(5, 7)];
    let mut acc = [[_mm512_setzero_ps(); 2]; R];
    let mut mins = [_mm256_setzero_ps(); R];
    for sb in 0..nsb {
        // SAFETY: as in `q4k_rows`: super-block sb of every row, activations sb*256 ..
        // sb*256 + 256 and scales sb*8 .. sb*8 + 8 are in bounds (asserted above).
        unsafe {
            let xp = x.as_ptr().add(sb * 256);
            let dx = _mm256_loadu_ps(d.as_ptr().add(sb * 8));
            let sx = _mm256_loadu_ps(s.as_ptr().add(sb * 8));
            let blk: [*const u8; R] = std::array::from_fn(|i| rows[i].as_ptr().add(sb * bb));
            // A loop, not `array::from_fn`: a closure here was measured not inlined (decode 45 ->
            // 35 tok/s on the 1.5B-shaped file).
            let mut scale = [_mm512_setzero_ps(); R];
            for i in 0..R {
                prefetch_block::<R>(blk[i], bb);
                scale[i] = q4k_scale(blk[i], dx, sx, &mut mins[i]);
            }
            for p in 0..2 {
                let x02 = _mm512_loadu_si512(xp.add(128 * p) as *const __m512i);
                let x13 = _mm512_loadu_si512(xp.add(128 * p + 64) as *const __m512i);
                for i in 0..R {
                    // Bytes 0..32: group 2p (low nibbles sub-block 4p, high 4p + 1); bytes
                    // 32..64: group 2p + 1 (4p + 2, 4p + 3).
                    let raw = _mm512_loadu_si512(blk[i].add(qoff + 64 * p) as *const __m512i);
                    let mut lo = _mm512_and_si512(raw, m4);
                    let mut hi = _mm512_and_si512(_mm512_srli_epi16::<4>(raw), m4);
                    if Q5 {
                        // Bytes 0..32 take qh >> 4p (bits of sub-blocks 4p, 4p + 1), bytes
                        // 32..64 qh >> (4p + 2) (4p + 2, 4p + 3); 16-bit shifts, masked per byte.
                        let hq = q5k_high(blk[i], p);
                        lo = _mm512_or_si512(lo, _mm512_and_si512(_mm512_slli_epi16::<4>(hq), b4));
                        hi = _mm512_or_si512(hi, _mm512_and_si512(_mm512_slli_epi16::<3>(hq), b4));
                    }
                    // q_w <= 31, |q_x| <= 127: each i32 lane sums 4 products, below 2^14.
                    let z = _mm512_setzero_si512();
                    let i0 = _mm512_dpbusd_epi32(z, lo, x02);
                    let i1 = _mm512_dpbusd_epi32(z, hi, x13);
                    let s0 = _mm512_permutexvar_ps(idx[2 * p], scale[i]);
                    let s1 = _mm512_permutexvar_ps(idx[2 * p + 1], scale[i]);
                    acc[i][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i0), s0, acc[i][0]);
                    acc[i][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i1), s1, acc[i][1]);
                }
            }
        }
    }
    std::array::from_fn(|i| {
        _mm512_reduce_add_ps(_mm512_add_ps(acc[i][0], acc[i][1])) - hsum(mins[i])
    })
}

/// `Q6_K` dot of `R` rows with 8-bit activations `x` in element order (block scales `d`):
/// `dpbusd` of the unsigned quants (0..=63) with the activations, minus `32 * sum(x)`.
///
/// # Safety
/// AVX-512F/BW/VNNI and AVX2/FMA/F16C present.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn q6k_rows_i8<const R: usize>(rows: [&[u8]; R], x: &[i8], d: &[f32]) -> [f32; R] {
    let nsb = d.len() / 8;
    let bb = 210;
    assert!(rows.iter().all(|r| r.len() >= nsb * bb) && x.len() >= nsb * 256);
    let m4 = _mm512_set1_epi8(0x0F);
    let m30 = _mm512_set1_epi8(0x30);
    let c32 = _mm512_set1_epi8(32);
    let dup = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    let idx = [quarters(0), quarters(4), quarters(8), quarters(12)];
    let mut acc = [[_mm512_setzero_ps(); 2]; R];
    for sb in 0..nsb {
        // SAFETY: as in `q6k_rows`: super-block sb of every row, activations sb*256 ..
        // sb*256 + 256 and scales sb*8 .. sb*8 + 8 are in bounds (asserted above).
        unsafe {
            let xp = x.as_ptr().add(sb * 256);
            let dx = _mm512_castps256_ps512(_mm256_loadu_ps(d.as_ptr().add(sb * 8)));
            let dxd = _mm512_permutexvar_ps(dup, dx);
            let blk: [*const u8; R] = std::array::from_fn(|i| rows[i].as_ptr().add(sb * bb));
            let mut sc = [_mm512_setzero_ps(); R];
            for i in 0..R {
                prefetch_block::<R>(blk[i], bb);
                sc[i] = _mm512_mul_ps(q6k_scale_w(blk[i]), dxd);
            }
            for n in 0..2 {
                // Blocks 4n, 4n + 1 (low nibbles) and 4n + 2, 4n + 3 (high nibbles).
                let x01 = _mm512_loadu_si512(xp.add(128 * n) as *const __m512i);
                let x23 = _mm512_loadu_si512(xp.add(128 * n + 64) as *const __m512i);
                let z = _mm512_setzero_si512();
                let off01 = _mm512_dpbusd_epi32(z, c32, x01);
                let off23 = _mm512_dpbusd_epi32(z, c32, x23);
                for i in 0..R {
                    let p = blk[i];
                    let ql = _mm512_loadu_si512(p.add(64 * n) as *const __m512i);
                    let qh = _mm256_loadu_si256(p.add(128 + 32 * n) as *const __m256i);
                    // qh in bytes 0..32, qh >> 2 in bytes 32..64 (16-bit shifts: the masks
                    // below drop the bits crossing bytes).
                    let qh2 = _mm512_inserti64x4::<1>(
                        _mm512_castsi256_si512(qh),
                        _mm256_srli_epi16::<2>(qh),
                    );
                    let q01 = _mm512_or_si512(
                        _mm512_and_si512(ql, m4),
                        _mm512_and_si512(_mm512_slli_epi16::<4>(qh2), m30),
                    );
                    let q23 = _mm512_or_si512(
                        _mm512_and_si512(_mm512_srli_epi16::<4>(ql), m4),
                        _mm512_and_si512(qh2, m30),
                    );
                    // q_w <= 63, |q_x| <= 127: each i32 lane sums 4 products, below 2^15.
                    let i0 = _mm512_sub_epi32(_mm512_dpbusd_epi32(z, q01, x01), off01);
                    let i1 = _mm512_sub_epi32(_mm512_dpbusd_epi32(z, q23, x23), off23);
                    let s0 = _mm512_permutexvar_ps(idx[2 * n], sc[i]);
                    let s1 = _mm512_permutexvar_ps(idx[2 * n + 1], sc[i]);
                    acc[i][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i0), s0, acc[i][0]);
                    acc[i][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i1), s1, acc[i][1]);
                }
            }
        }
    }
    std::array::from_fn(|i| _mm512_reduce_add_ps(_mm512_add_ps(acc[i][0], acc[i][1])))
}

/// The 512-bit `Q4_K` / `Q5_K` / `Q6_K` kernels with 8-bit activations as a [`RowDots`] kernel: `x` in
/// [`pairs512_i8`] order for `Q4_K` and `Q5_K`, in element order for `Q6_K`.
pub(super) struct K8Dots512<'a> {
    pub(super) format: WeightFormat,
    pub(super) x: &'a [i8],
    pub(super) d: &'a [f32],
    pub(super) s: &'a [f32],
}

impl RowDots for K8Dots512<'_> {
    #[inline(always)]
    unsafe fn dots<const N: usize>(&self, rows: [&[u8]; N]) -> [f32; N] {
        // SAFETY: AVX-512F/BW/VNNI and AVX2/FMA/F16C present per this method's contract; the
        // kernels assert the lengths they rely on.
        unsafe {
            match self.format {
                WeightFormat::Q6_K => q6k_rows_i8::<N>(rows, self.x, self.d),
                WeightFormat::Q5_K => q4k_rows_i8::<true, N>(rows, self.x, self.d, self.s),
                _ => q4k_rows_i8::<false, N>(rows, self.x, self.d, self.s),
            }
        }
    }
}

/// The 512-bit `Q4_K` / `Q5_K` / `Q6_K` kernels as a [`RowDots`] kernel: `x` in [`pairs512`] order for
/// `format`.
pub(super) struct K16Dots512<'a> {
    pub(super) format: WeightFormat,
    pub(super) x: &'a [i16],
    pub(super) d: &'a [f32],
    pub(super) s: &'a [f32],
}

impl RowDots for K16Dots512<'_> {
    #[inline(always)]
    unsafe fn dots<const N: usize>(&self, rows: [&[u8]; N]) -> [f32; N] {
        // SAFETY: AVX-512F/BW/VNNI and AVX2/FMA/F16C present per this method's contract; the
        // kernels assert the lengths they rely on.
        unsafe {
            match self.format {
                WeightFormat::Q6_K => q6k_rows::<N>(rows, self.x, self.d),
                WeightFormat::Q5_K => q4k_rows::<true, N>(rows, self.x, self.d, self.s),
                _ => q4k_rows::<false, N>(rows, self.x, self.d, self.s),
            }
        }
    }
}
