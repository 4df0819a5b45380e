//! The kernel of Q4_K and Q5_K rows repacked eight at a time ([`crate::Q40x8`], the group
//! super-blocks of `q40x8/q4k.rs`) on `dotprod` CPUs, 16-bit activations
//! ([`Precision::Fast`](crate::Precision::Fast)) split as
//! [`Split16`](super::matvec_split::Split16) splits them, one token or several (each sub-block
//! unpacked once for all).
//!
//! A group super-block holds the 8 rows' f16 `d`, their f16 `dmin`, the three u32 words of each
//! row's packed 6-bit scales and mins (word `i` of row `r` at `32 + 32 i + 4 r`), then per
//! sub-block of 32 its 8 rows' nibbles as a Q4_0 group block's (Q5_K: then their fifth bits as a
//! Q5_0 group block's), which [`super::q40x8`]'s unpacking and by-element dots turn into one exact
//! sum a row lane. The scales unpack for four rows at once (llama.cpp's `kmask` operations on the
//! rows' 32-bit lanes).
//!
//! Results: the split rows' (`kquant_split.rs`'s `q45k_block` and `dot_row`) bit for bit. Those
//! keep per row four lanes `j` of `(d * sc_J) * d_x` FMAs (sub-block `J = j`, then `J = j + 4`, in
//! each super-block), add the lanes pairwise at the end (`(a0 + a1) + (a2 + a3)`) and subtract the
//! min term, summed over super-blocks from each super-block's `fma((m_k * dmin) * s_x, m_{k+4} *
//! dmin, s_x)` lanes added pairwise; here each of those lanes is a register whose lanes are rows,
//! the same operations in the same order.

use std::arch::aarch64::*;

use super::q40x8::{weights, Fifth, Perm8};
use super::q80x8::quad_sums;
use super::simd::{add_pairwise, f16x4, rows_less, split_block};
use crate::arch::tags::{Q4_0, Q5_0};
use crate::q40x8::q4k::{group_sb, sub_bytes, SUBS};
use crate::quant::QActs16;

/// Offset of the packed scales in a group super-block.
const SCALES: usize = 32;

/// Byte `J % 4` of each u32 lane of `v` (a scale or min of sub-block `J`), as f32.
#[inline(always)]
fn byte_of<const J: usize>(v: uint32x4_t) -> float32x4_t {
    // SAFETY: NEON is baseline on aarch64.
    unsafe {
        let b = match J % 4 {
            0 => vandq_u32(v, vdupq_n_u32(0xFF)),
            1 => vandq_u32(vshrq_n_u32::<8>(v), vdupq_n_u32(0xFF)),
            2 => vandq_u32(vshrq_n_u32::<16>(v), vdupq_n_u32(0xFF)),
            _ => vshrq_n_u32::<24>(v),
        };
        vcvtq_f32_u32(b)
    }
}

/// Four rows' 6-bit scales and mins (their packed words `u0`, `u1`, `u2`): scales of sub-blocks
/// 0-3 and 4-7, mins of 0-3 and 4-7, a byte each per row lane (`scale_min_k4`).
#[inline(always)]
fn unpack(u0: uint32x4_t, u1: uint32x4_t, u2: uint32x4_t) -> [uint32x4_t; 4] {
    // SAFETY: NEON is baseline on aarch64.
    unsafe {
        let (k1, k2, k3) = (
            vdupq_n_u32(0x3f3f_3f3f),
            vdupq_n_u32(0x0f0f_0f0f),
            vdupq_n_u32(0x0303_0303),
        );
        let top = |u: uint32x4_t| vshlq_n_u32::<4>(vandq_u32(vshrq_n_u32::<6>(u), k3));
        [
            vandq_u32(u0, k1),
            vorrq_u32(vandq_u32(u2, k2), top(u0)),
            vandq_u32(u1, k1),
            vorrq_u32(vandq_u32(vshrq_n_u32::<4>(u2), k2), top(u1)),
        ]
    }
}

