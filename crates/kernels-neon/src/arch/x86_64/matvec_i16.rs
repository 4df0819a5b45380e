//! `matvec` with 16-bit activations ([`Precision::Fast`](crate::Precision::Fast)):
//! `madd_epi16` integer dots of several rows at once.

use std::arch::x86_64::*;

use super::iq4xs_rows::Iq4xsDots;
use super::kquant512::{pairs512, K16Dots512};
use super::kquant_low::K23Dots;
use super::kquant_rows::{K16Dots, K16Prep};
use super::q40_512::Q40Wide;
use super::q40_pairs;
use super::simd::{f16_at, hsum, iq4nl_values32, prefetch_distance, q5_quants32};
use crate::arch::drivers::{rows_blocked, rows_dense_or_listed, RowDots};
use crate::arch::tags::{
    block_bytes, has_min, quants_offset, IQ4_NL, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
};
use crate::arch::Rows;
use crate::quant::QActs16;
use crate::QMatrix;
use crate::WeightFormat;

/// The 32 weights of the quantized block at `p` as two i16x16 vectors
/// (elements 0..16 and 16..32; Q4_0 already offset by -8, Q5_0 by -16).
///
/// # Safety
/// AVX2 present; a full block of `block_bytes(F)` bytes readable at `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn weights_i16<const F: u8>(p: *const u8) -> (__m256i, __m256i) {
    // SAFETY: caller guarantees a full block at `p`; the loads read bytes
    // 2..34 (Q8_0), 2..18 (Q4_0), 4..20 (Q4_1), 2..22 (Q5_0) or 4..24
    // (Q5_1) or 2..18 (IQ4_NL), all inside it.
    unsafe {
        match F {
            Q5_0 | Q5_1 | IQ4_NL => {
                let mut q = if F == IQ4_NL {
                    iq4nl_values32(p.add(2))
                } else {
                    q5_quants32(p.add(quants_offset(F)))
                };
                if F == Q5_0 {
                    q = _mm256_sub_epi8(q, _mm256_set1_epi8(16));
                }
                (
                    _mm256_cvtepi8_epi16(_mm256_castsi256_si128(q)),
                    _mm256_cvtepi8_epi16(_mm256_extracti128_si256::<1>(q)),
                )
            }
            Q8_0 => (
                _mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(2) as *const __m128i)),
                _mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(18) as *const __m128i)),
            ),
            _ => {
                let qoff = if F == Q4_0 { 2 } else { 4 };
                let raw = _mm_loadu_si128(p.add(qoff) as *const __m128i);
                let m = _mm_set1_epi8(0x0F);
                let lo = _mm256_cvtepu8_epi16(_mm_and_si128(raw, m));
                let hi = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(raw), m));
                if F == Q4_0 {
                    let eight = _mm256_set1_epi16(8);
                    (_mm256_sub_epi16(lo, eight), _mm256_sub_epi16(hi, eight))
                } else {
                    (lo, hi)
                }
            }
        }
    }
}

/// Integer dot of `R` rows (starting at row pointers `rows[i]`) with the
/// 16-bit activations: per block, weights widened to i16, `madd_epi16`
/// with the i16 quants into i32 lanes, one `cvtepi32_ps` and one FMA with
/// `d_w * d_x`. Overflow: |q_x| <= 32767, |q_w| <= 128, so a `madd` pair is
/// below 2^23 and the 8-lane sum of a block below 2^26.
///
/// # Safety
/// AVX2/FMA/F16C present; every `rows[i]` has at least `xq.d.len()`
/// blocks of `block_bytes(F)` bytes; `xq` is consistent (`qs.len() ==
/// 32 * d.len()`, `s.len() == d.len()`), as asserted.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_i16_rows<const F: u8, const R: usize>(rows: [&[u8]; R], xq: &QActs16) -> [f32; R] {
    let nb = xq.d.len();
    let bb = block_bytes(F);
    assert!(rows.iter().all(|r| r.len() >= nb * bb) && xq.qs.len() >= nb * 32 && xq.s.len() >= nb);
    let mut acc = [_mm256_setzero_ps(); R];
    let mut extra = [0f32; R];
    let ahead = if F == Q8_0 && R == 1 {
        Q80_AHEAD
    } else {
        prefetch_distance::<R>()
    };
    for b in 0..nb {
        // SAFETY: b < nb: block b of every row (bytes b*bb..(b+1)*bb) and
        // activation block b (qs[b*32..b*32+32], d[b], s[b]) are in bounds
        // (asserted above).
        unsafe {
            let xp = xq.qs.as_ptr().add(b * 32);
            let x0 = _mm256_loadu_si256(xp as *const __m256i);
            let x1 = _mm256_loadu_si256(xp.add(16) as *const __m256i);
            let (dx, sx) = (*xq.d.get_unchecked(b), *xq.s.get_unchecked(b));
            for i in 0..R {
                let p = rows[i].as_ptr().add(b * bb);
                // Prefetch hint (never faults; wrapping_add keeps it UB-free).
                _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(ahead) as *const i8);
                let (w0, w1) = weights_i16::<F>(p);
                let isum = _mm256_add_epi32(_mm256_madd_epi16(w0, x0), _mm256_madd_epi16(w1, x1));
                let dw = if has_min(F) {
                    // d and m are adjacent f16s: one conversion for both.
                    let dm =
                        _mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(p as *const i32)));
                    extra[i] += _mm_cvtss_f32(_mm_movehdup_ps(dm)) * sx;
                    _mm_cvtss_f32(dm)
                } else {
                    f16_at(p)
                };
                acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(dw * dx), acc[i]);
            }
        }
    }
    std::array::from_fn(|i| hsum(acc[i]) + extra[i])
}

