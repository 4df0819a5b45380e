//! `exp` eight lanes at a time (AVX2/FMA) for SiLU and softmax: glibc's `expf` in f64 lanes
//! ([`crate::arch::expf_consts`]), so every value is libm's `__expf_fma`'s, bit for bit. A slice's
//! last lanes run through the same code in a padded step.

use std::arch::x86_64::*;

use crate::arch::expf_consts as c;

/// `exp(x)` of four lanes, without the limits (`x` already clamped).
///
/// # Safety
/// AVX2/FMA/F16C present.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn exp4(x: __m128) -> __m128 {
    let xd = _mm256_cvtps_pd(x);
    let n = _mm256_set1_pd(c::INV_LN2_N);
    let shift = _mm256_set1_pd(c::SHIFT);
    // glibc's `z = x·N/ln 2` is fused into both its uses, as GCC compiles it.
    let kd = _mm256_fmadd_pd(n, xd, shift);
    let ki = _mm256_castpd_si256(kd);
    let kd = _mm256_sub_pd(kd, shift);
    let r = _mm256_fmsub_pd(n, xd, kd);
    let i = _mm256_and_si256(ki, _mm256_set1_epi64x(31));
    // SAFETY: every index is below 32, the table's length.
    let t = unsafe { _mm256_i64gather_epi64::<8>(c::TABLE.as_ptr().cast(), i) };
    let s = _mm256_castsi256_pd(_mm256_add_epi64(t, _mm256_slli_epi64::<47>(ki)));
    let z = _mm256_fmadd_pd(_mm256_set1_pd(c::C0), r, _mm256_set1_pd(c::C1));
    let r2 = _mm256_mul_pd(r, r);
    let y = _mm256_fmadd_pd(_mm256_set1_pd(c::C2), r, _mm256_set1_pd(1.0));
    let y = _mm256_fmadd_pd(z, r2, y);
    _mm256_cvtpd_ps(_mm256_mul_pd(y, s))
}

/// `exp(x)` of eight lanes: 0 below `ln 2^-150`, ∞ above `ln 2^128`, NaN kept.
///
/// # Safety
/// AVX2/FMA/F16C present.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn exp8(x: __m256) -> __m256 {
    // NaN stays NaN: `max`/`min` return their second operand when one is NaN (and the table
    // index is masked, whatever the lane holds).
    let xc = _mm256_min_ps(
        _mm256_set1_ps(c::CLAMP_HI),
        _mm256_max_ps(_mm256_set1_ps(c::CLAMP_LO), x),
    );
    // SAFETY: AVX2/FMA/F16C present (this function's contract).
    let e = unsafe {
        _mm256_set_m128(
            exp4(_mm256_extractf128_ps::<1>(xc)),
            exp4(_mm256_castps256_ps128(xc)),
        )
    };
    let e = _mm256_blendv_ps(
        e,
        _mm256_setzero_ps(),
        _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(c::UNDERFLOW)),
    );
    _mm256_blendv_ps(
        e,
        _mm256_set1_ps(f32::INFINITY),
        _mm256_cmp_ps::<_CMP_GT_OQ>(x, _mm256_set1_ps(c::OVERFLOW)),
    )
}

/// `gate = silu(gate) · up` over the common prefix ([`crate::silu_mul_inplace`]).
///
/// # Safety
/// AVX2/FMA/F16C present.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn silu_mul(gate: &mut [f32], up: &[f32]) {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn step(g: &mut [f32], u: &[f32]) {
        // SAFETY: both hold at least 8 floats (the callers below pass exactly 8).
        unsafe {
            let gv = _mm256_loadu_ps(g.as_ptr());
            let e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), gv));
            let s = _mm256_div_ps(gv, _mm256_add_ps(_mm256_set1_ps(1.0), e));
            _mm256_storeu_ps(
                g.as_mut_ptr(),
                _mm256_mul_ps(s, _mm256_loadu_ps(u.as_ptr())),
            );
        }
    }
    let n = gate.len().min(up.len());
    let whole = n / 8 * 8;
    for (g, u) in gate[..whole]
        .chunks_exact_mut(8)
        .zip(up[..whole].chunks_exact(8))
    {
        // SAFETY: AVX2/FMA/F16C present (this function's contract); chunks of 8.
        unsafe { step(g, u) };
    }
    if whole < n {
        let (mut g, mut u) = ([0f32; 8], [0f32; 8]);
        g[..n - whole].copy_from_slice(&gate[whole..n]);
        u[..n - whole].copy_from_slice(&up[whole..n]);
        // SAFETY: as above, on a padded step.
        unsafe { step(&mut g, &u) };
        gate[whole..n].copy_from_slice(&g[..n - whole]);
    }
}

/// `x = exp(x - max)` (softmax's middle pass; its sum is the caller's, in order).
///
/// # Safety
/// AVX2/FMA/F16C present.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn exp_sub(x: &mut [f32], max: f32) {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn step(v: &mut [f32], m: __m256) {
        // SAFETY: `v` holds at least 8 floats (the callers below pass exactly 8).
        unsafe {
            let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(v.as_ptr()), m));
            _mm256_storeu_ps(v.as_mut_ptr(), e);
        }
    }
    let m = _mm256_set1_ps(max);
    let whole = x.len() / 8 * 8;
    for v in x[..whole].chunks_exact_mut(8) {
        // SAFETY: AVX2/FMA/F16C present (this function's contract); chunks of 8.
        unsafe { step(v, m) };
    }
    let rest = x.len() - whole;
    if rest > 0 {
        let mut v = [0f32; 8];
        v[..rest].copy_from_slice(&x[whole..]);
        // SAFETY: as above, on a padded step.
        unsafe { step(&mut v, m) };
        x[whole..].copy_from_slice(&v[..rest]);
    }
}
