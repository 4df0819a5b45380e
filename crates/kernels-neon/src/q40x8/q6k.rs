//! Q6_K rows repacked eight at a time: the layout ([`repack`]), which `arch/x86_64/q6kx8.rs` and
//! `arch/aarch64/q6kx8.rs` read, and its scalar reference ([`group_scalar`]) for the other paths.
//!
//! A group super-block (256 columns of 8 rows, [`GROUP_SB`] bytes as the file's 8 blocks) holds
//! the rows' f16 `d` (16 bytes), then per group `G` of 16 columns the 8 rows' signed scales (8
//! bytes at `16 + 8 G`), then per sub-block `j` of 32 columns ([`SUB`] bytes at `144 + 192 j`) the
//! low 4 bits of its 8 rows' quants as a Q4_0 group block's nibbles (4 registers of 32 bytes,
//! register `k` holding weights `8k..8k + 8` of row `r` in bytes `4r..4r + 4`: byte `i` the low
//! nibble of weight `8k + [0, 4, 1, 5][i]` and the high one of `8k + [2, 6, 3, 7][i]`, rows 0-3 in
//! the first 16 bytes), then their high 2 bits in 2 registers of 32 bytes: register `kk`'s byte at
//! the same place as the nibbles' holds, from bit 0, those of the low and the high nibble of
//! register `2 kk`, then of register `2 kk + 1`.

use super::{Q40x8, GROUP};
use crate::q40x8::{CopiedRows, ZeroedBytes};
use crate::quant::QActs16;
use crate::QMatrix;

/// Bytes of a group super-block.
pub(crate) const GROUP_SB: usize = 1680;
/// Offset of the first sub-block in a group super-block.
pub(crate) const SUBS: usize = 144;
/// Bytes of a sub-block (32 columns of 8 rows).
pub(crate) const SUB: usize = 192;
/// The weight of 8 a low nibble of byte `i` of a row's four holds (`8k +` it), and a high one.
const LOW: [usize; 4] = [0, 4, 1, 5];
const HIGH: [usize; 4] = [2, 6, 3, 7];

/// The 256 quants (0..=63) of a Q6_K block (ggml's `dequantize_row_q6_K` order).
fn quants(blk: &[u8]) -> [u8; 256] {
    let (ql, qh) = (&blk[..128], &blk[128..192]);
    let mut q = [0u8; 256];
    for n in 0..2 {
        let (ql, qh) = (&ql[64 * n..], &qh[32 * n..]);
        for l in 0..32 {
            let e = 128 * n + l;
            q[e] = (ql[l] & 0x0F) | ((qh[l] & 3) << 4);
            q[e + 32] = (ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4);
            q[e + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
            q[e + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
        }
    }
    q
}

/// Where row `r`'s byte `i` of register `k` (32 bytes each) of a sub-block lies in it.
const fn at(k: usize, r: usize, i: usize) -> usize {
    32 * k + 16 * (r / 4) + 4 * (r % 4) + i
}

/// `w` (Q6_K) repacked (module docs).
pub(super) fn repack(w: &QMatrix<'_>, mem: (ZeroedBytes<'_>, CopiedRows<'_>)) -> Q40x8 {
    Q40x8::pack_groups(w, GROUP_SB, mem, |r, blk, gs| {
        gs[2 * r..2 * r + 2].copy_from_slice(&blk[208..210]);
        for g in 0..16 {
            gs[16 + 8 * g + r] = blk[192 + g];
        }
        let q = quants(blk);
        for j in 0..8 {
            let (x, sub) = (&q[32 * j..32 * j + 32], &mut gs[SUBS + SUB * j..][..SUB]);
            for i in 0..4 {
                for k in 0..4 {
                    let (lo, hi) = (x[8 * k + LOW[i]], x[8 * k + HIGH[i]]);
                    sub[at(k, r, i)] = (lo & 0x0F) | (hi & 0x0F) << 4;
                }
                for kk in 0..2 {
                    let two = |k: usize| x[8 * k + LOW[i]] >> 4 | (x[8 * k + HIGH[i]] >> 4) << 2;
                    sub[128 + at(kk, r, i)] = two(2 * kk) | two(2 * kk + 1) << 4;
                }
            }
        }
    })
}

/// A Q6_K group's 8 dots in scalar code: per row, super-block and group of 16, the exact sum of
/// `(q - 32) x` times `(d * sc) * d_x`, in order.
pub(super) fn group_scalar(group: &[u8], xq: &QActs16) -> [f32; GROUP] {
    let mut y = [0f32; GROUP];
    for (sb, gs) in group.chunks_exact(GROUP_SB).enumerate() {
        for (r, yr) in y.iter_mut().enumerate() {
            let d = half::f16::from_le_bytes([gs[2 * r], gs[2 * r + 1]]).to_f32();
            for j in 0..8 {
                let sub = &gs[SUBS + SUB * j..][..SUB];
                let b = 8 * sb + j;
                let x = &xq.qs[32 * b..32 * b + 32];
                let mut isum = [0i32; 2];
                for k in 0..4 {
                    for i in 0..4 {
                        let v = sub[at(k, r, i)];
                        let h = sub[128 + at(k / 2, r, i)] >> (4 * (k % 2));
                        let lo = (v & 0x0F) | (h & 3) << 4;
                        let hi = (v >> 4) | ((h >> 2) & 3) << 4;
                        isum[k / 2] += (i32::from(lo) - 32) * i32::from(x[8 * k + LOW[i]])
                            + (i32::from(hi) - 32) * i32::from(x[8 * k + HIGH[i]]);
                    }
                }
                for (half, s) in isum.iter().enumerate() {
                    let sc = f32::from(gs[16 + 8 * (2 * j + half) + r] as i8);
                    *yr += sc * d * xq.d[b] * *s as f32;
                }
            }
        }
    }
    y
}
