//! The kernel of Q6_K rows repacked eight at a time ([`crate::Q40x8`], the layout of
//! `q40x8/q6k.rs`) on `dotprod` CPUs, 16-bit activations
//! ([`Precision::Fast`](crate::Precision::Fast)) split as [`Split16`] splits them, one token.
//!
//! Per sub-block of 32 columns and four rows, 4 loads of nibbles and 2 of high bits make 8 weight
//! vectors (0..=63, unsigned; the high bits put at bits 4-5 by one shift and one bit select), whose
//! by-element dots with the permuted split activations ([`super::q40x8`]'s order) give each row
//! lane the exact sums of the sub-block's two groups of 16: `256 sdot(q, hi) + udot(q, lo)`.
//!
//! Results: the split rows' (`kquant_split.rs`'s `q6k_block`, `offset_term` and `dot_row`) bit
//! for bit. Those keep per row four lanes `l` of `(d * sc_G) * d_x` FMAs over the groups `G` with
//! `G % 4 = l`, in order, and a second four of the offset's `scale_G * sum16_G`, added pairwise
//! (`(a0 + a1) + (a2 + a3)`), times 32, summed over super-blocks and subtracted at the end; here
//! each such lane is a register whose lanes are rows, the same operations in the same order.

use std::arch::aarch64::*;

use super::matvec_split::Split16;
use super::q40x8::Perm8;
use super::q80x8::{sdot_at, udot_at};
use super::simd::{add_pairwise, f16x4, rows_less, split_block};
use crate::q40x8::q6k::{GROUP_SB, SUB, SUBS};
use crate::quant::QActs16;

/// The exact sums of one group of 16 columns of four rows: its 4 weight vectors `w` (register `k`'s
/// low and high nibbles, then `k + 1`'s) with the 16 split activations `h`, `l` (by element).
///
/// # Safety
/// `dotprod` present. Always inlined into callers with it.
#[inline(always)]
unsafe fn group_sums(w: [uint8x16_t; 4], h: int8x16_t, l: uint8x16_t) -> int32x4_t {
    // SAFETY: dotprod present per contract; NEON is baseline.
    unsafe {
        let s = w.map(|v| vreinterpretq_s8_u8(v));
        let a = sdot_at::<1>(sdot_at::<0>(vdupq_n_s32(0), s[0], h), s[1], h);
        let a = sdot_at::<3>(sdot_at::<2>(a, s[2], h), s[3], h);
        let u = vshlq_n_s32::<8>(a);
        let u = udot_at::<1>(udot_at::<0>(u, w[0], l), w[1], l);
        udot_at::<3>(udot_at::<2>(u, w[2], l), w[3], l)
    }
}

/// The 8 weight vectors of one half (four rows) of a sub-block at `q`: per register `k`, its low
/// and high nibbles with their high bits.
///
/// # Safety
/// The sub-block's [`SUB`] bytes readable at `q`; `h` is 0 or 1.
#[inline(always)]
unsafe fn weights(q: *const u8, h: usize) -> [uint8x16_t; 8] {
    // SAFETY: the loads are within the sub-block per contract; NEON is baseline.
    unsafe {
        let (nib, top) = (vdupq_n_u8(0x0F), vdupq_n_u8(0x30));
        let mut w = [vdupq_n_u8(0); 8];
        for kk in 0..2 {
            let hb = vld1q_u8(q.add(128 + 32 * kk + 16 * h));
            let v = [
                vld1q_u8(q.add(64 * kk + 16 * h)),
                vld1q_u8(q.add(64 * kk + 32 + 16 * h)),
            ];
            // Register 2 kk: the high bits at 0-1 and 2-3; 2 kk + 1: at 4-5 and 6-7.
            w[4 * kk] = vbslq_u8(top, vshlq_n_u8::<4>(hb), vandq_u8(v[0], nib));
            w[4 * kk + 1] = vbslq_u8(top, vshlq_n_u8::<2>(hb), vshrq_n_u8::<4>(v[0]));
            w[4 * kk + 2] = vbslq_u8(top, hb, vandq_u8(v[1], nib));
            w[4 * kk + 3] = vbslq_u8(top, vshrq_n_u8::<2>(hb), vshrq_n_u8::<4>(v[1]));
        }
        w
    }
}

