//! The kernel of Q4_0, Q4_1, Q5_0, Q5_1 and IQ4_NL rows repacked eight at a time ([`crate::Q40x8`], in the
//! layout the x86 kernel reads: `arch/x86_64/q40x8.rs`) on `dotprod` CPUs, 16-bit activations
//! ([`Precision::Fast`](crate::Precision::Fast)) split as [`Split16`] splits them, one token.
//!
//! Register `k` of a group block (32 bytes) holds in bytes `4r..4r + 4` row `r`'s weights
//! `8k..8k + 8` as nibbles: byte 0 weights `8k` (low) and `8k + 2`, byte 1 `8k + 4` and `8k + 6`,
//! byte 2 `8k + 1` and `8k + 3`, byte 3 `8k + 5` and `8k + 7`. Its first 16 bytes are rows 0-3,
//! the last 16 rows 4-7. A mask and a shift give each row four weights a byte lane (`8k, 8k + 4,
//! 8k + 1, 8k + 5` and `8k + 2, 8k + 6, 8k + 3, 8k + 7`), which the by-element dots
//! ([`super::q80x8`]'s) multiply by the activations in that order ([`Perm8`], made once per
//! vector): each i32 lane gathers one row's exact block dot, as [`super::q80x8`] does for Q8_0.
//! Q4_0's nibbles go in unsigned with its offset taken back (`-8 * sum(x)`), Q4_1's as they are
//! (its mins' term summed apart and added at the end), Q5_0's and Q5_1's likewise (offset 16) with
//! each fifth bit put at bit 4 of its byte (row `r`'s u32 of fifth bits after the quants, shifted
//! down by `k`: bits 4, 12, 20, 28 are the first vector's, and with each u16's bytes swapped and
//! shifted up by 4 once a quad the second's, where each register `k` rotated its own before; the
//! x86 layout's order, `crate::q40x8`), IQ4_NL's looked up in its table (`tbl`), signed, by
//! `sdot` on the rounded high bytes `hr` and the low bytes as i8 ([`Split16`]). Per row the f32
//! operations are [`super::rows_acc`]'s: bit for bit the split rows' results.

use std::arch::aarch64::*;

use super::matvec_split::{offsets, Split16};
use super::q80x8::quad_sums;
use super::simd::{f16x8_times, split_block};
use crate::arch::tags::{has_min, IQ4_NL};
use crate::q40x8::{group_block, has_fifth, quants_at};
use crate::quant::QActs16;

/// The split activations in the order the unpacked weights take them: per 8 elements `8k..8k +
/// 8`, `[0, 4, 1, 5, 2, 6, 3, 7]`.
pub(crate) struct Perm8 {
    pub(super) hi: Vec<i8>,
    pub(super) lo: Vec<u8>,
    /// [`Split16`]'s rounded high bytes (IQ4_NL's signed values take them).
    pub(super) hr: Vec<i8>,
}

impl Perm8 {
    /// `s` reordered (whole 32-element blocks), 16 bytes a `tbl`.
    pub(crate) fn new(s: &Split16) -> Perm8 {
        let n = s.hi.len().min(s.lo.len()).min(s.hr.len()) / 32 * 32;
        let (mut hi, mut lo, mut hr) = (vec![0i8; n], vec![0u8; n], vec![0i8; n]);
        // SAFETY: each source and destination holds `n` bytes (i8 and u8 alike).
        unsafe {
            permute(s.hi.as_ptr() as *const u8, hi.as_mut_ptr() as *mut u8, n);
            permute(s.lo.as_ptr(), lo.as_mut_ptr(), n);
            permute(s.hr.as_ptr() as *const u8, hr.as_mut_ptr() as *mut u8, n);
        }
        Perm8 { hi, lo, hr }
    }
}

/// The `n` bytes at `src` (a multiple of 16) in [`Perm8`]'s order, at `dst`.
///
/// # Safety
/// `n` bytes readable at `src` and writable at `dst`.
unsafe fn permute(src: *const u8, dst: *mut u8, n: usize) {
    const ORDER: [u8; 16] = [0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15];
    // SAFETY: 16 indices below 16 at `ORDER`; 16 bytes at `src + i` and `dst + i` for each step
    // below `n` (per contract); NEON is baseline on aarch64.
    unsafe {
        let order = vld1q_u8(ORDER.as_ptr());
        for i in (0..n / 16 * 16).step_by(16) {
            vst1q_u8(dst.add(i), vqtbl1q_u8(vld1q_u8(src.add(i)), order));
        }
    }
}

