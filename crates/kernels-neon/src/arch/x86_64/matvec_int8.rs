//! `matvec` with 8-bit activations ([`Precision::Int8`](crate::Precision::Int8)):
//! `maddubs` integer dots of several rows at once.

use std::arch::x86_64::*;

use super::iq4xs_rows::Iq4xsDots;
use super::kquant512::{pairs512_i8, K8Dots512};
use super::kquant_low::{sums16, K23Dots};
use super::kquant_super::{K8SuperDots, SuperActs};
use super::simd::{f16_at, hsum, iq4nl_values32, nibbles32, prefetch_distance, q5_quants32};
use crate::arch::drivers::{rows_blocked, rows_dense_or_listed, RowDots};
use crate::arch::tags::{block_bytes, IQ4_NL, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};
use crate::arch::Rows;
use crate::quant::QActs;
use crate::QMatrix;
use crate::WeightFormat;

/// Signed i8 × i8 dot of 32 lanes, as 8 partial i32 sums converted to f32
/// (llama.cpp `mul_sum_i8_pairs_float`). `x` must be in -127..=127.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn mul_sum_i8(w: __m256i, x: __m256i) -> __m256 {
    let aw = _mm256_sign_epi8(w, w);
    let sx = _mm256_sign_epi8(x, w);
    let p16 = _mm256_maddubs_epi16(aw, sx);
    _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)))
}

/// Unsigned u8 (0..=31) × i8 dot of 32 lanes as 8 f32 partial sums.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn mul_sum_u8_i8(w: __m256i, x: __m256i) -> __m256 {
    let p16 = _mm256_maddubs_epi16(w, x);
    _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)))
}

/// Integer dot of block `b` of the row at `p` with the activation block at
/// `xq`: returns (d_w * d_x * isum lanes, extra scalar term).
///
/// # Safety
/// AVX2/FMA/F16C present; a full block at `p`, 32 i8 at `xq`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block_fast<const F: u8>(
    p: *const u8,
    xq: *const i8,
    dx: f32,
    sx: f32,
    acc: __m256,
    extra: &mut f32,
) -> __m256 {
    // SAFETY: caller guarantees a full block at `p` (34/18/20/22/24 bytes:
    // the loads below read at most that) and 32 readable i8 at `xq`.
    unsafe {
        let xv = _mm256_loadu_si256(xq as *const __m256i);
        let (d, prod) = match F {
            Q8_0 => (
                f16_at(p) * dx,
                mul_sum_i8(_mm256_loadu_si256(p.add(2) as *const __m256i), xv),
            ),
            Q4_0 => (
                f16_at(p) * dx,
                mul_sum_i8(
                    _mm256_sub_epi8(nibbles32(p.add(2)), _mm256_set1_epi8(8)),
                    xv,
                ),
            ),
            IQ4_NL => (f16_at(p) * dx, mul_sum_i8(iq4nl_values32(p.add(2)), xv)),
            Q5_0 => (
                f16_at(p) * dx,
                mul_sum_i8(
                    _mm256_sub_epi8(q5_quants32(p.add(2)), _mm256_set1_epi8(16)),
                    xv,
                ),
            ),
            _ => {
                // Q4_1, Q5_1: d and m are adjacent f16s, one conversion for both.
                let dm = _mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(p as *const i32)));
                *extra += _mm_cvtss_f32(_mm_movehdup_ps(dm)) * sx;
                let q = if F == Q5_1 {
                    q5_quants32(p.add(4))
                } else {
                    nibbles32(p.add(4))
                };
                (_mm_cvtss_f32(dm) * dx, mul_sum_u8_i8(q, xv))
            }
        };
        _mm256_fmadd_ps(_mm256_set1_ps(d), prod, acc)
    }
}

