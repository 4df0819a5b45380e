//! f32 slice operations (attention): `dot_f32` and `axpy_f32`; `add_fixed` (f32 into i64 fixed
//! point, AVX-512DQ; `add_fixed_avx2` without it).

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

/// [`crate::add_fixed`] with `vcvtps2qq`: eight values a step scaled by 2^32 in f32 (exact: a
/// power of two) and converted with the default rounding (to nearest, ties to even), as the
/// reference does in f64; a step holding a value of magnitude 2^31 or more (or NaN) takes the
/// reference.
///
/// # Safety
/// AVX-512F/DQ and AVX2 present.
#[target_feature(enable = "avx512f,avx512dq,avx2,fma,f16c")]
pub(crate) unsafe fn add_fixed(acc: &mut [i64], x: &mut [f32]) {
    let n = acc.len().min(x.len());
    let n8 = n / 8 * 8;
    let scale = _mm256_set1_ps(4_294_967_296.0);
    let abs = _mm256_set1_epi32(0x7fff_ffff);
    // 2^31 as f32 bits, less one: lanes above it do not fit the conversion.
    let limit = _mm256_set1_epi32(0x4eff_ffff);
    let mut j = 0;
    while j < n8 {
        // SAFETY: j + 8 <= n <= both lengths.
        unsafe {
            let xp = x.as_mut_ptr().add(j);
            let xv = _mm256_loadu_ps(xp);
            let big = _mm256_cmpgt_epi32(_mm256_and_si256(_mm256_castps_si256(xv), abs), limit);
            if _mm256_movemask_epi8(big) != 0 {
                crate::scalar::add_fixed(&mut acc[j..j + 8], &mut x[j..j + 8]);
            } else {
                let q = _mm512_cvtps_epi64(_mm256_mul_ps(xv, scale));
                let ap = acc.as_mut_ptr().add(j) as *mut __m512i;
                _mm512_storeu_si512(ap, _mm512_add_epi64(_mm512_loadu_si512(ap), q));
                _mm256_storeu_ps(xp, _mm256_setzero_ps());
            }
        }
        j += 8;
    }
    crate::scalar::add_fixed(&mut acc[n8..n], &mut x[n8..n]);
}

/// [`crate::add_fixed`] on AVX2: four values a step widened to f64, scaled by 2^32 (exact) and
/// rounded to an integer by adding 1.5 · 2^52 (to nearest, ties to even: the sum lies in
/// [2^52, 2^53), where f64's step is 1), whose bits less the constant's are that integer; a step
/// holding a value of magnitude 2^19 or more (or NaN), past that trick's range, takes the
/// reference. The same arithmetic as `scalar::add_fixed_portable`.
///
/// # Safety
/// AVX2 present.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn add_fixed_avx2(acc: &mut [i64], x: &mut [f32]) {
    const MAGIC: f64 = 6_755_399_441_055_744.0;
    let n = acc.len().min(x.len());
    let n4 = n / 4 * 4;
    let scale = _mm256_set1_pd(crate::FIXED_SCALE);
    let magic = _mm256_set1_pd(MAGIC);
    let abs = _mm_set1_epi32(0x7fff_ffff);
    // 2^19 as f32 bits, less one: lanes above it leave the trick's range.
    let limit = _mm_set1_epi32(0x48ff_ffff);
    let mut j = 0;
    while j < n4 {
        // SAFETY: j + 4 <= n <= both lengths.
        unsafe {
            let xp = x.as_mut_ptr().add(j);
            let xv = _mm_loadu_ps(xp);
            let big = _mm_cmpgt_epi32(_mm_and_si128(_mm_castps_si128(xv), abs), limit);
            if _mm_movemask_epi8(big) != 0 {
                crate::scalar::add_fixed(&mut acc[j..j + 4], &mut x[j..j + 4]);
            } else {
                let y = _mm256_add_pd(_mm256_mul_pd(_mm256_cvtps_pd(xv), scale), magic);
                let q = _mm256_sub_epi64(_mm256_castpd_si256(y), _mm256_castpd_si256(magic));
                let ap = acc.as_mut_ptr().add(j) as *mut __m256i;
                _mm256_storeu_si256(ap, _mm256_add_epi64(_mm256_loadu_si256(ap), q));
                _mm_storeu_ps(xp, _mm_setzero_ps());
            }
        }
        j += 4;
    }
    crate::scalar::add_fixed(&mut acc[n4..n], &mut x[n4..n]);
}
