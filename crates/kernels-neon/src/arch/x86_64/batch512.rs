//! Small-batch `matvec` with 16-bit activations on 512-bit registers, for
//! [`KernelPath::Avx512`](crate::KernelPath::Avx512): two tokens share each register, the lower
//! eight lanes one token's and the upper eight the other's, so a block's products for both come
//! from one `madd` and one `vpdpwssd` against the block's weights broadcast to both halves. The
//! tokens go in groups of up to eight ([`TokenOctet`]), whose per-block scale products
//! `d_w * d_x` and `m` terms take one 8-lane multiply for the group.
//!
//! Each half does exactly what [`super::matvec_i16`] does for its token (the same i32 block sums,
//! converted, scaled by the same `d_w * d_x` product and FMA'd into eight lanes in block order,
//! the `m` term summed apart in block order, then the same horizontal sum): results are
//! bit-identical to one token at a time. For Q4_0 that kernel is [`super::q40_512`]'s, which keeps
//! even and odd blocks in lanes of their own and adds them before the horizontal sum: here two
//! accumulators per pair of tokens, by block parity, then the same sums. With the weights unpacked once per batch, the per-token
//! part (the integer dots, the conversion and the FMA) is what a batched step spends its time on;
//! pairing halves it.

use std::arch::x86_64::*;

use super::matvec_i16::weights_i16;
use super::matvec_i16_batch::dot_i16_tokens;
use super::q40_512;
use super::simd::{f16_at, hsum, STREAM_PREFETCH};
use crate::arch::tags::{block_bytes, has_min, Q4_0, Q4_1, Q8_0};
use crate::quant::QActs16;
use crate::QMatrix;

/// Tokens per [`TokenOctet`].
pub(crate) const OCTET: usize = 8;

/// The 16-bit activations of up to eight tokens, `2 * pairs` of them, interleaved for
/// [`dot_octet`].
pub(crate) struct TokenOctet {
    /// Token pairs (1..=4).
    pairs: usize,
    /// Per block, per pair `(a, b)`: `a`'s elements 0..16, `b`'s 0..16, `a`'s 16..32, `b`'s
    /// 16..32.
    qs: Vec<i16>,
    /// Per block: each token's scale `d` (unused lanes 0).
    d: Vec<[f32; OCTET]>,
    /// Per block: each token's `d * sum(q)` (unused lanes 0).
    s: Vec<[f32; OCTET]>,
}

impl TokenOctet {
    /// Interleaves an even number (2..=8) of tokens' activations, all of one length.
    pub(crate) fn new(tokens: &[&QActs16]) -> TokenOctet {
        assert!(tokens.len() % 2 == 0 && (2..=OCTET).contains(&tokens.len()));
        let nb = tokens[0].d.len();
        assert!(tokens
            .iter()
            .all(|t| t.d.len() == nb && t.s.len() >= nb && t.qs.len() >= nb * 32));
        let mut qs = Vec::with_capacity(nb * 32 * tokens.len());
        let (mut d, mut s) = (vec![[0f32; OCTET]; nb], vec![[0f32; OCTET]; nb]);
        for blk in 0..nb {
            for pair in tokens.chunks_exact(2) {
                let (xa, xb) = (&pair[0].qs[blk * 32..], &pair[1].qs[blk * 32..]);
                for half in [0..16, 16..32] {
                    qs.extend_from_slice(&xa[half.clone()]);
                    qs.extend_from_slice(&xb[half]);
                }
            }
            for (t, q) in tokens.iter().enumerate() {
                d[blk][t] = q.d[blk];
                s[blk][t] = q.s[blk];
            }
        }
        TokenOctet {
            pairs: tokens.len() / 2,
            qs,
            d,
            s,
        }
    }

    fn blocks(&self) -> usize {
        self.d.len()
    }
}

