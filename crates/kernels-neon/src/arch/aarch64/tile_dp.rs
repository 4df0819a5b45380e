//! The integer prompt tiles with `dotprod` and no `i8mm`
//! ([`KernelPath::NeonDotprod`](crate::KernelPath::NeonDotprod)): the rows in the lanes. A
//! work item's rows are unpacked four at a time ([`unpack_quad`]: per block of 32, eight vectors, vector
//! `c` holding elements `4c..4c + 4` of each row, row `r` in bytes `4r..4r + 4`), and one `sdot`
//! by element (`sdot acc.4s, w.16b, x.4b[l]`) adds four elements of one token to the four rows'
//! sums: eight `sdot` per block of 32, row quad and token for 8-bit activations ([`Dp8`]),
//! sixteen for 16-bit ones ([`Dp16`]), where the f32 tile of dequantized weights took 32 `fmla`.
//!
//! 16-bit activations (|x| <= 32639) are split exactly into two signed bytes, `x = 256 * hr +
//! lo`, `hr = (x + 128) >> 8` (-127..=127, `rshrn`) and `lo` the low byte read as i8, so both
//! take `sdot` (no unsigned-by-signed dot without `i8mm`, and no offset to add back): the i32
//! lanes are the block's exact dots `sum(q_w * q_x)`, the integer products of `matvec_i16`
//! (|q_w| <= 128, |q_x| <= 32639: below 2^28). Each block's sums get one convert,
//! one multiply by the rows' scales and one FMA by the token's, and for the formats with a min
//! one more FMA (`m_w * s_x`); the halves of Q2_K, Q3_K and Q6_K (8-bit only), whose scales are
//! per 16, are multiplied by their integer scales in i32 first, as `tile_mm.rs` does Q6_K's, and
//! Q2_K's min term takes each half's (`m_w * s_x` of elements 0..16 and 16..32). 8-bit activations
//! of one scale per 16 (`Fast` Q4_0 and Q4_1 prompts, `fast_prompts_halves`) have each half's sums
//! converted and weighted by the token's scale of that half. Tokens go four at a time, each weight
//! load feeding four.

use std::arch::aarch64::*;

use super::dequant::weights_i8;
use super::q80x8::sdot_at;
use super::row_blocks::{has_row_blocks, row_blocks, takes_halves, takes_min, Blk};
use super::simd::f16_lanes;
use crate::arch::tags::{block_bytes, has_min, IQ4_NL, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};
use crate::quant::{QActs, QActs16, QBlocks};
use crate::{QMatrix, WeightFormat};

/// `acc` plus the dots of the eight quad vectors `w[c0..c0 + 4]` with the four groups of four
/// bytes of `x` (elements `4c0..4c0 + 16` of a token).
///
/// # Safety
/// The CPU must support the `dotprod` extension.
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn dots16(acc: int32x4_t, w: &[int8x16_t], x: int8x16_t) -> int32x4_t {
    // SAFETY: dotprod present per this function's contract.
    unsafe {
        let a = sdot_at::<0>(acc, w[0], x);
        let a = sdot_at::<1>(a, w[1], x);
        let a = sdot_at::<2>(a, w[2], x);
        sdot_at::<3>(a, w[3], x)
    }
}

/// A block of 32 of four rows: the quants as [`quad`] lays them out, the rows' scales `d`, min
/// factors `m` (Q2_K: `m` and `m2`, one per half) and (Q2_K, Q3_K, Q6_K) halves' integer scales
/// `sa`, `sb`, one per lane.
#[derive(Clone, Copy)]
struct QuadBlock {
    q: [int8x16_t; 8],
    d: float32x4_t,
    m: float32x4_t,
    m2: float32x4_t,
    sa: int32x4_t,
    sb: int32x4_t,
}

