//! Q4_0's (and IQ4_NL's, Q5_0's, and on the AVX2 path Q4_1's and Q5_1's) one-token (`matvec`)
//! kernel with 16-bit activations ([`Precision::Fast`](crate::Precision::Fast)): two blocks a
//! register.
//!
//! The 16 quant bytes of blocks `b` and `b + 1` are loaded into the two halves of one register
//! and read as 16-bit lanes: lane `k` of a half holds the quants of elements `2k` (bits 0..4),
//! `2k + 16` (4..8), `2k + 1` (8..12) and `2k + 17` (12..16). A mask and three shifts widen the
//! 64 weights to four i16 registers with no shuffle; the activations are reordered to match once
//! per call ([`Q40Acts::new`]), with each `madd` lane's sum of activations times -8 beside them:
//! one add per two blocks takes Q4_0's offset of 8 in exact integers. Four blocks (two such
//! registers) are then reduced together (unpacks and adds: the four exact block sums in one
//! register), converted once and multiplied by the four `d_w * d_x` (the four f16 scales
//! gathered through a scalar register: one `vcvtph2ps`). The last `nb % 4` blocks go one at a
//! time.
//!
//! IQ4_NL takes the same kernel (`F`): its blocks are Q4_0's (an f16 scale, 32 nibbles), its
//! nibbles indices into a table of 16 signed values, looked up by byte (`vpshufb`) and sign-extended
//! into the same lanes; signed, they need no correction.
//!
//! Q5_0 and Q5_1 (a 4-byte `qh` of fifth bits before the nibbles): the nibble bytes' low and high
//! nibbles are masked as bytes, each byte `or`ed with its element's fifth bit (llama.cpp's
//! `bytes_from_bits_32` per block, [`fifth_bits`]), and the two resulting registers split into
//! their lanes' low and high bytes: four registers as Q4_0's. Q5_0's offset of 16 is the
//! correction taken twice. Q4_1 and Q5_1 (unsigned, a min `m` after the scale): no correction;
//! per quad the four mins, gathered as the scales, times the four activation sums (`QActs16::s`)
//! in one more FMA. The AVX-512 path keeps its own kernels for Q5_0 (`q40_512`), Q4_1 and Q5_1
//! (`matvec_i16`'s, whose bits its batch kernels give).
//!
//! Results: per block the exact i32 sum times `d_w * d_x` in f32, as the scalar reference; only
//! the f32 summation order differs.

use std::arch::x86_64::*;

use super::matvec_i16::weights_i16;
use super::simd::{f16_at, hsum_i32, prefetch_distance, PREFETCH};
use crate::arch::drivers::RowDots;
use crate::arch::tags::{block_bytes, has_min, quants_offset, IQ4_NL, Q4_0, Q4_1, Q5_0, Q5_1};
use crate::quant::QActs16;
use crate::QMatrix;

/// Bytes of a Q4_0 (and IQ4_NL) block.
pub(super) const BB: usize = 18;

/// The 16-bit activations of a call in the lane order of [`q40_rows`]: per pair of blocks its
/// four registers of 16 (elements `2k`, `2k + 16`, `2k + 1`, `2k + 17` of the first block in
/// lanes `k < 8`, of the second in lanes `8 + k`) and 8 i32 corrections (-8 times the
/// activations each `madd` lane of the four sums).
pub(super) struct Q40Acts {
    pub(super) x: Vec<i16>,
    pub(super) corr: Vec<i32>,
    /// The activation scales of quads of blocks in the order `b, b + 2, b + 1, b + 3`.
    pub(super) d: Vec<f32>,
    /// The activation sums (`QActs16::s`) in the order of `d`: the factors of the mins of
    /// Q4_1 and Q5_1.
    pub(super) s: Vec<f32>,
}

