//! The batch form of [`super::q40_pairs`] (Q4_0's one-token kernel with 16-bit activations on the
//! AVX2 and AVX-512 paths: `q40_512::takes_matrix` takes only Q5_0) on 512-bit
//! registers: two tokens a register. A quad's weights are unpacked once as `q40_pairs` unpacks them
//! and broadcast to both halves; the two tokens' reordered activations ([`Q40Acts`]) are
//! interleaved sixteen by sixteen ([`Q40Two`]), so one `vpdpwssd` chain gives both tokens' exact
//! lane sums, one reduction both tokens' four block sums, and one 256-bit conversion, multiply and
//! FMA both tokens' lanes. Per token each lane's f32 operations are those of the one-token kernel
//! in its order (the same exact i32 sums, the same `d_w * d_x` products, the same FMA chain and
//! horizontal sum), so each token's result is its own `matvec`'s bit for bit. An odd last token
//! takes the one-token kernel's 256-bit operations on the lower halves of the unpacked weights.

use std::arch::x86_64::*;

use super::q40_512::dpwssd;
use super::q40_pairs::{hsum4, pair_dot, pair_weights, q40_tail, quad_sums, scales, Q40Acts, BB};
use super::simd::PREFETCH;
use crate::arch::tags::Q4_0;
use crate::quant::QActs16;
use crate::QMatrix;

/// Token pairs per row step: up to eight tokens share a quad's unpacking.
const PAIRS: usize = 4;

/// Two tokens' [`Q40Acts`] interleaved: per 16 activations the first token's, then the second's
/// (one 512-bit register); per 8 corrections the same; per quad the first's four scales, then the
/// second's.
struct Q40Two {
    x: Vec<i16>,
    corr: Vec<i32>,
    d: Vec<f32>,
}

impl Q40Two {
    fn new(a: &Q40Acts, b: &Q40Acts) -> Q40Two {
        let quads = a.d.len() / 4;
        assert!(b.d.len() == a.d.len());
        fn weave<T: Copy>(u: &[T], v: &[T], n: usize) -> Vec<T> {
            let mut out = Vec::with_capacity(2 * u.len());
            for (p, q) in u.chunks_exact(n).zip(v.chunks_exact(n)) {
                out.extend_from_slice(p);
                out.extend_from_slice(q);
            }
            out
        }
        Q40Two {
            x: weave(&a.x[..quads * 128], &b.x[..quads * 128], 16),
            corr: weave(&a.corr[..quads * 16], &b.corr[..quads * 16], 8),
            d: weave(&a.d, &b.d, 4),
        }
    }

    fn quads(&self) -> usize {
        self.d.len() / 8
    }
}

/// [`pair_dot`] of two tokens at once: `q` the pair's four weight registers broadcast to both
/// halves, `x` and `c` the pair's interleaved activations and corrections; lanes 0..8 the first
/// token's sums, 8..16 the second's (exact integers, so any order of the adds gives them).
///
/// # Safety
/// AVX-512F/BW/VNNI present; 128 i16 readable at `x`, 16 i32 at `c`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
unsafe fn pair_dot2<const F: u8>(q: &[__m512i; 4], x: *const i16, c: *const i32) -> __m512i {
    // SAFETY: 256 bytes at x and 64 at c, per contract.
    unsafe {
        let xv = |k: usize| _mm512_loadu_si512(x.add(32 * k) as *const _);
        // Q4_0's correction (its weights are unsigned); IQ4_NL's are signed.
        let s = if F == Q4_0 {
            _mm512_loadu_si512(c as *const _)
        } else {
            _mm512_setzero_si512()
        };
        dpwssd(
            dpwssd(dpwssd(dpwssd(s, q[0], xv(0)), q[1], xv(1)), q[2], xv(2)),
            q[3],
            xv(3),
        )
    }
}

