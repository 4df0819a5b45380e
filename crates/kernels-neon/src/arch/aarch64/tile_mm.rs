//! The driver shared by the prompt tiles with `i8mm` ([`KernelPath::NeonI8mm`](crate::KernelPath)):
//! the 8-bit one (`tile_i8mm.rs`) and the 16-bit one (`tile_i16mm.rs`). One `smmla` (or `usmmla`)
//! multiplies a 2×8 block of two tokens by an 8×2 block of two weight rows into four i32 sums, so
//! two rows by two tokens take four matrix multiplies per 32-element block (and per byte of the
//! activations) where `sdot` takes eight.
//!
//! A work item's rows are unpacked two at a time ([`unpack_pair`]: the quants as i8, interleaved
//! as the multiplies read them, with the rows' scales and mins), every token
//! pair's activations once
//! per work item ([`token_pairs`]: each tile's own split, [`TokenQuants`]), and every token pair passes over a row
//! pair, two token pairs at a time so that each weight load feeds four tokens. Each block's four
//! exact integer sums get one convert and one FMA with the four `d_w * d_x`, and for Q4_1/Q5_1 one
//! more FMA with `m_w * s_x` (`s` = `d * sum(q)`; Q4_K/Q5_K, whose sub-blocks of 32 are the
//! blocks, subtract theirs: `m_w` is `-dmin * m`). Q6_K's blocks multiply each half's sums by its
//! integer scale in i32 first. Lanes: `[t0 · r0, t0 · r1, t1 · r0, t1 · r1]`, the tokens being the
//! multiplies' first operand.

use std::arch::aarch64::*;

use super::dequant::weights_i8;
use super::row_blocks::{row_blocks, takes_min, Blk};
use super::simd::f16_lanes;
use crate::arch::tags::{block_bytes, has_min, IQ4_NL, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};
use crate::quant::QBlocks;
use crate::{QMatrix, WeightFormat};

super::simd::acc_insn!(
    /// `acc += a · bᵀ` for `a`, `b` two 2×8 i8 matrices (row-major in the 16 lanes): lanes
    /// `[a0·b0, a0·b1, a1·b0, a1·b1]`.
    pub(super) smmla, "smmla", int8x16_t, int8x16_t, "neon,i8mm"
);

/// Two 32-element blocks (`p` and `q`, each as two halves of 16) as the multiplies' operands: for
/// each 8 elements `8c..8c + 8`, `p`'s then `q`'s.
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn interleave(p: (int8x16_t, int8x16_t), q: (int8x16_t, int8x16_t)) -> [int8x16_t; 4] {
    let z = |a: int8x16_t, b: int8x16_t| {
        let (a, b) = (vreinterpretq_s64_s8(a), vreinterpretq_s64_s8(b));
        (
            vreinterpretq_s8_s64(vzip1q_s64(a, b)),
            vreinterpretq_s8_s64(vzip2q_s64(a, b)),
        )
    };
    let (c0, c1) = z(p.0, q.0);
    let (c2, c3) = z(p.1, q.1);
    [c0, c1, c2, c3]
}

/// A token pair's quants of one block in a tile's own form (for each 8 elements `8c..8c + 8`, the
/// first token's then the second's), as the multiplies read them.
pub(super) trait TokenQuants: Copy {
    /// The block's exact integer dots with the interleaved quants `w` of a row pair, lanes as the
    /// module docs say.
    ///
    /// # Safety
    /// The CPU must support the `i8mm` extension.
    unsafe fn dots(&self, w: &[int8x16_t; 4]) -> int32x4_t;
    /// [`TokenQuants::dots`] of the block's two halves apart (elements 0..16, 16..32).
    ///
    /// # Safety
    /// The CPU must support the `i8mm` extension.
    unsafe fn dots_halves(&self, w: &[int8x16_t; 4]) -> (int32x4_t, int32x4_t);
}

/// One block of a token pair: its quants `q`, the scales `[d0, d0, d1, d1]` and `[s0, s0, s1,
/// s1]` (`s = d * sum(q)`, the min term's); with activations of a scale per 16
/// (`QActs::quantize_halves`), `d` the first half's and `d2` the second's (else `d2` is `d`).
#[derive(Clone, Copy)]
pub(super) struct TokenBlock<Q> {
    q: Q,
    d: float32x4_t,
    d2: float32x4_t,
    s: float32x4_t,
}

/// A prompt's tokens as an `i8mm` tile reads them, built once per product ([`token_pairs`]):
/// pair `p` (tokens `2p` and `2p + 1`, the last token alone repeated when their count is odd),
/// per block its quants in the tile's form and its factors.
pub(crate) struct TokenPairs<Q> {
    pairs: Vec<Vec<TokenBlock<Q>>>,
    n: usize,
    /// Whether the activations take a scale per 16 (`QBlocks::d16`).
    halves: bool,
}