/// The two weight vectors of the 16 bytes `v` (four rows' lanes): nibbles at bits 0-3 and 4-7 of
/// each byte as values (Q4_0, Q4_1: 0..=15; Q5_0, Q5_1: 0..=31 with the fifth bits at bit 4 of
/// each byte of `ha` and `hb`, [`Fifth::of`]; IQ4_NL: its table's, signed).
#[inline(always)]
pub(super) fn weights<const F: u8>(
    v: uint8x16_t,
    [ha, hb]: [uint8x16_t; 2],
    table: int8x16_t,
) -> [int8x16_t; 2] {
    // SAFETY: NEON is baseline on aarch64.
    unsafe {
        let (a, b) = (vandq_u8(v, vdupq_n_u8(0x0F)), vshrq_n_u8::<4>(v));
        if F == IQ4_NL {
            return [vqtbl1q_s8(table, a), vqtbl1q_s8(table, b)];
        }
        if has_fifth(F) {
            // Bit 4 of each byte from `ha` and `hb`, the rest from the nibbles (whose bit 4 is 0).
            let bit = vdupq_n_u8(0x10);
            return [
                vreinterpretq_s8_u8(vbslq_u8(bit, ha, a)),
                vreinterpretq_s8_u8(vbslq_u8(bit, hb, b)),
            ];
        }
        [vreinterpretq_s8_u8(a), vreinterpretq_s8_u8(b)]
    }
}

/// A quad's rows' u32 of fifth bits (`h`) and the same with each u16's bytes swapped and shifted
/// up by 4 (`r`), made once a quad: for register `k` the first vector's bits are `h`'s at `4 + k,
/// 12 + k, 20 + k, 28 + k`, the second's `h`'s at `8 + k, k, 24 + k, 16 + k` (the x86 layout's
/// order), which `r` holds at `4 + k, 12 + k, 20 + k, 28 + k`.
pub(super) struct Fifth {
    h: uint32x4_t,
    r: uint32x4_t,
}

impl Fifth {
    #[inline(always)]
    pub(super) fn new(h: uint32x4_t) -> Fifth {
        // SAFETY: NEON is baseline on aarch64.
        unsafe {
            let swapped = vrev16q_u8(vreinterpretq_u8_u32(h));
            let r = vshlq_n_u16::<4>(vreinterpretq_u16_u8(swapped));
            Fifth {
                h,
                r: vreinterpretq_u32_u16(r),
            }
        }
    }

    /// Register `k`'s fifth bits at bit 4 of each byte (and others elsewhere): the first vector's,
    /// the second's.
    #[inline(always)]
    pub(super) fn of(&self, k: usize) -> [uint8x16_t; 2] {
        // SAFETY: NEON is baseline on aarch64.
        unsafe { [self.h, self.r].map(|v| vreinterpretq_u8_u32(fifth_of(v, k))) }
    }
}

/// Row lanes' u32 `h` shifted down by `k` (0..4).
#[inline(always)]
fn fifth_of(h: uint32x4_t, k: usize) -> uint32x4_t {
    // SAFETY: NEON is baseline on aarch64.
    unsafe {
        match k {
            0 => h,
            1 => vshrq_n_u32::<1>(h),
            2 => vshrq_n_u32::<2>(h),
            _ => vshrq_n_u32::<3>(h),
        }
    }
}