/// The 4×4 transpose of four vectors' 32-bit lanes: vector `c` of the result holds lane `c` of
/// `a`, `b`, `c`, `d` in that order.
#[inline]
#[target_feature(enable = "neon")]
fn transpose4(v: [int8x16_t; 4]) -> [int8x16_t; 4] {
    let [a, b, c, d] = v.map(|x| vreinterpretq_u32_s8(x));
    let (t0, t1) = (vtrn1q_u32(a, b), vtrn2q_u32(a, b));
    let (t2, t3) = (vtrn1q_u32(c, d), vtrn2q_u32(c, d));
    let z1 = |x: uint32x4_t, y: uint32x4_t| {
        vreinterpretq_s8_u64(vzip1q_u64(
            vreinterpretq_u64_u32(x),
            vreinterpretq_u64_u32(y),
        ))
    };
    let z2 = |x: uint32x4_t, y: uint32x4_t| {
        vreinterpretq_s8_u64(vzip2q_u64(
            vreinterpretq_u64_u32(x),
            vreinterpretq_u64_u32(y),
        ))
    };
    [z1(t0, t2), z1(t1, t3), z2(t0, t2), z2(t1, t3)]
}

/// Four rows' blocks (`row_blocks`) as [`QuadBlock`]s, into `out`: the min factors only where
/// `MIN` (`takes_min` of the format), the halves' integer scales only where `HALVES`
/// (`takes_halves`), else zero, as the tile reads them.
#[target_feature(enable = "neon")]
fn quad<const MIN: bool, const HALVES: bool>(rows: [&[Blk]; 4], out: &mut Vec<QuadBlock>) {
    out.clear();
    let nb = rows[0].len();
    assert!(rows.iter().all(|r| r.len() == nb));
    let blocks = rows[0].iter().zip(rows[1]).zip(rows[2]).zip(rows[3]);
    for (((a, b), c), d) in blocks {
        let k = [a, b, c, d];
        let f = |v: [f32; 4]| {
            // SAFETY: `v` is 4 readable f32.
            unsafe { vld1q_f32(v.as_ptr()) }
        };
        let i = |v: [i32; 4]| {
            // SAFETY: `v` is 4 readable i32.
            unsafe { vld1q_s32(v.as_ptr()) }
        };
        let lo = transpose4(k.map(|k| k.q.0));
        let hi = transpose4(k.map(|k| k.q.1));
        let q = [lo[0], lo[1], lo[2], lo[3], hi[0], hi[1], hi[2], hi[3]];
        let (zf, zi) = (vdupq_n_f32(0.0), vdupq_n_s32(0));
        out.push(QuadBlock {
            q,
            d: f(k.map(|k| k.d)),
            m: if MIN { f(k.map(|k| k.m)) } else { zf },
            m2: if MIN && HALVES {
                f(k.map(|k| k.m2))
            } else {
                zf
            },
            sa: if HALVES { i(k.map(|k| k.sa)) } else { zi },
            sb: if HALVES { i(k.map(|k| k.sb)) } else { zi },
        });
    }
}

/// Four rows of a 32-element block format (tag `F`) as [`quad`] makes them from their
/// [`row_blocks`], in one pass with no [`Blk`] between (that way took about 1.2 instructions a
/// weight, paid once per product: more than half of an 8-token Q8_0 prompt's).
#[target_feature(enable = "neon")]
fn quad_blocks<const F: u8>(rows: [&[u8]; 4], out: &mut Vec<QuadBlock>) {
    let bb = block_bytes(F);
    let nb = rows.iter().map(|r| r.len() / bb).min().unwrap_or(0);
    out.clear();
    out.reserve(nb);
    let zero = vdupq_n_s32(0);
    for i in 0..nb {
        let b: [&[u8]; 4] = [
            &rows[0][i * bb..i * bb + bb],
            &rows[1][i * bb..i * bb + bb],
            &rows[2][i * bb..i * bb + bb],
            &rows[3][i * bb..i * bb + bb],
        ];
        let (w0, w1, w2, w3) = (
            weights_i8::<F>(b[0]),
            weights_i8::<F>(b[1]),
            weights_i8::<F>(b[2]),
            weights_i8::<F>(b[3]),
        );
        let lo = transpose4([w0.0, w1.0, w2.0, w3.0]);
        let hi = transpose4([w0.1, w1.1, w2.1, w3.1]);
        let q = [lo[0], lo[1], lo[2], lo[3], hi[0], hi[1], hi[2], hi[3]];
        out.push(QuadBlock {
            q,
            d: f16_lanes(b, 0),
            m: if has_min(F) {
                f16_lanes(b, 2)
            } else {
                vdupq_n_f32(0.0)
            },
            m2: vdupq_n_f32(0.0),
            sa: zero,
            sb: zero,
        });
    }
}

