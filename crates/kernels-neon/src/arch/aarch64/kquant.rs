//! K-quant rows (`Q2_K`, `Q3_K`, `Q4_K`, `Q5_K`, `Q6_K`, `IQ4_XS`): super-block
//! dequantization, exact dot, and the integer dot with 8- or 16-bit activations (and its row
//! loop).

use std::arch::aarch64::*;

use super::simd::{
    f16_at, iq4nl_values, iq4xs_scales8, load_f32x4, load_u8x16, q2k_scales_f32, q3k_scales_f32,
    s8_to_f32, store16, u8_to_f32,
};
use super::vector::axpy_f32;
use crate::arch::drivers::axpy_superblocks;
use crate::arch::Rows;
use crate::{QMatrix, WeightFormat};

/// `Q4_K`/`Q5_K` sub-block scales and mins, `d*sc` and `dmin*m`: the scalar reference's
/// operations, with the two f16 read by [`f16_at`] (`fcvtl`, not `half`'s software conversion).
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn q4k_scales(blk: &[u8]) -> ([f32; 8], [f32; 8]) {
    let (d, dmin) = (f16_at(blk, 0), f16_at(blk, 2));
    let mut dl = [0f32; 8];
    let mut ml = [0f32; 8];
    for j in 0..8 {
        let (sc, m) = crate::scalar::scale_min_k4(j, &blk[4..16]);
        dl[j] = d * f32::from(sc);
        ml[j] = dmin * f32::from(m);
    }
    (dl, ml)
}

/// `Q6_K` sub-block scales `d*sc`, as the scalar reference computes them ([`q4k_scales`]).
#[inline]
#[target_feature(enable = "neon")]
fn q6k_scales(blk: &[u8]) -> [f32; 16] {
    let d = f16_at(blk, 208);
    std::array::from_fn(|s| d * f32::from(blk[192 + s] as i8))
}

/// The signed 6-bit quants `q - 32` of Q6_K elements `128n + 32k + 16p ..
/// + 16` (half `n`, quarter `k`, part `p`) of super-block `blk`.
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn q6k_quants16(blk: &[u8], n: usize, k: usize, p: usize) -> int8x16_t {
    let src = load_u8x16(&blk[64 * n + 32 * (k & 1) + 16 * p..]);
    let qh = load_u8x16(&blk[128 + 32 * n + 16 * p..]);
    let m4 = vdupq_n_u8(0x0F);
    let lo = if k < 2 {
        vandq_u8(src, m4)
    } else {
        vshrq_n_u8::<4>(src)
    };
    let hb = vandq_u8(vshlq_u8(qh, vdupq_n_s8(-2 * k as i8)), vdupq_n_u8(3));
    vsubq_s8(
        vreinterpretq_s8_u8(vorrq_u8(lo, vshlq_n_u8::<4>(hb))),
        vdupq_n_s8(32),
    )
}

/// The quants of elements `128n + 32k + 16p .. + 16` (sub-block
/// `8n + 2k + p`) of a `Q2_K` (0..=3) or `Q3_K` (-4..=3) super-block: bits
/// `2k..2k + 2` of `qs[32n + 16p..]` (byte 16, or 32 for Q3_K), Q3_K minus 4
/// where bit `4n + k` of `hmask[16p..]` is clear.
#[inline]
#[target_feature(enable = "neon")]
fn k23_quants16(format: WeightFormat, blk: &[u8], n: usize, k: usize, p: usize) -> int8x16_t {
    let q3 = format == WeightFormat::Q3_K;
    let qoff = if q3 { 32 } else { 16 };
    let qs = load_u8x16(&blk[qoff + 32 * n + 16 * p..]);
    let lo = vandq_u8(vshlq_u8(qs, vdupq_n_s8(-2 * k as i8)), vdupq_n_u8(3));
    if q3 {
        let hm = load_u8x16(&blk[16 * p..]);
        let h = vandq_u8(
            vshlq_u8(hm, vdupq_n_s8(-((4 * n + k) as i8))),
            vdupq_n_u8(1),
        );
        vsubq_s8(
            vreinterpretq_s8_u8(vorrq_u8(lo, vshlq_n_u8::<2>(h))),
            vdupq_n_s8(4),
        )
    } else {
        vreinterpretq_s8_u8(lo)
    }
}

