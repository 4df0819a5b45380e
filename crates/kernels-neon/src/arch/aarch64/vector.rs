//! f32 slice operations (attention): `dot_f32` and `axpy_f32`.

use std::arch::aarch64::*;

use super::simd::load_f32x4;

#[target_feature(enable = "neon")]
pub(crate) fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let n16 = n / 16 * 16;
    let mut acc = [vdupq_n_f32(0.0); 4];
    for (ca, cb) in a[..n16].chunks_exact(16).zip(b[..n16].chunks_exact(16)) {
        for i in 0..4 {
            acc[i] = vfmaq_f32(acc[i], load_f32x4(&ca[4 * i..]), load_f32x4(&cb[4 * i..]));
        }
    }
    let mut s = vaddvq_f32(vaddq_f32(
        vaddq_f32(acc[0], acc[1]),
        vaddq_f32(acc[2], acc[3]),
    ));
    for k in n16..n {
        s += a[k] * b[k];
    }
    s
}

#[inline]
#[target_feature(enable = "neon")]
pub(crate) fn axpy_f32(alpha: f32, x: &[f32], y: &mut [f32]) {
    let n = x.len().min(y.len());
    let n4 = n / 4 * 4;
    for (cx, cy) in x[..n4].chunks_exact(4).zip(y[..n4].chunks_exact_mut(4)) {
        let v = vfmaq_n_f32(load_f32x4(cy), load_f32x4(cx), alpha);
        // SAFETY: `cy` is exactly 4 writable f32.
        unsafe { vst1q_f32(cy.as_mut_ptr(), v) };
    }
    for k in n4..n {
        y[k] += alpha * x[k];
    }
}