/// The dots of one Q4_K (Q5_K: `FIVE`) group's 8 rows (module docs) with each of `T` tokens'
/// `xq`, whose splits are permuted as `p`: each sub-block's weights unpacked and the scales
/// decoded once for the `T` tokens, each token's operations those of one token alone (the same
/// bits).
///
/// # Safety
/// `dotprod` present. Always inlined into `group_dp`, which both public forms call.
#[inline(always)]
unsafe fn group_body<const FIVE: bool, const T: usize>(
    group: &[u8],
    p: [&Perm8; T],
    xq: [&QActs16; T],
) -> [[f32; 8]; T] {
    let nsb = xq[0].d.len() / 8;
    let (gsb, sub) = (group_sb(FIVE), sub_bytes(FIVE));
    assert!(group.len() >= nsb * gsb);
    for t in 0..T {
        assert!(
            xq[t].d.len() == 8 * nsb
                && p[t].hi.len() >= nsb * 256
                && p[t].lo.len() >= nsb * 256
                && xq[t].s.len() >= nsb * 8
        );
    }
    // SAFETY: NEON is baseline on aarch64.
    let (mut acc, mut min) =
        unsafe { ([[[vdupq_n_f32(0.0); 2]; 4]; T], [[vdupq_n_f32(0.0); 2]; T]) };
    for sb in 0..nsb {
        // SAFETY: sb < nsb: group super-block sb (`gsb` bytes at `gsb sb`), each token's permuted
        // bytes and its activations' scales and sums of blocks 8 sb..8 sb + 8 are in bounds
        // (asserted above); dotprod per contract.
        unsafe {
            let gs = group.as_ptr().add(sb * gsb);
            let dx: [_; T] = std::array::from_fn(|t| xq[t].d.as_ptr().add(8 * sb));
            let dh = vld1q_u16(gs as *const u16);
            let mh = vld1q_u16(gs.add(16) as *const u16);
            let d = [f16x4(vget_low_u16(dh)), f16x4(vget_high_u16(dh))];
            let dmin = [f16x4(vget_low_u16(mh)), f16x4(vget_high_u16(mh))];
            // Per half (rows 0-3, 4-7): the scales and mins of the sub-blocks, a byte a row lane.
            let packed: [[uint32x4_t; 4]; 2] = std::array::from_fn(|h| {
                let w = |i: usize| vld1q_u32(gs.add(SCALES + 32 * i + 16 * h) as *const u32);
                unpack(w(0), w(1), w(2))
            });
            // The min term, lanes k = 0..4 of the split rows' vector, then added pairwise.
            for h in 0..2 {
                let [_, _, m_lo, m_hi] = packed[h];
                let m = [
                    byte_of::<0>(m_lo),
                    byte_of::<1>(m_lo),
                    byte_of::<2>(m_lo),
                    byte_of::<3>(m_lo),
                    byte_of::<0>(m_hi),
                    byte_of::<1>(m_hi),
                    byte_of::<2>(m_hi),
                    byte_of::<3>(m_hi),
                ];
                for t in 0..T {
                    let sx = xq[t].s.as_ptr().add(8 * sb);
                    let v: [float32x4_t; 4] = std::array::from_fn(|k| {
                        vfmaq_f32(
                            vmulq_n_f32(vmulq_f32(m[k], dmin[h]), *sx.add(k)),
                            vmulq_f32(m[k + 4], dmin[h]),
                            vdupq_n_f32(*sx.add(k + 4)),
                        )
                    });
                    min[t][h] = vaddq_f32(min[t][h], add_pairwise(v));
                }
            }
            macro_rules! sub {
                ($j:literal) => {{
                    let b = 8 * sb + $j;
                    let hl: [_; T] = std::array::from_fn(|t| {
                        split_block(p[t].hi.as_ptr().add(32 * b), p[t].lo.as_ptr().add(32 * b))
                    });
                    let q = gs.add(SUBS + sub * $j);
                    let dxj: [f32; T] = std::array::from_fn(|t| *dx[t].add($j));
                    for h in 0..2 {
                        let mut w = [vdupq_n_s8(0); 8];
                        let none = vdupq_n_s8(0);
                        // Q4_K's weights take no fifth bits (its unused shifts are dropped).
                        let h5 = Fifth::new(if FIVE {
                            vld1q_u32(q.add(128 + 16 * h) as *const u32)
                        } else {
                            vdupq_n_u32(0)
                        });
                        for k in 0..4 {
                            let v = vld1q_u8(q.add(32 * k + 16 * h));
                            [w[2 * k], w[2 * k + 1]] = if FIVE {
                                weights::<Q5_0>(v, h5.of(k), none)
                            } else {
                                weights::<Q4_0>(v, h5.of(k), none)
                            };
                        }
                        let sc = if $j < 4 { packed[h][0] } else { packed[h][1] };
                        let dsc = vmulq_f32(byte_of::<$j>(sc), d[h]);
                        for t in 0..T {
                            let (hv, lv) = hl[t];
                            let isum = quad_sums::<false>(w, hv, lv, vdupq_n_s32(0));
                            let scale = vmulq_n_f32(dsc, dxj[t]);
                            let a = &mut acc[t][$j % 4][h];
                            *a = vfmaq_f32(*a, vcvtq_f32_s32(isum), scale);
                        }
                    }
                }};
            }
            sub!(0);
            sub!(1);
            sub!(2);
            sub!(3);
            sub!(4);
            sub!(5);
            sub!(6);
            sub!(7);
        }
    }
    std::array::from_fn(|t| rows_less(&acc[t], min[t]))
}

#[target_feature(enable = "neon,dotprod")]
unsafe fn group_dp<const FIVE: bool, const T: usize>(
    group: &[u8],
    p: [&Perm8; T],
    xq: [&QActs16; T],
) -> [[f32; 8]; T] {
    // SAFETY: dotprod present per this function's contract.
    unsafe { group_body::<FIVE, T>(group, p, xq) }
}

/// The dots of the 8 rows of one Q4_K group (Q5_K where `FIVE`; `xq.d.len() / 8` group
/// super-blocks at `group`) with `xq`, whose split
/// ([`Split16::new`](super::matvec_split::Split16::new)) is permuted as `p` ([`Perm8::new`]). The
/// weights are unsigned and the `lo` dot `udot`, so `i8mm` adds nothing here.
///
/// # Safety
/// The CPU must support `dotprod`.
pub(crate) unsafe fn q4kx8_group_neon<const FIVE: bool>(
    group: &[u8],
    p: &Perm8,
    xq: &QActs16,
) -> [f32; 8] {
    // SAFETY: dotprod is present per this function's contract.
    unsafe { group_dp::<FIVE, 1>(group, [p], [xq])[0] }
}

/// [`q4kx8_group_neon`] of each of `T` tokens, the group read and unpacked once for all: each
/// token's results its own call's bits.
///
/// # Safety
/// The CPU must support `dotprod`.
pub(crate) unsafe fn q4kx8_group_neon_tokens<const FIVE: bool, const T: usize>(
    group: &[u8],
    p: [&Perm8; T],
    xq: [&QActs16; T],
) -> [[f32; 8]; T] {
    // SAFETY: dotprod is present per this function's contract.
    unsafe { group_dp::<FIVE, T>(group, p, xq) }
}
