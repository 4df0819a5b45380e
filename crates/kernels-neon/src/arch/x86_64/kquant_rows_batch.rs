//! The batch form of [`super::kquant_rows`]' `Q4_K`, `Q5_K` and `Q6_K` kernels on the AVX2 path
//! (16-bit activations, several tokens: batched decode, best-of-N, verification of drafted tokens):
//! each super-block's quants unpacked and its scales decoded once per row for up to four tokens,
//! then per token the operations of the one-token kernel in its order, so each token's result is
//! bit for bit its own `matvec` on this path (the one-token kernels run one row a step over dense
//! matrices, and a row's operations do not depend on the rows beside it). Before, the AVX2 path ran
//! one `matvec` per token: every quant unpacked, and every row chunk's activations reordered, once
//! per token.

use std::arch::x86_64::*;

use super::kquant_rows::{
    acts64, prefetch_block, q4k_quants, q4k_scales8, q5k_quants, q6k_even_odd, q6k_half_dx,
    q6k_half_sums, q6k_pair_scales, sub_block_sums, sub_pair_sums, sum_pairs, sum_quads, K16Prep,
};
use super::simd::hsum;
use crate::quant::QActs16;
use crate::{QMatrix, WeightFormat};

/// One token's activations in the order of the one-token kernels: the `even_odd` quants, the
/// per-32 scales and sums, and for Q6_K the offsets of its groups (`q6k_corr`), from its
/// [`K16Prep`].
struct KActs<'a> {
    x: &'a [i16],
    d: &'a [f32],
    s: &'a [f32],
    c6: &'a [i32],
}

/// Q4_K (Q5_K where `FIVE`) dots of one row with `T` tokens: [`super::kquant_rows`]'
/// `q4k_i16_rows` of one row per token, the unpacking of the quants (and fifth bits) and the
/// decoding of the scales shared.
///
/// # Safety
/// AVX2/FMA/F16C present.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4k_tokens<const FIVE: bool, const T: usize>(row: &[u8], a: [&KActs<'_>; T]) -> [f32; T] {
    let nsb = a[0].d.len() / 8;
    let (bb, qoff) = if FIVE { (176, 48) } else { (144, 16) };
    assert!(
        row.len() >= nsb * bb
            && a.iter().all(|a| {
                a.d.len() == nsb * 8 && a.x.len() >= nsb * 256 && a.s.len() >= nsb * 8
            })
    );
    let mut acc = [_mm256_setzero_ps(); T];
    let mut mins = [_mm256_setzero_ps(); T];
    for sb in 0..nsb {
        // SAFETY: sb < nsb: super-block sb of the row (bytes sb*bb .. (sb+1)*bb), every token's
        // activations sb*256 .. sb*256 + 256 and scales sb*8 .. sb*8 + 8 (asserted above).
        unsafe {
            let blk = row.as_ptr().add(sb * bb);
            prefetch_block::<1>(blk, bb);
            let (dl, ml) = q4k_scales8(blk);
            let scale: [__m256; T] = std::array::from_fn(|t| {
                let dx = _mm256_loadu_ps(a[t].d.as_ptr().add(sb * 8));
                let sx = _mm256_loadu_ps(a[t].s.as_ptr().add(sb * 8));
                mins[t] = _mm256_fmadd_ps(ml, sx, mins[t]);
                _mm256_mul_ps(dl, dx)
            });
            let mut pairs = [[_mm256_setzero_si256(); 2]; T];
            let mut quads = [[_mm256_setzero_si256(); 2]; T];
            for g in 0..4 {
                let raw = _mm256_loadu_si256(blk.add(qoff + 32 * g) as *const __m256i);
                let q = if FIVE {
                    q5k_quants(raw, _mm256_loadu_si256(blk.add(16) as *const __m256i), g)
                } else {
                    q4k_quants(raw)
                };
                for t in 0..T {
                    let x = acts64(a[t].x.as_ptr().add(sb * 256 + 64 * g));
                    let (i0, i1) = sub_pair_sums(&q, &x);
                    pairs[t][g % 2] = sum_pairs(i0, i1);
                    if g % 2 == 1 {
                        quads[t][g / 2] = sum_quads(pairs[t][0], pairs[t][1]);
                    }
                }
            }
            for t in 0..T {
                let isum = sub_block_sums(quads[t]);
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), scale[t], acc[t]);
            }
        }
    }
    std::array::from_fn(|t| hsum(acc[t]) - hsum(mins[t]))
}

