//! Small-batch `matvec` with 16-bit activations ([`crate::matvec_batch`] in
//! [`Precision::Fast`](crate::Precision::Fast)): each weight block is widened
//! to i16 once and `madd_epi16`-dotted with every token's activations, so
//! the unpacking (the cost of a decode step with the weights in cache) is
//! paid once per batch. Per token the operations are those of
//! [`super::matvec_i16()`], in the same order: the results are bit-identical.

use std::arch::x86_64::*;

use super::batch512::{batch_octets, TokenOctet, OCTET};
use super::kquant512_batch::{batch_k512, KPairs};
use super::kquant_rows::K16Prep;
use super::matvec_i16::{matvec_i16, weights_i16};
use super::q40_512::{self, Q40Wide};
use super::q40_pairs512::Q40Batch;
use super::simd::{f16_at, hsum, PREFETCH};
use crate::arch::tags::{block_bytes, has_min, IQ4_NL, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};
use crate::arch::Rows;
use crate::quant::QActs16;
use crate::QMatrix;
use crate::WeightFormat;

/// Dots of `R` rows with the activations of `T` tokens: per block, each row's weights are widened
/// once and each token's activations loaded once.
///
/// # Safety
/// AVX2/FMA/F16C present; lengths as asserted.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_i16_tokens<const F: u8, const R: usize, const T: usize>(
    rows: [&[u8]; R],
    xq: [&QActs16; T],
) -> [[f32; T]; R] {
    let nb = xq[0].d.len();
    let bb = block_bytes(F);
    assert!(
        rows.iter().all(|r| r.len() >= nb * bb)
            && xq
                .iter()
                .all(|q| q.d.len() == nb && q.qs.len() >= nb * 32 && q.s.len() >= nb)
    );
    let mut acc = [[_mm256_setzero_ps(); T]; R];
    let mut extra = [[0f32; T]; R];
    for b in 0..nb {
        // SAFETY: b < nb: block b of every row (bytes b*bb..(b+1)*bb) and
        // activation block b of every token (qs[b*32..b*32+32], d[b], s[b])
        // are in bounds (asserted above).
        unsafe {
            let mut w = [(_mm256_setzero_si256(), _mm256_setzero_si256()); R];
            let mut dw = [0f32; R];
            let mut mw = [0f32; R];
            for i in 0..R {
                let p = rows[i].as_ptr().add(b * bb);
                // Prefetch hint (never faults; wrapping_add keeps it UB-free).
                _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(PREFETCH) as *const i8);
                w[i] = weights_i16::<F>(p);
                if has_min(F) {
                    // d and m are adjacent f16s: one conversion for both.
                    let dm =
                        _mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(p as *const i32)));
                    dw[i] = _mm_cvtss_f32(dm);
                    mw[i] = _mm_cvtss_f32(_mm_movehdup_ps(dm));
                } else {
                    dw[i] = f16_at(p);
                }
            }
            for t in 0..T {
                let q = xq[t];
                let xp = q.qs.as_ptr().add(b * 32);
                let x0 = _mm256_loadu_si256(xp as *const __m256i);
                let x1 = _mm256_loadu_si256(xp.add(16) as *const __m256i);
                let (dx, sx) = (*q.d.get_unchecked(b), *q.s.get_unchecked(b));
                for i in 0..R {
                    let isum = _mm256_add_epi32(
                        _mm256_madd_epi16(w[i].0, x0),
                        _mm256_madd_epi16(w[i].1, x1),
                    );
                    if has_min(F) {
                        extra[i][t] += mw[i] * sx;
                    }
                    acc[i][t] = _mm256_fmadd_ps(
                        _mm256_cvtepi32_ps(isum),
                        _mm256_set1_ps(dw[i] * dx),
                        acc[i][t],
                    );
                }
            }
        }
    }
    std::array::from_fn(|i| std::array::from_fn(|t| hsum(acc[i][t]) + extra[i][t]))
}

/// Rows `r0..r0 + ys[t].len()` for every token `t`, one row at a time: its tokens 4 at a time, then
/// the 3, 2 or 1 left. (2 rows by 4 tokens measured slower: the accumulators spill.)
///
/// # Safety
/// AVX2/FMA/F16C present.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn batch_q<const F: u8>(w: &QMatrix<'_>, r0: usize, xq: &[&QActs16], ys: &mut [&mut [f32]]) {
    for r in 0..ys[0].len() {
        let row = w.row_data(r0 + r);
        let mut t = 0;
        while t < xq.len() {
            let left = xq.len() - t;
            let done = if left >= 4 {
                // SAFETY: features present per contract; the kernel asserts the lengths.
                let [d] = unsafe {
                    dot_i16_tokens::<F, 1, 4>([row], [xq[t], xq[t + 1], xq[t + 2], xq[t + 3]])
                };
                ys[t..t + 4].iter_mut().zip(d).for_each(|(y, v)| y[r] = v);
                4
            } else if left == 3 {
                // SAFETY: as above.
                let [d] =
                    unsafe { dot_i16_tokens::<F, 1, 3>([row], [xq[t], xq[t + 1], xq[t + 2]]) };
                ys[t..t + 3].iter_mut().zip(d).for_each(|(y, v)| y[r] = v);
                3
            } else if left >= 2 {
                // SAFETY: as above.
                let [d] = unsafe { dot_i16_tokens::<F, 1, 2>([row], [xq[t], xq[t + 1]]) };
                ys[t..t + 2].iter_mut().zip(d).for_each(|(y, v)| y[r] = v);
                2
            } else {
                // SAFETY: as above.
                let [[v]] = unsafe { dot_i16_tokens::<F, 1, 1>([row], [xq[t]]) };
                ys[t][r] = v;
                1
            };
            t += done;
        }
    }
}