impl Q40Acts {
    /// The reordered activations of `xq`'s whole quads of blocks (shuffles: a few operations per
    /// 16 activations, as the rows of a short row list would not pay for a scalar reorder).
    ///
    /// # Safety
    /// AVX2 present.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn new(xq: &QActs16) -> Self {
        let quads = xq.d.len() / 4;
        assert!(xq.qs.len() >= quads * 128);
        let mut x = vec![0i16; quads * 128];
        let mut corr = vec![0i32; quads * 16];
        // Per 128-bit lane: its 4 even elements, then its 4 odd ones.
        let eo = _mm256_setr_epi8(
            0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0, 1, 4, 5, 8, 9, 12, 13, 2, 3,
            6, 7, 10, 11, 14, 15,
        );
        // 16 elements -> their 8 even ones, then their 8 odd ones.
        let split = |p: *const i16| {
            // SAFETY: 16 i16 readable at `p` (the callers' ranges are asserted above).
            let v = unsafe { _mm256_loadu_si256(p as *const __m256i) };
            _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_shuffle_epi8(v, eo))
        };
        for p in 0..quads * 2 {
            // SAFETY: pair p < quads * 2: activations p*64..p*64 + 64 (asserted above), output
            // x[p*64..p*64 + 64] and corr[p*8..p*8 + 8] (allocated above).
            unsafe {
                let src = xq.qs.as_ptr().add(64 * p);
                // [evens | odds] of elements 0..16 and 16..32 of both blocks.
                let (l0, h0, l1, h1) = (
                    split(src),
                    split(src.add(16)),
                    split(src.add(32)),
                    split(src.add(48)),
                );
                let out = [
                    _mm256_permute2x128_si256::<0x20>(l0, l1), // elements 2k
                    _mm256_permute2x128_si256::<0x20>(h0, h1), // 2k + 16
                    _mm256_permute2x128_si256::<0x31>(l0, l1), // 2k + 1
                    _mm256_permute2x128_si256::<0x31>(h0, h1), // 2k + 17
                ];
                let dst = x.as_mut_ptr().add(64 * p);
                let ones = _mm256_set1_epi16(1);
                let mut sum = _mm256_setzero_si256();
                for (k, v) in out.into_iter().enumerate() {
                    _mm256_storeu_si256(dst.add(16 * k) as *mut __m256i, v);
                    sum = _mm256_add_epi32(sum, _mm256_madd_epi16(v, ones));
                }
                let c = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32::<3>(sum));
                _mm256_storeu_si256(corr.as_mut_ptr().add(8 * p) as *mut __m256i, c);
            }
        }
        let quad_order = |v: &[f32]| {
            v[..quads * 4]
                .chunks_exact(4)
                .flat_map(|q| [q[0], q[2], q[1], q[3]])
                .collect()
        };
        Q40Acts {
            x,
            corr,
            d: quad_order(&xq.d),
            s: quad_order(&xq.s),
        }
    }
}

/// Whether format `F` takes this module's kernels and their 512-bit batch form
/// ([`super::q40_pairs512`]): Q4_0, and IQ4_NL (the same 18-byte blocks of a scale and 32
/// nibbles, the nibbles indices into `IQ4NL_VALUES`).
pub(crate) const fn takes(f: u8) -> bool {
    matches!(f, Q4_0 | IQ4_NL)
}

/// Whether format `F` takes this module's AVX2 kernels: [`takes`]'s, Q5_0, Q4_1 and Q5_1
/// (module docs).
pub(crate) const fn takes_avx2(f: u8) -> bool {
    takes(f) || matches!(f, Q5_0 | Q4_1 | Q5_1)
}

/// Offset of the 16 nibble bytes in a block of format `F` (after the scale, the min and `qh`
/// where it has them).
const fn nibbles_offset(f: u8) -> usize {
    quants_offset(f) + if has_fifth_bits(f) { 4 } else { 0 }
}

/// Whether blocks of format `F` carry a fifth bit per element (`qh`, at [`quants_offset`]).
const fn has_fifth_bits(f: u8) -> bool {
    matches!(f, Q5_0 | Q5_1)
}

