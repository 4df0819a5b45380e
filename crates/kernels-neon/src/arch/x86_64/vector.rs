//! f32 slice operations (attention): `dot_f32` and `axpy_f32`.

use std::arch::x86_64::*;

use super::simd::hsum;

/// # Safety
/// AVX2/FMA present.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let mut acc = [_mm256_setzero_ps(); 4];
    let n32 = n / 32 * 32;
    let n8 = n / 8 * 8;
    let mut j = 0;
    while j < n32 {
        for (i, ac) in acc.iter_mut().enumerate() {
            // SAFETY: j + 32 <= n <= len of both slices.
            unsafe {
                *ac = _mm256_fmadd_ps(
                    _mm256_loadu_ps(a.as_ptr().add(j + 8 * i)),
                    _mm256_loadu_ps(b.as_ptr().add(j + 8 * i)),
                    *ac,
                );
            }
        }
        j += 32;
    }
    while j < n8 {
        // SAFETY: j + 8 <= n.
        unsafe {
            acc[0] = _mm256_fmadd_ps(
                _mm256_loadu_ps(a.as_ptr().add(j)),
                _mm256_loadu_ps(b.as_ptr().add(j)),
                acc[0],
            );
        }
        j += 8;
    }
    let mut s = hsum(_mm256_add_ps(
        _mm256_add_ps(acc[0], acc[1]),
        _mm256_add_ps(acc[2], acc[3]),
    ));
    for k in n8..n {
        s += a[k] * b[k];
    }
    s
}

/// # Safety
/// AVX2/FMA present.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn axpy_f32(alpha: f32, x: &[f32], y: &mut [f32]) {
    let n = x.len().min(y.len());
    let n8 = n / 8 * 8;
    let av = _mm256_set1_ps(alpha);
    let mut j = 0;
    while j < n8 {
        // SAFETY: j + 8 <= n <= len of both slices.
        unsafe {
            let yp = y.as_mut_ptr().add(j);
            _mm256_storeu_ps(
                yp,
                _mm256_fmadd_ps(av, _mm256_loadu_ps(x.as_ptr().add(j)), _mm256_loadu_ps(yp)),
            );
        }
        j += 8;
    }
    for k in n8..n {
        y[k] += alpha * x[k];
    }
}
