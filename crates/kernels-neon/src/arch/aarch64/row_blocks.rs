//! One weight row's blocks of 32 as the integer prompt tiles read them ([`row_blocks`]): the
//! quants as i8, the block's scale, its min term's factors and, for Q2_K, Q3_K and Q6_K (whose
//! scales are per 16), the integer scales of its two halves. The `i8mm` tiles (`tile_mm.rs`) interleave two rows' blocks, the `dotprod`
//! tiles (`tile_dp.rs`) four.

use std::arch::aarch64::*;

use super::dequant::weights_i8;
use super::kquant::{q45k_quants16, q4k_scales, q6k_quants16};
use super::kquant_low_split::k23_quants16;
use super::simd::{f16_at, iq4nl_values, iq4xs_scales8, q3k_scales};
use crate::arch::tags::{block_bytes, has_min, IQ4_NL, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};
use crate::WeightFormat;

/// One row's block of 32: its quants as i8 (elements 0..16, 16..32), the scale `d` (Q4_K/Q5_K
/// `d * sc`, IQ4_XS `d * (ls - 32)`), the min term's factor `m` (Q4_1/Q5_1 the block's min,
/// Q4_K/Q5_K `-dmin * m`, Q2_K the first half's `-dmin * m` and `m2` the second's; else zero)
/// and, for Q2_K, Q3_K and Q6_K, the integer scales `sa`, `sb` of the halves (else zero).
#[derive(Clone, Copy)]
pub(super) struct Blk {
    pub(super) q: (int8x16_t, int8x16_t),
    pub(super) d: f32,
    pub(super) m: f32,
    pub(super) m2: f32,
    pub(super) sa: i32,
    pub(super) sb: i32,
}

/// Whether [`row_blocks`] takes `format`.
pub(super) fn has_row_blocks(format: WeightFormat) -> bool {
    use WeightFormat::*;
    matches!(
        format,
        Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | IQ4_NL | IQ4_XS | Q2_K | Q3_K | Q4_K | Q5_K | Q6_K
    )
}

/// Whether a tile adds the min term `m * s_x` for blocks of `format` (Q2_K: `m * s_x + m2 *
/// s2_x` over the halves).
pub(super) fn takes_min(format: WeightFormat) -> bool {
    use WeightFormat::*;
    matches!(format, Q4_1 | Q5_1 | Q2_K | Q4_K | Q5_K)
}

/// Whether a tile weights each half of a block of `format` by its integer scale.
pub(super) fn takes_halves(format: WeightFormat) -> bool {
    use WeightFormat::*;
    matches!(format, Q2_K | Q3_K | Q6_K)
}

/// `row`'s blocks of 32 (a row of `format`, one of [`has_row_blocks`]'s), appended to `out`:
/// the quants of the 32-element block formats as `weights_i8` gives them (Q4_0/Q5_0 less their
/// offset, Q4_1/Q5_1 unsigned, IQ4_NL its table's values), IQ4_XS's sub-blocks as IQ4_NL blocks,
/// Q4_K/Q5_K's sub-blocks unsigned (0..=15, 0..=31), Q6_K's 32s as `q - 32`, Q2_K's unsigned
/// (0..=3), Q3_K's signed (-4..=3).
#[target_feature(enable = "neon")]
pub(super) fn row_blocks(format: WeightFormat, row: &[u8], out: &mut Vec<Blk>) {
    match format {
        WeightFormat::Q4_0 => blocks::<Q4_0>(row, out),
        WeightFormat::Q4_1 => blocks::<Q4_1>(row, out),
        WeightFormat::Q5_0 => blocks::<Q5_0>(row, out),
        WeightFormat::Q5_1 => blocks::<Q5_1>(row, out),
        WeightFormat::Q8_0 => blocks::<Q8_0>(row, out),
        WeightFormat::IQ4_NL => blocks::<IQ4_NL>(row, out),
        WeightFormat::IQ4_XS => iq4xs_blocks(row, out),
        WeightFormat::Q4_K | WeightFormat::Q5_K => k_blocks(format, row, out),
        WeightFormat::Q6_K => q6k_blocks(row, out),
        WeightFormat::Q2_K => k23_blocks::<false, 84>(row, out),
        WeightFormat::Q3_K => k23_blocks::<true, 110>(row, out),
        _ => panic!("row_blocks: {format:?} has no integer prompt tile"),
    }
}