/// Four rows of `format` (the first `k` real, the last of them repeated after) unpacked as
/// [`QuadBlock`]s into `rq`: the 32-element block formats in one pass ([`quad_blocks`]), the
/// others through [`row_blocks`] (the `k` real rows into `bufs`) and [`quad`] (`MIN`, `HALVES`:
/// `takes_min` and `takes_halves` of `format`).
#[target_feature(enable = "neon")]
fn unpack_quad<const MIN: bool, const HALVES: bool>(
    format: WeightFormat,
    (rows, k): ([&[u8]; 4], usize),
    bufs: &mut [Vec<Blk>; 4],
    rq: &mut Vec<QuadBlock>,
) {
    match format {
        WeightFormat::Q8_0 => quad_blocks::<Q8_0>(rows, rq),
        WeightFormat::Q4_0 => quad_blocks::<Q4_0>(rows, rq),
        WeightFormat::Q4_1 => quad_blocks::<Q4_1>(rows, rq),
        WeightFormat::Q5_0 => quad_blocks::<Q5_0>(rows, rq),
        WeightFormat::Q5_1 => quad_blocks::<Q5_1>(rows, rq),
        WeightFormat::IQ4_NL => quad_blocks::<IQ4_NL>(rows, rq),
        _ => {
            for (b, row) in bufs.iter_mut().zip(rows).take(k) {
                b.clear();
                row_blocks(format, row, b);
            }
            quad::<MIN, HALVES>(std::array::from_fn(|r| bufs[r.min(k - 1)].as_slice()), rq)
        }
    }
}

/// A token's quants of one block in a tile's own form.
trait DpQuants: Copy {
    /// The block's exact integer dots with the four rows of `w`, one per lane.
    ///
    /// # Safety
    /// The CPU must support the `dotprod` extension.
    unsafe fn dots(&self, w: &QuadBlock) -> int32x4_t;
    /// [`DpQuants::dots`] of the block's two halves apart (elements 0..16, 16..32).
    ///
    /// # Safety
    /// The CPU must support the `dotprod` extension.
    unsafe fn dots_halves(&self, w: &QuadBlock) -> (int32x4_t, int32x4_t);
}

/// A token's 8-bit quants of one block.
#[derive(Clone, Copy)]
pub(crate) struct Dp8 {
    q: [int8x16_t; 2],
}

impl DpQuants for Dp8 {
    #[inline(always)]
    unsafe fn dots(&self, w: &QuadBlock) -> int32x4_t {
        // SAFETY: dotprod present per this method's contract.
        unsafe {
            dots16(
                dots16(vdupq_n_s32(0), &w.q[..4], self.q[0]),
                &w.q[4..],
                self.q[1],
            )
        }
    }
    #[inline(always)]
    unsafe fn dots_halves(&self, w: &QuadBlock) -> (int32x4_t, int32x4_t) {
        // SAFETY: dotprod present per this method's contract (NEON is baseline).
        unsafe {
            let zero = vdupq_n_s32(0);
            (
                dots16(zero, &w.q[..4], self.q[0]),
                dots16(zero, &w.q[4..], self.q[1]),
            )
        }
    }
}

/// A token's 16-bit quants of one block, split: the rounded high bytes and the low ones as i8.
#[derive(Clone, Copy)]
pub(crate) struct Dp16 {
    hi: [int8x16_t; 2],
    lo: [int8x16_t; 2],
}

impl DpQuants for Dp16 {
    #[inline(always)]
    unsafe fn dots(&self, w: &QuadBlock) -> int32x4_t {
        // SAFETY: dotprod present per this method's contract.
        unsafe {
            let h = dots16(vdupq_n_s32(0), &w.q[..4], self.hi[0]);
            let h = dots16(h, &w.q[4..], self.hi[1]);
            let l = dots16(vdupq_n_s32(0), &w.q[..4], self.lo[0]);
            let l = dots16(l, &w.q[4..], self.lo[1]);
            vmlaq_n_s32(l, h, 256)
        }
    }
    #[inline(always)]
    unsafe fn dots_halves(&self, w: &QuadBlock) -> (int32x4_t, int32x4_t) {
        // SAFETY: dotprod present per this method's contract.
        unsafe {
            let zero = vdupq_n_s32(0);
            let ha = dots16(zero, &w.q[..4], self.hi[0]);
            let hb = dots16(zero, &w.q[4..], self.hi[1]);
            let la = dots16(zero, &w.q[..4], self.lo[0]);
            let lb = dots16(zero, &w.q[4..], self.lo[1]);
            (vmlaq_n_s32(la, ha, 256), vmlaq_n_s32(lb, hb, 256))
        }
    }
}

