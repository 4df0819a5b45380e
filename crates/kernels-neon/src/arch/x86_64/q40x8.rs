//! The kernel of nibble rows (Q4_0, IQ4_NL, Q5_0, Q4_1, Q5_1) repacked eight at a time
//! ([`crate::Q40x8`]), 16-bit activations ([`Precision::Fast`](crate::Precision::Fast)), AVX2 (on
//! the AVX-512 path the same kernels with `vpdpwssd`, [`dot_acc`]): one token (decode), or two to
//! four at a time with each group block loaded and unpacked once (a short prompt's products, its
//! small MoE expert groups, a decode step's tokens).
//!
//! A group block holds the f16 scales of its 8 rows (16 bytes; Q4_1 and Q5_1 then their f16 mins,
//! whose term, the min times the block's activation sum, is one more FMA per block), then four
//! registers of quants: in register `k`, 32-bit lane `r` is row `r`, its low u16 the nibbles of
//! weights `8k + 2m` (bits `4m`, `m < 4`) and its high u16 those of `8k + 2m + 1`. Nibble `m` of
//! every u16 (a mask, or a shift) times the activation pair `8k + 2m, 8k + 2m + 1` broadcast to
//! all lanes is one `vpmaddwd` for 8 rows: the lanes are the rows, so no horizontal sum and one
//! scale conversion per 8 rows. For one token, nibbles 1 and 2 are taken by a mask alone (16 and
//! 256 times the weight) into sums of their own, divided back by exact shifts once per block
//! ([`masked_sums`]).
//!
//! Q5_0 (and Q5_1) blocks end with the 8 rows' fifth bits, one u32 a row (lane `r`), laid out for
//! these masks: the bit of weight `8k + 2m + h` at `16h + 4s + k` with `s` = 1, 2, 3, 0 for
//! `m` = 0..4, so that after a shift by `k` one mask a nibble puts it just above that nibble (bits
//! 4, 8 and 12 of each u16; bit 0 shifted to 4 for the nibble taken by a shift). The weights are
//! then Q5_0's unsigned quants (0..=31), whose offset of 16 is the activations' correction taken
//! twice (Q5_1's, as Q4_1's, are unsigned in the file: no correction). IQ4_NL's nibbles index a
//! table of 16 signed values: looked up by byte (`vpshufb`) in the table plus 128 (unsigned,
//! 1..=241), whose offset of 128 is the correction taken 16 times.
//!
//! Results: per row, token and block the exact i32 sum times `d_w * d_x`, accumulated in the order
//! of the one-row kernel of this path (`q40_pairs`: blocks `b % 4` in four lanes, `(A0 + A1) + (A2
//! + A3)` at the end, then the last `nb % 4` blocks' sum added), so bit for bit its result.

use std::arch::x86_64::*;

use super::simd::STREAM_PREFETCH as PREFETCH;
use crate::arch::tags::{has_min, IQ4_NL};
use crate::q40x8::{corr_factor, group_block, has_fifth, quants_at, IQ4NL_BIASED};
use crate::quant::QActs16;

/// Group block `gp`'s fifth bits (Q5_0, Q5_1; zero for the other formats), which [`fifth_of`]
/// shifts down by `k` to put register `k`'s at bits 0, 4, 8 and 12 of each u16 (module docs).
///
/// # Safety
/// AVX2 present; a group block of format `F` readable at `gp`.
#[inline(always)]
pub(super) unsafe fn fifth_bits<const F: u8>(gp: *const u8) -> __m256i {
    if has_fifth(F) {
        // SAFETY: the 32 bytes of fifth bits after the quants, per contract.
        unsafe { _mm256_loadu_si256(gp.add(quants_at(F) + 128) as *const __m256i) }
    } else {
        // SAFETY: AVX2 present per contract.
        unsafe { _mm256_setzero_si256() }
    }
}

/// [`fifth_bits`] of register `k` (`h` shifted down by `k`).
#[inline(always)]
pub(super) unsafe fn fifth_of(h: __m256i, k: usize) -> __m256i {
    // SAFETY: AVX2 present per the callers' contracts (inlined into AVX2 functions).
    unsafe {
        match k {
            0 => h,
            1 => _mm256_srli_epi32::<1>(h),
            2 => _mm256_srli_epi32::<2>(h),
            _ => _mm256_srli_epi32::<3>(h),
        }
    }
}