/// The 64 weights of blocks `b` and `b + 1` at `p` in the lane order of [`Q40Acts`]: four i16
/// registers. Q4_0's unsigned (0..=15: its offset is the activations' correction, [`pair_dot`]);
/// Q5_0's likewise (0..=31, with the fifth bits of [`fifth_bits`]); Q4_1's and Q5_1's unsigned
/// (their mins' term apart); IQ4_NL's the table's signed values (two `vpshufb` on the bytes' low
/// and high nibbles, then each byte sign-extended into its lane).
///
/// # Safety
/// AVX2 present; `F` one of [`takes_avx2`]; two blocks readable at `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn pair_weights<const F: u8>(p: *const u8) -> [__m256i; 4] {
    let (bb, qoff) = (block_bytes(F), nibbles_offset(F));
    // SAFETY: the 16 nibble bytes of both blocks (`qoff..qoff + 16`), per contract.
    let v = unsafe {
        _mm256_loadu2_m128i(
            p.add(bb + qoff) as *const __m128i,
            p.add(qoff) as *const __m128i,
        )
    };
    if F == IQ4_NL {
        // SAFETY: the table holds 16 bytes.
        let kv = unsafe {
            _mm256_broadcastsi128_si256(_mm_loadu_si128(
                tensor_types::IQ4NL_VALUES.as_ptr() as *const __m128i
            ))
        };
        let m = _mm256_set1_epi8(0x0F);
        // Byte 2k of a lane's pair: element 2k's value (low nibbles) or 2k + 16's (high);
        // byte 2k + 1: element 2k + 1's or 2k + 17's.
        let lo = _mm256_shuffle_epi8(kv, _mm256_and_si256(v, m));
        let hi = _mm256_shuffle_epi8(kv, _mm256_and_si256(_mm256_srli_epi16::<4>(v), m));
        return [
            _mm256_srai_epi16::<8>(_mm256_slli_epi16::<8>(lo)),
            _mm256_srai_epi16::<8>(_mm256_slli_epi16::<8>(hi)),
            _mm256_srai_epi16::<8>(lo),
            _mm256_srai_epi16::<8>(hi),
        ];
    }
    if has_fifth_bits(F) {
        // SAFETY: the `qh` bytes of both blocks, per contract.
        let (h, h16) = unsafe { fifth_bits(p.add(quants_offset(F)), p.add(bb + quants_offset(F))) };
        // Bytes of the low nibbles (elements 2k, 2k + 1 of a lane k) and of the high ones (2k + 16,
        // 2k + 17), each with its fifth bit, then split into the lanes' low and high bytes.
        let m = _mm256_set1_epi8(0x0F);
        let lo = _mm256_or_si256(_mm256_and_si256(v, m), h);
        let hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(v), m), h16);
        let low = _mm256_set1_epi16(0xFF);
        return [
            _mm256_and_si256(lo, low),
            _mm256_and_si256(hi, low),
            _mm256_srli_epi16::<8>(lo),
            _mm256_srli_epi16::<8>(hi),
        ];
    }
    let m = _mm256_set1_epi16(0x0F);
    [
        _mm256_and_si256(v, m),
        _mm256_and_si256(_mm256_srli_epi16::<4>(v), m),
        _mm256_and_si256(_mm256_srli_epi16::<8>(v), m),
        _mm256_srli_epi16::<12>(v),
    ]
}

