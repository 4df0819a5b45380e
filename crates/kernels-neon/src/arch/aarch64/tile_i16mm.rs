//! The 16-bit prompt tile with `i8mm` ([`KernelPath::NeonI8mm`](crate::KernelPath::NeonI8mm)):
//! [`Precision::Fast`](crate::Precision) prompts of the 32-element block formats that keep 16
//! bits (Q4_0, Q4_1, Q5_1, IQ4_NL; Q5_0 and Q8_0 take the 8-bit tile first) and of IQ4_XS (its
//! sub-blocks of 32 are IQ4_NL blocks with the scale `d * (ls - 32)`). Without it these prompts
//! took the f32 tile of dequantized weights: 32 `fmla` per 128 products against 8 matrix
//! multiplies here.
//!
//! Each 16-bit activation is split into its high byte, signed, and its low byte, unsigned: `x =
//! 256 * hi + lo`, exactly. Per 32-element block, two weight rows by two tokens: four `smmla` sum
//! the high bytes' products (signed by signed), the sums are shifted up by 8, and four `usmmla`
//! add the low bytes' (unsigned activations by signed weights) on top. The i32 lanes are then the
//! block's exact dots `sum(q_w * q_x)`, the integer products of `matvec_i16` (|q_w| <= 128, |q_x|
//! <= 32767: a block's sum below 2^28), converted and weighted by `d_w * d_x` in f32, a min term
//! `m_w * s_x` added for Q4_1 and Q5_1; only the f32 summation order differs from `matvec`'s.
//!
//! Lanes, as `usmmla` lays them out with the tokens as its first operand: `[t0 · r0, t0 · r1, t1
//! · r0, t1 · r1]`. A row pair's quants are unpacked once and every token pair passes over them,
//! two token pairs at a time so that each weight load feeds four tokens.

use std::arch::aarch64::*;
use std::arch::asm;

use super::dequant::weights_i8;
use super::simd::f16_at;
use super::tile_i8mm::{interleave, smmla};
use crate::arch::tags::{block_bytes, has_min, IQ4_NL, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};
use crate::quant::QActs16;
use crate::{QMatrix, WeightFormat};

/// Whether [`tile_i16mm`] takes weights of `format`: the formats of 32-element blocks of integer
/// quants, and IQ4_XS.
pub(crate) fn has_tile_i16mm(format: WeightFormat) -> bool {
    use WeightFormat::*;
    matches!(format, Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | IQ4_NL | IQ4_XS)
}