/// The 32 weights of the quantized block at `p` as two i16x32 vectors, elements 0..16 in both
/// halves of the first and 16..32 in both halves of the second: the values of
/// [`weights_i16`] broadcast to 512 bits, unpacked from broadcast loads where that takes fewer
/// instructions (`Q4_0`, `Q4_1`, `Q8_0`).
///
/// # Safety
/// AVX2/FMA/F16C and AVX-512F/BW present; a full block of `block_bytes(F)` bytes readable at `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw")]
unsafe fn weights_broadcast<const F: u8>(p: *const u8) -> (__m512i, __m512i) {
    // SAFETY: the caller guarantees a full block at `p`; the loads read bytes 2..34 (Q8_0),
    // 2..18 (Q4_0) or 4..20 (Q4_1), inside it, and `weights_i16` reads within the block.
    unsafe {
        match F {
            Q4_0 | Q4_1 => {
                // Both halves hold the 16 quant bytes, widened to i16: the low nibbles are
                // elements 0..16, the high ones 16..32.
                let raw =
                    _mm256_broadcastsi128_si256(_mm_loadu_si128(
                        p.add(if F == Q4_0 { 2 } else { 4 }) as *const __m128i,
                    ));
                let wide = _mm512_cvtepu8_epi16(raw);
                let lo = _mm512_and_si512(wide, _mm512_set1_epi16(0x0F));
                let hi = _mm512_srli_epi16::<4>(wide);
                if F == Q4_0 {
                    let eight = _mm512_set1_epi16(8);
                    (_mm512_sub_epi16(lo, eight), _mm512_sub_epi16(hi, eight))
                } else {
                    (lo, hi)
                }
            }
            Q8_0 => (
                _mm512_cvtepi8_epi16(_mm256_broadcastsi128_si256(_mm_loadu_si128(
                    p.add(2) as *const __m128i
                ))),
                _mm512_cvtepi8_epi16(_mm256_broadcastsi128_si256(_mm_loadu_si128(
                    p.add(18) as *const __m128i
                ))),
            ),
            _ => {
                let (w0, w1) = weights_i16::<F>(p);
                (_mm512_broadcast_i64x4(w0), _mm512_broadcast_i64x4(w1))
            }
        }
    }
}

/// Block `b` of `row` with the `P` token pairs of `o`, FMA'd into `acc` (the `m` terms into
/// `extra`): [`dot_octet`]'s loop body.
///
/// # Safety
/// AVX2/FMA/F16C and AVX-512F/BW/VNNI present; block `b` in bounds of `row` and `o`.
#[inline(always)]
unsafe fn octet_block<const F: u8, const P: usize>(
    row: &[u8],
    o: &TokenOctet,
    b: usize,
    pick: &[__m512i; P],
    acc: &mut [__m512; P],
    extra: &mut __m256,
) {
    let bb = block_bytes(F);
    // SAFETY: block b of the row and of the octet are in bounds (contract); the features are
    // present (contract).
    unsafe {
        let p = row.as_ptr().add(b * bb);
        // Prefetch hint (never faults; wrapping_add keeps it UB-free).
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(STREAM_PREFETCH) as *const i8);
        let (w0, w1) = weights_broadcast::<F>(p);
        // d and m are adjacent f16s for the formats with a minimum: one conversion for both.
        let dw = if has_min(F) {
            let dm = _mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(p as *const i32)));
            // Each token's `m * s` added in block order, as one token's kernel adds it.
            let mw = _mm256_broadcastss_ps(_mm_movehdup_ps(dm));
            let s = _mm256_loadu_ps(o.s.get_unchecked(b).as_ptr());
            *extra = _mm256_add_ps(*extra, _mm256_mul_ps(mw, s));
            _mm_cvtss_f32(dm)
        } else {
            f16_at(p)
        };
        let dx = _mm256_loadu_ps(o.d.get_unchecked(b).as_ptr());
        let scales = _mm512_castps256_ps512(_mm256_mul_ps(_mm256_set1_ps(dw), dx));
        let xp = o.qs.as_ptr().add(b * P * 64);
        for j in 0..P {
            let x0 = _mm512_loadu_si512(xp.add(j * 64) as *const _);
            let x1 = _mm512_loadu_si512(xp.add(j * 64 + 32) as *const _);
            let isum = q40_512::dpwssd(_mm512_madd_epi16(w0, x0), w1, x1);
            let scale = _mm512_permutexvar_ps(pick[j], scales);
            acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), scale, acc[j]);
        }
    }
}