/// The fifth bits (16 or 0 in each byte) of the Q5_0/Q5_1 blocks whose `qh` is at `p0` (bytes
/// 0..16) and `p1` (16..32) in the byte order of the blocks' nibble bytes: byte `j` of a half holds
/// bit `j` of `qh` (element `j`, the low nibble of nibble byte `j`) in the first vector, bit
/// `16 + j` (the high nibble's element) in the second. llama.cpp's `bytes_from_bits_32`: each `qh`
/// byte spread over 8 bytes, `or` with all bits but the byte's own, `cmpeq` with all ones.
///
/// # Safety
/// AVX2 present; the 4 `qh` bytes at `p0` and at `p1` readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn fifth_bits(p0: *const u8, p1: *const u8) -> (__m256i, __m256i) {
    // SAFETY: per contract.
    let (h0, h1) = unsafe {
        (
            std::ptr::read_unaligned(p0 as *const i32),
            std::ptr::read_unaligned(p1 as *const i32),
        )
    };
    let qh = _mm256_set_m128i(_mm_set1_epi32(h1), _mm_set1_epi32(h0));
    let others = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe);
    let bits = |spread: __m256i| {
        let set = _mm256_cmpeq_epi8(
            _mm256_or_si256(_mm256_shuffle_epi8(qh, spread), others),
            _mm256_set1_epi8(-1),
        );
        _mm256_and_si256(set, _mm256_set1_epi8(16))
    };
    let (b0, b1, b2, b3) = (
        0,
        0x0101_0101_0101_0101,
        0x0202_0202_0202_0202,
        0x0303_0303_0303_0303,
    );
    (
        bits(_mm256_set_epi64x(b1, b0, b1, b0)),
        bits(_mm256_set_epi64x(b3, b2, b3, b2)),
    )
}

/// The exact i32 sums of the 64 products of [`pair_weights`] `q` of format `F` (blocks `b` in
/// lanes 0..4, `b + 1` in lanes 4..8) with the reordered activations at `x` (their correction at
/// `c`, added for Q4_0 and twice for Q5_0, whose weights are unsigned).
///
/// # Safety
/// AVX2 present; 64 i16 readable at `x`, 8 i32 at `c`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn pair_dot<const F: u8>(
    q: &[__m256i; 4],
    x: *const i16,
    c: *const i32,
) -> __m256i {
    // SAFETY: 128 bytes at x and 32 at c, per contract.
    unsafe {
        let xv = |k: usize| _mm256_loadu_si256(x.add(16 * k) as *const __m256i);
        // |q_w| <= 127, |q_x| <= 32767: a lane sums 8 products, below 2^26 (and the correction,
        // 8 * 8 * 32767, twice for Q5_0).
        let s01 = _mm256_add_epi32(
            _mm256_madd_epi16(q[0], xv(0)),
            _mm256_madd_epi16(q[1], xv(1)),
        );
        let s23 = _mm256_add_epi32(
            _mm256_madd_epi16(q[2], xv(2)),
            _mm256_madd_epi16(q[3], xv(3)),
        );
        let s = _mm256_add_epi32(s01, s23);
        match F {
            Q4_0 => _mm256_add_epi32(s, _mm256_loadu_si256(c as *const __m256i)),
            Q5_0 => {
                let c = _mm256_loadu_si256(c as *const __m256i);
                _mm256_add_epi32(s, _mm256_add_epi32(c, c))
            }
            _ => s,
        }
    }
}

/// The exact sums of the four blocks of a quad `[b0, b2, b1, b3]` from [`pair_dot`]'s
/// `p01 = [b0 x4 | b1 x4]` and `p23 = [b2 x4 | b3 x4]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn quad_sums(p01: __m256i, p23: __m256i) -> __m128i {
    // [b0 0+2, b2 0+2, b0 1+3, b2 1+3 | the same of b1, b3]
    let s = _mm256_add_epi32(
        _mm256_unpacklo_epi32(p01, p23),
        _mm256_unpackhi_epi32(p01, p23),
    );
    // [b0, b2, _, _ | b1, b3, _, _] -> [b0, b2, b1, b3].
    let s = _mm256_add_epi32(s, _mm256_srli_si256::<8>(s));
    _mm256_castsi256_si128(_mm256_permute4x64_epi64::<0b1000>(s))
}