/// How far ahead the one-row Q8_0 kernel prefetches, bytes (other kernels: `prefetch_distance`'s
/// 4096). Measured 2026-12-06 on the SYNTHETIC 16-layer d 1024 Q8_0 file on the Intel Xeon VM
/// (`sparrow bench -p 0 -n 32 -r 2`, the builds alternating): two threads 64.9-66.4 -> 73.6-75.4
/// tok/s with AVX2 forced and 64.7-65.5 -> 72.6-76.4 on the AVX-512 path; one thread unchanged
/// (36.8-40.9 against 38.1-38.4). A first probe with every one-row kernel's distance at 1024, 2048,
/// 4096, 8192, 16384, 32768 and 65536 bytes put 16384 first for Q8_0; for all of them together it
/// measured mixed (Q6_K and BF16 lost 2-4% with two threads), so the distance is Q8_0's alone.
const Q80_AHEAD: usize = 16384;

/// [`dot_i16_rows`] as the kernel of the shared row drivers.
struct I16Dots<'a, const F: u8>(&'a QActs16);

impl<const F: u8> RowDots for I16Dots<'_, F> {
    #[inline(always)]
    unsafe fn dots<const N: usize>(&self, rows: [&[u8]; N]) -> [f32; N] {
        // SAFETY: AVX2/FMA/F16C present per this method's contract; the
        // kernel asserts the lengths it relies on.
        unsafe { dot_i16_rows::<F, N>(rows, self.0) }
    }
}

/// `R` rows per iteration (sharing the activation loads), then pairs, then
/// single rows ([`rows_blocked`]).
/// Measured (AVX2, 2026-11-23): with the matrix in cache, 4 rows is best
/// for the 4-bit formats and 2 for Q8_0 (1 thread, criterion); streaming
/// SmolLM2's 92 MiB per token from DRAM on 2 threads (`sparrow bench`,
/// interleaved with llama-bench), 2 rows for the 4-bit formats and 1 for
/// Q8_0 decode about 9% faster than 4 and 2. The callers use the latter
/// for dense matrices and the former for row lists.
///
/// # Safety
/// AVX2/FMA/F16C present.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn matvec_i16_q<const F: u8, const R: usize>(
    w: &QMatrix<'_>,
    sel: Rows<'_>,
    xq: &QActs16,
    y: &mut [f32],
) {
    // SAFETY: features present per contract (all `dot_i16_rows` needs); it
    // asserts the lengths.
    unsafe { rows_blocked::<R, _>(&I16Dots::<F>(xq), w, sel, y) }
}