/// The token pairs of `acts` (whole blocks of 32), each pair's quants of a block by `quants` of
/// the two tokens' 32 quants.
#[target_feature(enable = "neon")]
pub(super) fn token_pairs<E, Q: TokenQuants>(
    acts: &[QBlocks<E>],
    quants: impl Fn(&[E], &[E]) -> Q,
) -> TokenPairs<Q> {
    let n = acts.len();
    let nb = acts.first().map_or(0, |a| a.qs.len() / 32);
    let halves = acts.first().is_some_and(|a| !a.d16.is_empty());
    assert!(acts.iter().all(|a| a.d16.is_empty() != halves));
    let lanes = |u: f32, v: f32| vcombine_f32(vdup_n_f32(u), vdup_n_f32(v));
    let pair = |a: &QBlocks<E>, b: &QBlocks<E>| {
        (0..nb)
            .map(|blk| {
                let e = 32 * blk..32 * blk + 32;
                let (d, d2) = match halves {
                    true => (
                        lanes(a.d16[2 * blk], b.d16[2 * blk]),
                        lanes(a.d16[2 * blk + 1], b.d16[2 * blk + 1]),
                    ),
                    false => (lanes(a.d[blk], b.d[blk]), lanes(a.d[blk], b.d[blk])),
                };
                TokenBlock {
                    q: quants(&a.qs[e.clone()], &b.qs[e]),
                    d,
                    d2,
                    s: lanes(a.s[blk], b.s[blk]),
                }
            })
            .collect()
    };
    let pairs = (0..n.div_ceil(2))
        .map(|p| pair(&acts[2 * p], &acts[(2 * p + 1).min(n - 1)]))
        .collect();
    TokenPairs { pairs, n, halves }
}

/// One block of rows `i` and `j` (`j` may equal `i`) unpacked: the quants interleaved, the scales
/// `[d_i, d_j, d_i, d_j]` and, for Q4_1/Q5_1, the mins likewise (Q4_K/Q5_K: `-dmin * m`, the
/// min term being subtracted there; else zero); Q6_K: the integer scales of the block's halves
/// (`sa`, `sb`, lanes as `d`'s; else zero).
#[derive(Clone, Copy)]
pub(super) struct RowBlock {
    q: [int8x16_t; 4],
    d: float32x4_t,
    m: float32x4_t,
    sa: int32x4_t,
    sb: int32x4_t,
}

/// `[u, v, u, v]`: a row pair's per-block factors in the lanes' order.
#[inline]
#[target_feature(enable = "neon")]
fn row_lanes(u: f32, v: f32) -> float32x4_t {
    let uv = vset_lane_f32::<1>(v, vdup_n_f32(u));
    vcombine_f32(uv, uv)
}

/// Rows `a` and `b` of a 32-element block format (tag `F`) as [`row_pair`] makes them from their
/// [`row_blocks`], in one pass with no [`Blk`] between (the unpacking of two rows took about one
/// instruction a weight that way, paid once per product: at 8 tokens a fifth of a Q8_0 prompt's).
#[target_feature(enable = "neon")]
fn row_pair_blocks<const F: u8>(a: &[u8], b: &[u8], out: &mut Vec<RowBlock>) {
    let bb = block_bytes(F);
    out.clear();
    out.extend(
        a.chunks_exact(bb)
            .zip(b.chunks_exact(bb))
            .map(|(x, y)| RowBlock {
                q: interleave(weights_i8::<F>(x), weights_i8::<F>(y)),
                d: f16_lanes([x, y], 0),
                m: if has_min(F) {
                    f16_lanes([x, y], 2)
                } else {
                    vdupq_n_f32(0.0)
                },
                sa: vdupq_n_s32(0),
                sb: vdupq_n_s32(0),
            }),
    );
}

