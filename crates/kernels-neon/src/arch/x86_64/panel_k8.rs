//! A few Q4_K/Q5_K/Q6_K rows against a few tokens' super-block-scaled 8-bit activations (the
//! prompt tile of [`Precision::Int8`](crate::Precision), `tile_k8.rs`), super-block by
//! super-block: each row's super-block is unpacked and its sub-block scales broadcast once into a
//! small array, then a tight loop runs every token over them, `STEP` at a time, so the integer
//! multiply units see little besides `maddubs` and `madd`, and the tokens' 256 activations of that
//! super-block, read from L1, serve every row. Per token the f32 operations are
//! `kquant_super.rs`'s, in the same order (integer sums per super-block, one conversion and
//! multiply-add a super-block, horizontal sums at the end), so each result is bit-identical to
//! `matvec`'s for that token.

use std::arch::x86_64::*;

use super::kquant::{q45k_pair, q6k_half_u};
use super::kquant_super::{q4k_scales_int, q6k_block_scale, q6k_scales_d, sub_scale, SuperActs};
use super::simd::hsum;
use crate::WeightFormat;

/// Tokens per step of the inner loop (sharing the loads of the unpacked weights and scales);
/// [`token_sums`] names their pointers one by one. A remainder goes one token at a time.
const STEP: usize = 4;

/// Per (row, token) f32 accumulators of a panel, reused across panels.
pub(super) struct PanelScratch {
    acc: Vec<__m256>,
    mins: Vec<__m256>,
}

impl PanelScratch {
    /// Room for `n` (row, token) pairs.
    pub(super) fn new(n: usize) -> Self {
        // SAFETY: `__m256` is plain data (eight f32 lanes): all-zero bits are a valid value, and
        // making one needs no CPU feature.
        let z: __m256 = unsafe { std::mem::zeroed() };
        PanelScratch {
            acc: vec![z; n],
            mins: vec![z; n],
        }
    }
}

/// The integer sums of one super-block for `P` tokens: `Σ_k madd(maddubs(w[k], x_k), s[k])`
/// over its 8 blocks of 32 (`x` at `xp[c] + 32 k`), with `x_k` first given the signs of
/// `sign[k]` where `SIGNED` (Q6_K: `w·x` as `maddubs(|q|, sign(x, q))`).
///
/// # Safety
/// AVX2/FMA/F16C present; 256 bytes readable at each `xp[c]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block_sums<const SIGNED: bool, const P: usize>(
    w: &[__m256i; 8],
    sign: &[__m256i; 8],
    s: &[__m256i; 8],
    xp: [*const i8; P],
) -> [__m256i; P] {
    let mut sumi = [_mm256_setzero_si256(); P];
    for k in 0..8 {
        for c in 0..P {
            // SAFETY: 256 bytes readable at xp[c] per the contract.
            let mut x = unsafe { _mm256_loadu_si256(xp[c].add(32 * k) as *const __m256i) };
            if SIGNED {
                x = _mm256_sign_epi8(x, sign[k]);
            }
            let p = _mm256_madd_epi16(_mm256_maddubs_epi16(w[k], x), s[k]);
            sumi[c] = _mm256_add_epi32(sumi[c], p);
        }
    }
    sumi
}

/// [`block_sums`] of the super-block at element `o` for the tokens of `xs` from `c`: [`STEP`]
/// of them where that many remain, else one; returns the sums and how many tokens they cover.
///
/// # Safety
/// AVX2/FMA/F16C present; `c < xs.len()` and every token's activations `o .. o + 256` readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn token_sums<const SIGNED: bool>(
    w: &[__m256i; 8],
    sign: &[__m256i; 8],
    s: &[__m256i; 8],
    xs: &[SuperActs<'_>],
    c: usize,
    o: usize,
) -> ([__m256i; STEP], usize) {
    // SAFETY: per this function's contract.
    unsafe {
        if xs.len() - c >= STEP {
            let xp = [
                xs[c].x.as_ptr().add(o),
                xs[c + 1].x.as_ptr().add(o),
                xs[c + 2].x.as_ptr().add(o),
                xs[c + 3].x.as_ptr().add(o),
            ];
            (block_sums::<SIGNED, STEP>(w, sign, s, xp), STEP)
        } else {
            let [v] = block_sums::<SIGNED, 1>(w, sign, s, [xs[c].x.as_ptr().add(o)]);
            ([v; STEP], 1)
        }
    }
}