/// Quantized weights × 16-bit activations ([`Precision::Fast`](crate::Precision::Fast)); `wide`
/// takes the 512-bit kernels where they exist (`Q4_K`, `Q5_K`, `Q6_K`: [`super::kquant512`];
/// `Q5_0`: [`super::q40_512`], on `q40` if given, else on `xq` reordered
/// here); the AVX2 K-quant kernels take `xq` in the orders `k16` keeps (made there on first use).
///
/// # Safety
/// AVX2/FMA/F16C present, and AVX-512F/BW/VNNI too where `wide`; `k16` belongs to `xq` (made for
/// it, or new).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn matvec_i16(
    w: &QMatrix<'_>,
    sel: Rows<'_>,
    xq: &QActs16,
    y: &mut [f32],
    wide: bool,
    q40: Option<&Q40Wide>,
    k16: &K16Prep,
) {
    // Rows per step (see `matvec_i16_q`): dense rows stream from memory, where fewer concurrent
    // row streams per thread measured faster end to end; listed rows are scattered, where more rows
    // in flight hide their latency. One row for Q4_0, Q4_1 and Q5_0 (2026-11-25, quiet machine, 2
    // threads): `sparrow calibrate`'s 48 MiB matrices 12.5/13.2 -> 25.9/25.5 GB/s (Q4_0), 19.0/17.5
    // -> 29.2/30.6 (Q4_1), 13.2/12.7 -> 26.0/25.6 (Q5_0) with 2 rows -> 1, two runs each; decode
    // (`sparrow bench -p 0`, three interleaved rounds) Qwen2.5-0.5B 50.0/50.7/49.2 -> 70.6/67.8/69.4
    // tok/s (Q5_0 alone; 4 rows: 38.9/38.1/36.8), SmolLM2 191.0/196.0/194.9 -> 227.8/243.1/243.5
    // (Q4_1). Q5_1 and IQ4_NL too (2026-11-26, `sparrow calibrate --formats iq4_nl,q5_1`, two
    // interleaved runs, 2 threads): IQ4_NL 13.9/14.1 -> 27.3/27.9 GB/s, Q5_1 20.3/20.6 -> 26.0/26.2.
    let dense = matches!(sel, Rows::From(_));
    // SAFETY: features present per contract.
    unsafe {
        match w.format() {
            WeightFormat::Q8_0 if dense => matvec_i16_q::<Q8_0, 1>(w, sel, xq, y),
            WeightFormat::Q8_0 => matvec_i16_q::<Q8_0, 2>(w, sel, xq, y),
            // The AVX-512 path's own Q5_0 kernel (`q40_512`, two blocks a register; its batch form
            // gives the same bits), on activations reordered once per token where the caller kept
            // them (`q40`).
            WeightFormat::Q5_0 if wide && super::q40_512::takes_matrix(w.format()) => {
                let own;
                let x = match q40 {
                    Some(x) => x,
                    None => {
                        own = Q40Wide::new(xq);
                        &own
                    }
                };
                super::q40_512::matvec::<Q5_0>(w, sel, x, y)
            }
            // Q4_0's kernel on both paths (`q40_pairs`, whose bits the repacked `Q40x8` copies
            // give); IQ4_NL on the same kernel (its blocks are Q4_0's
            // with a table for the nibbles).
            WeightFormat::Q4_0 => q40_pairs::matvec::<Q4_0>(w, sel, xq, y),
            WeightFormat::IQ4_NL => q40_pairs::matvec::<IQ4_NL>(w, sel, xq, y),
            // Q5_0 on Q4_0's kernel too, each register's fifth bits or'ed in; Q4_1 and Q5_1 with
            // their mins' term beside, on the AVX2 path (the AVX-512 path's batch kernels of these
            // two, `batch512`, give the bits of `matvec_i16_q`).
            WeightFormat::Q5_0 => q40_pairs::matvec::<Q5_0>(w, sel, xq, y),
            WeightFormat::Q4_1 if !wide => q40_pairs::matvec::<Q4_1>(w, sel, xq, y),
            WeightFormat::Q5_1 if !wide => q40_pairs::matvec::<Q5_1>(w, sel, xq, y),
            WeightFormat::Q4_1 if dense => matvec_i16_q::<Q4_1, 1>(w, sel, xq, y),
            WeightFormat::Q4_1 => matvec_i16_q::<Q4_1, 4>(w, sel, xq, y),
            WeightFormat::Q5_1 if dense => matvec_i16_q::<Q5_1, 1>(w, sel, xq, y),
            WeightFormat::Q5_1 => matvec_i16_q::<Q5_1, 4>(w, sel, xq, y),
            WeightFormat::Q4_K | WeightFormat::Q5_K | WeightFormat::Q6_K if wide => {
                let x = pairs512(&xq.qs, w.format());
                let k = K16Dots512 {
                    format: w.format(),
                    x: &x,
                    d: &xq.d,
                    s: &xq.s,
                };
                rows_dense_or_listed(&k, w, sel, y)
            }
            WeightFormat::Q4_K | WeightFormat::Q5_K | WeightFormat::Q6_K => {
                // Activations reordered once per call (see `kquant_rows`).
                // Rows per step: 1 for dense rows, 4 (sharing the activation
                // loads) for listed ones. Measured streaming qwen2.5-coder-0.5b
                // (2 threads, `sparrow bench`, 2026-11-25, shared 2-core machine):
                // dense decode 26.9 / 25.9 tok/s with 1 row, 22.9 / 22.1 with 2,
                // 24.2 / 20.2 with 4 (two interleaved rounds).
                let x = k16.even_odd(xq);
                let c6 = if w.format() == WeightFormat::Q6_K {
                    k16.q6k_corr(xq)
                } else {
                    &[]
                };
                let k = K16Dots {
                    format: w.format(),
                    x,
                    d: &xq.d,
                    s: &xq.s,
                    c6,
                };
                rows_dense_or_listed(&k, w, sel, y)
            }
            WeightFormat::Q2_K | WeightFormat::Q3_K => {
                // Rows per step as for the other K-quants: 1 dense, 4 listed.
                let k = K23Dots {
                    q3: w.format() == WeightFormat::Q3_K,
                    x: k16.even_odd(xq),
                    d: &xq.d,
                    s16: k16.sums16(xq),
                };
                rows_dense_or_listed(&k, w, sel, y)
            }
            WeightFormat::IQ4_XS => {
                // Rows per step as for the other K-quants: 1 dense, 4 listed.
                let k = Iq4xsDots {
                    x: k16.even_odd(xq),
                    d: &xq.d,
                };
                rows_dense_or_listed(&k, w, sel, y)
            }
            // Float and hybrid formats never take the integer path: the scalar reference.
            _ => crate::scalar::matvec_i16(w, sel, xq, y),
        }
    }
}
