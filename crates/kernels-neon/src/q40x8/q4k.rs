//! Q4_K and Q5_K rows repacked eight at a time: the layout ([`repack`]), which
//! `arch/x86_64/q4kx8.rs` and `arch/aarch64/q4kx8.rs` read, and its scalar reference
//! ([`group_scalar`]) for the other paths.
//!
//! A group super-block (256 columns of 8 rows, as the file's 8 blocks) holds the rows' f16 `d`,
//! their f16 `dmin`, the three u32 words of their packed scales (each word of the 8 rows
//! together), then per sub-block of 32 its 8 rows' nibbles as a Q4_0 group block's; Q5_K's
//! sub-blocks end with their 8 rows' fifth bits as a Q5_0 group block's (one u32 a row, bit
//! `fifth_bit_at(e)` that of weight `e`).

use super::{fifth_bit_at, fifth_bits, four_nibbles, Q40x8, GROUP};
use crate::q40x8::{CopiedRows, ZeroedBytes};
use crate::quant::QActs16;
use crate::{QMatrix, WeightFormat};

/// Offset of the first sub-block in a group super-block.
pub(crate) const SUBS: usize = 128;

/// Bytes of a sub-block of 32 columns: the nibbles, and Q5_K's fifth bits (`five`).
pub(crate) const fn sub_bytes(five: bool) -> usize {
    if five {
        160
    } else {
        128
    }
}

/// Bytes of a group super-block: Q4_K's 1152 (as the file's 8 blocks), Q5_K's (`five`) 1408.
pub(crate) const fn group_sb(five: bool) -> usize {
    SUBS + 8 * sub_bytes(five)
}

/// [`Q40x8::repack`] of a Q4_K or Q5_K matrix (module docs).
pub(super) fn repack(w: &QMatrix<'_>, mem: (ZeroedBytes<'_>, CopiedRows<'_>)) -> Q40x8 {
    let five = w.format() == WeightFormat::Q5_K;
    // The file's quants: after the scales (Q5_K: after the fifth bits too).
    let qs = if five { 48 } else { 16 };
    let sub = sub_bytes(five);
    Q40x8::pack_groups(w, group_sb(five), mem, |r, blk, gs| {
        gs[2 * r..2 * r + 2].copy_from_slice(&blk[..2]);
        gs[16 + 2 * r..18 + 2 * r].copy_from_slice(&blk[2..4]);
        for i in 0..3 {
            let at = 32 + 32 * i + 4 * r;
            gs[at..at + 4].copy_from_slice(&blk[4 + 4 * i..8 + 4 * i]);
        }
        // Sub-block j: the low (j even) or high nibbles of bytes 32(j / 2)..+32; Q5_K's fifth
        // bit of its element `e`: bit j of byte `e` of the block's 32.
        for j in 0..8 {
            let s = SUBS + sub * j;
            for k in 0..4 {
                for h in 0..2 {
                    let at = qs + 32 * (j / 2) + 8 * k;
                    let x = u64::from_le_bytes(blk[at..at + 8].try_into().expect("8"));
                    let v = four_nibbles(x >> (8 * h), j % 2 == 1);
                    let to = s + 32 * k + 4 * r + 2 * h;
                    gs[to..to + 2].copy_from_slice(&v.to_le_bytes());
                }
            }
            if five {
                let bits = fifth_bits(|e| u32::from(blk[16 + e] >> j & 1));
                let to = s + 128 + 4 * r;
                gs[to..to + 4].copy_from_slice(&bits.to_le_bytes());
            }
        }
    })
}

/// A Q4_K (Q5_K: `five`) group's 8 dots in scalar code: per row and super-block, per sub-block
/// `j` the exact sum times `(d * sc_j) * d_x` less `(dmin * m_j) * s_x`, in order.
pub(super) fn group_scalar(group: &[u8], xq: &QActs16, five: bool) -> [f32; GROUP] {
    let mut y = [0f32; GROUP];
    let f16_at = |gs: &[u8], at: usize| half::f16::from_le_bytes([gs[at], gs[at + 1]]).to_f32();
    let sub = sub_bytes(five);
    for (sb, gs) in group.chunks_exact(group_sb(five)).enumerate() {
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
                let s = SUBS + sub * j;
                let fifth = if five {
                    let at = s + 128 + 4 * r;
                    u32::from_le_bytes(gs[at..at + 4].try_into().expect("4"))
                } else {
                    0
                };
                let b = sb * 8 + j;
                let x = &xq.qs[b * 32..b * 32 + 32];
                let mut isum = 0i32;
                for k in 0..4 {
                    for h in 0..2 {
                        let at = s + 32 * k + 4 * r + 2 * h;
                        let v = u16::from_le_bytes([gs[at], gs[at + 1]]);
                        for mm in 0..4 {
                            let e = 8 * k + 2 * mm + h;
                            let top = (fifth >> fifth_bit_at(e) & 1) << 4;
                            let q = u32::from((v >> (4 * mm)) & 0x0F) | top;
                            isum += q as i32 * i32::from(x[e]);
                        }
                    }
                }
                *yr += f32::from(sc) * d * xq.d[b] * isum as f32 - f32::from(m) * dmin * xq.s[b];
            }
        }
    }
    y
}
