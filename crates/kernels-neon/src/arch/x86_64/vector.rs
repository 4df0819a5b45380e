//! f32 slice operations (attention): `dot_f32` and `axpy_f32`; `add_fixed` (f32 into i64 fixed
//! point, AVX-512DQ; `add_fixed_avx2` without it) and the eight-value steps both take, which the
//! fused `axpy_rows_fixed` shares.

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

/// [`crate::add_fixed`] with `vcvtps2qq`: eight values a step through [`add_fixed8_dq`], then
/// cleared; a tail shorter than a step takes the reference.
///
/// # Safety
/// AVX-512F/DQ and AVX2 present.
#[target_feature(enable = "avx512f,avx512dq,avx2,fma,f16c")]
pub(crate) unsafe fn add_fixed(acc: &mut [i64], x: &mut [f32]) {
    let n = acc.len().min(x.len());
    let n8 = n / 8 * 8;
    let mut j = 0;
    while j < n8 {
        // SAFETY: j + 8 <= n <= both lengths; the features are this function's.
        unsafe {
            let xp = x.as_mut_ptr().add(j);
            add_fixed8_dq(acc.as_mut_ptr().add(j), _mm256_loadu_ps(xp));
            _mm256_storeu_ps(xp, _mm256_setzero_ps());
        }
        j += 8;
    }
    crate::scalar::add_fixed(&mut acc[n8..n], &mut x[n8..n]);
}

/// [`crate::add_fixed`] on AVX2: eight values a step through [`add_fixed8`], then cleared; a
/// tail shorter than a step takes the reference.
///
/// # Safety
/// AVX2 present.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn add_fixed_avx2(acc: &mut [i64], x: &mut [f32]) {
    let n = acc.len().min(x.len());
    let n8 = n / 8 * 8;
    let mut j = 0;
    while j < n8 {
        // SAFETY: j + 8 <= n <= both lengths; the features are this function's.
        unsafe {
            let xp = x.as_mut_ptr().add(j);
            add_fixed8(acc.as_mut_ptr().add(j), _mm256_loadu_ps(xp));
            _mm256_storeu_ps(xp, _mm256_setzero_ps());
        }
        j += 8;
    }
    crate::scalar::add_fixed(&mut acc[n8..n], &mut x[n8..n]);
}

/// `acc[0..8] += round(s · 2^32)` as [`crate::add_fixed`] does: scaled by 2^32 in f32 (exact: a
/// power of two) and converted by `vcvtps2qq` with the default rounding (to nearest, ties to
/// even), as the reference does in f64; eight values holding one of magnitude 2^31 or more (or
/// NaN) take the reference. Shared by `add_fixed` and the fused `axpy_rows_fixed`.
///
/// # Safety
/// AVX-512F/DQ and AVX2 present; `acc..acc + 8` is valid for reads and writes.
#[inline]
#[target_feature(enable = "avx512f,avx512dq,avx2,fma,f16c")]
pub(crate) unsafe fn add_fixed8_dq(acc: *mut i64, s: __m256) {
    let abs = _mm256_and_si256(_mm256_castps_si256(s), _mm256_set1_epi32(0x7fff_ffff));
    // 2^31 as f32 bits, less one: lanes above it do not fit the conversion.
    let big = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x4eff_ffff));
    if _mm256_movemask_epi8(big) != 0 {
        // SAFETY: as the caller's contract.
        unsafe { add_fixed8_reference(acc, s) };
        return;
    }
    let q = _mm512_cvtps_epi64(_mm256_mul_ps(s, _mm256_set1_ps(4_294_967_296.0)));
    // SAFETY: eight i64 from `acc` (caller contract).
    unsafe {
        let ap = acc as *mut __m512i;
        _mm512_storeu_si512(ap, _mm512_add_epi64(_mm512_loadu_si512(ap), q));
    }
}

/// `acc[0..8] += round(s · 2^32)` as [`crate::add_fixed`] does, on AVX2: widened to f64, scaled
/// by 2^32 (exact) and rounded to an integer by adding 1.5 · 2^52 (to nearest, ties to even: the
/// sum lies in [2^52, 2^53), where f64's step is 1), whose bits less the constant's are that
/// integer; eight values holding one of magnitude 2^19 or more (or NaN), past that trick's
/// range, take the reference. The same arithmetic as `scalar::add_fixed_portable`; shared by
/// `add_fixed_avx2` and the fused `axpy_rows_fixed`.
///
/// # Safety
/// AVX2 present; `acc..acc + 8` is valid for reads and writes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn add_fixed8(acc: *mut i64, s: __m256) {
    const MAGIC: f64 = 6_755_399_441_055_744.0;
    let abs = _mm256_and_si256(_mm256_castps_si256(s), _mm256_set1_epi32(0x7fff_ffff));
    // 2^19 as f32 bits, less one: lanes above it leave the trick's range.
    let big = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x48ff_ffff));
    if _mm256_movemask_epi8(big) != 0 {
        // SAFETY: as the caller's contract.
        unsafe { add_fixed8_reference(acc, s) };
        return;
    }
    let (scale, magic) = (_mm256_set1_pd(crate::FIXED_SCALE), _mm256_set1_pd(MAGIC));
    for (h, half) in [_mm256_castps256_ps128(s), _mm256_extractf128_ps::<1>(s)]
        .into_iter()
        .enumerate()
    {
        let y = _mm256_add_pd(_mm256_mul_pd(_mm256_cvtps_pd(half), scale), magic);
        let q = _mm256_sub_epi64(_mm256_castpd_si256(y), _mm256_castpd_si256(magic));
        // SAFETY: 4 * h + 4 <= 8 elements from `acc` (caller contract).
        unsafe {
            let ap = acc.add(4 * h) as *mut __m256i;
            _mm256_storeu_si256(ap, _mm256_add_epi64(_mm256_loadu_si256(ap), q));
        }
    }
}

/// `crate::scalar::add_fixed` of eight values.
///
/// # Safety
/// AVX present; `acc..acc + 8` is valid for reads and writes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn add_fixed8_reference(acc: *mut i64, s: __m256) {
    let mut x = [0f32; 8];
    // SAFETY: `x` holds eight f32; `acc..acc + 8` is valid (caller contract).
    unsafe {
        _mm256_storeu_ps(x.as_mut_ptr(), s);
        crate::scalar::add_fixed(std::slice::from_raw_parts_mut(acc, 8), &mut x);
    }
}