/// [`quad_sums`] of two tokens at once: the first token's four block sums in lanes 0..4, the
/// second's in 4..8.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw")]
fn quad_sums2(p01: __m512i, p23: __m512i) -> __m256i {
    // Per 128-bit lane, as `quad_sums`: [b0 0+2, b2 0+2, b0 1+3, b2 1+3] (lanes 0 and 2), the
    // same of b1, b3 (lanes 1 and 3).
    let s = _mm512_add_epi32(
        _mm512_unpacklo_epi32(p01, p23),
        _mm512_unpackhi_epi32(p01, p23),
    );
    let s = _mm512_add_epi32(s, _mm512_bsrli_epi128::<8>(s));
    // Qwords 0 and 2 (the first token's [b0, b2], [b1, b3]), 4 and 6 (the second's).
    let idx = _mm512_setr_epi64(0, 2, 4, 6, 0, 0, 0, 0);
    _mm512_castsi512_si256(_mm512_permutexvar_epi64(idx, s))
}

/// One row's dots over the whole quads with the `P` token pairs of `two`, and with `lone` where
/// `S`: element `[j][k]` token `k` of pair `j`, then the lone token's.
///
/// # Safety
/// AVX2/FMA/F16C and AVX-512F/BW/VNNI present; lengths as asserted.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
unsafe fn row_pairs<const F: u8, const P: usize, const S: bool>(
    row: &[u8],
    two: &[Q40Two],
    lone: Option<&Q40Acts>,
) -> ([[f32; 2]; P], f32) {
    let quads = match (two.first(), lone) {
        (Some(t), _) => t.quads(),
        (None, Some(a)) => a.d.len() / 4,
        (None, None) => 0,
    };
    assert!(
        super::q40_pairs::takes(F)
            && two.len() == P
            && row.len() >= quads * 4 * BB
            && two.iter().all(|t| t.quads() == quads
                && t.x.len() >= quads * 256
                && t.corr.len() >= quads * 32)
            && (!S
                || lone.is_some_and(|a| a.d.len() == quads * 4
                    && a.x.len() >= quads * 128
                    && a.corr.len() >= quads * 16))
    );
    let mut acc = [_mm256_setzero_ps(); P];
    let mut one = _mm_setzero_ps();
    for q in 0..quads {
        // SAFETY: q < quads: blocks 4q..4q + 4 of the row, each pair's activations
        // 256q..256q + 256, corrections 32q..32q + 32 and scales 8q..8q + 8, and the lone token's
        // (as `q40_tokens`'s) are in bounds (asserted above).
        unsafe {
            let p = row.as_ptr().add(4 * BB * q);
            // Prefetch hints (never fault; wrapping_add keeps them UB-free).
            _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(PREFETCH) as *const i8);
            _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(PREFETCH + 64) as *const i8);
            let (w01, w23) = (pair_weights::<F>(p), pair_weights::<F>(p.add(2 * BB)));
            let sc = scales::<F>(p);
            if P > 0 {
                let (v01, v23) = (
                    w01.map(|v| _mm512_broadcast_i64x4(v)),
                    w23.map(|v| _mm512_broadcast_i64x4(v)),
                );
                let sc2 = _mm256_set_m128(sc, sc);
                for j in 0..P {
                    let t = &two[j];
                    let x = t.x.as_ptr().add(256 * q);
                    let c = t.corr.as_ptr().add(32 * q);
                    let isum = quad_sums2(
                        pair_dot2::<F>(&v01, x, c),
                        pair_dot2::<F>(&v23, x.add(128), c.add(16)),
                    );
                    let f = _mm256_mul_ps(sc2, _mm256_loadu_ps(t.d.as_ptr().add(8 * q)));
                    acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), f, acc[j]);
                }
            }
            if let Some(a) = lone.filter(|_| S) {
                // `q40_tokens`'s body for one token.
                let x = a.x.as_ptr().add(128 * q);
                let c = a.corr.as_ptr().add(16 * q);
                let isum = quad_sums(
                    pair_dot::<F>(&w01, x, c),
                    pair_dot::<F>(&w23, x.add(64), c.add(8)),
                );
                let f = _mm_mul_ps(sc, _mm_loadu_ps(a.d.as_ptr().add(4 * q)));
                one = _mm_fmadd_ps(_mm_cvtepi32_ps(isum), f, one);
            }
        }
    }
    let out = std::array::from_fn(|j| {
        let (lo, hi) = (
            _mm256_castps256_ps128(acc[j]),
            _mm256_extractf128_ps::<1>(acc[j]),
        );
        [hsum4(lo), hsum4(hi)]
    });
    (out, if S { hsum4(one) } else { 0.0 })
}

