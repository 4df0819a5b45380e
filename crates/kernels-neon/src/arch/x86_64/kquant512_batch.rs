//! Small-batch `Q4_K`, `Q5_K` and `Q6_K` products with 16-bit activations on 512-bit registers
//! ([`crate::matvec_batch`] in [`Precision::Fast`](crate::Precision::Fast) on
//! [`KernelPath::Avx512`](crate::KernelPath::Avx512)): each super-block of a row is unpacked once
//! (its scales and its quants, [`q4k_quants16`], [`q6k_quants16`]) and dotted with up to
//! [`GROUP`] tokens, whose activations were put in the kernels' order once per batched product
//! ([`KPairs`]).
//!
//! Per token the operations are those of the one-token kernels of [`super::kquant512`] (one row at
//! a time, as dense rows run there), in the same order and through the same inner functions:
//! the same scale products, the same exact i32 sums converted and FMA'd into the same two
//! accumulators pair by pair, the same min terms and the same final reduction. Results are
//! bit-identical to one token at a time.

use std::arch::x86_64::*;

use super::kquant512::{
    acc_pair, halves, pairs512, q4k_quants16, q4k_token_scale, q4k_total, q6k_dxd, q6k_quants16,
    q6k_scale_w, q6k_total, quarters,
};
use super::kquant_rows::{prefetch_block, q4k_scales8};
use crate::quant::QActs16;
use crate::{QMatrix, WeightFormat};

/// Tokens dotted with each unpacked super-block at a time (their accumulators, scales and the
/// weights of one pair stay in the 32 vector registers).
/// (`batch_k512` matches 1, 2, 3 and `GROUP` tokens.)
const GROUP: usize = 4;

/// The 16-bit activations of a batch's tokens in [`pairs512`] order, per format family: built once
/// per batched product for the families its matrices need (empty otherwise).
#[derive(Default)]
pub(crate) struct KPairs {
    /// Per token, the `Q4_K` / `Q5_K` order.
    q45: Vec<Vec<i16>>,
    /// Per token, the `Q6_K` order.
    q6: Vec<Vec<i16>>,
}

impl KPairs {
    /// The orders of the formats in `formats` (K-quants of whole 256-element super-blocks: the
    /// tokens' length is then a multiple of 256).
    pub(crate) fn new(tokens: &[&QActs16], formats: &[WeightFormat]) -> KPairs {
        let order = |want: &[WeightFormat], f: WeightFormat| {
            if formats.iter().any(|g| want.contains(g)) {
                tokens.iter().map(|q| pairs512(&q.qs, f)).collect()
            } else {
                Vec::new()
            }
        };
        KPairs {
            q45: order(
                &[WeightFormat::Q4_K, WeightFormat::Q5_K],
                WeightFormat::Q4_K,
            ),
            q6: order(&[WeightFormat::Q6_K], WeightFormat::Q6_K),
        }
    }

    /// Each token's activations for `format`, if built.
    pub(super) fn of(&self, format: WeightFormat) -> Option<&[Vec<i16>]> {
        let x = match format {
            WeightFormat::Q4_K | WeightFormat::Q5_K => &self.q45,
            WeightFormat::Q6_K => &self.q6,
            _ => return None,
        };
        (!x.is_empty()).then_some(x.as_slice())
    }
}