/// The dots of one group's 8 rows of format `F` (module docs) with each of `T` tokens' `xq`,
/// split as `s` and permuted as `p`: each quad's weights unpacked once for the `T` tokens, each
/// token's operations those of one token alone (the same bits).
///
/// # Safety
/// `dotprod` present.
#[target_feature(enable = "neon,dotprod")]
unsafe fn group_body<const F: u8, const T: usize>(
    group: &[u8],
    s: [&Split16; T],
    p: [&Perm8; T],
    xq: [&QActs16; T],
) -> [[f32; 8]; T] {
    let nb = xq[0].d.len();
    let gbb = group_block(F);
    assert!(group.len() >= nb * gbb);
    for t in 0..T {
        assert!(
            xq[t].d.len() == nb
                && p[t].hi.len() >= nb * 32
                && p[t].hr.len() >= nb * 32
                && p[t].lo.len() >= nb * 32
                && xq[t].s.len() >= nb
        );
    }
    // Each block's offset taken back: the unsigned nibbles' (Q4_0's 8, Q5_0's 16: this kernel
    // takes Q5_0 unsigned); IQ4_NL's signed values have none.
    let corr: [Option<&[_]>; T] = std::array::from_fn(|t| offsets::<F>(s[t]));
    assert!(corr.iter().all(|c| c.is_none_or(|c| c.len() >= nb)));
    // SAFETY: NEON is baseline on aarch64; the table is exactly 16 readable i8.
    let (mut acc, mut mins, table) = unsafe {
        (
            [[vdupq_n_f32(0.0); 2]; T],
            [[vdupq_n_f32(0.0); 2]; T],
            vld1q_s8(tensor_types::IQ4NL_VALUES.as_ptr()),
        )
    };
    for b in 0..nb {
        // SAFETY: b < nb: group block b (gbb bytes at gbb b), each token's permuted bytes 32b..32b
        // + 32, d[b], s[b] and the corrections' entry b are in bounds (asserted above); dotprod
        // per contract.
        unsafe {
            let gp = group.as_ptr().add(b * gbb);
            let hl: [_; T] = std::array::from_fn(|t| {
                let h = if F == IQ4_NL { &p[t].hr } else { &p[t].hi };
                split_block(h.as_ptr().add(32 * b), p[t].lo.as_ptr().add(32 * b))
            });
            let corr: [_; T] =
                std::array::from_fn(|t| vdupq_n_s32(corr[t].map_or(0, |c| c.get_unchecked(b)[0])));
            let d: [_; T] = std::array::from_fn(|t| f16x8_times(gp, *xq[t].d.get_unchecked(b)));
            let q = gp.add(quants_at(F));
            for quad in 0..2 {
                let h5 = Fifth::new(if has_fifth(F) {
                    vld1q_u32(q.add(128 + 16 * quad) as *const u32)
                } else {
                    vdupq_n_u32(0)
                });
                let mut w = [vdupq_n_s8(0); 8];
                for k in 0..4 {
                    let v = vld1q_u8(q.add(32 * k + 16 * quad));
                    [w[2 * k], w[2 * k + 1]] = weights::<F>(v, h5.of(k), table);
                }
                for t in 0..T {
                    let (h, l) = hl[t];
                    let isum = if F == IQ4_NL {
                        quad_sums::<true>(w, h, l, corr[t])
                    } else {
                        quad_sums::<false>(w, h, l, corr[t])
                    };
                    acc[t][quad] = vfmaq_f32(acc[t][quad], vcvtq_f32_s32(isum), d[t][quad]);
                }
            }
            if has_min(F) {
                // The mins times the activations' sum, summed apart (`RowsAcc`'s order).
                for t in 0..T {
                    let m = f16x8_times(gp.add(16), *xq[t].s.get_unchecked(b));
                    mins[t] = [vaddq_f32(mins[t][0], m[0]), vaddq_f32(mins[t][1], m[1])];
                }
            }
        }
    }
    let mut y = [[0f32; 8]; T];
    for t in 0..T {
        // SAFETY: 8 writable f32 in `y[t]`; NEON is baseline.
        unsafe {
            let mut a = acc[t];
            if has_min(F) {
                a = [vaddq_f32(a[0], mins[t][0]), vaddq_f32(a[1], mins[t][1])];
            }
            vst1q_f32(y[t].as_mut_ptr(), a[0]);
            vst1q_f32(y[t].as_mut_ptr().add(4), a[1]);
        }
    }
    y
}

/// The dots of the 8 rows of one group of format `F` (Q4_0, Q4_1, Q5_0, Q5_1 or IQ4_NL; `xq.d.len()` group
/// blocks at `group`) with `xq`, split as `s` ([`Split16::new`] of `xq`) and permuted as `p`
/// ([`Perm8::new`] of `s`).
///
/// # Safety
/// The CPU must support `dotprod`.
pub(crate) unsafe fn q40x8_group_neon<const F: u8>(
    group: &[u8],
    s: &Split16,
    p: &Perm8,
    xq: &QActs16,
) -> [f32; 8] {
    // SAFETY: dotprod present per this function's contract.
    let [y] = unsafe { group_body::<F, 1>(group, [s], [p], [xq]) };
    y
}

/// [`q40x8_group_neon`] for `T` tokens at once, each quad of the group unpacked once for all:
/// each token's results its own call's bits.
///
/// # Safety
/// The CPU must support `dotprod`.
pub(crate) unsafe fn q40x8_group_neon_tokens<const F: u8, const T: usize>(
    group: &[u8],
    s: [&Split16; T],
    p: [&Perm8; T],
    xq: [&QActs16; T],
) -> [[f32; 8]; T] {
    // SAFETY: dotprod present per this function's contract.
    unsafe { group_body::<F, T>(group, s, p, xq) }
}