/// A batch's tokens as [`q40_batch512`] takes them, made once per batched product: each token's
/// [`Q40Acts`], and the pairs of them interleaved ([`Q40Two`]).
pub(crate) struct Q40Batch {
    acts: Vec<Q40Acts>,
    twos: Vec<Q40Two>,
}

impl Q40Batch {
    /// `xq` reordered and paired.
    ///
    /// # Safety
    /// AVX2 present.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn new(xq: &[&QActs16]) -> Q40Batch {
        // SAFETY: AVX2 present per contract.
        let acts: Vec<Q40Acts> = xq.iter().map(|q| unsafe { Q40Acts::new(q) }).collect();
        let twos = acts
            .chunks_exact(2)
            .map(|c| Q40Two::new(&c[0], &c[1]))
            .collect();
        Q40Batch { acts, twos }
    }

    /// Tokens.
    pub(crate) fn len(&self) -> usize {
        self.acts.len()
    }
}

/// Q4_0 rows `r0..r0 + ys[t].len()` for every token `t` of `xq` (all `ys[t]` of one length), on
/// `b` made from `xq`: one row at a time, its tokens in pairs, up to [`PAIRS`] pairs a step
/// ([`row_pairs`]), an odd last token with the last step, then each token's last `nb % 4` blocks
/// as its `matvec` adds them ([`q40_tail`]): each token's results bit-identical to its own
/// `matvec` on `q40_pairs`.
///
/// # Safety
/// AVX2/FMA/F16C and AVX-512F/BW/VNNI present; `b` made from `xq`; rows `r0..r0 + ys[0].len()` in
/// `w`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn q40_batch512<const F: u8>(
    w: &QMatrix<'_>,
    r0: usize,
    b: &Q40Batch,
    xq: &[&QActs16],
    ys: &mut [&mut [f32]],
) {
    assert!(xq.len() == ys.len() && b.len() == xq.len() && !ys.is_empty());
    let n = ys[0].len();
    assert!(ys.iter().all(|y| y.len() == n) && r0 + n <= w.rows());
    let (acts, twos) = (&b.acts, &b.twos);
    let lone = (acts.len() % 2 == 1).then(|| &acts[acts.len() - 1]);
    let nb = xq[0].d.len();
    let steps = twos.len().div_ceil(PAIRS).max(1);
    // `r` indexes every token's output, not only `ys[0]`.
    #[allow(clippy::needless_range_loop)]
    for r in 0..n {
        let row = w.row_data(r0 + r);
        for s in 0..steps {
            let group = &twos[(s * PAIRS).min(twos.len())..((s + 1) * PAIRS).min(twos.len())];
            let with = lone.filter(|_| s + 1 == steps);
            macro_rules! step {
                ($p:literal, $s:literal) => {{
                    // SAFETY: features present per contract; `row_pairs` asserts the lengths.
                    let (d, v) = unsafe { row_pairs::<F, $p, $s>(row, group, with) };
                    for (j, pair) in d.iter().enumerate() {
                        ys[2 * (s * PAIRS + j)][r] = pair[0];
                        ys[2 * (s * PAIRS + j) + 1][r] = pair[1];
                    }
                    if $s {
                        ys[xq.len() - 1][r] = v;
                    }
                }};
            }
            match (group.len(), with.is_some()) {
                (0, _) => step!(0, true),
                (1, false) => step!(1, false),
                (2, false) => step!(2, false),
                (3, false) => step!(3, false),
                (_, false) => step!(4, false),
                (1, true) => step!(1, true),
                (2, true) => step!(2, true),
                (3, true) => step!(3, true),
                (_, true) => step!(4, true),
            }
        }
        for (t, a) in acts.iter().enumerate() {
            if a.d.len() < nb {
                // SAFETY: AVX2/FMA/F16C present per contract; `q40_tail` asserts the lengths.
                ys[t][r] += unsafe { q40_tail::<F, 1>([row], xq[t], a.d.len()) }[0];
            }
        }
    }
}