/// The unsigned quants of elements `32j + 16p .. + 16` (sub-block `j`, part
/// `p`) of a `Q4_K` or `Q5_K` super-block: the nibbles of `qs` (byte 16, or
/// 48 for Q5_K), low for even `j`, high for odd, with bit `j` of Q5_K's
/// `qh[16p..16p + 16]` (byte 16) as bit 4.
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn q45k_quants16(format: WeightFormat, blk: &[u8], j: usize, p: usize) -> uint8x16_t {
    let q5 = format == WeightFormat::Q5_K;
    let qoff = if q5 { 48 } else { 16 };
    let raw = load_u8x16(&blk[qoff + 32 * (j / 2) + 16 * p..]);
    let lo = if j % 2 == 0 {
        vandq_u8(raw, vdupq_n_u8(0x0F))
    } else {
        vshrq_n_u8::<4>(raw)
    };
    if q5 {
        let qh = load_u8x16(&blk[16 + 16 * p..]);
        let bit = vandq_u8(vshlq_u8(qh, vdupq_n_s8(-(j as i8))), vdupq_n_u8(1));
        vorrq_u8(lo, vshlq_n_u8::<4>(bit))
    } else {
        lo
    }
}

/// Dequantizes one K-quant super-block (`blk`, a full block) into the
/// first 256 elements of `out`. Same f32 operations as the scalar reference
/// (`d*sc * q - dmin*m` for Q2_K, Q4_K and Q5_K, `(d*sc) * q` for Q3_K and Q6_K,
/// `d*(ls - 32) * v` for IQ4_XS; no FMA), so the results are bit-identical.
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn dequant_superblock(format: WeightFormat, blk: &[u8], out: &mut [f32]) {
    let out = &mut out[..256];
    if format == WeightFormat::Q4_K || format == WeightFormat::Q5_K {
        let (dl, ml) = q4k_scales(blk);
        for j in 0..8 {
            for part in 0..2 {
                let q = q45k_quants16(format, blk, j, part);
                let m = vdupq_n_f32(ml[j]);
                let v = u8_to_f32(q).map(|x| vsubq_f32(vmulq_n_f32(x, dl[j]), m));
                store16(&mut out[32 * j + 16 * part..], v);
            }
        }
    } else if format == WeightFormat::IQ4_XS {
        let dl = iq4xs_scales8(blk);
        for (j, &dlj) in dl.iter().enumerate() {
            let (lo, hi) = iq4nl_values(&blk[8 + 16 * j..]);
            store16(
                &mut out[32 * j..],
                s8_to_f32(lo).map(|x| vmulq_n_f32(x, dlj)),
            );
            store16(
                &mut out[32 * j + 16..],
                s8_to_f32(hi).map(|x| vmulq_n_f32(x, dlj)),
            );
        }
    } else if format == WeightFormat::Q2_K || format == WeightFormat::Q3_K {
        let (dl, ml) = if format == WeightFormat::Q2_K {
            q2k_scales_f32(blk)
        } else {
            (q3k_scales_f32(blk), [0f32; 16])
        };
        for n in 0..2 {
            for k in 0..4 {
                for p in 0..2 {
                    let q = k23_quants16(format, blk, n, k, p);
                    let s = 8 * n + 2 * k + p;
                    let v = if format == WeightFormat::Q2_K {
                        let m = vdupq_n_f32(ml[s]);
                        s8_to_f32(q).map(|x| vsubq_f32(vmulq_n_f32(x, dl[s]), m))
                    } else {
                        s8_to_f32(q).map(|x| vmulq_n_f32(x, dl[s]))
                    };
                    store16(&mut out[16 * s..], v);
                }
            }
        }
    } else {
        let ds = q6k_scales(blk);
        for n in 0..2 {
            for k in 0..4 {
                for p in 0..2 {
                    let q = q6k_quants16(blk, n, k, p);
                    let d = ds[8 * n + 2 * k + p];
                    let v = s8_to_f32(q).map(|x| vmulq_n_f32(x, d));
                    store16(&mut out[128 * n + 32 * k + 16 * p..], v);
                }
            }
        }
    }
}