/// `acc` plus the 8 lanes' `vpmaddwd` of `w` and `x` (pairs of i16 products summed into i32):
/// `vpdpwssd` with `V` (AVX-512 VNNI, one instruction in place of two), `vpmaddwd` and `vpaddd`
/// without. Both wrap the same exact sums (no lane of these kernels' sums overflows), so `V`
/// changes no bit of any result.
///
/// # Safety
/// AVX2 present, and AVX-512 VNNI and VL with `V`. Always inlined, into callers that enable them.
#[inline(always)]
unsafe fn dot_acc<const V: bool>(acc: __m256i, w: __m256i, x: __m256i) -> __m256i {
    // SAFETY: the features are present per contract.
    unsafe {
        if V {
            _mm256_dpwssd_epi32(acc, w, x)
        } else {
            _mm256_add_epi32(acc, _mm256_madd_epi16(w, x))
        }
    }
}

/// `acc` plus the [`dot_acc`] sums of the four weight registers `w` with the four activation pairs
/// `x` (without `V` in `((w0 x0 + w1 x1) + (w2 x2 + w3 x3))`'s order, one dependency on `acc`).
///
/// # Safety
/// As [`dot_acc`].
#[inline(always)]
unsafe fn four_dots<const V: bool>(acc: __m256i, w: [__m256i; 4], x: [__m256i; 4]) -> __m256i {
    // SAFETY: the features are present per contract.
    unsafe {
        if V {
            let acc = dot_acc::<V>(acc, w[0], x[0]);
            let acc = dot_acc::<V>(acc, w[1], x[1]);
            let acc = dot_acc::<V>(acc, w[2], x[2]);
            dot_acc::<V>(acc, w[3], x[3])
        } else {
            let a = _mm256_add_epi32(_mm256_madd_epi16(w[0], x[0]), _mm256_madd_epi16(w[1], x[1]));
            let b = _mm256_add_epi32(_mm256_madd_epi16(w[2], x[2]), _mm256_madd_epi16(w[3], x[3]));
            _mm256_add_epi32(acc, _mm256_add_epi32(a, b))
        }
    }
}

/// IQ4_NL's values plus 128 in both 128-bit lanes.
///
/// # Safety
/// AVX2 present.
#[inline(always)]
unsafe fn biased_table() -> __m256i {
    // SAFETY: the table holds 16 bytes; AVX2 present per contract.
    unsafe { _mm256_broadcastsi128_si256(_mm_loadu_si128(IQ4NL_BIASED.as_ptr() as *const __m128i)) }
}

/// The four weight registers of quant register `v` (fifth bits `hk` from [`fifth_of`]) as their
/// values: nibble `m` of every u16 in lane `m`'s register (Q4_0 and Q4_1 0..=15, Q5_0 and Q5_1
/// 0..=31 with its fifth bit, IQ4_NL the table's value plus 128).
///
/// # Safety
/// AVX2 present.
#[inline(always)]
pub(super) unsafe fn unpack<const F: u8>(v: __m256i, hk: __m256i) -> [__m256i; 4] {
    // SAFETY: AVX2 present per contract (inlined into AVX2 functions).
    unsafe {
        let m0 = _mm256_set1_epi16(0x000F);
        if F == IQ4_NL {
            let (t, mb) = (biased_table(), _mm256_set1_epi8(0x0F));
            // Byte 0 of each u16: nibble 0 (then 1), byte 1: nibble 2 (then 3).
            let lo = _mm256_shuffle_epi8(t, _mm256_and_si256(v, mb));
            let hi = _mm256_shuffle_epi8(t, _mm256_and_si256(_mm256_srli_epi16::<4>(v), mb));
            let low = _mm256_set1_epi16(0x00FF);
            return [
                _mm256_and_si256(lo, low),
                _mm256_and_si256(hi, low),
                _mm256_srli_epi16::<8>(lo),
                _mm256_srli_epi16::<8>(hi),
            ];
        }
        let w = [
            _mm256_and_si256(v, m0),
            _mm256_and_si256(_mm256_srli_epi16::<4>(v), m0),
            _mm256_and_si256(_mm256_srli_epi16::<8>(v), m0),
            _mm256_srli_epi16::<12>(v),
        ];
        if !has_fifth(F) {
            return w;
        }
        let b4 = _mm256_set1_epi16(0x0010);
        [
            _mm256_or_si256(w[0], _mm256_and_si256(hk, b4)),
            _mm256_or_si256(w[1], _mm256_and_si256(_mm256_srli_epi16::<4>(hk), b4)),
            _mm256_or_si256(w[2], _mm256_and_si256(_mm256_srli_epi16::<8>(hk), b4)),
            _mm256_or_si256(w[3], _mm256_and_si256(_mm256_slli_epi16::<4>(hk), b4)),
        ]
    }
}