/// One block of four tokens: each one's quants, their scales `d` and sums `s` (`d * sum(q)`),
/// and the sums of each half (`sa`, `sb`: `d * sum(q)` over elements 0..16 and 16..32, Q2_K's
/// min terms; zero for the other formats), one per lane. With activations of a scale per 16
/// (`QActs::quantize_halves`), `d` is the first half's scale and `d2` the second's (else `d`).
#[derive(Clone, Copy)]
struct TokQuad<Q> {
    q: [Q; 4],
    d: float32x4_t,
    d2: float32x4_t,
    s: float32x4_t,
    sa: float32x4_t,
    sb: float32x4_t,
}

/// A prompt's tokens as a `dotprod` tile reads them, built once per product ([`token_quads`]):
/// group `g` (tokens `4g..4g + 4`, the last group's missing ones the last token repeated), per
/// block each token's quants in the tile's form and the four tokens' factors.
pub(crate) struct TokenQuads<Q> {
    groups: Vec<Vec<TokQuad<Q>>>,
    n: usize,
    /// Whether the activations take a scale per 16 (`QBlocks::d16`).
    xh: bool,
}

/// The token groups of `acts` (whole blocks of 32) for a tile over weights of `format`, each
/// token's quants of a block by `quants` of its 32 quants; the sums of each half only where the
/// format's min term takes them (Q2_K), else zero.
#[target_feature(enable = "neon")]
fn token_quads<E: Copy + Into<i32>, Q: DpQuants>(
    acts: &[QBlocks<E>],
    format: WeightFormat,
    quants: impl Fn(&[E]) -> Q,
) -> TokenQuads<Q> {
    let halves = takes_min(format) && takes_halves(format);
    let n = acts.len();
    let nb = acts.first().map_or(0, |a| a.qs.len() / 32);
    let xh = acts.first().is_some_and(|a| !a.d16.is_empty());
    assert!(acts.iter().all(|a| a.d16.is_empty() != xh) && !(xh && halves));
    let groups = (0..n.div_ceil(4))
        .map(|g| {
            let a: [&QBlocks<E>; 4] = std::array::from_fn(|t| &acts[(4 * g + t).min(n - 1)]);
            (0..nb)
                .map(|b| {
                    let f = |v: [f32; 4]| {
                        // SAFETY: `v` is 4 readable f32.
                        unsafe { vld1q_f32(v.as_ptr()) }
                    };
                    let half = |x: &QBlocks<E>, h: usize| {
                        if !halves {
                            return 0.0;
                        }
                        let q = &x.qs[32 * b + 16 * h..32 * b + 16 * h + 16];
                        x.d[b] * q.iter().map(|&v| v.into()).sum::<i32>() as f32
                    };
                    TokQuad {
                        q: a.map(|x| quants(&x.qs[32 * b..32 * b + 32])),
                        d: f(a.map(|x| if xh { x.d16[2 * b] } else { x.d[b] })),
                        d2: f(a.map(|x| if xh { x.d16[2 * b + 1] } else { x.d[b] })),
                        s: f(a.map(|x| x.s[b])),
                        sa: f(a.map(|x| half(x, 0))),
                        sb: f(a.map(|x| half(x, 1))),
                    }
                })
                .collect()
        })
        .collect();
    TokenQuads { groups, n, xh }
}