/// `y += c * dequant(row)` for a K-quant row: each 256-element super-block
/// dequantized on the stack, then FMA'd in with `axpy_f32`.
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn axpy_k(format: WeightFormat, c: f32, row: &[u8], y: &mut [f32]) {
    let dequant = |blk: &[u8], buf: &mut [f32; 256]| dequant_superblock(format, blk, buf);
    axpy_superblocks(format, c, row, y, dequant, |c, buf, ys| {
        axpy_f32(c, buf, ys)
    });
}

/// Exact dot of a K-quant row with f32 `x`: each super-block is dequantized
/// into 256 f32 on the stack, then multiplied with NEON FMAs (4 accumulators).
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn dot_exact_k(format: WeightFormat, row: &[u8], x: &[f32]) -> f32 {
    let mut buf = [0f32; 256];
    let mut acc = [vdupq_n_f32(0.0); 4];
    for (blk, xs) in row
        .chunks_exact(format.block_bytes())
        .zip(x.chunks_exact(256))
    {
        dequant_superblock(format, blk, &mut buf);
        for (i, (w, v)) in buf.chunks_exact(4).zip(xs.chunks_exact(4)).enumerate() {
            acc[i & 3] = vfmaq_f32(acc[i & 3], load_f32x4(w), load_f32x4(v));
        }
    }
    vaddvq_f32(vaddq_f32(
        vaddq_f32(acc[0], acc[1]),
        vaddq_f32(acc[2], acc[3]),
    ))
}

/// Sum of 16 products of i8 weights `w` (widened to i16) with 16 i16
/// activations `x`, in 4 i32 lanes (`smull`/`smlal`).
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn dot16(w: int8x16_t, x: [int16x8_t; 2]) -> int32x4_t {
    let w0 = vmovl_s8(vget_low_s8(w));
    let w1 = vmovl_high_s8(w);
    let s = vmull_s16(vget_low_s16(w0), vget_low_s16(x[0]));
    let s = vmlal_high_s16(s, w0, x[0]);
    let s = vmlal_s16(s, vget_low_s16(w1), vget_low_s16(x[1]));
    vmlal_high_s16(s, w1, x[1])
}

