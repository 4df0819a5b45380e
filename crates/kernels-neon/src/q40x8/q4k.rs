//! Q4_K rows repacked eight at a time: the layout ([`repack`]), which `arch/x86_64/q4kx8.rs` and
//! `arch/aarch64/q4kx8.rs` read, and its scalar reference ([`group_scalar`]) for the other paths.

use super::{four_nibbles, Q40x8, GROUP};
use crate::q40x8::{CopiedRows, ZeroedBytes};
use crate::quant::QActs16;
use crate::QMatrix;

/// Bytes of a group super-block (256 columns of 8 rows, as the file's 8 blocks).
pub(crate) const GROUP_SB: usize = 1152;

/// [`Q40x8::repack`] of a Q4_K matrix: per group super-block the rows' `d`, their `dmin`,
/// the three u32 words of their packed scales (each word of the 8 rows together), then per
/// sub-block of 32 their nibbles as a Q4_0 group block's (`arch/x86_64/q4kx8.rs`).
pub(super) fn repack(w: &QMatrix<'_>, mem: (ZeroedBytes<'_>, CopiedRows<'_>)) -> Q40x8 {
    Q40x8::pack_groups(w, GROUP_SB, mem, |r, blk, gs| {
        gs[2 * r..2 * r + 2].copy_from_slice(&blk[..2]);
        gs[16 + 2 * r..18 + 2 * r].copy_from_slice(&blk[2..4]);
        for i in 0..3 {
            let at = 32 + 32 * i + 4 * r;
            gs[at..at + 4].copy_from_slice(&blk[4 + 4 * i..8 + 4 * i]);
        }
        // Sub-block j: the low (j even) or high nibbles of bytes 32(j / 2)..+32.
        for j in 0..8 {
            for k in 0..4 {
                for h in 0..2 {
                    let at = 16 + 32 * (j / 2) + 8 * k;
                    let x = u64::from_le_bytes(blk[at..at + 8].try_into().expect("8"));
                    let v = four_nibbles(x >> (8 * h), j % 2 == 1);
                    let to = 128 + 128 * j + 32 * k + 4 * r + 2 * h;
                    gs[to..to + 2].copy_from_slice(&v.to_le_bytes());
                }
            }
        }
    })
}

/// A Q4_K group's 8 dots in scalar code: per row and super-block, per sub-block `j` the exact sum
/// times `(d * sc_j) * d_x` less `(dmin * m_j) * s_x`, in order.
pub(super) fn group_scalar(group: &[u8], xq: &QActs16) -> [f32; GROUP] {
    let mut y = [0f32; GROUP];
    let f16_at = |gs: &[u8], at: usize| half::f16::from_le_bytes([gs[at], gs[at + 1]]).to_f32();
    for (sb, gs) in group.chunks_exact(GROUP_SB).enumerate() {
        for (r, yr) in y.iter_mut().enumerate() {
            let (d, dmin) = (f16_at(gs, 2 * r), f16_at(gs, 16 + 2 * r));
            let mut packed = [0u8; 12];
            for i in 0..3 {
                let at = 32 + 32 * i + 4 * r;
                packed[4 * i..4 * i + 4].copy_from_slice(&gs[at..at + 4]);
            }
            for j in 0..8 {
                // llama.cpp's `get_scale_min_k4`.
                let (sc, m) = if j < 4 {
                    (packed[j] & 63, packed[j + 4] & 63)
                } else {
                    (
                        (packed[j + 4] & 0x0F) | ((packed[j - 4] >> 6) << 4),
                        (packed[j + 4] >> 4) | ((packed[j] >> 6) << 4),
                    )
                };
                let b = sb * 8 + j;
                let x = &xq.qs[b * 32..b * 32 + 32];
                let mut isum = 0i32;
                for k in 0..4 {
                    for h in 0..2 {
                        let at = 128 + 128 * j + 32 * k + 4 * r + 2 * h;
                        let v = u16::from_le_bytes([gs[at], gs[at + 1]]);
                        for mm in 0..4 {
                            isum += i32::from((v >> (4 * mm)) & 0x0F)
                                * i32::from(x[8 * k + 2 * mm + h]);
                        }
                    }
                }
                *yr += f32::from(sc) * d * xq.d[b] * isum as f32 - f32::from(m) * dmin * xq.s[b];
            }
        }
    }
    y
}
