//! Dequantization: the `Q8_0`/`Q4_0`/`Q4_1`/`Q5_0`/`Q5_1` block unpackers shared by the
//! other families (to f32 and to i8 lanes), and `dequant_row` (every format).

use std::arch::aarch64::*;

use super::hybrid::dequant_hybrid;
use super::kquant::dequant_superblock;
use super::simd::{f16_at, f16x4, iq4nl_values, load_u8x16, q5_quants, s8_to_f32, u8_to_f32};
use crate::arch::tags::{
    block_bytes, has_min, quants_offset, BF16, F16, F32, IQ4_NL, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
};
use crate::WeightFormat;

/// Eight elements of a float-format row of tag `F` (`c`: their 32, 16 or 16 bytes of F32, F16 or
/// BF16) as two f32x4, exactly (F16 by `fcvtl`, BF16 shifted into the high half of each f32).
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn float8<const F: u8>(c: &[u8]) -> [float32x4_t; 2] {
    match F {
        F32 => [
            vreinterpretq_f32_u8(load_u8x16(&c[..16])),
            vreinterpretq_f32_u8(load_u8x16(&c[16..32])),
        ],
        F16 => {
            let v = vreinterpretq_u16_u8(load_u8x16(c));
            [f16x4(vget_low_u16(v)), f16x4(vget_high_u16(v))]
        }
        _ => {
            let v = vreinterpretq_u16_u8(load_u8x16(c));
            [
                vreinterpretq_f32_u32(vshll_n_u16::<16>(vget_low_u16(v))),
                vreinterpretq_f32_u32(vshll_high_n_u16::<16>(v)),
            ]
        }
    }
}

/// A float-format row (tag `F`) into `dst`: eight elements at a time by [`float8`], the rest by
/// the scalar reference (the same exact values).
#[target_feature(enable = "neon")]
pub(super) fn dequant_float<const F: u8>(src: &[u8], dst: &mut [f32]) {
    let eb = block_bytes(F);
    let n8 = dst.len() / 8 * 8;
    for (c, o) in src[..n8 * eb]
        .chunks_exact(8 * eb)
        .zip(dst.chunks_exact_mut(8))
    {
        let [lo, hi] = float8::<F>(c);
        // SAFETY: `o` is exactly 8 writable f32.
        unsafe {
            vst1q_f32(o.as_mut_ptr(), lo);
            vst1q_f32(o.as_mut_ptr().add(4), hi);
        }
    }
    let format = match F {
        F32 => WeightFormat::F32,
        F16 => WeightFormat::F16,
        _ => WeightFormat::BF16,
    };
    crate::scalar::dequant_row(format, &src[n8 * eb..], &mut dst[n8..]);
}

/// Dequantizes one block (`blk` starts at the block) into 8 × f32x4.
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn dequant_block<const F: u8>(blk: &[u8]) -> [float32x4_t; 8] {
    let d = f16_at(blk, 0);
    let (a, b) = match F {
        Q8_0 => (
            s8_to_f32(vreinterpretq_s8_u8(load_u8x16(&blk[2..18]))),
            s8_to_f32(vreinterpretq_s8_u8(load_u8x16(&blk[18..34]))),
        ),
        Q4_0 => {
            let raw = load_u8x16(&blk[2..18]);
            let eight = vdupq_n_s8(8);
            (
                s8_to_f32(vsubq_s8(
                    vreinterpretq_s8_u8(vandq_u8(raw, vdupq_n_u8(0x0F))),
                    eight,
                )),
                s8_to_f32(vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8::<4>(raw)), eight)),
            )
        }
        Q5_0 => {
            let (lo, hi) = q5_quants(&blk[quants_offset(F)..]);
            let sixteen = vdupq_n_s8(16);
            (
                s8_to_f32(vsubq_s8(vreinterpretq_s8_u8(lo), sixteen)),
                s8_to_f32(vsubq_s8(vreinterpretq_s8_u8(hi), sixteen)),
            )
        }
        Q5_1 => {
            let (lo, hi) = q5_quants(&blk[quants_offset(F)..]);
            (u8_to_f32(lo), u8_to_f32(hi))
        }
        IQ4_NL => {
            let (lo, hi) = iq4nl_values(&blk[2..18]);
            (s8_to_f32(lo), s8_to_f32(hi))
        }
        _ => {
            let raw = load_u8x16(&blk[4..20]);
            (
                u8_to_f32(vandq_u8(raw, vdupq_n_u8(0x0F))),
                u8_to_f32(vshrq_n_u8::<4>(raw)),
            )
        }
    };
    let mut out = [vdupq_n_f32(0.0); 8];
    if has_min(F) {
        let m = vdupq_n_f32(f16_at(blk, 2));
        for (o, v) in out.iter_mut().zip(a.iter().chain(&b)) {
            *o = vfmaq_n_f32(m, *v, d);
        }
    } else {
        for (o, v) in out.iter_mut().zip(a.iter().chain(&b)) {
            *o = vmulq_n_f32(*v, d);
        }
    }
    out
}