/// Dots of one row with the `P` token pairs of `o` (`P == o.pairs`): per block the row's weights
/// are widened once and broadcast to both halves of a register, every token's `d_w * d_x` (and
/// `m * s`) comes from one 8-lane multiply, and each pair takes its two scales from it by a
/// permutation. Token `t`'s result is element `t` of the array.
///
/// # Safety
/// AVX2/FMA/F16C and AVX-512F/BW/VNNI present; lengths as asserted.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
unsafe fn dot_octet<const F: u8, const P: usize>(row: &[u8], o: &TokenOctet) -> [f32; OCTET] {
    let nb = o.blocks();
    let bb = block_bytes(F);
    assert!(o.pairs == P && row.len() >= nb * bb && o.qs.len() >= nb * P * 64 && o.s.len() >= nb);
    // Lanes 0..8 take token 2j's scale, lanes 8..16 token 2j + 1's.
    let pick: [__m512i; P] = {
        let mut pick = [_mm512_setzero_si512(); P];
        for (j, v) in pick.iter_mut().enumerate() {
            let (a, b) = (2 * j as i32, 2 * j as i32 + 1);
            *v = _mm512_setr_epi32(a, a, a, a, a, a, a, a, b, b, b, b, b, b, b, b);
        }
        pick
    };
    let mut acc = [_mm512_setzero_ps(); P];
    // Q4_0: odd blocks in accumulators of their own, as `q40_512`'s one-token kernel keeps them.
    let mut odd = [_mm512_setzero_ps(); P];
    let mut extra = _mm256_setzero_ps();
    let mut b = 0;
    while b < nb {
        // SAFETY: b < nb (and b + 1 < nb where taken): the row's blocks (bytes b*bb..(b+1)*bb)
        // and the octet's (qs[b*P*64..(b+1)*P*64], d[b], s[b]) are in bounds (asserted above).
        unsafe {
            octet_block::<F, P>(row, o, b, &pick, &mut acc, &mut extra);
            if F == Q4_0 && b + 1 < nb {
                octet_block::<F, P>(row, o, b + 1, &pick, &mut odd, &mut extra);
                b += 1;
            }
        }
        b += 1;
    }
    let mut e = [0f32; OCTET];
    // SAFETY: `e` holds 8 floats.
    unsafe { _mm256_storeu_ps(e.as_mut_ptr(), extra) };
    let mut out = [0f32; OCTET];
    let halves = |v: __m512| {
        (
            _mm512_castps512_ps256(v),
            _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v))),
        )
    };
    for j in 0..P {
        let (lo, hi) = halves(acc[j]);
        if F == Q4_0 {
            // Even blocks' lanes plus odd blocks' lanes, then the horizontal sum: `q40_512`.
            let (olo, ohi) = halves(odd[j]);
            out[2 * j] = hsum(_mm256_add_ps(lo, olo));
            out[2 * j + 1] = hsum(_mm256_add_ps(hi, ohi));
        } else {
            out[2 * j] = hsum(lo) + e[2 * j];
            out[2 * j + 1] = hsum(hi) + e[2 * j + 1];
        }
    }
    out
}

/// Rows `r0..r0 + ys[t].len()` for every token `t`, one row at a time: each octet's tokens on
/// [`dot_octet`], and a last unpaired token (`single`) on the one-token kernel (256-bit; Q4_0's
/// `q40_512`).
///
/// # Safety
/// AVX2/FMA/F16C and AVX-512F/BW/VNNI present; `F` a 32-element block format; `octets` and
/// `single` the tokens of `ys` in order, every `ys[t]` of one length with rows `r0..r0 + len` in
/// `w`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn batch_octets<const F: u8>(
    w: &QMatrix<'_>,
    r0: usize,
    octets: &[TokenOctet],
    single: Option<&QActs16>,
    ys: &mut [&mut [f32]],
) {
    let paired: usize = octets.iter().map(|o| 2 * o.pairs).sum();
    assert_eq!(ys.len(), paired + usize::from(single.is_some()));
    let n = ys[0].len();
    assert!(ys.iter().all(|y| y.len() == n) && r0 + n <= w.rows());
    let single40 = single.filter(|_| F == Q4_0).map(q40_512::Q40Wide::new);
    // `r` indexes every token's output, not only `ys[0]`.
    #[allow(clippy::needless_range_loop)]
    for r in 0..n {
        let row = w.row_data(r0 + r);
        let mut t0 = 0;
        for o in octets {
            // SAFETY: features present per contract; the kernel asserts the lengths.
            let d = unsafe {
                match o.pairs {
                    4 => dot_octet::<F, 4>(row, o),
                    3 => dot_octet::<F, 3>(row, o),
                    2 => dot_octet::<F, 2>(row, o),
                    _ => dot_octet::<F, 1>(row, o),
                }
            };
            for (k, v) in d.iter().take(2 * o.pairs).enumerate() {
                ys[t0 + k][r] = *v;
            }
            t0 += 2 * o.pairs;
        }
        if let Some(q) = single {
            ys[t0][r] = if F == Q4_0 {
                // SAFETY: as above.
                let [[v]] = unsafe { q40_512::dots::<1, 1>([row], [single40.as_ref().unwrap()]) };
                v
            } else {
                // SAFETY: features present per contract; the kernel asserts the lengths.
                let [[v]] = unsafe { dot_i16_tokens::<F, 1, 1>([row], [q]) };
                v
            };
        }
    }
}