/// The exact i32 sums of one group block's 8 rows (format `F`, at `gp`) with the 32 activations
/// at `x`, plus `corr` (the activations' `-8 * sum(q_x)`, taken [`corr_factor`] times; the mins'
/// term of Q4_1 and Q5_1 is apart).
///
/// # Safety
/// AVX2 present (AVX-512 VNNI and VL with `V`, [`dot_acc`]); a group block of format `F` readable
/// at `gp`, 32 i16 at `x`. Always inlined, into callers that enable them.
#[inline(always)]
unsafe fn block_sums<const F: u8, const V: bool>(
    gp: *const u8,
    x: *const i16,
    corr: i32,
) -> __m256i {
    let xp = x as *const i32;
    let corr = corr * corr_factor(F);
    // SAFETY: 16 i32 pairs at `xp`, the group block at `gp`, per contract.
    unsafe {
        let pair = |j: usize| _mm256_set1_epi32(std::ptr::read_unaligned(xp.add(j)));
        if F == IQ4_NL {
            // 0 < w <= 241, |q_x| <= 32767: 16 madds of at most 2 * 241 * 32767 a lane and the
            // correction (128 * 32 * 32767): below 2^28.
            let mut s = _mm256_set1_epi32(corr);
            for k in 0..4 {
                let v = _mm256_loadu_si256(gp.add(quants_at(F) + 32 * k) as *const __m256i);
                let w = unpack::<F>(v, _mm256_setzero_si256());
                s = four_dots::<V>(s, w, [0, 1, 2, 3].map(|m| pair(4 * k + m)));
            }
            return s;
        }
        masked_sums::<F, V>(gp.add(quants_at(F)), fifth_bits::<F>(gp), x, corr)
    }
}