/// `acc += a · bᵀ` for `a` a 2×8 u8 matrix and `b` a 2×8 i8 matrix (row-major in the 16 lanes):
/// lanes `[a0·b0, a0·b1, a1·b0, a1·b1]`.
///
/// # Safety
/// The CPU must support the `i8mm` extension.
#[inline]
#[target_feature(enable = "neon,i8mm")]
unsafe fn usmmla(mut acc: int32x4_t, a: uint8x16_t, b: int8x16_t) -> int32x4_t {
    // SAFETY: `usmmla` only reads/writes the named vector registers; the caller guarantees the
    // i8mm extension is present.
    unsafe {
        asm!(
            "usmmla {acc:v}.4s, {a:v}.16b, {b:v}.16b",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    acc
}

/// One block of a token pair's activations split and interleaved for the matrix multiplies (for
/// each 8 elements `8c..8c + 8` of the block, the first token's then the second's), with the
/// scales `[d0, d0, d1, d1]` and `[s0, s0, s1, s1]` (`s` = `d * sum(q)`, the min term's).
#[derive(Clone, Copy)]
struct TokBlock {
    /// The high bytes (signed).
    hi: [int8x16_t; 4],
    /// The low bytes (unsigned).
    lo: [uint8x16_t; 4],
    d: float32x4_t,
    s: float32x4_t,
}

/// The blocks of a token pair (`b` may be `a`).
#[target_feature(enable = "neon")]
fn token_pair(a: &QActs16, b: &QActs16, nb: usize) -> Vec<TokBlock> {
    let eight = |x: &QActs16, e: usize| {
        let q = &x.qs[e..e + 8];
        // SAFETY: `q` has exactly 8 readable i16 (bounds-checked above).
        unsafe { vld1q_s16(q.as_ptr()) }
    };
    let pair4 = |u: f32, v: f32| vcombine_f32(vdup_n_f32(u), vdup_n_f32(v));
    (0..nb)
        .map(|blk| {
            let mut t = TokBlock {
                hi: [vdupq_n_s8(0); 4],
                lo: [vdupq_n_u8(0); 4],
                d: pair4(a.d[blk], b.d[blk]),
                s: pair4(a.s[blk], b.s[blk]),
            };
            for c in 0..4 {
                let e = 32 * blk + 8 * c;
                let (p, q) = (eight(a, e), eight(b, e));
                t.hi[c] = vcombine_s8(vshrn_n_s16::<8>(p), vshrn_n_s16::<8>(q));
                t.lo[c] = vcombine_u8(
                    vmovn_u16(vreinterpretq_u16_s16(p)),
                    vmovn_u16(vreinterpretq_u16_s16(q)),
                );
            }
            t
        })
        .collect()
}

/// One block of rows `i` and `j` (`j` may equal `i`) unpacked: the quants interleaved, the scales
/// `[d_i, d_j, d_i, d_j]` and, for Q4_1/Q5_1, the mins likewise (else zero).
#[derive(Clone, Copy)]
struct RowBlock {
    q: [int8x16_t; 4],
    d: float32x4_t,
    m: float32x4_t,
}

/// The blocks of two rows of format tag `F` (IQ4_XS where `XS`, with `F` IQ4_NL's).
#[target_feature(enable = "neon")]
fn row_pair<const F: u8, const XS: bool>(ri: &[u8], rj: &[u8]) -> Vec<RowBlock> {
    let both = |u: f32, v: f32| {
        let uv = vset_lane_f32::<1>(v, vdup_n_f32(u));
        vcombine_f32(uv, uv)
    };
    let mut p = Vec::new();
    if XS {
        for (si, sj) in ri.chunks_exact(136).zip(rj.chunks_exact(136)) {
            let (di, dj) = (
                crate::scalar::iq4xs_scales(si),
                crate::scalar::iq4xs_scales(sj),
            );
            for b in 0..8 {
                // Sub-block `b` as an IQ4_NL block: its 16 quant bytes after two of scale, which
                // `weights_i8` does not read.
                let nl = |s: &[u8]| {
                    let mut nl = [0u8; 18];
                    nl[2..].copy_from_slice(&s[8 + 16 * b..8 + 16 * b + 16]);
                    nl
                };
                p.push(RowBlock {
                    q: interleave(weights_i8::<IQ4_NL>(&nl(si)), weights_i8::<IQ4_NL>(&nl(sj))),
                    d: both(di[b], dj[b]),
                    m: vdupq_n_f32(0.0),
                });
            }
        }
        return p;
    }
    let bb = block_bytes(F);
    for (bi, bj) in ri.chunks_exact(bb).zip(rj.chunks_exact(bb)) {
        p.push(RowBlock {
            q: interleave(weights_i8::<F>(bi), weights_i8::<F>(bj)),
            d: both(f16_at(bi, 0), f16_at(bj, 0)),
            m: if has_min(F) {
                both(f16_at(bi, 2), f16_at(bj, 2))
            } else {
                vdupq_n_f32(0.0)
            },
        });
    }
    p
}

/// The exact dots of one block of a row pair (`w`) with one token pair (`hi`, `lo`), lanes as
/// the module docs say.
///
/// # Safety
/// The CPU must support the `i8mm` extension.
#[inline]
#[target_feature(enable = "neon,i8mm")]
unsafe fn block_dots(w: &[int8x16_t; 4], hi: &[int8x16_t; 4], lo: &[uint8x16_t; 4]) -> int32x4_t {
    // SAFETY: i8mm present per this function's contract.
    unsafe {
        let h = smmla(vdupq_n_s32(0), hi[0], w[0]);
        let h = smmla(h, hi[1], w[1]);
        let h = smmla(h, hi[2], w[2]);
        let h = smmla(h, hi[3], w[3]);
        let s = usmmla(vshlq_n_s32::<8>(h), lo[0], w[0]);
        let s = usmmla(s, lo[1], w[1]);
        let s = usmmla(s, lo[2], w[2]);
        usmmla(s, lo[3], w[3])
    }
}

/// The sums of a row pair's blocks `rp` with `T` token pairs' (`toks`), lanes as the module docs
/// say; the min term where `MIN`.
///
/// # Safety
/// The CPU must support the `i8mm` extension; every token pair has as many blocks as `rp`.
#[inline]
#[target_feature(enable = "neon,i8mm")]
unsafe fn sums<const T: usize, const MIN: bool>(
    rp: &[RowBlock],
    toks: [&[TokBlock]; T],
) -> [float32x4_t; T] {
    let mut acc = [vdupq_n_f32(0.0); T];
    for (b, w) in rp.iter().enumerate() {
        for t in 0..T {
            // SAFETY: `b < rp.len()`, which every token pair's length equals (the contract).
            let x = unsafe { toks[t].get_unchecked(b) };
            // SAFETY: i8mm present per this function's contract.
            let s = unsafe { block_dots(&w.q, &x.hi, &x.lo) };
            acc[t] = vfmaq_f32(acc[t], vcvtq_f32_s32(s), vmulq_f32(w.d, x.d));
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
unsafe fn step<const T: usize, const MIN: bool>(
    rp: &[RowBlock],
    pairs: &[Vec<TokBlock>],
    p0: usize,
    (i, j, nr, n): (usize, usize, usize, usize),
    out: &mut [f32],
) {
    let toks: [&[TokBlock]; T] = std::array::from_fn(|t| pairs[p0 + t].as_slice());
    // SAFETY: per this function's contract.
    let acc = unsafe { sums::<T, MIN>(rp, toks) };
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

/// [`tile_i16mm`] for one format (IQ4_XS where `XS`, with `F` IQ4_NL's tag).
///
/// # Safety
/// The CPU must support the `i8mm` extension.
#[target_feature(enable = "neon,i8mm")]
unsafe fn tile_f<const F: u8, const XS: bool>(
    w: &QMatrix<'_>,
    r0: usize,
    nr: usize,
    acts: &[QActs16],
    out: &mut [f32],
) {
    let n = acts.len();
    let nb = w.cols() / 32;
    assert!(acts
        .iter()
        .all(|a| a.qs.len() >= nb * 32 && a.d.len() >= nb && a.s.len() >= nb));
    assert!(out.len() >= n * nr && r0 + nr <= w.rows());
    let pairs: Vec<Vec<TokBlock>> = (0..n.div_ceil(2))
        .map(|p| token_pair(&acts[2 * p], &acts[(2 * p + 1).min(n - 1)], nb))
        .collect();
    for i in (0..nr).step_by(2) {
        let j = (i + 1).min(nr - 1);
        let rp = row_pair::<F, XS>(w.row_data(r0 + i), w.row_data(r0 + j));
        assert_eq!(rp.len(), nb);
        let at = (i, j, nr, n);
        let mut p = 0;
        while p < pairs.len() {
            // SAFETY: i8mm present per this function's contract; the row pair and the token
            // pairs have `nb` blocks each.
            unsafe {
                match (pairs.len() - p >= 2, has_min(F)) {
                    (true, true) => step::<2, true>(&rp, &pairs, p, at, out),
                    (true, false) => step::<2, false>(&rp, &pairs, p, at, out),
                    (false, true) => step::<1, true>(&rp, &pairs, p, at, out),
                    (false, false) => step::<1, false>(&rp, &pairs, p, at, out),
                }
            }
            p += 2;
        }
    }
}

/// The 16-bit prompt tile with `i8mm`: `out[t * nr + i]` = row `r0 + i` of `w` · token `t` for
/// every token of `acts` (16-bit activations with one scale per 32, as `matvec` quantizes them in
/// `Fast`): the integer products of `matvec_i16`, summed in another f32 order. Formats other than
/// [`has_tile_i16mm`]'s are left to the caller.
///
/// # Safety
/// The CPU must support the `i8mm` extension.
#[target_feature(enable = "neon,i8mm")]
pub(crate) unsafe fn tile_i16mm(
    w: &QMatrix<'_>,
    r0: usize,
    nr: usize,
    acts: &[QActs16],
    out: &mut [f32],
) {
    if acts.is_empty() || nr == 0 {
        return;
    }
    type Tile = unsafe fn(&QMatrix<'_>, usize, usize, &[QActs16], &mut [f32]);
    let f: Tile = match w.format() {
        WeightFormat::Q4_0 => tile_f::<Q4_0, false>,
        WeightFormat::Q4_1 => tile_f::<Q4_1, false>,
        WeightFormat::Q5_0 => tile_f::<Q5_0, false>,
        WeightFormat::Q5_1 => tile_f::<Q5_1, false>,
        WeightFormat::Q8_0 => tile_f::<Q8_0, false>,
        WeightFormat::IQ4_NL => tile_f::<IQ4_NL, false>,
        WeightFormat::IQ4_XS => tile_f::<IQ4_NL, true>,
        _ => return,
    };
    // SAFETY: i8mm present per this function's contract.
    unsafe { f(w, r0, nr, acts, out) }
}