/// Integer dot of a K-quant row (`Q2_K`, `Q3_K`, `Q4_K`, `Q5_K`, `Q6_K` or `IQ4_XS`) with quantized
/// activations `qs` (8- or 16-bit): `dot(q, x, e)` returns the sum of 16 weight quants `q` times
/// the activation quants `x[e..e + 16]` of the super-block's 256 (`x`), in 4 i32 lanes ([`dot16`]
/// or `sdot`); `d`/`s` are the per-32 scales and `d*sum(q)`. The activations and scales are cut
/// per super-block into fixed-size arrays, so that `dot`'s loads at offsets below 256 need no
/// bounds check (with slices of the whole vector each paid its compares and branches). Per
/// sub-block an i32 sum (|q_w| <= 63, |q_x| <= 32767: each lane sums at most 8 products, below
/// 2^24), one convert and one FMA with `(d*sc) * d_x`; the Q4_K/Q5_K min term `(dmin*m) * s_x` is
/// accumulated separately (see the crate docs). Q2_K's min term: the activation sum of each
/// 16-wide sub-block (a dot with ones), FMA'd with `-(dmin*m) * d_x`.
#[inline]
#[target_feature(enable = "neon")]
fn dot_k_int<T>(
    format: WeightFormat,
    row: &[u8],
    qs: &[T],
    d: &[f32],
    s: &[f32],
    dot: impl Fn(int8x16_t, &[T; 256], usize) -> int32x4_t,
) -> f32 {
    let mut acc = vdupq_n_f32(0.0);
    let mut extra = 0f32;
    for (sb, blk) in row
        .chunks_exact(format.block_bytes())
        .enumerate()
        .take(d.len() / 8)
    {
        let x: &[T; 256] = qs[256 * sb..256 * sb + 256].try_into().expect("256 quants");
        let d: &[f32; 8] = d[8 * sb..8 * sb + 8].try_into().expect("8 scales");
        let s: &[f32; 8] = s[8 * sb..8 * sb + 8].try_into().expect("8 sums");
        if format == WeightFormat::Q4_K || format == WeightFormat::Q5_K {
            let (dl, ml) = q4k_scales(blk);
            for j in 0..8 {
                let q = |p| vreinterpretq_s8_u8(q45k_quants16(format, blk, j, p));
                let isum = vaddq_s32(dot(q(0), x, 32 * j), dot(q(1), x, 32 * j + 16));
                acc = vfmaq_n_f32(acc, vcvtq_f32_s32(isum), dl[j] * d[j]);
                extra -= ml[j] * s[j];
            }
        } else if format == WeightFormat::IQ4_XS {
            let dl = iq4xs_scales8(blk);
            for (j, &dlj) in dl.iter().enumerate() {
                let (lo, hi) = iq4nl_values(&blk[8 + 16 * j..]);
                let isum = vaddq_s32(dot(lo, x, 32 * j), dot(hi, x, 32 * j + 16));
                acc = vfmaq_n_f32(acc, vcvtq_f32_s32(isum), dlj * d[j]);
            }
        } else if format == WeightFormat::Q2_K || format == WeightFormat::Q3_K {
            let q2 = format == WeightFormat::Q2_K;
            let (dl, ml) = if q2 {
                q2k_scales_f32(blk)
            } else {
                (q3k_scales_f32(blk), [0f32; 16])
            };
            for n in 0..2 {
                for k in 0..4 {
                    let b = 4 * n + k;
                    for p in 0..2 {
                        let g = 8 * n + 2 * k + p;
                        let e = 32 * b + 16 * p;
                        let isum = dot(k23_quants16(format, blk, n, k, p), x, e);
                        acc = vfmaq_n_f32(acc, vcvtq_f32_s32(isum), dl[g] * d[b]);
                        if q2 {
                            let xsum = dot(vdupq_n_s8(1), x, e);
                            acc = vfmaq_n_f32(acc, vcvtq_f32_s32(xsum), -(ml[g] * d[b]));
                        }
                    }
                }
            }
        } else {
            let ds = q6k_scales(blk);
            for n in 0..2 {
                for p in 0..2 {
                    for k in 0..4 {
                        let q = q6k_quants16(blk, n, k, p);
                        let b = 4 * n + k;
                        let isum = dot(q, x, 32 * b + 16 * p);
                        acc = vfmaq_n_f32(acc, vcvtq_f32_s32(isum), ds[8 * n + 2 * k + p] * d[b]);
                    }
                }
            }
        }
    }
    vaddvq_f32(acc) + extra
}

/// `y[i] = dot_k_int(row sel.get(i))` for a K-quant matrix (no prefetch of
/// listed rows), `qs`, `dot`, `d` and `s` as for [`dot_k_int`].
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn matvec_k_int<T>(
    w: &QMatrix<'_>,
    sel: Rows<'_>,
    qs: &[T],
    d: &[f32],
    s: &[f32],
    y: &mut [f32],
    dot: impl Fn(int8x16_t, &[T; 256], usize) -> int32x4_t,
) {
    let f = w.format();
    for (i, yv) in y.iter_mut().enumerate() {
        *yv = dot_k_int(f, w.row_data(sel.get(i)), qs, d, s, &dot);
    }
}