/// The exact i32 sums of 8 rows' 32 unsigned nibbles (four registers at `q` in the layout of the
/// module docs; Q5_0 and Q5_1 with the fifth bits `h` of [`fifth_bits`]) with the 32 activations at
/// `x`, plus `corr`: nibbles 1 and 2 taken in place by a mask (16 and 256 times the weight) into
/// sums of their own, divided back by exact shifts.
///
/// # Safety
/// AVX2 present (AVX-512 VNNI and VL with `V`, [`dot_acc`]); 128 bytes readable at `q`, 32 i16 at
/// `x`. Always inlined, into callers that enable them.
#[inline(always)]
pub(super) unsafe fn masked_sums<const F: u8, const V: bool>(
    q: *const u8,
    h: __m256i,
    x: *const i16,
    corr: i32,
) -> __m256i {
    let xp = x as *const i32;
    // SAFETY: 16 i32 pairs at `xp` and 128 bytes at `q`, per contract.
    unsafe {
        let pair = |j: usize| _mm256_set1_epi32(std::ptr::read_unaligned(xp.add(j)));
        let (m0, m1, m2) = (
            _mm256_set1_epi16(0x000F),
            _mm256_set1_epi16(0x00F0),
            _mm256_set1_epi16(0x0F00),
        );
        // 0 <= w <= 31 (x1, x16, x256 in s1, s2, s3; Q4_0 up to 15), |q_x| <= 32767: s3 sums 8
        // products of at most 7936 * 32767 a lane (2.08e9 < 2^31), s1 16 of 31 * 32767 and the
        // correction (16 * 32 * 32767).
        let mut s1 = _mm256_set1_epi32(corr);
        let mut s2 = _mm256_setzero_si256();
        let mut s3 = _mm256_setzero_si256();
        for k in 0..4 {
            let v = _mm256_loadu_si256(q.add(32 * k) as *const __m256i);
            let (mut w0, mut w1, mut w2) = (
                _mm256_and_si256(v, m0),
                _mm256_and_si256(v, m1),
                _mm256_and_si256(v, m2),
            );
            let mut w3 = _mm256_srli_epi16::<12>(v);
            if has_fifth(F) {
                // Each fifth bit just above its nibble (module docs).
                let hk = fifth_of(h, k);
                w0 = _mm256_or_si256(w0, _mm256_and_si256(hk, _mm256_set1_epi16(0x0010)));
                w1 = _mm256_or_si256(w1, _mm256_and_si256(hk, _mm256_set1_epi16(0x0100)));
                w2 = _mm256_or_si256(w2, _mm256_and_si256(hk, _mm256_set1_epi16(0x1000)));
                let b3 = _mm256_and_si256(_mm256_slli_epi16::<4>(hk), _mm256_set1_epi16(0x0010));
                w3 = _mm256_or_si256(w3, b3);
            }
            if V {
                s1 = dot_acc::<V>(dot_acc::<V>(s1, w0, pair(4 * k)), w3, pair(4 * k + 3));
            } else {
                let a = _mm256_madd_epi16(w0, pair(4 * k));
                let d = _mm256_madd_epi16(w3, pair(4 * k + 3));
                s1 = _mm256_add_epi32(s1, _mm256_add_epi32(a, d));
            }
            s2 = dot_acc::<V>(s2, w1, pair(4 * k + 1));
            s3 = dot_acc::<V>(s3, w2, pair(4 * k + 2));
        }
        // s3 = 256 T3 and s2 + s3 / 16 = 16 (T2 + T3): both shifts are exact.
        let t = _mm256_srai_epi32::<4>(_mm256_add_epi32(s2, _mm256_srai_epi32::<4>(s3)));
        _mm256_add_epi32(s1, t)
    }
}

/// `acc` plus group block `b`'s 8 exact sums times `d_w * d_x` (one FMA).
///
/// # Safety
/// AVX2/FMA/F16C present (AVX-512 VNNI and VL with `V`); `b` below the blocks of `group` (of format
/// `F`), of `xq` and of `corr`. Always inlined, into callers that enable them.
#[inline(always)]
unsafe fn block_fma<const F: u8, const V: bool>(
    group: &[u8],
    xq: &QActs16,
    corr: &[i32],
    b: usize,
    acc: __m256,
) -> __m256 {
    // SAFETY: group block b, activations b*32..b*32 + 32, d[b] and corr[b] are in bounds per
    // contract.
    unsafe {
        let gp = group.as_ptr().add(b * group_block(F));
        // Prefetch hints (never fault; wrapping_add keeps them UB-free).
        let ahead = gp.wrapping_add(PREFETCH);
        _mm_prefetch::<_MM_HINT_T1>(ahead as *const i8);
        _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(64) as *const i8);
        _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(128) as *const i8);
        let isum = block_sums::<F, V>(gp, xq.qs.as_ptr().add(b * 32), *corr.get_unchecked(b));
        let dw = _mm256_cvtph_ps(_mm_loadu_si128(gp as *const __m128i));
        let f = _mm256_mul_ps(dw, _mm256_set1_ps(*xq.d.get_unchecked(b)));
        let acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), f, acc);
        if has_min(F) {
            // The mins times the block's activation sum, as the one-row kernel's second FMA.
            let m = _mm256_cvtph_ps(_mm_loadu_si128(gp.add(16) as *const __m128i));
            _mm256_fmadd_ps(m, _mm256_set1_ps(*xq.s.get_unchecked(b)), acc)
        } else {
            acc
        }
    }
}

