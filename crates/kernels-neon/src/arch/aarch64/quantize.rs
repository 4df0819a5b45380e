//! Activation quantizers (8- and 16-bit) on NEON: the same f32 operations as the scalar
//! references (`QBlocks::quantize_groups`, `QActs::quantize_halves_scalar`), so the quants are
//! the same on every path: `amax` by `fabs`/`fmaxnm` (NaNs passed over, as `f32::max` does), `x *
//! id` rounded to an integer ties to even by `frintn`, converted exactly by `fcvtzs` (a NaN to 0,
//! as the scalar `as` cast), narrowed by `sqxtn`.

use std::arch::aarch64::*;

use super::simd::load_f32x4;
use crate::quant::{QActs, QActs16, Quant};

/// The largest |x| over `x` (a multiple of 4 long; 0 for none), NaNs passed over.
#[inline]
#[target_feature(enable = "neon")]
fn amax(x: &[f32]) -> f32 {
    let mut m = vdupq_n_f32(0.0);
    for c in x.chunks_exact(4) {
        m = vmaxnmq_f32(m, vabsq_f32(load_f32x4(c)));
    }
    vmaxnmvq_f32(m)
}

/// `max / amax` in every lane, or 0 where `amax` is 0 (as the scalar reference).
#[inline]
#[target_feature(enable = "neon")]
fn inverse(max: f32, amax: f32) -> float32x4_t {
    vdupq_n_f32(if amax > 0.0 { max / amax } else { 0.0 })
}

/// The four floats `x[..4]` times `id`, rounded to integers ties to even, as i32.
#[inline]
#[target_feature(enable = "neon")]
fn rounded(x: &[f32], id: float32x4_t) -> int32x4_t {
    vcvtq_s32_f32(vrndnq_f32(vmulq_f32(load_f32x4(x), id)))
}

/// Quantizes the 16 floats `x[..16]` by `id` into `q[..16]` (`|x * id|` at most 127 and a rounding
/// error: no saturation) and returns the sum of the quants.
#[inline]
#[target_feature(enable = "neon")]
fn sixteen_i8(x: &[f32], id: float32x4_t, q: &mut [i8]) -> i32 {
    let r: [int32x4_t; 4] = [
        rounded(&x[..4], id),
        rounded(&x[4..8], id),
        rounded(&x[8..12], id),
        rounded(&x[12..16], id),
    ];
    let lo = vcombine_s16(vqmovn_s32(r[0]), vqmovn_s32(r[1]));
    let hi = vcombine_s16(vqmovn_s32(r[2]), vqmovn_s32(r[3]));
    let b = vcombine_s8(vqmovn_s16(lo), vqmovn_s16(hi));
    let q = &mut q[..16];
    // SAFETY: `q` has exactly 16 writable bytes (bounds-checked above).
    unsafe { vst1q_s8(q.as_mut_ptr(), b) };
    i32::from(vaddlvq_s8(b))
}

/// Quantizes `x` with one scale per `blocks` 32-element blocks (the last group may be shorter),
/// as `QBlocks::quantize_groups`: `d = amax / 127` over the group, quants `round_ties_even(x *
/// (127 / amax))`, `s = d * sum(q)` per block.
#[target_feature(enable = "neon")]
fn groups_i8(x: &[f32], out: &mut QActs, blocks: usize) {
    let nb = x.len() / 32;
    assert!(out.d.len() >= nb && out.s.len() >= nb && out.qs.len() >= nb * 32);
    for (g, xs) in x[..nb * 32].chunks(32 * blocks).enumerate() {
        let a = amax(xs);
        let (d, id) = (a / 127.0, inverse(127.0, a));
        for (j, blk) in xs.chunks_exact(32).enumerate() {
            let b = g * blocks + j;
            let q = &mut out.qs[32 * b..32 * b + 32];
            let (qa, qb) = q.split_at_mut(16);
            let sum = sixteen_i8(&blk[..16], id, qa) + sixteen_i8(&blk[16..], id, qb);
            out.d[b] = d;
            out.s[b] = d * sum as f32;
        }
    }
}