/// The sum of the four lanes of `v`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn hsum4(v: __m128) -> f32 {
    let s = _mm_add_ps(v, _mm_movehl_ps(v, v));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps::<1>(s, s)))
}

/// The four f16 scales of the quad of format `F` at `p` in the order `b, b + 2, b + 1, b + 3`, as
/// f32.
///
/// # Safety
/// F16C present; four blocks readable at `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn scales<const F: u8>(p: *const u8) -> __m128 {
    let bb = block_bytes(F);
    // SAFETY: the first two bytes of each of the four blocks, in bounds per contract.
    let h = |k: usize| u64::from(unsafe { std::ptr::read_unaligned(p.add(k * bb) as *const u16) });
    let bits = h(0) | h(2) << 16 | h(1) << 32 | h(3) << 48;
    _mm_cvtph_ps(_mm_cvtsi64_si128(bits as i64))
}

/// Dot of `R` rows of format `F` ([`takes_avx2`]) over the whole quads of `a` (module docs); the
/// caller adds the rest.
///
/// # Safety
/// AVX2/FMA/F16C present.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q40_rows<const F: u8, const R: usize>(rows: [&[u8]; R], a: &Q40Acts) -> [f32; R] {
    let (quads, bb) = (a.d.len() / 4, block_bytes(F));
    assert!(
        takes_avx2(F)
            && rows.iter().all(|r| r.len() >= quads * 4 * bb)
            && a.x.len() >= quads * 128
            && a.corr.len() >= quads * 16
            && a.s.len() >= quads * 4
    );
    let mut acc = [_mm_setzero_ps(); R];
    let dist = prefetch_distance::<R>();
    for q in 0..quads {
        // SAFETY: q < quads: blocks 4q..4q + 4 of every row, activations q*128..q*128 + 128,
        // corrections q*16..q*16 + 16 and scales q*4..q*4 + 4 are in bounds (asserted above).
        unsafe {
            let x = a.x.as_ptr().add(128 * q);
            let c = a.corr.as_ptr().add(16 * q);
            let dx = _mm_loadu_ps(a.d.as_ptr().add(4 * q));
            for i in 0..R {
                let p = rows[i].as_ptr().add(4 * bb * q);
                // Prefetch hints (never fault; wrapping_add keeps them UB-free): a quad is 72
                // bytes (Q5_0's 88), two lines at most.
                let ahead = p.wrapping_add(dist);
                _mm_prefetch::<_MM_HINT_T1>(ahead as *const i8);
                _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(64) as *const i8);
                let p01 = pair_dot::<F>(&pair_weights::<F>(p), x, c);
                let p23 = pair_dot::<F>(&pair_weights::<F>(p.add(2 * bb)), x.add(64), c.add(8));
                let isum = quad_sums(p01, p23);
                let f = _mm_mul_ps(scales::<F>(p), dx);
                acc[i] = _mm_fmadd_ps(_mm_cvtepi32_ps(isum), f, acc[i]);
                if has_min(F) {
                    // The mins (the f16s after the scales) times the activation sums.
                    let s = _mm_loadu_ps(a.s.as_ptr().add(4 * q));
                    acc[i] = _mm_fmadd_ps(scales::<F>(p.add(2)), s, acc[i]);
                }
            }
        }
    }
    std::array::from_fn(|i| hsum4(acc[i]))
}