/// The dots of one Q6_K group's 8 rows (module docs) with each of `T` tokens' `xq`, split as `s`
/// and permuted as `p`: each half sub-block's weights unpacked once for the `T` tokens, each
/// token's operations those of one token alone (the same bits).
///
/// # Safety
/// `dotprod` present. Always inlined into `group_dp`, which both public forms call.
#[inline(always)]
unsafe fn group_body<const T: usize>(
    group: &[u8],
    s: [&Split16; T],
    p: [&Perm8; T],
    xq: [&QActs16; T],
) -> [[f32; 8]; T] {
    let nsb = xq[0].d.len() / 8;
    assert!(group.len() >= nsb * GROUP_SB);
    for t in 0..T {
        assert!(
            xq[t].d.len() == 8 * nsb
                && p[t].hi.len() >= nsb * 256
                && p[t].lo.len() >= nsb * 256
                && s[t].sum16.len() >= nsb * 16
        );
    }
    // Per token, lane `G % 4` and half: the scaled sums, and the offset's terms.
    // SAFETY: NEON is baseline on aarch64.
    let (mut acc, mut off) =
        unsafe { ([[[vdupq_n_f32(0.0); 2]; 4]; T], [[vdupq_n_f32(0.0); 2]; T]) };
    for sb in 0..nsb {
        // SAFETY: sb < nsb: group super-block sb ([`GROUP_SB`] bytes at `GROUP_SB sb`), each
        // token's permuted bytes of blocks 8 sb..8 sb + 8, their scales and the sums of 16 of
        // groups 16 sb..16 sb + 16 are in bounds (asserted above); dotprod per contract.
        unsafe {
            let gs = group.as_ptr().add(sb * GROUP_SB);
            let dh = vld1q_u16(gs as *const u16);
            let d = [f16x4(vget_low_u16(dh)), f16x4(vget_high_u16(dh))];
            let sum16: [_; T] = std::array::from_fn(|t| s[t].sum16.as_ptr().add(16 * sb));
            let mut tt = [[[vdupq_n_f32(0.0); 2]; 4]; T];
            // Sub-blocks in pairs, so that each group's lane (`(2 j + g) % 4 = 2 o + g`) is a
            // constant of the unrolled inner loop, as in the one-token kernel.
            for j2 in (0..8).step_by(2) {
                for o in 0..2 {
                    let j = j2 + o;
                    let b = 8 * sb + j;
                    let hl: [_; T] = std::array::from_fn(|t| {
                        split_block(p[t].hi.as_ptr().add(32 * b), p[t].lo.as_ptr().add(32 * b))
                    });
                    let q = gs.add(SUBS + SUB * j);
                    let dx: [f32; T] = std::array::from_fn(|t| *xq[t].d.get_unchecked(b));
                    // The two groups' scales, rows 0-3 and 4-7: `d * sc`.
                    let scf: [[float32x4_t; 2]; 2] = std::array::from_fn(|g| {
                        let sc = vmovl_s8(vld1_s8(gs.add(16 + 8 * (2 * j + g)) as *const i8));
                        [
                            vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(sc))), d[0]),
                            vmulq_f32(vcvtq_f32_s32(vmovl_high_s16(sc)), d[1]),
                        ]
                    });
                    for h in 0..2 {
                        let w = weights(q, h);
                        for g in 0..2 {
                            let lane = 2 * o + g;
                            let wg = [w[4 * g], w[4 * g + 1], w[4 * g + 2], w[4 * g + 3]];
                            for t in 0..T {
                                let (hv, lv) = hl[t];
                                let isum = group_sums(wg, hv[g], lv[g]);
                                let scale = vmulq_n_f32(scf[g][h], dx[t]);
                                let a = &mut acc[t][lane][h];
                                *a = vfmaq_f32(*a, vcvtq_f32_s32(isum), scale);
                                let x16 = vdupq_n_f32(*sum16[t].add(2 * j + g) as f32);
                                tt[t][lane][h] = vfmaq_f32(tt[t][lane][h], scale, x16);
                            }
                        }
                    }
                }
            }
            for t in 0..T {
                for h in 0..2 {
                    let v = tt[t];
                    let sum = add_pairwise([v[0][h], v[1][h], v[2][h], v[3][h]]);
                    off[t][h] = vaddq_f32(off[t][h], vmulq_n_f32(sum, 32.0));
                }
            }
        }
    }
    std::array::from_fn(|t| rows_less(&acc[t], off[t]))
}

#[target_feature(enable = "neon,dotprod")]
unsafe fn group_dp<const T: usize>(
    group: &[u8],
    s: [&Split16; T],
    p: [&Perm8; T],
    xq: [&QActs16; T],
) -> [[f32; 8]; T] {
    // SAFETY: dotprod present per this function's contract.
    unsafe { group_body::<T>(group, s, p, xq) }
}

/// The dots of the 8 rows of one Q6_K group (`xq.d.len() / 8` group super-blocks at `group`) with
/// `xq`, split as `s` ([`Split16::new`]) and permuted as `p` ([`Perm8::new`]). The weights are
/// unsigned and the `lo` dot `udot`, so `i8mm` adds nothing here.
///
/// # Safety
/// The CPU must support `dotprod`.
pub(crate) unsafe fn q6kx8_group_neon(
    group: &[u8],
    s: &Split16,
    p: &Perm8,
    xq: &QActs16,
) -> [f32; 8] {
    // SAFETY: dotprod is present per this function's contract.
    unsafe { group_dp::<1>(group, [s], [p], [xq])[0] }
}

/// [`q6kx8_group_neon`] of each of `T` tokens, the group read and unpacked once for all: each
/// token's results its own call's bits.
///
/// # Safety
/// The CPU must support `dotprod`.
pub(crate) unsafe fn q6kx8_group_neon_tokens<const T: usize>(
    group: &[u8],
    s: [&Split16; T],
    p: [&Perm8; T],
    xq: [&QActs16; T],
) -> [[f32; 8]; T] {
    // SAFETY: dotprod is present per this function's contract.
    unsafe { group_dp::<T>(group, s, p, xq) }
}