/// Q6_K dots of one row with `T` tokens: `q6k_i16_rows` of one row per token, the quants' loads
/// and unpacking and the row's scales shared.
///
/// # Safety
/// AVX2/FMA/F16C present.
// `n` also picks the half's loads and activation blocks.
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6k_tokens<const T: usize>(row: &[u8], a: [&KActs<'_>; T]) -> [f32; T] {
    let nsb = a[0].d.len() / 8;
    let bb = 210;
    assert!(
        row.len() >= nsb * bb
            && a.iter().all(|a| {
                a.d.len() == nsb * 8 && a.x.len() >= nsb * 256 && a.c6.len() >= nsb * 16
            })
    );
    let mut acc = [_mm256_setzero_ps(); T];
    for sb in 0..nsb {
        // SAFETY: sb < nsb: super-block sb of the row (210 bytes at sb*210), every token's
        // activations sb*256 .. sb*256 + 256, scales sb*8 .. sb*8 + 8 and corrections sb*16 ..
        // sb*16 + 16 (asserted above).
        unsafe {
            let blk = row.as_ptr().add(sb * bb);
            prefetch_block::<1>(blk, bb);
            let [r0, r1] = q6k_pair_scales(blk);
            let sc: [[__m256; 2]; T] = std::array::from_fn(|t| {
                let dx = q6k_half_dx(a[t].d.as_ptr().add(sb * 8));
                [_mm256_mul_ps(r0, dx[0]), _mm256_mul_ps(r1, dx[1])]
            });
            for n in 0..2 {
                let (l0, l1, h) = (
                    _mm256_loadu_si256(blk.add(64 * n) as *const __m256i),
                    _mm256_loadu_si256(blk.add(64 * n + 32) as *const __m256i),
                    _mm256_loadu_si256(blk.add(128 + 32 * n) as *const __m256i),
                );
                let mut sums = [[_mm256_setzero_si256(); 4]; T];
                macro_rules! block {
                    ($k:literal) => {{
                        let j = 4 * n + $k;
                        let (e, o) = q6k_even_odd::<$k>(l0, l1, h);
                        for t in 0..T {
                            let xp = a[t].x.as_ptr().add(sb * 256 + 32 * j);
                            let xe = _mm256_loadu_si256(xp as *const __m256i);
                            let xo = _mm256_loadu_si256(xp.add(16) as *const __m256i);
                            sums[t][$k] = _mm256_add_epi32(
                                _mm256_madd_epi16(e, xe),
                                _mm256_madd_epi16(o, xo),
                            );
                        }
                    }};
                }
                block!(0);
                block!(1);
                block!(2);
                block!(3);
                for t in 0..T {
                    let cp = a[t].c6.as_ptr().add(sb * 16 + 8 * n);
                    let corr = _mm256_loadu_si256(cp as *const __m256i);
                    let g = _mm256_cvtepi32_ps(q6k_half_sums(sums[t], corr));
                    acc[t] = _mm256_fmadd_ps(g, sc[t][n], acc[t]);
                }
            }
        }
    }
    std::array::from_fn(|t| hsum(acc[t]))
}

/// Whether [`batch`] takes matrices of `format`.
pub(super) fn takes(format: WeightFormat) -> bool {
    matches!(
        format,
        WeightFormat::Q4_K | WeightFormat::Q5_K | WeightFormat::Q6_K
    )
}

/// `ys[t][i] = dot(W[r0 + i], x_t)` for a Q4_K, Q5_K or Q6_K matrix ([`takes`]) and every token `t`
/// (all `ys[t]` of one length, rows in bounds): one row at a time, its tokens 4 at a time, then
/// the 3, 2 or 1 left, each token's results bit-identical to its own `matvec` on the AVX2 path;
/// `k16[t]` keeps token `t`'s orders.
///
/// # Safety
/// AVX2/FMA/F16C present; `k16[t]` belongs to `xq[t]`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn batch(
    w: &QMatrix<'_>,
    r0: usize,
    xq: &[&QActs16],
    k16: &[K16Prep],
    ys: &mut [&mut [f32]],
) {
    let format = w.format();
    let q6 = format == WeightFormat::Q6_K;
    assert!(takes(format) && xq.len() == ys.len() && k16.len() == xq.len());
    let acts: Vec<KActs<'_>> = xq
        .iter()
        .zip(k16)
        .map(|(q, k)| KActs {
            x: k.even_odd(q),
            d: &q.d,
            s: &q.s,
            c6: if q6 { k.q6k_corr(q) } else { &[] },
        })
        .collect();
    for r in 0..ys.first().map_or(0, |y| y.len()) {
        let row = w.row_data(r0 + r);
        let mut t = 0;
        while t < acts.len() {
            let a = &acts[t..];
            // SAFETY: features present per contract; the kernels assert the lengths.
            let n = unsafe {
                if a.len() >= 4 {
                    put(
                        ys,
                        t,
                        r,
                        tokens::<4>(format, row, [&a[0], &a[1], &a[2], &a[3]]),
                    )
                } else if a.len() == 3 {
                    put(ys, t, r, tokens::<3>(format, row, [&a[0], &a[1], &a[2]]))
                } else if a.len() == 2 {
                    put(ys, t, r, tokens::<2>(format, row, [&a[0], &a[1]]))
                } else {
                    put(ys, t, r, tokens::<1>(format, row, [&a[0]]))
                }
            };
            t += n;
        }
    }
}

/// [`q4k_tokens`] (Q4_K, Q5_K) or [`q6k_tokens`] for a matrix of `format` ([`takes`]).
///
/// # Safety
/// AVX2/FMA/F16C present.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tokens<const T: usize>(format: WeightFormat, row: &[u8], a: [&KActs<'_>; T]) -> [f32; T] {
    // SAFETY: features present per contract; the kernels assert the lengths.
    unsafe {
        match format {
            WeightFormat::Q6_K => q6k_tokens::<T>(row, a),
            WeightFormat::Q5_K => q4k_tokens::<true, T>(row, a),
            _ => q4k_tokens::<false, T>(row, a),
        }
    }
}

/// `ys[t + k][r] = d[k]`; the number of tokens done.
fn put<const T: usize>(ys: &mut [&mut [f32]], t: usize, r: usize, d: [f32; T]) -> usize {
    for (k, v) in d.into_iter().enumerate() {
        ys[t + k][r] = v;
    }
    T
}