/// `Q4_K` (or, with `Q5`, `Q5_K`) dots of one row with `T` tokens (`x[t]` in [`pairs512`] order,
/// `q[t]` its scales and sums): each token's result is [`super::kquant512`]'s one-row kernel's.
///
/// # Safety
/// AVX-512F/BW/VNNI and AVX2/FMA/F16C present; lengths as asserted.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn q4k_tokens<const Q5: bool, const T: usize>(
    row: &[u8],
    x: [&[i16]; T],
    q: [&QActs16; T],
) -> [f32; T] {
    let nsb = q[0].d.len() / 8;
    let bb = if Q5 { 176 } else { 144 };
    assert!(
        row.len() >= nsb * bb
            && (0..T).all(|t| {
                q[t].d.len() == nsb * 8 && q[t].s.len() >= nsb * 8 && x[t].len() >= nsb * 256
            })
    );
    // Pair p's first sums are sub-blocks 4p (lanes 0..8) and 4p + 2, its second 4p + 1 and 4p + 3.
    let idx = [halves(0, 2), halves(1, 3), halves(4, 6), halves(5, 7)];
    let mut acc = [[_mm512_setzero_ps(); 2]; T];
    let mut mins = [_mm256_setzero_ps(); T];
    for sb in 0..nsb {
        // SAFETY: sb < nsb: super-block sb of the row (bytes sb*bb .. sb*bb + bb), every token's
        // activations sb*256 .. sb*256 + 256 and scales and sums sb*8 .. sb*8 + 8 are in bounds
        // (asserted above).
        unsafe {
            let blk = row.as_ptr().add(sb * bb);
            prefetch_block::<1>(blk, bb);
            let (dl, ml) = q4k_scales8(blk);
            let mut scale = [_mm512_setzero_ps(); T];
            for t in 0..T {
                let dx = _mm256_loadu_ps(q[t].d.as_ptr().add(sb * 8));
                let sx = _mm256_loadu_ps(q[t].s.as_ptr().add(sb * 8));
                scale[t] = q4k_token_scale(dl, ml, dx, sx, &mut mins[t]);
            }
            for p in 0..2 {
                let wq = q4k_quants16::<Q5>(blk, p);
                for t in 0..T {
                    let xq = x[t].as_ptr().add(sb * 256 + 128 * p);
                    let xs = [
                        _mm512_loadu_si512(xq as *const __m512i),
                        _mm512_loadu_si512(xq.add(32) as *const __m512i),
                        _mm512_loadu_si512(xq.add(64) as *const __m512i),
                        _mm512_loadu_si512(xq.add(96) as *const __m512i),
                    ];
                    let s0 = _mm512_permutexvar_ps(idx[2 * p], scale[t]);
                    let s1 = _mm512_permutexvar_ps(idx[2 * p + 1], scale[t]);
                    acc_pair(&mut acc[t], wq, xs, [s0, s1]);
                }
            }
        }
    }
    std::array::from_fn(|t| q4k_total(acc[t], mins[t]))
}

/// `Q6_K` dots of one row with `T` tokens (`x[t]` in [`pairs512`] order, `q[t]` its scales):
/// each token's result is [`super::kquant512`]'s one-row kernel's.
///
/// # Safety
/// AVX-512F/BW/VNNI and AVX2/FMA/F16C present; lengths as asserted.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn q6k_tokens<const T: usize>(row: &[u8], x: [&[i16]; T], q: [&QActs16; T]) -> [f32; T] {
    let nsb = q[0].d.len() / 8;
    let bb = 210;
    assert!(
        row.len() >= nsb * bb && (0..T).all(|t| q[t].d.len() == nsb * 8 && x[t].len() >= nsb * 256)
    );
    // Pair q's sums are sub-blocks 4q..4q + 4.
    let idx = [quarters(0), quarters(4), quarters(8), quarters(12)];
    let mut acc = [[_mm512_setzero_ps(); 2]; T];
    for sb in 0..nsb {
        // SAFETY: sb < nsb: super-block sb of the row (210 bytes at sb*210), every token's
        // activations sb*256 .. sb*256 + 256 and scales sb*8 .. sb*8 + 8 are in bounds
        // (asserted above).
        unsafe {
            let blk = row.as_ptr().add(sb * bb);
            prefetch_block::<1>(blk, bb);
            let sw = q6k_scale_w(blk);
            let mut sc = [_mm512_setzero_ps(); T];
            for t in 0..T {
                sc[t] = _mm512_mul_ps(sw, q6k_dxd(q[t].d.as_ptr().add(sb * 8)));
            }
            for n in 0..2 {
                let wq = q6k_quants16(blk, n);
                for t in 0..T {
                    let xn = x[t].as_ptr().add(sb * 256 + 128 * n);
                    let xs = [
                        _mm512_loadu_si512(xn as *const __m512i),
                        _mm512_loadu_si512(xn.add(32) as *const __m512i),
                        _mm512_loadu_si512(xn.add(64) as *const __m512i),
                        _mm512_loadu_si512(xn.add(96) as *const __m512i),
                    ];
                    let s0 = _mm512_permutexvar_ps(idx[2 * n], sc[t]);
                    let s1 = _mm512_permutexvar_ps(idx[2 * n + 1], sc[t]);
                    acc_pair(&mut acc[t], wq, xs, [s0, s1]);
                }
            }
        }
    }
    std::array::from_fn(|t| q6k_total(acc[t]))
}

