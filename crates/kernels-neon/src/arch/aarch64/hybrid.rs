//! `I4Hybrid` rows (per-row INT4 plus INT8 outliers): dequantization, exact
//! dot and `axpy` of a column range.

use std::arch::aarch64::*;

use super::simd::{load_f32x4, load_u8x16, s8_to_f32};

/// The 32 INT4 weights `q - 8` of one nibble group (16 bytes, `Q4_0`
/// order) of an I4Hybrid row as 8 × f32x4 (unpacked as in `dequant_block`
/// for `Q4_0`, without the scale).
#[inline]
#[target_feature(enable = "neon")]
fn hybrid_group(g: &[u8]) -> [float32x4_t; 8] {
    let raw = load_u8x16(g);
    let eight = vdupq_n_s8(8);
    let lo = s8_to_f32(vsubq_s8(
        vreinterpretq_s8_u8(vandq_u8(raw, vdupq_n_u8(0x0F))),
        eight,
    ));
    let hi = s8_to_f32(vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8::<4>(raw)), eight));
    [lo[0], lo[1], lo[2], lo[3], hi[0], hi[1], hi[2], hi[3]]
}

/// Dequantizes an I4Hybrid row: `s * (q - 8)` (the scalar reference's
/// operations, bit-identical), then the outliers added by the scalar code.
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn dequant_hybrid(k: usize, src: &[u8], dst: &mut [f32]) {
    let h = crate::scalar::Hybrid::parse(k, dst.len(), src);
    for (g, out) in h.nib.chunks_exact(16).zip(dst.chunks_exact_mut(32)) {
        let w = hybrid_group(g);
        for (o, v) in out.chunks_exact_mut(4).zip(&w) {
            // SAFETY: `o` is exactly 4 writable f32.
            unsafe { vst1q_f32(o.as_mut_ptr(), vmulq_n_f32(*v, h.s)) };
        }
    }
    for (c, v) in h.outliers() {
        dst[c] += h.so * v;
    }
}

/// Exact dot of an I4Hybrid row with f32 `x`: `s * Σ (q - 8) x` with FMAs
/// (4 accumulators), plus the outliers `so * Σ o_j x[c_j]` (scalar).
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn dot_exact_hybrid(k: usize, row: &[u8], x: &[f32]) -> f32 {
    let h = crate::scalar::Hybrid::parse(k, x.len(), row);
    let mut acc = [vdupq_n_f32(0.0); 4];
    for (g, xs) in h.nib.chunks_exact(16).zip(x.chunks_exact(32)) {
        let w = hybrid_group(g);
        for i in 0..8 {
            acc[i & 3] = vfmaq_f32(acc[i & 3], w[i], load_f32x4(&xs[4 * i..]));
        }
    }
    let sum = vaddvq_f32(vaddq_f32(
        vaddq_f32(acc[0], acc[1]),
        vaddq_f32(acc[2], acc[3]),
    ));
    h.s * sum + h.outlier_dot(x)
}

/// `ys += c * W[c0 .. c0 + ys.len()]` for an I4Hybrid row of `cols`
/// elements (`c0` and `ys.len()` multiples of 32): the nibble groups of the
/// range FMA'd with `c * s` (as `axpy_q` for `Q4_0`), then the outliers in
/// the range added by the scalar code.
#[inline]
#[target_feature(enable = "neon")]
pub(crate) fn axpy_hybrid(k: usize, c: f32, row: &[u8], cols: usize, c0: usize, ys: &mut [f32]) {
    let h = crate::scalar::Hybrid::parse(k, cols, row);
    let cs = c * h.s;
    let nib = &h.nib[c0 / 2..(c0 + ys.len()) / 2];
    for (g, out) in nib.chunks_exact(16).zip(ys.chunks_exact_mut(32)) {
        let w = hybrid_group(g);
        for (o, v) in out.chunks_exact_mut(4).zip(&w) {
            let r = vfmaq_n_f32(load_f32x4(o), *v, cs);
            // SAFETY: `o` is exactly 4 writable f32.
            unsafe { vst1q_f32(o.as_mut_ptr(), r) };
        }
    }
    h.outlier_axpy(c, c0, ys);
}
