//! `exp` four lanes at a time (NEON) for SiLU and softmax: glibc's and musl's `expf` in f64 lanes,
//! as the x86_64 module computes it ([`crate::arch::expf_consts`]; within an ulp of this target's
//! libm, whose `expf` may round `x·N/ln 2` apart). A slice's last lanes run through the same code
//! in a padded step.

use std::arch::aarch64::*;

use super::simd::load_f32x4;
use crate::arch::expf_consts as c;

/// `exp(x)` of two f64 lanes, without the limits (`x` already clamped), before rounding to f32.
#[inline]
#[target_feature(enable = "neon")]
fn exp2d(xd: float64x2_t) -> float64x2_t {
    let n = vdupq_n_f64(c::INV_LN2_N);
    let shift = vdupq_n_f64(c::SHIFT);
    let kd = vfmaq_f64(shift, n, xd);
    let ki = vreinterpretq_u64_f64(kd);
    let kd = vsubq_f64(kd, shift);
    let r = vfmaq_f64(vnegq_f64(kd), n, xd);
    let (i0, i1) = (
        (vgetq_lane_u64::<0>(ki) & 31) as usize,
        (vgetq_lane_u64::<1>(ki) & 31) as usize,
    );
    let t = vsetq_lane_u64::<1>(c::TABLE[i1], vdupq_n_u64(c::TABLE[i0]));
    let s = vreinterpretq_f64_u64(vaddq_u64(t, vshlq_n_u64::<47>(ki)));
    let z = vfmaq_f64(vdupq_n_f64(c::C1), vdupq_n_f64(c::C0), r);
    let r2 = vmulq_f64(r, r);
    let y = vfmaq_f64(vdupq_n_f64(1.0), vdupq_n_f64(c::C2), r);
    let y = vfmaq_f64(y, z, r2);
    vmulq_f64(y, s)
}

/// `exp(x)` of four lanes: 0 below `ln 2^-150`, ∞ above `ln 2^128`, NaN kept.
#[inline]
#[target_feature(enable = "neon")]
fn exp4(x: float32x4_t) -> float32x4_t {
    // NaN stays NaN: `fmax`/`fmin` return NaN when either operand is (and the table index is
    // masked, whatever the lane holds).
    let xc = vminq_f32(
        vdupq_n_f32(c::CLAMP_HI),
        vmaxq_f32(vdupq_n_f32(c::CLAMP_LO), x),
    );
    let lo = exp2d(vcvt_f64_f32(vget_low_f32(xc)));
    let hi = exp2d(vcvt_high_f64_f32(xc));
    let e = vcvt_high_f32_f64(vcvt_f32_f64(lo), hi);
    let e = vbslq_f32(vcltq_f32(x, vdupq_n_f32(c::UNDERFLOW)), vdupq_n_f32(0.0), e);
    vbslq_f32(
        vcgtq_f32(x, vdupq_n_f32(c::OVERFLOW)),
        vdupq_n_f32(f32::INFINITY),
        e,
    )
}

/// `gate = silu(gate) · up` over the common prefix ([`crate::silu_mul_inplace`]).
#[target_feature(enable = "neon")]
pub(crate) fn silu_mul(gate: &mut [f32], up: &[f32]) {
    #[inline]
    #[target_feature(enable = "neon")]
    fn step(g: &mut [f32], u: &[f32]) {
        let gv = load_f32x4(g);
        let e = exp4(vnegq_f32(gv));
        let s = vdivq_f32(gv, vaddq_f32(vdupq_n_f32(1.0), e));
        let g = &mut g[..4];
        // SAFETY: `g` has exactly 4 writable f32 (bounds-checked above).
        unsafe { vst1q_f32(g.as_mut_ptr(), vmulq_f32(s, load_f32x4(u))) };
    }
    let n = gate.len().min(up.len());
    let whole = n / 4 * 4;
    for (g, u) in gate[..whole]
        .chunks_exact_mut(4)
        .zip(up[..whole].chunks_exact(4))
    {
        step(g, u);
    }
    if whole < n {
        let (mut g, mut u) = ([0f32; 4], [0f32; 4]);
        g[..n - whole].copy_from_slice(&gate[whole..n]);
        u[..n - whole].copy_from_slice(&up[whole..n]);
        step(&mut g, &u);
        gate[whole..n].copy_from_slice(&g[..n - whole]);
    }
}

/// `x = exp(x - max)` (softmax's middle pass; its sum is the caller's, in order).
#[target_feature(enable = "neon")]
pub(crate) fn exp_sub(x: &mut [f32], max: f32) {
    #[inline]
    #[target_feature(enable = "neon")]
    fn step(v: &mut [f32], m: float32x4_t) {
        let e = exp4(vsubq_f32(load_f32x4(v), m));
        let v = &mut v[..4];
        // SAFETY: `v` has exactly 4 writable f32 (bounds-checked above).
        unsafe { vst1q_f32(v.as_mut_ptr(), e) };
    }
    let m = vdupq_n_f32(max);
    let whole = x.len() / 4 * 4;
    for v in x[..whole].chunks_exact_mut(4) {
        step(v, m);
    }
    let rest = x.len() - whole;
    if rest > 0 {
        let mut v = [0f32; 4];
        v[..rest].copy_from_slice(&x[whole..]);
        step(&mut v, m);
        x[whole..].copy_from_slice(&v[..rest]);
    }
}