/// The dots of `row` with `T` tokens of format `F` (a K-quant tag: 4 `Q4_K`, 5 `Q5_K`, 6 `Q6_K`).
///
/// # Safety
/// AVX-512F/BW/VNNI and AVX2/FMA/F16C present.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn tokens<const F: u8, const T: usize>(
    row: &[u8],
    x: &[Vec<i16>],
    q: &[&QActs16],
) -> [f32; T] {
    let xs: [&[i16]; T] = std::array::from_fn(|t| x[t].as_slice());
    let qs: [&QActs16; T] = std::array::from_fn(|t| q[t]);
    // SAFETY: features present per contract; the kernels assert the lengths.
    unsafe {
        match F {
            6 => q6k_tokens::<T>(row, xs, qs),
            5 => q4k_tokens::<true, T>(row, xs, qs),
            _ => q4k_tokens::<false, T>(row, xs, qs),
        }
    }
}

/// Rows `r0..r0 + ys[t].len()` of `w` (format tag `F` as in [`tokens`]) for every token `t`:
/// [`GROUP`] tokens at a time (then the rest together), each group over the rows one at a time.
///
/// # Safety
/// AVX-512F/BW/VNNI and AVX2/FMA/F16C present; `x` and `xq` one entry per token of `ys`, `x`
/// in the order of `w`'s format, every `ys[t]` of one length with rows `r0..r0 + len` in `w`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn batch_k512<const F: u8>(
    w: &QMatrix<'_>,
    r0: usize,
    x: &[Vec<i16>],
    xq: &[&QActs16],
    ys: &mut [&mut [f32]],
) {
    assert!(x.len() == ys.len() && xq.len() == ys.len() && !ys.is_empty());
    let n = ys[0].len();
    assert!(ys.iter().all(|y| y.len() == n) && r0 + n <= w.rows());
    // Tokens by groups, each group over every row of the chunk: a group's activations (up to
    // 4 × 2 bytes × columns) are re-read for each row from the nearer caches, while all of a
    // batch's at once (8 tokens of Qwen's 4864-column `ffn_down`: 78 KB) measured 2x slower.
    let mut t = 0;
    while t < ys.len() {
        let (xt, qt) = (&x[t..], &xq[t..]);
        let k = (ys.len() - t).min(GROUP);
        for r in 0..n {
            let row = w.row_data(r0 + r);
            let mut d = [0f32; GROUP];
            // SAFETY: features present per contract; the kernels assert the lengths.
            unsafe {
                match k {
                    1 => d[..1].copy_from_slice(&tokens::<F, 1>(row, xt, qt)),
                    2 => d[..2].copy_from_slice(&tokens::<F, 2>(row, xt, qt)),
                    3 => d[..3].copy_from_slice(&tokens::<F, 3>(row, xt, qt)),
                    _ => d = tokens::<F, GROUP>(row, xt, qt),
                }
            }
            for (y, v) in ys[t..t + k].iter_mut().zip(d) {
                y[r] = v;
            }
        }
        t += k;
    }
}