/// The dots of the 8 rows of one group of format `F` (`nb` group blocks at `group`) with `xq`,
/// whose blocks' `-8 * sum(q_x)` are `corr`.
///
/// # Safety
/// AVX2/FMA/F16C present.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q40x8_group<const F: u8>(
    group: &[u8],
    xq: &QActs16,
    corr: &[i32],
) -> [f32; 8] {
    // SAFETY: AVX2/FMA/F16C present per contract, enabled here.
    unsafe { group_body::<F, false>(group, xq, corr) }
}

/// [`q40x8_group`] with AVX-512 VNNI's `vpdpwssd` ([`dot_acc`]): the same bits.
///
/// # Safety
/// AVX2/FMA/F16C and AVX-512 VNNI and VL present.
#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
pub(crate) unsafe fn q40x8_group_vnni<const F: u8>(
    group: &[u8],
    xq: &QActs16,
    corr: &[i32],
) -> [f32; 8] {
    // SAFETY: AVX2/FMA/F16C and AVX-512 VNNI and VL present per contract, enabled here.
    unsafe { group_body::<F, true>(group, xq, corr) }
}

/// [`q40x8_group`]'s body, `V` as [`dot_acc`]'s.
///
/// # Safety
/// As [`q40x8_group_vnni`] with `V`, [`q40x8_group`] without; always inlined into them.
#[inline(always)]
unsafe fn group_body<const F: u8, const V: bool>(
    group: &[u8],
    xq: &QActs16,
    corr: &[i32],
) -> [f32; 8] {
    let nb = xq.d.len();
    assert!(group.len() >= nb * group_block(F) && xq.qs.len() >= nb * 32 && corr.len() >= nb);
    // SAFETY: the features per contract; every block index below is under `nb`, so group block
    // b, activations b*32..b*32 + 32, d[b] and corr[b] are in bounds (asserted above); 8 f32 are
    // written to an 8-element array.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); 4];
        for q in 0..nb / 4 {
            // Block 4q + j into accumulator j, written out so that the four stay in registers.
            let [a0, a1, a2, a3] = &mut acc;
            *a0 = block_fma::<F, V>(group, xq, corr, 4 * q, *a0);
            *a1 = block_fma::<F, V>(group, xq, corr, 4 * q + 1, *a1);
            *a2 = block_fma::<F, V>(group, xq, corr, 4 * q + 2, *a2);
            *a3 = block_fma::<F, V>(group, xq, corr, 4 * q + 3, *a3);
        }
        let mut s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
        if nb % 4 != 0 {
            // The last `nb % 4` blocks as the one-row kernel's tail (`q40_tail`): per block
            // `(d_w * d_x) * sum` (no FMA) summed from zero, added to the quads' sum at the end.
            let mut t = _mm256_setzero_ps();
            for b in nb - nb % 4..nb {
                let gp = group.as_ptr().add(b * group_block(F));
                let x = xq.qs.as_ptr().add(b * 32);
                let isum = block_sums::<F, V>(gp, x, *corr.get_unchecked(b));
                let dw = _mm256_cvtph_ps(_mm_loadu_si128(gp as *const __m128i));
                let f = _mm256_mul_ps(dw, _mm256_set1_ps(*xq.d.get_unchecked(b)));
                t = _mm256_add_ps(t, _mm256_mul_ps(f, _mm256_cvtepi32_ps(isum)));
                if has_min(F) {
                    let m = _mm256_cvtph_ps(_mm_loadu_si128(gp.add(16) as *const __m128i));
                    t = _mm256_add_ps(t, _mm256_mul_ps(m, _mm256_set1_ps(*xq.s.get_unchecked(b))));
                }
            }
            s = _mm256_add_ps(s, t);
        }
        let mut y = [0f32; 8];
        _mm256_storeu_ps(y.as_mut_ptr(), s);
        y
    }
}