/// Rows `a` and `b` of `format` (`b` `None`: `a` again, a tail's odd row) unpacked as the
/// multiplies read them, into `rp`: the 32-element block formats in one pass
/// ([`row_pair_blocks`]), the others through [`row_blocks`] (into `ba` and `bb`, `a`'s blocks
/// once where `b` is `None`) and [`row_pair`] (`MIN`, `HALVES`: whether the tile reads the min
/// factors and the halves' integer scales).
#[target_feature(enable = "neon")]
fn unpack_pair<const MIN: bool, const HALVES: bool>(
    format: WeightFormat,
    (a, b): (&[u8], Option<&[u8]>),
    (ba, bb): (&mut Vec<Blk>, &mut Vec<Blk>),
    rp: &mut Vec<RowBlock>,
) {
    let b2 = b.unwrap_or(a);
    match format {
        WeightFormat::Q8_0 => row_pair_blocks::<Q8_0>(a, b2, rp),
        WeightFormat::Q4_0 => row_pair_blocks::<Q4_0>(a, b2, rp),
        WeightFormat::Q4_1 => row_pair_blocks::<Q4_1>(a, b2, rp),
        WeightFormat::Q5_0 => row_pair_blocks::<Q5_0>(a, b2, rp),
        WeightFormat::Q5_1 => row_pair_blocks::<Q5_1>(a, b2, rp),
        WeightFormat::IQ4_NL => row_pair_blocks::<IQ4_NL>(a, b2, rp),
        _ => {
            ba.clear();
            row_blocks(format, a, ba);
            match b {
                Some(b) => {
                    bb.clear();
                    row_blocks(format, b, bb);
                    row_pair::<MIN, HALVES>(ba, bb, rp);
                }
                None => row_pair::<MIN, HALVES>(ba, ba, rp),
            }
        }
    }
}

/// Two rows' blocks `a` and `b` (`row_blocks`) as the multiplies read them, into `out`: the min
/// factors only where `MIN`, the halves' integer scales only where `HALVES`, else zero.
#[target_feature(enable = "neon")]
fn row_pair<const MIN: bool, const HALVES: bool>(a: &[Blk], b: &[Blk], out: &mut Vec<RowBlock>) {
    out.clear();
    let pair = |u: i32, v: i32| {
        let uv = vset_lane_s32::<1>(v, vdup_n_s32(u));
        vcombine_s32(uv, uv)
    };
    out.extend(a.iter().zip(b).map(|(a, b)| RowBlock {
        q: interleave(a.q, b.q),
        d: row_lanes(a.d, b.d),
        m: if MIN {
            row_lanes(a.m, b.m)
        } else {
            vdupq_n_f32(0.0)
        },
        sa: if HALVES {
            pair(a.sa, b.sa)
        } else {
            vdupq_n_s32(0)
        },
        sb: if HALVES {
            pair(a.sb, b.sb)
        } else {
            vdupq_n_s32(0)
        },
    }));
}

/// The sums of a row pair's blocks `rp` with `T` token pairs' (`toks`), lanes as the module docs
/// say; the min term where `MIN`; each half of a block weighted by its integer scale where
/// `HALVES` (Q6_K), by the tokens' scale of that half where `XH` (activations of a scale per 16).
///
/// # Safety
/// The CPU must support the `i8mm` extension; every token pair has as many blocks as `rp`.
#[inline]
#[target_feature(enable = "neon,i8mm")]
unsafe fn sums<
    Q: TokenQuants,
    const T: usize,
    const MIN: bool,
    const HALVES: bool,
    const XH: bool,
>(
    rp: &[RowBlock],
    toks: [&[TokenBlock<Q>]; T],
) -> [float32x4_t; T] {
    let mut acc = [vdupq_n_f32(0.0); T];
    for (b, w) in rp.iter().enumerate() {
        for t in 0..T {
            // SAFETY: `b < rp.len()`, which every token pair's length equals (the contract).
            let x = unsafe { toks[t].get_unchecked(b) };
            if XH {
                // Activations of a scale per 16: each half's dots weighted by its own.
                // SAFETY: i8mm present per this function's contract.
                let (ha, hb) = unsafe { x.q.dots_halves(&w.q) };
                let v = vmulq_f32(vcvtq_f32_s32(ha), x.d);
                let v = vfmaq_f32(v, vcvtq_f32_s32(hb), x.d2);
                acc[t] = vfmaq_f32(acc[t], v, w.d);
            } else {
                // SAFETY: i8mm present per this function's contract.
                let s = unsafe {
                    if HALVES {
                        // Each half's sum times its integer scale: |sum| < 16 * 32 * 128, |sc|
                        // <= 128.
                        let (ha, hb) = x.q.dots_halves(&w.q);
                        vmlaq_s32(vmulq_s32(ha, w.sa), hb, w.sb)
                    } else {
                        x.q.dots(&w.q)
                    }
                };
                acc[t] = vfmaq_f32(acc[t], vcvtq_f32_s32(s), vmulq_f32(w.d, x.d));
            }
            if MIN {
                acc[t] = vfmaq_f32(acc[t], w.m, x.s);
            }
        }
    }
    acc
}

/// Row pair `(i, j)`'s sums with token pairs `p0 .. p0 + T` of `pairs`, written to `out`.
///
/// # Safety
/// The CPU must support the `i8mm` extension; the row pair and every token pair have the same
/// number of blocks.
#[inline]
#[target_feature(enable = "neon,i8mm")]
unsafe fn step<
    Q: TokenQuants,
    const T: usize,
    const MIN: bool,
    const HALVES: bool,
    const XH: bool,