/// Dot of `R` rows of format `F` ([`takes_avx2`]) over blocks `from..` of `xq`, one block at a
/// time (the blocks after the last whole quad), with the mins' term of Q4_1 and Q5_1.
///
/// # Safety
/// AVX2/FMA/F16C present.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q40_tail<const F: u8, const R: usize>(
    rows: [&[u8]; R],
    xq: &QActs16,
    from: usize,
) -> [f32; R] {
    let (nb, bb) = (xq.d.len(), block_bytes(F));
    assert!(rows.iter().all(|r| r.len() >= nb * bb) && xq.qs.len() >= nb * 32 && xq.s.len() >= nb);
    let mut y = [0f32; R];
    for b in from..nb {
        // SAFETY: b < nb: block b of every row and activations b*32..b*32 + 32 in bounds.
        unsafe {
            let xp = xq.qs.as_ptr().add(32 * b);
            let x0 = _mm256_loadu_si256(xp as *const __m256i);
            let x1 = _mm256_loadu_si256(xp.add(16) as *const __m256i);
            for (yi, row) in y.iter_mut().zip(rows) {
                let p = row.as_ptr().add(b * bb);
                let (w0, w1) = weights_i16::<F>(p);
                let v = _mm256_add_epi32(_mm256_madd_epi16(w0, x0), _mm256_madd_epi16(w1, x1));
                *yi += f16_at(p) * xq.d[b] * hsum_i32(v) as f32;
                if has_min(F) {
                    *yi += f16_at(p.add(2)) * xq.s[b];
                }
            }
        }
    }
    y
}

/// [`q40_rows`] over the whole quads, [`q40_tail`] over the last `nb % 4` blocks, as the kernel
/// of the shared row drivers.
struct Q40Dots<'a, const F: u8> {
    acts: &'a Q40Acts,
    xq: &'a QActs16,
}

impl<const F: u8> RowDots for Q40Dots<'_, F> {
    #[inline(always)]
    unsafe fn dots<const N: usize>(&self, rows: [&[u8]; N]) -> [f32; N] {
        let done = self.acts.d.len();
        // SAFETY: AVX2/FMA/F16C present per this method's contract; the kernels assert the
        // lengths they rely on.
        unsafe {
            let mut y = q40_rows::<F, N>(rows, self.acts);
            if done < self.xq.d.len() {
                let t = q40_tail::<F, N>(rows, self.xq, done);
                for (v, t) in y.iter_mut().zip(t) {
                    *v += t;
                }
            }
            y
        }
    }
}

/// `y[i] = dot(W[sel.get(i)], x)` for a matrix of format `F` ([`takes`]) on this module's kernel
/// ([`Q40Dots`]): dense rows one a step (they stream), listed rows four a step (more in flight
/// hide their scattered reads).
///
/// # Safety
/// AVX2/FMA/F16C present.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn matvec<const F: u8>(
    w: &QMatrix<'_>,
    sel: crate::arch::Rows<'_>,
    xq: &QActs16,
    y: &mut [f32],
) {
    use crate::arch::drivers::rows_blocked;
    // SAFETY: AVX2 present per contract.
    let acts = unsafe { Q40Acts::new(xq) };
    let k = Q40Dots::<F> { acts: &acts, xq };
    // SAFETY: AVX2/FMA/F16C present per contract, all the kernel needs.
    unsafe {
        if matches!(sel, crate::arch::Rows::From(_)) {
            rows_blocked::<1, _>(&k, w, sel, y)
        } else {
            rows_blocked::<4, _>(&k, w, sel, y)
        }
    }
}