/// [`block_sums`] for each of `T` tokens (`x[t]`, `corr[t]`), the block's quants loaded and
/// unpacked once for all: every nibble is taken down to its value ([`unpack`]; two more operations
/// a register than the one-token masks, shared by the tokens) into one sum a token, which needs
/// fewer registers and adds a token (one thread, a prompt's OLMoE-shaped expert layer: 1.05x the
/// masked form for two tokens). The sums are exact integers, so each token's are [`block_sums`]'s.
///
/// # Safety
/// AVX2 present (AVX-512 VNNI and VL with `V`, [`dot_acc`]); a group block of format `F` readable
/// at `gp`, 32 i16 at each `x[t]`. Always inlined, into callers that enable them (a call per block
/// cost a third of the kernel's time).
// The token index `t` reaches several arrays at once (loops over the const `T`, unrolled).
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn block_sums_t<const F: u8, const T: usize, const V: bool>(
    gp: *const u8,
    x: [*const i16; T],
    corr: [i32; T],
) -> [__m256i; T] {
    // SAFETY: AVX2 present, 16 i32 pairs at each `x[t]` and the group block at `gp`, per
    // contract.
    unsafe {
        let pair = |t: usize, j: usize| {
            _mm256_set1_epi32(std::ptr::read_unaligned((x[t] as *const i32).add(j)))
        };
        let mut s1 = [_mm256_setzero_si256(); T];
        for t in 0..T {
            s1[t] = _mm256_set1_epi32(corr[t] * corr_factor(F));
        }
        let h = fifth_bits::<F>(gp);
        // 0 <= w <= 241, |q_x| <= 32767: 16 madds of at most 2 * 241 * 32767 a lane and the
        // correction (128 * 32 * 32767): below 2^28.
        for k in 0..4 {
            let v = _mm256_loadu_si256(gp.add(quants_at(F) + 32 * k) as *const __m256i);
            let w = unpack::<F>(v, fifth_of(h, k));
            for t in 0..T {
                s1[t] = four_dots::<V>(s1[t], w, [0, 1, 2, 3].map(|m| pair(t, 4 * k + m)));
            }
        }
        s1
    }
}

/// Each token's `acc[t]` plus group block `b`'s 8 exact sums times `d_w * d_x` (one FMA), or,
/// with `TAIL`, `acc[t]` plus that product rounded apart (no FMA; the one-row kernel's tail).
///
/// # Safety
/// AVX2/FMA/F16C present; `b` below the blocks of `group` (of format `F`) and of each token's
/// `xq` and `corr`. Always inlined, as [`block_sums_t`].
// The token index `t` reaches several arrays at once (loops over the const `T`, unrolled).
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn block_fma_t<const F: u8, const T: usize, const TAIL: bool, const V: bool>(
    group: &[u8],
    xq: [&QActs16; T],
    corr: [&[i32]; T],
    b: usize,
    acc: [__m256; T],
) -> [__m256; T] {
    // SAFETY: group block b, each token's activations b*32..b*32 + 32, d[b] and corr[b] are in
    // bounds per contract.
    unsafe {
        let gp = group.as_ptr().add(b * group_block(F));
        if !TAIL {
            // Prefetch hints (never fault; wrapping_add keeps them UB-free).
            let ahead = gp.wrapping_add(PREFETCH);
            _mm_prefetch::<_MM_HINT_T1>(ahead as *const i8);
            _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(64) as *const i8);
            _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(128) as *const i8);
        }
        let mut x = [std::ptr::null::<i16>(); T];
        let mut c = [0i32; T];
        for t in 0..T {
            x[t] = xq[t].qs.as_ptr().add(b * 32);
            c[t] = *corr[t].get_unchecked(b);
        }
        let isum = block_sums_t::<F, T, V>(gp, x, c);
        let dw = _mm256_cvtph_ps(_mm_loadu_si128(gp as *const __m128i));
        let m = if has_min(F) {
            _mm256_cvtph_ps(_mm_loadu_si128(gp.add(16) as *const __m128i))
        } else {
            _mm256_setzero_ps()
        };
        let mut acc = acc;
        for t in 0..T {
            let f = _mm256_mul_ps(dw, _mm256_set1_ps(*xq[t].d.get_unchecked(b)));
            acc[t] = if TAIL {
                _mm256_add_ps(acc[t], _mm256_mul_ps(f, _mm256_cvtepi32_ps(isum[t])))
            } else {
                _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), f, acc[t])
            };
            if has_min(F) {
                // The mins' term as [`block_fma`] (or its tail) takes it.
                let s = _mm256_set1_ps(*xq[t].s.get_unchecked(b));
                acc[t] = if TAIL {
                    _mm256_add_ps(acc[t], _mm256_mul_ps(m, s))
                } else {
                    _mm256_fmadd_ps(m, s, acc[t])
                };
            }
        }
        acc
    }
}