/// A batch's tokens in the orders of the 512-bit batch kernels, each made only where a format of
/// the product takes it: interleaved in groups of up to eight ([`TokenOctet`]; an odd last token
/// stays alone) for `Q4_1`, `Q5_1` and `Q8_0`; each token in the order of `q40_512`
/// ([`Q40Wide`]: `Q5_0`) or of `q40_pairs` paired ([`Q40Batch`]: `Q4_0`, `IQ4_NL`); the
/// K-quants' ([`KPairs`]) unless [`crate::set_batch_kquants`] turned them off.
#[derive(Default)]
pub(crate) struct Interleaved {
    octets: Vec<TokenOctet>,
    kpairs: KPairs,
    q40: Vec<Q40Wide>,
    /// The order of Q4_0's and IQ4_NL's batch kernel ([`super::q40_pairs512`]).
    q40p: Option<Q40Batch>,
}

impl Interleaved {
    /// `tokens` in the orders the formats in `formats` take.
    ///
    /// # Safety
    /// AVX2/FMA/F16C present.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn new(tokens: &[&QActs16], formats: &[WeightFormat]) -> Interleaved {
        let any = |f: fn(WeightFormat) -> bool| formats.iter().any(|&w| f(w));
        let octets = if any(|f| {
            matches!(
                f,
                WeightFormat::Q4_1 | WeightFormat::Q5_1 | WeightFormat::Q8_0
            )
        }) {
            tokens[..tokens.len() / 2 * 2]
                .chunks(OCTET)
                .map(TokenOctet::new)
                .collect()
        } else {
            Vec::new()
        };
        let q40 = if any(|f| f == WeightFormat::Q5_0) {
            tokens.iter().map(|q| Q40Wide::new(q)).collect()
        } else {
            Vec::new()
        };
        let q40p = (any(|f| f == WeightFormat::IQ4_NL) || any(|f| f == WeightFormat::Q4_0))
            // SAFETY: AVX2 present per contract.
            .then(|| unsafe { Q40Batch::new(tokens) });
        let kpairs = if crate::batch::batch_kquants() {
            KPairs::new(tokens, formats)
        } else {
            KPairs::default()
        };
        Interleaved {
            octets,
            kpairs,
            q40,
            q40p,
        }
    }
}