/// Integer dot of `R` rows (starting at row pointers `rows[i]`) with the
/// 8-bit activations, sharing each activation block's load between the
/// rows (per row the same operations in the same order as for `R == 1`,
/// so results do not depend on `R`).
///
/// # Safety
/// AVX2/FMA/F16C present.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_int8_rows<const F: u8, const R: usize>(rows: [&[u8]; R], xq: &QActs) -> [f32; R] {
    let nb = xq.d.len();
    let bb = block_bytes(F);
    assert!(rows.iter().all(|r| r.len() >= nb * bb) && xq.qs.len() >= nb * 32 && xq.s.len() >= nb);
    let mut acc = [_mm256_setzero_ps(); R];
    let mut extra = [0f32; R];
    for b in 0..nb {
        // SAFETY: b < nb: block b of every row and activation block b are in
        // bounds (asserted above).
        unsafe {
            let xp = xq.qs.as_ptr().add(b * 32);
            let (dx, sx) = (*xq.d.get_unchecked(b), *xq.s.get_unchecked(b));
            for i in 0..R {
                let p = rows[i].as_ptr().add(b * bb);
                // Prefetch ahead of each weight stream (a hint: never faults,
                // so an address past the row is harmless; wrapping_add avoids UB).
                _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(prefetch_distance::<R>()) as *const i8);
                acc[i] = block_fast::<F>(p, xp, dx, sx, acc[i], &mut extra[i]);
            }
        }
    }
    std::array::from_fn(|i| hsum(acc[i]) + extra[i])
}

/// [`dot_int8_rows`] as the kernel of the shared row drivers.
struct Int8Dots<'a, const F: u8>(&'a QActs);

impl<const F: u8> RowDots for Int8Dots<'_, F> {
    #[inline(always)]
    unsafe fn dots<const N: usize>(&self, rows: [&[u8]; N]) -> [f32; N] {
        // SAFETY: AVX2/FMA/F16C present per this method's contract; the
        // kernel asserts the lengths it relies on.
        unsafe { dot_int8_rows::<F, N>(rows, self.0) }
    }
}

/// `R` rows per iteration (sharing the activation loads), then pairs, then
/// single rows ([`rows_blocked`]).
///
/// # Safety
/// AVX2/FMA/F16C present.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn matvec_int8_q<const F: u8, const R: usize>(
    w: &QMatrix<'_>,
    sel: Rows<'_>,
    xq: &QActs,
    y: &mut [f32],
) {
    // SAFETY: features present per contract (all `dot_int8_rows` needs); it
    // asserts the lengths.
    unsafe { rows_blocked::<R, _>(&Int8Dots::<F>(xq), w, sel, y) }
}