/// [`q40x8_group`] for each of `T` tokens (`xq[t]`, `corr[t]`; two for a prompt's small MoE
/// groups), the group blocks loaded and unpacked once for all: each token's f32 operations are
/// [`q40x8_group`]'s in its order, so each token's results its bits.
///
/// # Safety
/// AVX2/FMA/F16C present.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q40x8_group_tokens<const F: u8, const T: usize>(
    group: &[u8],
    xq: [&QActs16; T],
    corr: [&[i32]; T],
) -> [[f32; 8]; T] {
    // SAFETY: AVX2/FMA/F16C present per contract, enabled here.
    unsafe { tokens_body::<F, T, false>(group, xq, corr) }
}

/// [`q40x8_group_tokens`] with AVX-512 VNNI's `vpdpwssd` ([`dot_acc`]): the same bits.
///
/// # Safety
/// AVX2/FMA/F16C and AVX-512 VNNI and VL present.
#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
pub(crate) unsafe fn q40x8_group_tokens_vnni<const F: u8, const T: usize>(
    group: &[u8],
    xq: [&QActs16; T],
    corr: [&[i32]; T],
) -> [[f32; 8]; T] {
    // SAFETY: AVX2/FMA/F16C and AVX-512 VNNI and VL present per contract, enabled here.
    unsafe { tokens_body::<F, T, true>(group, xq, corr) }
}

/// [`q40x8_group_tokens`]'s body, `V` as [`dot_acc`]'s.
///
/// # Safety
/// As [`q40x8_group_tokens_vnni`] with `V`, [`q40x8_group_tokens`] without; always inlined into
/// them.
// The token index `t` reaches several arrays at once (loops over the const `T`, unrolled).
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn tokens_body<const F: u8, const T: usize, const V: bool>(
    group: &[u8],
    xq: [&QActs16; T],
    corr: [&[i32]; T],
) -> [[f32; 8]; T] {
    let nb = xq.first().map_or(0, |q| q.d.len());
    assert!(
        group.len() >= nb * group_block(F)
            && xq.iter().all(|q| q.d.len() == nb && q.qs.len() >= nb * 32)
            && corr.iter().all(|c| c.len() >= nb)
    );
    // SAFETY: the features per contract; every block index below is under `nb`, so in bounds
    // (asserted above); 8 f32 are written to each 8-element array.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); T]; 4];
        for q in 0..nb / 4 {
            // Block 4q + j into accumulator j, written out so that the four stay in registers.
            let [a0, a1, a2, a3] = &mut acc;
            *a0 = block_fma_t::<F, T, false, V>(group, xq, corr, 4 * q, *a0);
            *a1 = block_fma_t::<F, T, false, V>(group, xq, corr, 4 * q + 1, *a1);
            *a2 = block_fma_t::<F, T, false, V>(group, xq, corr, 4 * q + 2, *a2);
            *a3 = block_fma_t::<F, T, false, V>(group, xq, corr, 4 * q + 3, *a3);
        }
        let mut s = [_mm256_setzero_ps(); T];
        for t in 0..T {
            s[t] = _mm256_add_ps(
                _mm256_add_ps(acc[0][t], acc[1][t]),
                _mm256_add_ps(acc[2][t], acc[3][t]),
            );
        }
        if nb % 4 != 0 {
            // The last `nb % 4` blocks as the one-row kernel's tail (`q40_tail`): per block
            // `(d_w * d_x) * sum` (no FMA) summed from zero, added to the quads' sum at the end.
            let mut tail = [_mm256_setzero_ps(); T];
            for b in nb - nb % 4..nb {
                tail = block_fma_t::<F, T, true, V>(group, xq, corr, b, tail);
            }
            for t in 0..T {
                s[t] = _mm256_add_ps(s[t], tail[t]);
            }
        }
        let mut y = [[0f32; 8]; T];
        for (yt, st) in y.iter_mut().zip(s) {
            _mm256_storeu_ps(yt.as_mut_ptr(), st);
        }
        y
    }
}