/// `acc` plus token `L`'s (of the group's block `x`) products with the row quad's block `w`:
/// the block's exact dots, times the rows' scales and the token's; the min term where `MIN`; each
/// half of the block weighted by its integer scale where `HALVES` (Q2_K, Q3_K, Q6_K), and the
/// min term of each half where both (Q2_K); each half by the token's scale of it where `XH`
/// (activations of a scale per 16).
///
/// # Safety
/// The CPU must support the `dotprod` extension.
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn token<Q: DpQuants, const L: i32, const MIN: bool, const HALVES: bool, const XH: bool>(
    acc: float32x4_t,
    w: &QuadBlock,
    x: &TokQuad<Q>,
) -> float32x4_t {
    let q = &x.q[L as usize];
    if XH {
        // SAFETY: dotprod present per this function's contract.
        let (ha, hb) = unsafe { q.dots_halves(w) };
        // The halves weighted by the token's scales first, then the rows' once: five operations
        // where each half times both scales takes six.
        let v = vmulq_laneq_f32::<L>(vcvtq_f32_s32(ha), x.d);
        let v = vfmaq_laneq_f32::<L>(v, vcvtq_f32_s32(hb), x.d2);
        let acc = vfmaq_f32(acc, v, w.d);
        return if MIN {
            vfmaq_laneq_f32::<L>(acc, w.m, x.s)
        } else {
            acc
        };
    }
    // SAFETY: dotprod present per this function's contract.
    let s = unsafe {
        if HALVES {
            // Each half's sum times its integer scale: 8-bit, |sum| < 16 * 32 * 128 and |sc| <=
            // 128 (Q6_K); 16-bit, |sum| <= 16 * 4 * 32768 and |sc| <= 32 (Q3_K; Q2_K less).
            let (ha, hb) = q.dots_halves(w);
            vmlaq_s32(vmulq_s32(ha, w.sa), hb, w.sb)
        } else {
            q.dots(w)
        }
    };
    let acc = vfmaq_laneq_f32::<L>(acc, vmulq_f32(vcvtq_f32_s32(s), w.d), x.d);
    if MIN && HALVES {
        let acc = vfmaq_laneq_f32::<L>(acc, w.m, x.sa);
        vfmaq_laneq_f32::<L>(acc, w.m2, x.sb)
    } else if MIN {
        vfmaq_laneq_f32::<L>(acc, w.m, x.s)
    } else {
        acc
    }
}

/// The sums of a row quad's blocks `rq` with the first `T` tokens of a group's blocks `g`, one
/// vector per token, lanes the rows ([`token`]; each token written out, not a loop the compiler
/// might keep).
///
/// # Safety
/// The CPU must support the `dotprod` extension; `g` has as many blocks as `rq`.
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn sums<Q: DpQuants, const T: usize, const MIN: bool, const HALVES: bool, const XH: bool>(
    rq: &[QuadBlock],
    g: &[TokQuad<Q>],
) -> [float32x4_t; T] {
    let mut acc = [vdupq_n_f32(0.0); T];
    for (b, w) in rq.iter().enumerate() {
        // SAFETY: `b < rq.len()`, which `g`'s length equals (the contract).
        let x = unsafe { g.get_unchecked(b) };
        // SAFETY: dotprod present per this function's contract.
        unsafe {
            acc[0] = token::<Q, 0, MIN, HALVES, XH>(acc[0], w, x);
            if T > 1 {
                acc[1] = token::<Q, 1, MIN, HALVES, XH>(acc[1], w, x);
            }
            if T > 2 {
                acc[2] = token::<Q, 2, MIN, HALVES, XH>(acc[2], w, x);
            }
            if T > 3 {
                acc[3] = token::<Q, 3, MIN, HALVES, XH>(acc[3], w, x);
            }
        }
    }
    acc
}

/// Row quad `i..i + k` (`k` <= 4 real rows) against the first `T` tokens of group `gi`, written
/// to `out` (`nr` rows a token).
///
/// # Safety
/// The CPU must support the `dotprod` extension; the group has as many blocks as `rq`.
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn step<Q: DpQuants, const T: usize, const MIN: bool, const HALVES: bool, const XH: bool>(
    rq: &[QuadBlock],
    g: &[TokQuad<Q>],
    (gi, i, k, nr): (usize, usize, usize, usize),
    out: &mut [f32],
) {
    // SAFETY: per this function's contract.
    let acc = unsafe { sums::<Q, T, MIN, HALVES, XH>(rq, g) };
    for (t, v) in acc.iter().enumerate() {
        let o = (4 * gi + t) * nr + i;
        if k == 4 {
            let dst = &mut out[o..o + 4];
            // SAFETY: `dst` is exactly 4 writable f32.
            unsafe { vst1q_f32(dst.as_mut_ptr(), *v) };
        } else {
            let mut lanes = [0f32; 4];
            // SAFETY: `lanes` is 4 writable f32.
            unsafe { vst1q_f32(lanes.as_mut_ptr(), *v) };
            out[o..o + k].copy_from_slice(&lanes[..k]);
        }
    }
}