/// `wide` takes the 512-bit kernels where they exist (`Q4_K`, `Q5_K`, `Q6_K`: [`super::kquant512`]),
/// and `q40` (the activations reordered, given for Q4_0 weights on the wide path) Q4_0's
/// ([`super::q40_512_i8`]).
///
/// # Safety
/// AVX2/FMA/F16C present, and AVX-512F/BW/VNNI too where `wide` or `q40` is given; `q40` made
/// from `xq`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn matvec_int8(
    w: &QMatrix<'_>,
    sel: Rows<'_>,
    xq: &QActs,
    y: &mut [f32],
    wide: bool,
    q40: Option<&super::Q40Bytes>,
) {
    if let (Some(x), WeightFormat::Q4_0) = (q40, w.format()) {
        // SAFETY: AVX-512F/BW/VNNI present per contract where `q40` is given.
        return unsafe { super::q40_512_i8::matvec(w, sel, x, y) };
    }
    // Rows per step (see `matvec_i16_q`): dense rows stream from memory, where fewer concurrent
    // row streams per thread measured faster end to end; listed rows are scattered, where more rows
    // in flight hide their latency. One row for dense Q4_0, Q4_1 and Q5_0, as for 16-bit
    // activations: decode (`sparrow bench -p 0 -n 64 -r 2 --int8`, 2 threads, 2026-11-25, two
    // interleaved rounds) Qwen2.5-0.5B 44.3/45.1 -> 73.8/72.6 tok/s (Q5_0), SmolLM2 195.0/196.0 ->
    // 289.0/289.9 (Q4_1) with 2 rows -> 1. Q5_1 and IQ4_NL keep 2 (unmeasured).
    let dense = matches!(sel, Rows::From(_));
    // SAFETY: features present per contract.
    unsafe {
        match w.format() {
            WeightFormat::Q8_0 if dense => matvec_int8_q::<Q8_0, 1>(w, sel, xq, y),
            WeightFormat::Q8_0 => matvec_int8_q::<Q8_0, 2>(w, sel, xq, y),
            WeightFormat::Q4_0 if dense => matvec_int8_q::<Q4_0, 1>(w, sel, xq, y),
            WeightFormat::Q4_0 => matvec_int8_q::<Q4_0, 4>(w, sel, xq, y),
            WeightFormat::Q4_1 if dense => matvec_int8_q::<Q4_1, 1>(w, sel, xq, y),
            WeightFormat::Q4_1 => matvec_int8_q::<Q4_1, 4>(w, sel, xq, y),
            WeightFormat::Q5_0 if dense => matvec_int8_q::<Q5_0, 1>(w, sel, xq, y),
            WeightFormat::Q5_0 => matvec_int8_q::<Q5_0, 4>(w, sel, xq, y),
            WeightFormat::Q5_1 if dense => matvec_int8_q::<Q5_1, 2>(w, sel, xq, y),
            WeightFormat::Q5_1 => matvec_int8_q::<Q5_1, 4>(w, sel, xq, y),
            WeightFormat::IQ4_NL if dense => matvec_int8_q::<IQ4_NL, 2>(w, sel, xq, y),
            WeightFormat::IQ4_NL => matvec_int8_q::<IQ4_NL, 4>(w, sel, xq, y),
            WeightFormat::Q4_K | WeightFormat::Q5_K | WeightFormat::Q6_K if wide => {
                let reordered;
                let x = if w.format() != WeightFormat::Q6_K {
                    reordered = pairs512_i8(&xq.qs);
                    &reordered[..]
                } else {
                    &xq.qs[..]
                };
                let k = K8Dots512 {
                    format: w.format(),
                    x,
                    d: &xq.d,
                    s: &xq.s,
                };
                rows_dense_or_listed(&k, w, sel, y)
            }
            WeightFormat::Q4_K | WeightFormat::Q5_K | WeightFormat::Q6_K if xq.per_super => {
                // Sub-blocks weighted in integers (`kquant_super`): 1 row a step for dense rows,
                // 4 (sharing the activation loads) for listed ones.
                let k = K8SuperDots {
                    format: w.format(),
                    acts: SuperActs {
                        x: &xq.qs,
                        d: &xq.d,
                        s: &xq.s,
                    },
                };
                rows_dense_or_listed(&k, w, sel, y)
            }
            WeightFormat::Q2_K | WeightFormat::Q3_K => {
                // Rows per step as for the other K-quants: 1 dense, 4 listed.
                let s16 = sums16(&xq.qs, &xq.d);
                let k = K23Dots {
                    q3: w.format() == WeightFormat::Q3_K,
                    x: &xq.qs,
                    d: &xq.d,
                    s16: &s16,
                };
                rows_dense_or_listed(&k, w, sel, y)
            }
            WeightFormat::IQ4_XS => {
                // Rows per step as for the other K-quants: 1 dense, 4 listed.
                let k = Iq4xsDots {
                    x: &xq.qs,
                    d: &xq.d,
                };
                rows_dense_or_listed(&k, w, sel, y)
            }
            // Float and hybrid formats never take the integer path: the scalar reference.
            _ => crate::scalar::matvec_int8(w, sel, xq, y),
        }
    }
}