/// NEON activation quantizer of one scale per 32-block (`QActs::quantize`). Always `true`.
#[target_feature(enable = "neon")]
pub(crate) fn quantize(x: &[f32], out: &mut QActs) -> bool {
    groups_i8(x, out, 1);
    true
}

/// NEON activation quantizer of one scale per 256 values (`QActs::quantize_super`; the last group
/// may be shorter). Always `true`.
#[target_feature(enable = "neon")]
pub(crate) fn quantize_super(x: &[f32], out: &mut QActs) -> bool {
    groups_i8(x, out, 8);
    true
}

/// NEON activation quantizer of one scale per 16 values (`QActs::quantize_halves_scalar`'s f32
/// operations: per half block `d16 = amax / 127`, quants `round_ties_even(x * (127 / amax))`, per
/// block `s = d16[2b] * sum(first 16) + d16[2b + 1] * sum(last 16)`). Always `true`.
#[target_feature(enable = "neon")]
pub(crate) fn quantize_halves(x: &[f32], out: &mut QActs) -> bool {
    let nb = x.len() / 32;
    assert!(out.d16.len() >= 2 * nb && out.s.len() >= nb && out.qs.len() >= nb * 32);
    for (h, xs) in x[..nb * 32].chunks_exact(16).enumerate() {
        let a = amax(xs);
        let sum = sixteen_i8(xs, inverse(127.0, a), &mut out.qs[16 * h..16 * h + 16]);
        let d = a / 127.0;
        out.d16[h] = d;
        // Block `h / 2`'s sum: its first half's product, then the second's added.
        if h % 2 == 0 {
            out.s[h / 2] = d * sum as f32;
        } else {
            out.s[h / 2] += d * sum as f32;
        }
    }
    true
}

/// NEON 16-bit activation quantizer (`QActs16::quantize_scalar`'s f32 operations: `d = amax /
/// MAX`, quants `round_ties_even(x * (MAX / amax))` clamped to `-MAX..=MAX` (`MAX` 32639, `<i16
/// as Quant>::MAX`), `s = d * sum(q)` per 32-block). Always `true`.
#[target_feature(enable = "neon")]
pub(crate) fn quantize16(x: &[f32], out: &mut QActs16) -> bool {
    let nb = x.len() / 32;
    assert!(out.d.len() >= nb && out.s.len() >= nb && out.qs.len() >= nb * 32);
    const MAX: f32 = <i16 as Quant>::MAX;
    let (lo, hi) = (vdupq_n_f32(-MAX), vdupq_n_f32(MAX));
    for (b, blk) in x[..nb * 32].chunks_exact(32).enumerate() {
        let a = amax(blk);
        let (d, id) = (a / MAX, inverse(MAX, a));
        let q = &mut out.qs[32 * b..32 * b + 32];
        let mut sum = vdupq_n_s32(0);
        for (xs, qs) in blk.chunks_exact(8).zip(q.chunks_exact_mut(8)) {
            let clamped = |x: &[f32]| {
                let v = vrndnq_f32(vmulq_f32(load_f32x4(x), id));
                vcvtq_s32_f32(vminq_f32(vmaxq_f32(v, lo), hi))
            };
            let (r0, r1) = (clamped(&xs[..4]), clamped(&xs[4..]));
            sum = vaddq_s32(sum, vaddq_s32(r0, r1));
            let v = vcombine_s16(vqmovn_s32(r0), vqmovn_s32(r1));
            // SAFETY: `qs` has exactly 8 writable i16 (a whole chunk of 8).
            unsafe { vst1q_s16(qs.as_mut_ptr(), v) };
        }
        out.d[b] = d;
        out.s[b] = d * vaddvq_s32(sum) as f32;
    }
    true
}