/// The blocks of a row of a 32-element block format (tag `F`).
#[target_feature(enable = "neon")]
fn blocks<const F: u8>(row: &[u8], out: &mut Vec<Blk>) {
    out.extend(row.chunks_exact(block_bytes(F)).map(|b| Blk {
        q: weights_i8::<F>(b),
        d: f16_at(b, 0),
        m: if has_min(F) { f16_at(b, 2) } else { 0.0 },
        m2: 0.0,
        sa: 0,
        sb: 0,
    }));
}

/// IQ4_XS: each sub-block of 32 an IQ4_NL block with the scale `d * (ls - 32)`.
#[target_feature(enable = "neon")]
fn iq4xs_blocks(row: &[u8], out: &mut Vec<Blk>) {
    for s in row.chunks_exact(136) {
        let d = iq4xs_scales8(s);
        for (b, &d) in d.iter().enumerate() {
            out.push(Blk {
                q: iq4nl_values(&s[8 + 16 * b..8 + 16 * b + 16]),
                d,
                m: 0.0,
                m2: 0.0,
                sa: 0,
                sb: 0,
            });
        }
    }
}

/// Q4_K or Q5_K (`format`): one block per sub-block of 32, the quants unsigned, the scale `d *
/// sc`, the min factor `-dmin * m` (the min term being subtracted).
#[target_feature(enable = "neon")]
fn k_blocks(format: WeightFormat, row: &[u8], out: &mut Vec<Blk>) {
    for b in row.chunks_exact(format.block_bytes()) {
        let (d, m) = q4k_scales(b);
        for j in 0..8 {
            let q = |h: usize| vreinterpretq_s8_u8(q45k_quants16(format, b, j, h));
            out.push(Blk {
                q: (q(0), q(1)),
                d: d[j],
                m: -m[j],
                m2: 0.0,
                sa: 0,
                sb: 0,
            });
        }
    }
}

/// Q6_K: one block per 32 elements, the quants `q - 32`, each half's integer scale, `d`.
#[target_feature(enable = "neon")]
fn q6k_blocks(row: &[u8], out: &mut Vec<Blk>) {
    for b in row.chunks_exact(210) {
        let d = f16_at(b, 208);
        let sc = |s: usize| i32::from(b[192 + s] as i8);
        for n in 0..2 {
            for k in 0..4 {
                out.push(Blk {
                    q: (q6k_quants16(b, n, k, 0), q6k_quants16(b, n, k, 1)),
                    d,
                    m: 0.0,
                    m2: 0.0,
                    sa: sc(8 * n + 2 * k),
                    sb: sc(8 * n + 2 * k + 1),
                });
            }
        }
    }
}

/// Q2_K (`Q3` false, `N` = 84 bytes a super-block) or Q3_K (110): one block per 32 elements
/// `32j..` (`j = 4n + k`, each half's quants by `k23_quants16`, Q3_K's less 4), the integer scales
/// of its halves (Q2_K `sc`, Q3_K `ls - 32`), `d`, and Q2_K's `-dmin * m` of each half.
#[target_feature(enable = "neon")]
fn k23_blocks<const Q3: bool, const N: usize>(row: &[u8], out: &mut Vec<Blk>) {
    for b in row.chunks_exact(N) {
        let b: &[u8; N] = b.try_into().expect("a whole super-block");
        let (d, dmin) = if Q3 {
            (f16_at(b, 108), 0.0)
        } else {
            (f16_at(b, 80), f16_at(b, 82))
        };
        // Q3_K's 16 scales `ls - 32` at once (the decode kernels' unpacking).
        let mut ls = [0i8; 16];
        if Q3 {
            let b3: &[u8; 110] = b[..].try_into().expect("a Q3_K super-block");
            // SAFETY: `ls` is 16 writable i8.
            unsafe { vst1q_s8(ls.as_mut_ptr(), q3k_scales(b3)) };
        }
        // Sub-block `s`'s (16 elements) integer scale and, for Q2_K, its `-dmin * m`.
        let sc = |s: usize| -> (i32, f32) {
            if Q3 {
                (i32::from(ls[s]), 0.0)
            } else {
                (i32::from(b[s] & 0xF), -dmin * f32::from(b[s] >> 4))
            }
        };
        for j in 0..8 {
            let half = |p: usize| {
                let q = vreinterpretq_s8_u8(k23_quants16::<Q3, N>(b, (j / 4, j % 4, p)));
                if Q3 {
                    vsubq_s8(q, vdupq_n_s8(4))
                } else {
                    q
                }
            };
            let ((sa, ma), (sb, mb)) = (sc(2 * j), sc(2 * j + 1));
            out.push(Blk {
                q: (half(0), half(1)),
                d,
                m: ma,
                m2: mb,
                sa,
                sb,
            });
        }
    }
}
