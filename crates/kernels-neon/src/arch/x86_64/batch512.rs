//! Small-batch `matvec` with 16-bit activations on 512-bit registers, for
//! [`KernelPath::Avx512`](crate::KernelPath::Avx512): two tokens share each register, the lower
//! eight lanes one token's and the upper eight the other's, so a block's products for both come
//! from one `madd` and one `vpdpwssd` against the block's weights broadcast to both halves. The
//! tokens go in groups of up to eight ([`TokenOctet`]), whose per-block scale products
//! `d_w * d_x` and `m` terms take one 8-lane multiply for the group.
//!
//! Each half does exactly what [`super::matvec_i16()`] does for its token (the same i32 block sums,
//! converted, scaled by the same `d_w * d_x` product and FMA'd into eight lanes in block order, the
//! `m` term summed apart in block order, then the same horizontal sum): results are bit-identical
//! to one token at a time. Q4_0 and Q5_0, whose one-token kernel on this path is
//! [`super::q40_512`]'s, take that module's batch form instead. With the weights unpacked once per
//! batch, the per-token part (the integer dots, the conversion and the FMA) is what a batched step
//! spends its time on; pairing halves it.

use std::arch::x86_64::*;

use super::matvec_i16::weights_i16;
use super::matvec_i16_batch::dot_i16_tokens;
use super::q40_512;
use super::simd::{f16_at, hsum, STREAM_PREFETCH};
use crate::arch::tags::{block_bytes, has_min, quants_offset, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};
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
    /// No activations: [`dot_octet`]'s lone token where it has none.
    empty: QActs16,
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
            empty: QActs16::default(),
        }
    }

    fn blocks(&self) -> usize {
        self.d.len()
    }
}

/// The 32 weights of the quantized block at `p` as two i16x32 vectors, elements 0..16 in both
/// halves of the first and 16..32 in both halves of the second: the values of
/// [`weights_i16`] broadcast to 512 bits, unpacked from broadcast loads where that takes fewer
/// instructions (`Q4_0`, `Q4_1`, `Q5_0`, `Q5_1`, `Q8_0`).
///
/// # Safety
/// AVX2/FMA/F16C and AVX-512F/BW present; a full block of `block_bytes(F)` bytes readable at `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw")]
unsafe fn weights_broadcast<const F: u8>(p: *const u8) -> (__m512i, __m512i) {
    // SAFETY: the caller guarantees a full block at `p`; the loads read bytes 2..34 (Q8_0),
    // 2..18 (Q4_0), 4..20 (Q4_1), 2..22 (Q5_0) or 4..24 (Q5_1), inside it, and `weights_i16`
    // reads within the block.
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
            Q5_0 | Q5_1 => {
                // The nibbles as Q4_0's; each element's fifth bit (bit i of `qh` for element i)
                // from a mask register: both halves of the first vector take bits 0..16, both
                // of the second bits 16..32. Q5_0's elements without it are the nibble - 16, with
                // it the nibble itself; Q5_1's the nibble + 16 with it.
                let q = p.add(quants_offset(F));
                let qh = std::ptr::read_unaligned(q as *const u32);
                let raw = _mm256_broadcastsi128_si256(_mm_loadu_si128(q.add(4) as *const __m128i));
                let wide = _mm512_cvtepu8_epi16(raw);
                let lo = _mm512_and_si512(wide, _mm512_set1_epi16(0x0F));
                let hi = _mm512_srli_epi16::<4>(wide);
                let (l, h) = (qh & 0xFFFF, qh >> 16);
                let (m0, m1): (__mmask32, __mmask32) = (l | (l << 16), h | (h << 16));
                let sixteen = _mm512_set1_epi16(16);
                if F == Q5_0 {
                    (
                        _mm512_mask_sub_epi16(lo, !m0, lo, sixteen),
                        _mm512_mask_sub_epi16(hi, !m1, hi, sixteen),
                    )
                } else {
                    (
                        _mm512_mask_add_epi16(lo, m0, lo, sixteen),
                        _mm512_mask_add_epi16(hi, m1, hi, sixteen),
                    )
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

/// A last unpaired token of a batch ([`dot_octet`] with `S`): its activations, and its 8-lane
/// accumulator and `m` terms as the one-token kernel (`matvec_i16`'s) keeps them, so that its
/// products take the weights the octet has unpacked (the lower halves of the broadcast vectors
/// are the one-token kernel's vectors) with that kernel's 256-bit operations, in its order.
struct Lone<'q> {
    q: &'q QActs16,
    acc: __m256,
    extra: f32,
}

/// Block `b` of `row` with the `P` token pairs of `o`, FMA'd into `acc` (the `m` terms into
/// `extra`), and with `lone` where `S`: [`dot_octet`]'s loop body.
///
/// # Safety
/// AVX2/FMA/F16C and AVX-512F/BW/VNNI present; block `b` in bounds of `row`, `o` and, where `S`,
/// `lone.q`.
#[inline(always)]
unsafe fn octet_block<const F: u8, const P: usize, const S: bool>(
    row: &[u8],
    o: &TokenOctet,
    b: usize,
    pick: &[__m512i; P],
    acc: &mut [__m512; P],
    extra: &mut __m256,
    lone: &mut Lone<'_>,
) {
    let bb = block_bytes(F);
    // SAFETY: block b of the row, of the octet and (where S) of the lone token are in bounds
    // (contract); the features are present (contract).
    unsafe {
        let p = row.as_ptr().add(b * bb);
        // Prefetch hint (never faults; wrapping_add keeps it UB-free).
        _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(STREAM_PREFETCH) as *const i8);
        let (w0, w1) = weights_broadcast::<F>(p);
        // d and m are adjacent f16s for the formats with a minimum: one conversion for both.
        let (dw, mw) = if has_min(F) {
            let dm = _mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(p as *const i32)));
            // Each token's `m * s` added in block order, as one token's kernel adds it.
            let mw = _mm_movehdup_ps(dm);
            let s = _mm256_loadu_ps(o.s.get_unchecked(b).as_ptr());
            *extra = _mm256_add_ps(*extra, _mm256_mul_ps(_mm256_broadcastss_ps(mw), s));
            (_mm_cvtss_f32(dm), _mm_cvtss_f32(mw))
        } else {
            (f16_at(p), 0.0)
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
        if S {
            // `dot_i16_rows`'s block, on the lower halves of the unpacked weights.
            let q = lone.q;
            let xp = q.qs.as_ptr().add(b * 32);
            let x0 = _mm256_loadu_si256(xp as *const __m256i);
            let x1 = _mm256_loadu_si256(xp.add(16) as *const __m256i);
            let (dx, sx) = (*q.d.get_unchecked(b), *q.s.get_unchecked(b));
            let isum = _mm256_add_epi32(
                _mm256_madd_epi16(_mm512_castsi512_si256(w0), x0),
                _mm256_madd_epi16(_mm512_castsi512_si256(w1), x1),
            );
            if has_min(F) {
                lone.extra += mw * sx;
            }
            lone.acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(dw * dx), lone.acc);
        }
    }
}