/// `out[t * nr + i]` = row `r0 + i` of `w` · token `t` for the tokens of `toks`, the rows
/// unpacked four at a time, with the min term where `MIN` and the halves apart where `HALVES`
/// (Q2_K, Q3_K, Q6_K) or `XH` (the tokens' scales per 16).
///
/// # Safety
/// The CPU must support the `dotprod` extension; `w`'s format is one of `has_row_blocks`'s.
#[target_feature(enable = "neon,dotprod")]
unsafe fn drive_with<Q: DpQuants, const MIN: bool, const HALVES: bool, const XH: bool>(
    w: &QMatrix<'_>,
    (r0, nr): (usize, usize),
    toks: &TokenQuads<Q>,
    out: &mut [f32],
) {
    let (groups, n) = (toks.groups.as_slice(), toks.n);
    assert!(groups.len() == n.div_ceil(4) && out.len() >= n * nr && r0 + nr <= w.rows());
    let nb = groups.first().map_or(0, Vec::len);
    assert!(groups.iter().all(|g| g.len() == nb));
    let mut bufs: [Vec<Blk>; 4] = std::array::from_fn(|_| Vec::new());
    let mut rq = Vec::new();
    for i in (0..nr).step_by(4) {
        let k = 4.min(nr - i);
        let rows = std::array::from_fn(|r| w.row_data(r0 + i + r.min(k - 1)));
        // SAFETY: dotprod present per this function's contract.
        unpack_quad::<MIN, HALVES>(w.format(), (rows, k), &mut bufs, &mut rq);
        assert_eq!(rq.len(), nb);
        for (gi, g) in groups.iter().enumerate() {
            let at = (gi, i, k, nr);
            // SAFETY: dotprod present per this function's contract; the quad and the group
            // have `nb` blocks each (asserted).
            unsafe {
                match n - 4 * gi {
                    1 => step::<Q, 1, MIN, HALVES, XH>(&rq, g, at, out),
                    2 => step::<Q, 2, MIN, HALVES, XH>(&rq, g, at, out),
                    3 => step::<Q, 3, MIN, HALVES, XH>(&rq, g, at, out),
                    _ => step::<Q, 4, MIN, HALVES, XH>(&rq, g, at, out),
                }
            }
        }
    }
}

/// [`drive_with`] with the min term and halves of `w`'s format, and the tokens' scales per 16
/// where they take them (not with a format whose halves have scales).
///
/// # Safety
/// The CPU must support the `dotprod` extension; `w`'s format is one of `has_row_blocks`'s.
#[target_feature(enable = "neon,dotprod")]
unsafe fn drive<Q: DpQuants>(
    w: &QMatrix<'_>,
    at: (usize, usize),
    toks: &TokenQuads<Q>,
    out: &mut [f32],
) {
    let format = w.format();
    // SAFETY: per this function's contract.
    unsafe {
        match (takes_min(format), takes_halves(format), toks.xh) {
            (_, true, true) => panic!("tile_dp: {format:?} with activations of a scale per 16"),
            (true, true, false) => drive_with::<Q, true, true, false>(w, at, toks, out),
            (true, false, false) => drive_with::<Q, true, false, false>(w, at, toks, out),
            (false, true, false) => drive_with::<Q, false, true, false>(w, at, toks, out),
            (false, false, false) => drive_with::<Q, false, false, false>(w, at, toks, out),
            (true, false, true) => drive_with::<Q, true, false, true>(w, at, toks, out),
            (false, false, true) => drive_with::<Q, false, false, true>(w, at, toks, out),
        }
    }
}

/// Whether [`tile_i16dp`] takes weights of `format`: the formats of 32-element blocks of integer
/// quants, IQ4_XS, Q2_K, Q3_K, Q4_K and Q5_K (not Q6_K: the sum of a block's two halves, each
/// times its scale, could pass 2^31 with 16-bit activations).
pub(crate) fn has_tile_i16dp(format: WeightFormat) -> bool {
    has_row_blocks(format) && format != WeightFormat::Q6_K
}