/// Rows `rows` (Q4_K if `!Q5`, else Q5_K) · every token of `xs` into `res[r * xs.len() + c]`.
///
/// # Safety
/// AVX2/FMA/F16C present.
// `k` also picks the token, not only `sums[k]`.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q45k_panel<const Q5: bool>(
    rows: &[&[u8]],
    xs: &[SuperActs<'_>],
    scratch: &mut PanelScratch,
    res: &mut [f32],
) {
    let format = if Q5 {
        WeightFormat::Q5_K
    } else {
        WeightFormat::Q4_K
    };
    let (n, m) = (xs.len(), rows.len() * xs.len());
    let nsb = xs.first().map_or(0, |a| a.d.len() / 8);
    let bb = if Q5 { 176 } else { 144 };
    assert!(rows.iter().all(|r| r.len() >= nsb * bb) && res.len() >= m);
    assert!(scratch.acc.len() >= m && scratch.mins.len() >= m);
    assert!(xs
        .iter()
        .all(|a| a.d.len() >= nsb * 8 && a.x.len() >= nsb * 256 && a.s.len() >= nsb * 8));
    let (acc, mins) = (&mut scratch.acc[..m], &mut scratch.mins[..m]);
    acc.fill(_mm256_setzero_ps());
    mins.fill(_mm256_setzero_ps());
    let mut w = [_mm256_setzero_si256(); 8];
    let mut s = [_mm256_setzero_si256(); 8];
    for sb in 0..nsb {
        let o = sb * 256;
        for (r, row) in rows.iter().enumerate() {
            let blk = &row[sb * bb..(sb + 1) * bb];
            let (acc, mins) = (&mut acc[r * n..(r + 1) * n], &mut mins[r * n..(r + 1) * n]);
            // SAFETY: `blk` is a whole super-block (sliced above; `q45k_pair` asserts its
            // length); every token's activations o .. o + 256 and scales and sums sb*8 .. sb*8 + 8
            // are in bounds (asserted above), and c < n.
            unsafe {
                let (sc, ml, dw) = q4k_scales_int(blk.as_ptr());
                for g in 0..4 {
                    [w[2 * g], w[2 * g + 1]] = q45k_pair(format, blk, g);
                    s[2 * g] = sub_scale(sc, 2 * g);
                    s[2 * g + 1] = sub_scale(sc, 2 * g + 1);
                }
                let mut c = 0;
                while c < n {
                    let (sums, p) = token_sums::<false>(&w, &w, &s, xs, c, o);
                    for k in 0..p {
                        let a = xs.get_unchecked(c + k);
                        let dd = dw * *a.d.get_unchecked(sb * 8);
                        let sx = _mm256_loadu_ps(a.s.as_ptr().add(sb * 8));
                        let (ac, mn) =
                            (acc.get_unchecked_mut(c + k), mins.get_unchecked_mut(c + k));
                        *ac = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[k]), _mm256_set1_ps(dd), *ac);
                        *mn = _mm256_fmadd_ps(ml, sx, *mn);
                    }
                    c += p;
                }
            }
        }
    }
    for i in 0..m {
        res[i] = hsum(acc[i]) - hsum(mins[i]);
    }
}

/// Q6_K rows `rows` · every token of `xs` into `res[r * xs.len() + c]`: the quants less their
/// offset of 32 as signed bytes, multiplied as `maddubs(|q|, sign(x, q))` (the same i16 pair sums
/// as `kquant_super`'s `maddubs(q, x) - maddubs(32, x)`, one multiply fewer).
///
/// # Safety
/// AVX2/FMA/F16C present.
// `k` also picks the token or the block, not only `sums[k]` or `q[k]`.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6k_panel(
    rows: &[&[u8]],
    xs: &[SuperActs<'_>],
    scratch: &mut PanelScratch,
    res: &mut [f32],
) {
    let (n, m) = (xs.len(), rows.len() * xs.len());
    let nsb = xs.first().map_or(0, |a| a.d.len() / 8);
    let bb = 210;
    assert!(rows.iter().all(|r| r.len() >= nsb * bb) && res.len() >= m);
    assert!(scratch.acc.len() >= m);
    assert!(xs
        .iter()
        .all(|a| a.d.len() >= nsb * 8 && a.x.len() >= nsb * 256));
    let acc = &mut scratch.acc[..m];
    acc.fill(_mm256_setzero_ps());
    let c32 = _mm256_set1_epi8(32);
    let mut wa = [_mm256_setzero_si256(); 8];
    let mut ws = [_mm256_setzero_si256(); 8];
    let mut s = [_mm256_setzero_si256(); 8];
    for sb in 0..nsb {
        let o = sb * 256;
        for (r, row) in rows.iter().enumerate() {
            let blk = &row[sb * bb..(sb + 1) * bb];
            let acc = &mut acc[r * n..(r + 1) * n];
            // SAFETY: `blk` is a whole super-block (sliced above; `q6k_half_u` asserts its
            // length); every token's activations o .. o + 256 and scale sb*8 are in bounds
            // (asserted above), and c < n.
            unsafe {
                let (sc, dw) = q6k_scales_d(blk.as_ptr());
                for half in 0..2 {
                    let q = q6k_half_u(blk, half);
                    for k in 0..4 {
                        let j = 4 * half + k;
                        let signed = _mm256_sub_epi8(q[k], c32);
                        wa[j] = _mm256_abs_epi8(signed);
                        ws[j] = signed;
                        s[j] = q6k_block_scale(sc, j);
                    }
                }
                let mut c = 0;
                while c < n {
                    let (sums, pn) = token_sums::<true>(&wa, &ws, &s, xs, c, o);
                    for k in 0..pn {
                        let dd = dw * *xs.get_unchecked(c + k).d.get_unchecked(sb * 8);
                        let ac = acc.get_unchecked_mut(c + k);
                        *ac = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[k]), _mm256_set1_ps(dd), *ac);
                    }
                    c += pn;
                }
            }
        }
    }
    for i in 0..m {
        res[i] = hsum(acc[i]);
    }
}

/// Rows `rows` of `format` (Q4_K, Q5_K or Q6_K) · every token of `xs` into
/// `res[r * xs.len() + c]`.
///
/// # Safety
/// AVX2/FMA/F16C present.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn k_super_panel(
    format: WeightFormat,
    rows: &[&[u8]],
    xs: &[SuperActs<'_>],
    scratch: &mut PanelScratch,
    res: &mut [f32],
) {
    // SAFETY: AVX2/FMA/F16C present per this function's contract; the kernels assert the
    // lengths they rely on.
    unsafe {
        match format {
            WeightFormat::Q4_K => q45k_panel::<false>(rows, xs, scratch, res),
            WeightFormat::Q5_K => q45k_panel::<true>(rows, xs, scratch, res),
            _ => q6k_panel(rows, xs, scratch, res),
        }
    }
}