/// Dots of one row with the `P` token pairs of `o` (`P == o.pairs`), and with `lone` where `S`: per
/// block the row's weights are widened once and broadcast to both halves of a
/// register, every token's `d_w * d_x` (and `m * s`) comes from one 8-lane multiply, and each pair
/// takes its two scales from it by a permutation. Token `t`'s result is element `t` of the array;
/// the lone token's is the second value.
///
/// # Safety
/// AVX2/FMA/F16C and AVX-512F/BW/VNNI present; lengths as asserted.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
unsafe fn dot_octet<const F: u8, const P: usize, const S: bool>(
    row: &[u8],
    o: &TokenOctet,
    lone: Option<&QActs16>,
) -> ([f32; OCTET], f32) {
    let nb = o.blocks();
    let bb = block_bytes(F);
    assert!(o.pairs == P && row.len() >= nb * bb && o.qs.len() >= nb * P * 64 && o.s.len() >= nb);
    // The lone token (a dummy, never read, without `S`).
    let q = lone.unwrap_or(&o.empty);
    assert!(
        !S || (q.d.len() == nb && q.qs.len() >= nb * 32 && q.s.len() >= nb),
        "a lone token of the octet's length"
    );
    let mut lone = Lone {
        q,
        acc: _mm256_setzero_ps(),
        extra: 0.0,
    };
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
    let mut extra = _mm256_setzero_ps();
    for b in 0..nb {
        // SAFETY: b < nb: the row's block (bytes b*bb..(b+1)*bb), the octet's
        // (qs[b*P*64..(b+1)*P*64], d[b], s[b]) and, where S, the lone token's are in bounds
        // (asserted above).
        unsafe { octet_block::<F, P, S>(row, o, b, &pick, &mut acc, &mut extra, &mut lone) };
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
        out[2 * j] = hsum(lo) + e[2 * j];
        out[2 * j + 1] = hsum(hi) + e[2 * j + 1];
    }
    let single = if S { hsum(lone.acc) + lone.extra } else { 0.0 };
    (out, single)
}

/// Rows `r0..r0 + ys[t].len()` for every token `t`, one row at a time: each octet's tokens on
/// [`dot_octet`], and a last unpaired token (`single`) with the last octet's (on the weights it
/// unpacks, in the one-token kernel's operations).
///
/// # Safety
/// AVX2/FMA/F16C and AVX-512F/BW/VNNI present; `F` a 32-element block format other than Q4_0
/// (`q40_pairs`) and Q5_0 ([`q40_512::takes`]): their one-token kernels differ; `octets` and
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
    assert!(
        !q40_512::takes(F) && F != Q4_0 && ys.iter().all(|y| y.len() == n) && r0 + n <= w.rows()
    );
    // The lone token rides with the last octet.
    let lone = single.filter(|_| !octets.is_empty());
    // `r` indexes every token's output, not only `ys[0]`.
    #[allow(clippy::needless_range_loop)]
    for r in 0..n {
        let row = w.row_data(r0 + r);
        let mut t0 = 0;
        for (k, o) in octets.iter().enumerate() {
            let with = lone.filter(|_| k + 1 == octets.len());
            // SAFETY: features present per contract; the kernel asserts the lengths.
            let (d, v) = unsafe {
                match (o.pairs, with.is_some()) {
                    (4, false) => dot_octet::<F, 4, false>(row, o, None),
                    (3, false) => dot_octet::<F, 3, false>(row, o, None),
                    (2, false) => dot_octet::<F, 2, false>(row, o, None),
                    (_, false) => dot_octet::<F, 1, false>(row, o, None),
                    (4, true) => dot_octet::<F, 4, true>(row, o, with),
                    (3, true) => dot_octet::<F, 3, true>(row, o, with),
                    (2, true) => dot_octet::<F, 2, true>(row, o, with),
                    (_, true) => dot_octet::<F, 1, true>(row, o, with),
                }
            };
            for (k, v) in d.iter().take(2 * o.pairs).enumerate() {
                ys[t0 + k][r] = *v;
            }
            t0 += 2 * o.pairs;
            if with.is_some() {
                ys[t0][r] = v;
            }
        }
        if lone.is_some() {
            continue;
        }
        if let Some(q) = single {
            // SAFETY: features present per contract; the kernel asserts the lengths.
            let [[v]] = unsafe { dot_i16_tokens::<F, 1, 1>([row], [q]) };
            ys[t0][r] = v;
        }
    }
}