/// A prompt's 16-bit activations as [`tile_i16dp`] reads them over weights of `format` (once per
/// product): each block's rounded high bytes and low bytes as i8.
#[target_feature(enable = "neon")]
pub(crate) fn quads16(acts: &[QActs16], format: WeightFormat) -> TokenQuads<Dp16> {
    token_quads(acts, format, |x: &[i16]| {
        let split = |e: usize| {
            let q = &x[e..e + 16];
            // SAFETY: `q` has exactly 16 readable i16 (bounds-checked above).
            let (a, b) = unsafe { (vld1q_s16(q.as_ptr()), vld1q_s16(q.as_ptr().add(8))) };
            debug_assert!(
                vmaxvq_s16(vmaxq_s16(a, b)) <= 32639,
                "16-bit quants past 32639"
            );
            let hr = vcombine_s8(vrshrn_n_s16::<8>(a), vrshrn_n_s16::<8>(b));
            (hr, vcombine_s8(vmovn_s16(a), vmovn_s16(b)))
        };
        let ((h0, l0), (h1, l1)) = (split(0), split(16));
        Dp16 {
            hi: [h0, h1],
            lo: [l0, l1],
        }
    })
}

/// The 16-bit prompt tile with `dotprod`: `out[t * nr + i]` = row `r0 + i` of `w` · token `t`
/// for every token of `toks` (16-bit activations with one scale per 32, as `matvec` quantizes
/// them in `Fast`, by [`quads16`]): the integer products of `matvec_i16`, summed in another f32
/// order. Formats other than [`has_tile_i16dp`]'s are left to the caller.
///
/// # Safety
/// The CPU must support the `dotprod` extension.
#[target_feature(enable = "neon,dotprod")]
pub(crate) unsafe fn tile_i16dp(
    w: &QMatrix<'_>,
    r0: usize,
    nr: usize,
    toks: &TokenQuads<Dp16>,
    out: &mut [f32],
) {
    if nr == 0 || !has_tile_i16dp(w.format()) {
        return;
    }
    // SAFETY: dotprod present per this function's contract; the format is one `row_blocks`
    // takes.
    unsafe { drive::<Dp16>(w, (r0, nr), toks, out) }
}

/// Whether [`tile_i8dp`] takes weights of `format`: every format of `row_blocks`.
pub(crate) fn has_tile_i8dp(format: WeightFormat) -> bool {
    has_row_blocks(format)
}

/// A prompt's 8-bit activations as [`tile_i8dp`] reads them over weights of `format` (once per
/// product).
#[target_feature(enable = "neon")]
pub(crate) fn quads8(acts: &[QActs], format: WeightFormat) -> TokenQuads<Dp8> {
    token_quads(acts, format, |x: &[i8]| {
        let half = |e: usize| {
            let q = &x[e..e + 16];
            // SAFETY: `q` has exactly 16 readable i8 (bounds-checked above).
            unsafe { vld1q_s8(q.as_ptr()) }
        };
        Dp8 {
            q: [half(0), half(16)],
        }
    })
}

/// The 8-bit prompt tile with `dotprod`: `out[t * nr + i]` = row `r0 + i` of `w` · token `t` for
/// every token of `toks` (8-bit activations as `matvec` quantizes them in `Int8` for `w`'s
/// format, by [`quads8`]: one scale per 32, or per 256 for Q4_K/Q5_K/Q6_K with `d` and `s` kept
/// per 32): the integer products of `matvec_int8`, summed in another f32 order. Formats other
/// than [`has_tile_i8dp`]'s are left to the caller.
///
/// # Safety
/// The CPU must support the `dotprod` extension.
#[target_feature(enable = "neon,dotprod")]
pub(crate) unsafe fn tile_i8dp(
    w: &QMatrix<'_>,
    r0: usize,
    nr: usize,
    toks: &TokenQuads<Dp8>,
    out: &mut [f32],
) {
    if nr == 0 || !has_tile_i8dp(w.format()) {
        return;
    }
    // SAFETY: dotprod present per this function's contract; the format is one `row_blocks`
    // takes.
    unsafe { drive::<Dp8>(w, (r0, nr), toks, out) }
}