/// One row's dots with `T` tokens' activations: per quad the weights unpacked once, then per
/// token the operations of [`q40_rows`] in its order (so each token's result is bit-identical to
/// its own `matvec`).
///
/// # Safety
/// AVX2/FMA/F16C present.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q40_tokens<const F: u8, const T: usize>(row: &[u8], acts: [&Q40Acts; T]) -> [f32; T] {
    let (quads, bb) = (acts[0].d.len() / 4, block_bytes(F));
    assert!(
        takes_avx2(F)
            && row.len() >= quads * 4 * bb
            && acts.iter().all(|a| {
                a.d.len() == quads * 4
                    && a.s.len() == quads * 4
                    && a.x.len() >= quads * 128
                    && a.corr.len() >= quads * 16
            })
    );
    let mut acc = [_mm_setzero_ps(); T];
    for q in 0..quads {
        // SAFETY: q < quads: blocks 4q..4q + 4 of the row and every token's activations,
        // corrections and scales of quad q are in bounds (asserted above).
        unsafe {
            let p = row.as_ptr().add(4 * bb * q);
            _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(PREFETCH) as *const i8);
            _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(PREFETCH + 64) as *const i8);
            let (w01, w23) = (pair_weights::<F>(p), pair_weights::<F>(p.add(2 * bb)));
            let sc = scales::<F>(p);
            // The mins (Q4_1, Q5_1: the f16s after the scales), read where the format has them.
            let mins = if has_min(F) {
                scales::<F>(p.add(2))
            } else {
                _mm_setzero_ps()
            };
            for (t, a) in acts.iter().enumerate() {
                let x = a.x.as_ptr().add(128 * q);
                let c = a.corr.as_ptr().add(16 * q);
                let isum = quad_sums(
                    pair_dot::<F>(&w01, x, c),
                    pair_dot::<F>(&w23, x.add(64), c.add(8)),
                );
                let f = _mm_mul_ps(sc, _mm_loadu_ps(a.d.as_ptr().add(4 * q)));
                acc[t] = _mm_fmadd_ps(_mm_cvtepi32_ps(isum), f, acc[t]);
                if has_min(F) {
                    let s = _mm_loadu_ps(a.s.as_ptr().add(4 * q));
                    acc[t] = _mm_fmadd_ps(mins, s, acc[t]);
                }
            }
        }
    }
    std::array::from_fn(|t| hsum4(acc[t]))
}

/// Rows `r0..r0 + ys[t].len()` of a matrix of format `F` ([`takes_avx2`]) for every token `t` (all
/// `ys[t]` of one length, rows in bounds): one row at a time, its tokens 4 at a time, then the 3, 2
/// or 1 left ([`q40_tokens`] over the whole quads, [`q40_tail`] per token over the rest), each
/// token's results bit-identical to its own `matvec` on this path.
///
/// # Safety
/// AVX2/FMA/F16C present.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q40_batch<const F: u8>(
    w: &QMatrix<'_>,
    r0: usize,
    xq: &[&QActs16],
    ys: &mut [&mut [f32]],
) {
    // SAFETY: AVX2 present per contract.
    let acts: Vec<Q40Acts> = xq.iter().map(|q| unsafe { Q40Acts::new(q) }).collect();
    let nb = xq.first().map_or(0, |q| q.d.len());
    for r in 0..ys.first().map_or(0, |y| y.len()) {
        let row = w.row_data(r0 + r);
        let mut t = 0;
        while t < xq.len() {
            let a = &acts[t..];
            // SAFETY: features present per contract; the kernels assert the lengths.
            let (n, d) = unsafe {
                match a.len() {
                    4.. => (4, q40_tokens::<F, 4>(row, [&a[0], &a[1], &a[2], &a[3]])),
                    // Three at once (a verification step of the chosen token and two drafts):
                    // else the third would unpack every quad again alone.
                    3 => {
                        let [d0, d1, d2] = q40_tokens::<F, 3>(row, [&a[0], &a[1], &a[2]]);
                        (3, [d0, d1, d2, 0.0])
                    }
                    2 => {
                        let [d0, d1] = q40_tokens::<F, 2>(row, [&a[0], &a[1]]);
                        (2, [d0, d1, 0.0, 0.0])
                    }
                    _ => {
                        let [d0] = q40_tokens::<F, 1>(row, [&a[0]]);
                        (1, [d0, 0.0, 0.0, 0.0])
                    }
                }
            };
            for (k, &v) in d[..n].iter().enumerate() {
                let mut v = v;
                if a[k].d.len() < nb {
                    // SAFETY: as above.
                    v += unsafe { q40_tail::<F, 1>([row], xq[t + k], a[k].d.len()) }[0];
                }
                ys[t + k][r] = v;
            }
            t += n;
        }
    }
}
