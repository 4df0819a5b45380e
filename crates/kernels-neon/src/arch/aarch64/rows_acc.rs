//! The running dots of `R` rows (1, 2 or 4) of a 32-element block format whose blocks' integer
//! dots a kernel computes (the 16-bit split rows of `matvec_split.rs`, the 8-bit rows of
//! `matvec_int8_rows.rs`): per block, each row's exact integer sum (its four lanes added: `addp`,
//! or `addv` for one row) converted once and multiplied by the row's `d * d_x` in one FMA, the
//! rows in the lanes of one vector; `Q4_1`/`Q5_1`'s `m * s_x` summed beside. The same operations
//! on each row however many rows a pass takes, so `matvec_rows` gives `matvec`'s bits.

use std::arch::aarch64::*;

use super::simd::{f16x4, fma_sums4};
use crate::arch::tags::has_min;

/// The dots of `R` rows of format `F` so far (module docs).
pub(super) struct RowsAcc<const F: u8, const R: usize> {
    /// Lane `k`: row `k`'s dot (one row: `one`).
    acc: float32x4_t,
    one: f32,
    /// Row `k`'s sum of `m * s_x`: lane `k` with four rows, else lane `2k + 1`.
    mins: float32x4_t,
}

impl<const F: u8, const R: usize> RowsAcc<F, R> {
    /// Nothing summed yet.
    #[inline]
    #[target_feature(enable = "neon")]
    pub(super) fn new() -> Self {
        const { assert!(R == 1 || R == 2 || R == 4) };
        RowsAcc {
            acc: vdupq_n_f32(0.0),
            one: 0.0,
            mins: vdupq_n_f32(0.0),
        }
    }

    /// Adds one block: `isum[k]` row `k`'s integer dot in four lanes, `bs[k]` its block bytes
    /// (the f16 `d`, and `m` after it for `Q4_1`/`Q5_1`), `dx` the activations' scale and `dsx`
    /// `[d_x, s_x, d_x, s_x]` (read for `Q4_1`/`Q5_1` only).
    #[inline]
    #[target_feature(enable = "neon")]
    pub(super) fn add(&mut self, isum: &[int32x4_t; R], bs: &[&[u8]; R], dx: f32, dsx: &[f32; 4]) {
        // Lane `k`: row `k`'s `d * d_x` (and its `m * s_x`).
        let d = if has_min(F) {
            // Per pair of rows [d0, m0, d1, m1] * [d_x, s_x, d_x, s_x] (each row's d and m as one
            // 32-bit word; one row alone: its own twice), then the scales and the mins apart.
            let dm = |blk: &[u8]| u32::from_le_bytes([blk[0], blk[1], blk[2], blk[3]]);
            // SAFETY: `dsx` is 4 readable f32.
            let dsx = unsafe { vld1q_f32(dsx.as_ptr()) };
            // A plain loop: a closure here was not inlined (2.5x the instructions).
            let mut f = [dsx; 2];
            for (p, f) in f.iter_mut().enumerate().take(R.div_ceil(2)) {
                let h = vdup_n_u32(dm(bs[2 * p]));
                let h = if R > 1 {
                    vset_lane_u32::<1>(dm(bs[2 * p + 1]), h)
                } else {
                    h
                };
                *f = vmulq_f32(f16x4(vreinterpret_u16_u32(h)), dsx);
            }
            if R == 4 {
                self.mins = vaddq_f32(self.mins, vuzp2q_f32(f[0], f[1]));
                vuzp1q_f32(f[0], f[1])
            } else {
                // Fewer rows: row `k`'s mins in lane `2k + 1` (taken apart once, at the end).
                self.mins = vaddq_f32(self.mins, f[0]);
                if R == 2 {
                    vuzp1q_f32(f[0], f[0])
                } else {
                    f[0]
                }
            }
        } else {
            // [d0, d1, ..] * d_x.
            let d = |blk: &[u8]| u16::from_le_bytes([blk[0], blk[1]]);
            let mut h = vdup_n_u16(d(bs[0]));
            if R > 1 {
                h = vset_lane_u16::<1>(d(bs[1]), h);
            }
            if R == 4 {
                h = vset_lane_u16::<3>(d(bs[R - 1]), vset_lane_u16::<2>(d(bs[R - 2]), h));
            }
            vmulq_n_f32(f16x4(h), dx)
        };
        if R == 1 {
            self.one = (vaddvq_s32(isum[0]) as f32).mul_add(vgetq_lane_f32::<0>(d), self.one);
        } else {
            // Two rows: the four-row sum with each row twice (lanes 0, 1 the rows').
            let s = if R == 4 {
                [isum[0], isum[1], isum[2], isum[3]]
            } else {
                [isum[0], isum[R - 1], isum[0], isum[R - 1]]
            };
            self.acc = fma_sums4(self.acc, s, d);
        }
    }

    /// The `R` rows' dots.
    #[inline]
    #[target_feature(enable = "neon")]
    pub(super) fn finish(self) -> [f32; R] {
        let mut acc = if R == 1 {
            vsetq_lane_f32::<0>(self.one, self.acc)
        } else {
            self.acc
        };
        if has_min(F) {
            let m = if R == 4 {
                self.mins
            } else {
                vuzp2q_f32(self.mins, self.mins)
            };
            acc = vaddq_f32(acc, m);
        }
        let mut y = [0f32; 4];
        // SAFETY: `y` holds 4 writable f32.
        unsafe { vst1q_f32(y.as_mut_ptr(), acc) };
        std::array::from_fn(|k| y[k])
    }
}