/// The two 16-lane i8 halves of weight block `blk` (Q4_1: unsigned nibbles,
/// Q5_1: unsigned 5-bit quants; Q4_0 offset by -8, Q5_0 by -16; IQ4_NL its
/// table values).
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn weights_i8<const F: u8>(blk: &[u8]) -> (int8x16_t, int8x16_t) {
    match F {
        Q8_0 => (
            vreinterpretq_s8_u8(load_u8x16(&blk[2..18])),
            vreinterpretq_s8_u8(load_u8x16(&blk[18..34])),
        ),
        Q4_0 => {
            let raw = load_u8x16(&blk[2..18]);
            let eight = vdupq_n_s8(8);
            (
                vsubq_s8(vreinterpretq_s8_u8(vandq_u8(raw, vdupq_n_u8(0x0F))), eight),
                vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8::<4>(raw)), eight),
            )
        }
        Q5_0 => {
            let (lo, hi) = q5_quants(&blk[quants_offset(F)..]);
            let sixteen = vdupq_n_s8(16);
            (
                vsubq_s8(vreinterpretq_s8_u8(lo), sixteen),
                vsubq_s8(vreinterpretq_s8_u8(hi), sixteen),
            )
        }
        Q5_1 => {
            let (lo, hi) = q5_quants(&blk[quants_offset(F)..]);
            (vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi))
        }
        IQ4_NL => iq4nl_values(&blk[2..18]),
        _ => {
            let raw = load_u8x16(&blk[4..20]);
            (
                vreinterpretq_s8_u8(vandq_u8(raw, vdupq_n_u8(0x0F))),
                vreinterpretq_s8_u8(vshrq_n_u8::<4>(raw)),
            )
        }
    }
}

#[target_feature(enable = "neon")]
fn dequant_q<const F: u8>(src: &[u8], dst: &mut [f32]) {
    for (blk, out) in src
        .chunks_exact(block_bytes(F))
        .zip(dst.chunks_exact_mut(32))
    {
        let w = dequant_block::<F>(blk);
        for (o, v) in out.chunks_exact_mut(4).zip(&w) {
            // SAFETY: `o` is exactly 4 writable f32.
            unsafe { vst1q_f32(o.as_mut_ptr(), *v) };
        }
    }
}

/// Dequantizes a row (`src` has exactly `format.row_bytes(dst.len())` bytes).
#[inline]
#[target_feature(enable = "neon")]
pub(crate) fn dequant_row(format: WeightFormat, src: &[u8], dst: &mut [f32]) {
    match format {
        WeightFormat::Q8_0 => dequant_q::<Q8_0>(src, dst),
        WeightFormat::Q4_0 => dequant_q::<Q4_0>(src, dst),
        WeightFormat::Q4_1 => dequant_q::<Q4_1>(src, dst),
        WeightFormat::Q5_0 => dequant_q::<Q5_0>(src, dst),
        WeightFormat::Q5_1 => dequant_q::<Q5_1>(src, dst),
        WeightFormat::IQ4_NL => dequant_q::<IQ4_NL>(src, dst),
        WeightFormat::F32 => dequant_float::<F32>(src, dst),
        WeightFormat::F16 => dequant_float::<F16>(src, dst),
        WeightFormat::BF16 => dequant_float::<BF16>(src, dst),
        WeightFormat::Q2_K
        | WeightFormat::Q3_K
        | WeightFormat::Q4_K
        | WeightFormat::Q5_K
        | WeightFormat::Q6_K
        | WeightFormat::IQ4_XS => {
            for (blk, out) in src
                .chunks_exact(format.block_bytes())
                .zip(dst.chunks_exact_mut(256))
            {
                dequant_superblock(format, blk, out);
            }
        }
        WeightFormat::I4Hybrid { outliers_per_row } => {
            dequant_hybrid(usize::from(outliers_per_row), src, dst)
        }
    }
}