>(
    rp: &[RowBlock],
    pairs: &[Vec<TokenBlock<Q>>],
    p0: usize,
    (i, j, nr, n): (usize, usize, usize, usize),
    out: &mut [f32],
) {
    let toks: [&[TokenBlock<Q>]; T] = std::array::from_fn(|t| pairs[p0 + t].as_slice());
    // SAFETY: per this function's contract.
    let acc = unsafe { sums::<Q, T, MIN, HALVES, XH>(rp, toks) };
    for (t, v) in acc.iter().enumerate() {
        let mut lanes = [0f32; 4];
        // SAFETY: `lanes` is 4 writable f32.
        unsafe { vst1q_f32(lanes.as_mut_ptr(), *v) };
        let (t0, t1) = (2 * (p0 + t), 2 * (p0 + t) + 1);
        out[t0 * nr + i] = lanes[0];
        if j != i {
            out[t0 * nr + j] = lanes[1];
        }
        if t1 < n {
            out[t1 * nr + i] = lanes[2];
            if j != i {
                out[t1 * nr + j] = lanes[3];
            }
        }
    }
}

/// `out[t * nr + i]` = row `r0 + i` of `w` · token `t`, for the tokens of `toks`, the rows
/// unpacked two at a time (`row_blocks`: as many blocks as a token pair), with the min term for
/// the formats that have one and Q6_K's halves apart ([`sums`]), and each block's halves apart
/// where the tokens take a scale per 16 (not with Q6_K). `w`'s format is one of
/// `has_row_blocks`'s.
///
/// # Safety
/// The CPU must support the `i8mm` extension.
#[target_feature(enable = "neon,i8mm")]
pub(super) unsafe fn drive<Q: TokenQuants>(
    w: &QMatrix<'_>,
    at: (usize, usize),
    toks: &TokenPairs<Q>,
    out: &mut [f32],
) {
    let (format, pairs, n) = (w.format(), toks.pairs.as_slice(), toks.n);
    // SAFETY: i8mm present per this function's contract.
    unsafe {
        match (takes_min(format), format == WeightFormat::Q6_K, toks.halves) {
            (_, true, true) => panic!("tile_mm: Q6_K with activations of a scale per 16"),
            (true, _, false) => drive_with::<Q, true, false, false>(w, at, pairs, n, out),
            (false, true, false) => drive_with::<Q, false, true, false>(w, at, pairs, n, out),
            (false, false, false) => drive_with::<Q, false, false, false>(w, at, pairs, n, out),
            (true, _, true) => drive_with::<Q, true, false, true>(w, at, pairs, n, out),
            (false, _, true) => drive_with::<Q, false, false, true>(w, at, pairs, n, out),
        }
    }
}

/// [`drive`] with the min term where `MIN`, the halves apart where `HALVES` (weights' scales) or
/// `XH` (tokens').
///
/// # Safety
/// The CPU must support the `i8mm` extension.
#[target_feature(enable = "neon,i8mm")]
unsafe fn drive_with<Q: TokenQuants, const MIN: bool, const HALVES: bool, const XH: bool>(
    w: &QMatrix<'_>,
    (r0, nr): (usize, usize),
    pairs: &[Vec<TokenBlock<Q>>],
    n: usize,
    out: &mut [f32],
) {
    assert!(pairs.len() == n.div_ceil(2) && out.len() >= n * nr && r0 + nr <= w.rows());
    let nb = pairs.first().map_or(0, Vec::len);
    assert!(pairs.iter().all(|p| p.len() == nb));
    let (mut bi, mut bj, mut rp) = (Vec::new(), Vec::new(), Vec::new());
    for i in (0..nr).step_by(2) {
        let j = (i + 1).min(nr - 1);
        let rows = (w.row_data(r0 + i), (j != i).then(|| w.row_data(r0 + j)));
        unpack_pair::<MIN, HALVES>(w.format(), rows, (&mut bi, &mut bj), &mut rp);
        assert_eq!(rp.len(), nb);
        let at = (i, j, nr, n);
        let mut p = 0;
        while p < pairs.len() {
            // SAFETY: i8mm present per this function's contract; the row pair and the token
            // pairs have `nb` blocks each (asserted).
            unsafe {
                if pairs.len() - p >= 2 {
                    step::<Q, 2, MIN, HALVES, XH>(&rp, pairs, p, at, out)
                } else {
                    step::<Q, 1, MIN, HALVES, XH>(&rp, pairs, p, at, out)
                }
            }
            p += 2;
        }
    }
}