/// `ys[t][i] = dot(W[r0 + i], x_t)` for every token `t` (all `ys[t]` of one length): the
/// 32-element block formats share each block's unpacking across 4 (or 2) tokens at a time, or,
/// where `wide` and `octets` holds the tokens eight by eight ([`TokenOctet`]), across up to 8
/// tokens on 512-bit registers ([`super::batch512`]); `Q4_K`, `Q5_K` and `Q6_K` share each
/// super-block's unpacking across 4 tokens at a time where `wide` and `kpairs` holds the tokens in
/// their order ([`super::kquant512_batch`]), and up to 4 where not `wide`
/// ([`super::kquant_rows_batch`]); `Q5_0` shares each pair of
/// blocks' unpacking across up to 8 tokens where `wide` ([`super::q40_512::batch`]); the others
/// run [`matvec_i16`] once per token (`wide` as there). `k16[t]` keeps token `t`'s K-quant orders
/// (made on first use, shared by the product's work items; new ones here where `k16` is not one
/// per token).
///
/// # Safety
/// AVX2/FMA/F16C present, and AVX-512F/BW/VNNI too where `wide`; `il` built from `xq`
/// ([`Interleaved::new`]) or empty; `k16[t]` belongs to `xq[t]`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn matvec_i16_batch(
    w: &QMatrix<'_>,
    r0: usize,
    xq: &[&QActs16],
    il: &Interleaved,
    k16: &[K16Prep],
    ys: &mut [&mut [f32]],
    wide: bool,
) {
    assert_eq!(xq.len(), ys.len());
    let own: Vec<K16Prep>;
    let k16 = if k16.len() == xq.len() {
        k16
    } else {
        own = xq.iter().map(|_| K16Prep::default()).collect();
        &own
    };
    if ys.is_empty() || ys.iter().any(|y| y.len() != ys[0].len()) || r0 + ys[0].len() > w.rows() {
        for (t, (q, y)) in xq.iter().zip(ys.iter_mut()).enumerate() {
            // SAFETY: features present per contract; `k16[t]` belongs to `q`.
            unsafe { matvec_i16(w, Rows::From(r0), q, y, wide, None, &k16[t]) }
        }
        return;
    }
    if wide && q40_512::takes_matrix(w.format()) {
        let own: Vec<Q40Wide>;
        let q40 = if il.q40.len() == xq.len() {
            &il.q40
        } else {
            own = xq.iter().map(|q| Q40Wide::new(q)).collect();
            &own
        };
        // SAFETY: AVX-512F/BW/VNNI present where `wide` (contract); `q40` holds `xq`'s tokens
        // (contract, or made here); rows r0..r0+nr exist (checked above).
        unsafe { q40_512::batch::<Q5_0>(w, r0, q40, ys) }
        return;
    }
    let octets = &il.octets;
    if wide && !octets.is_empty() {
        let single = (xq.len() % 2 == 1).then(|| xq[xq.len() - 1]);
        // SAFETY: AVX-512F/BW/VNNI present where `wide` (contract); `octets` hold `xq`'s tokens
        // but an odd last one; rows r0..r0+nr exist (checked above).
        unsafe {
            match w.format() {
                WeightFormat::Q8_0 => return batch_octets::<Q8_0>(w, r0, octets, single, ys),
                WeightFormat::Q4_1 => return batch_octets::<Q4_1>(w, r0, octets, single, ys),
                WeightFormat::Q5_1 => return batch_octets::<Q5_1>(w, r0, octets, single, ys),
                _ => {}
            }
        }
    }
    if let Some(x) = il.kpairs.of(w.format()).filter(|_| wide) {
        // SAFETY: AVX-512F/BW/VNNI present where `wide` (contract); `x` holds the tokens of `xq`
        // in `w`'s format's order (`KPairs::of`); rows r0..r0+nr exist (checked above).
        unsafe {
            match w.format() {
                WeightFormat::Q6_K => batch_k512::<6>(w, r0, x, xq, ys),
                WeightFormat::Q5_K => batch_k512::<5>(w, r0, x, xq, ys),
                _ => batch_k512::<4>(w, r0, x, xq, ys),
            }
        }
        return;
    }
    // SAFETY: features present per contract; rows r0..r0+nr exist (checked above).
    unsafe {
        match w.format() {
            WeightFormat::Q8_0 => batch_q::<Q8_0>(w, r0, xq, ys),
            // `q40_pairs`, the Q4_0 `matvec` kernel of both paths, takes its own activation order:
            // its batch forms.
            WeightFormat::Q4_0 | WeightFormat::IQ4_NL if wide => {
                let own;
                let b = match &il.q40p {
                    Some(b) if b.len() == xq.len() => b,
                    _ => {
                        own = Q40Batch::new(xq);
                        &own
                    }
                };
                if w.format() == WeightFormat::Q4_0 {
                    super::q40_pairs512::q40_batch512::<Q4_0>(w, r0, b, xq, ys)
                } else {
                    super::q40_pairs512::q40_batch512::<IQ4_NL>(w, r0, b, xq, ys)
                }
            }
            WeightFormat::Q4_0 => super::q40_pairs::q40_batch::<Q4_0>(w, r0, xq, ys),
            WeightFormat::IQ4_NL => super::q40_pairs::q40_batch::<IQ4_NL>(w, r0, xq, ys),
            // Q5_0 takes `q40_pairs` on the AVX2 path and where the AVX-512 one has no kernel of
            // its own (`q40_512::takes_matrix`), Q4_1 and Q5_1 on the AVX2 path, as `matvec_i16`.
            WeightFormat::Q5_0 => super::q40_pairs::q40_batch::<Q5_0>(w, r0, xq, ys),
            WeightFormat::Q4_1 if !wide => super::q40_pairs::q40_batch::<Q4_1>(w, r0, xq, ys),
            WeightFormat::Q5_1 if !wide => super::q40_pairs::q40_batch::<Q5_1>(w, r0, xq, ys),
            WeightFormat::Q4_1 => batch_q::<Q4_1>(w, r0, xq, ys),
            WeightFormat::Q5_1 => batch_q::<Q5_1>(w, r0, xq, ys),
            // Q4_K, Q5_K and Q6_K on the AVX2 path (the AVX-512 path's one-token kernels are
            // `kquant512`'s, whose batch form is above).
            f if !wide && super::kquant_rows_batch::takes(f) => {
                super::kquant_rows_batch::batch(w, r0, xq, k16, ys)
            }
            _ => {
                for (t, (q, y)) in xq.iter().zip(ys.iter_mut()).enumerate() {
                    matvec_i16(w, Rows::From(r0), q, y, wide, None, &k16[t])
                }
            }
        }
    }
}
