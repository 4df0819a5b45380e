//! `I4Hybrid` rows (per-row INT4 plus INT8 outliers): dequantization, exact
//! dot and `axpy` of a column range.

use std::arch::x86_64::*;

use super::simd::{hsum, u8x16_to_f32, PREFETCH};

/// The 32 INT4 weights `q - 8` of nibble group `g` (16 bytes, Q4_0 order)
/// of an I4Hybrid row as 4 × f32x8.
///
/// # Safety
/// AVX2 present; 16 bytes readable at `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hybrid_group(p: *const u8) -> [__m256; 4] {
    // SAFETY: caller guarantees 16 readable bytes at `p`; unaligned load.
    let raw = unsafe { _mm_loadu_si128(p as *const __m128i) };
    let m = _mm_set1_epi8(0x0F);
    let off = _mm256_set1_epi32(8);
    let [a, b] = u8x16_to_f32(_mm_and_si128(raw, m), off);
    let [c, d] = u8x16_to_f32(_mm_and_si128(_mm_srli_epi16::<4>(raw), m), off);
    [a, b, c, d]
}

/// Dequantizes an I4Hybrid row: `s * (q - 8)` (the scalar reference's
/// operations, bit-identical), then the outliers added by the scalar code.
///
/// # Safety
/// AVX2/FMA/F16C present.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dequant_hybrid(k: usize, src: &[u8], dst: &mut [f32]) {
    let h = crate::scalar::Hybrid::parse(k, dst.len(), src);
    let nb = dst.len() / 32;
    assert!(h.nib.len() >= nb * 16);
    let s = _mm256_set1_ps(h.s);
    for b in 0..nb {
        // SAFETY: b < nb: bytes 16b..16b+16 of `nib` and elements
        // 32b..32b+32 of `dst` are in bounds (asserted above).
        unsafe {
            let w = hybrid_group(h.nib.as_ptr().add(16 * b));
            let o = dst.as_mut_ptr().add(32 * b);
            for (i, v) in w.iter().enumerate() {
                _mm256_storeu_ps(o.add(8 * i), _mm256_mul_ps(*v, s));
            }
        }
    }
    for (c, v) in h.outliers() {
        dst[c] += h.so * v;
    }
}

/// Exact dot of an I4Hybrid row with f32 `x`: `s * Σ (q - 8) x` with FMAs
/// (4 accumulators), plus the outliers `so * Σ o_j x[c_j]` (scalar).
///
/// # Safety
/// AVX2/FMA/F16C present.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_exact_hybrid(k: usize, row: &[u8], x: &[f32]) -> f32 {
    let h = crate::scalar::Hybrid::parse(k, x.len(), row);
    let nb = x.len() / 32;
    assert!(h.nib.len() >= nb * 16);
    let mut acc = [_mm256_setzero_ps(); 4];
    for b in 0..nb {
        // SAFETY: b < nb: nibble bytes 16b..16b+16 (asserted) and
        // x[32b..32b+32] are in bounds.
        unsafe {
            let w = hybrid_group(h.nib.as_ptr().add(16 * b));
            let xp = x.as_ptr().add(32 * b);
            for i in 0..4 {
                acc[i] = _mm256_fmadd_ps(w[i], _mm256_loadu_ps(xp.add(8 * i)), acc[i]);
            }
        }
    }
    let sum = hsum(_mm256_add_ps(
        _mm256_add_ps(acc[0], acc[1]),
        _mm256_add_ps(acc[2], acc[3]),
    ));
    h.s * sum + h.outlier_dot(x)
}

/// `ys += c * W[c0 .. c0 + ys.len()]` for an I4Hybrid row of `cols`
/// elements (`c0` and `ys.len()` multiples of 32): the nibble groups of the
/// range FMA'd with `c * s` (as `axpy_q` for `Q4_0`), then the outliers in
/// the range added by the scalar code.
///
/// # Safety
/// AVX2/FMA/F16C present.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn axpy_hybrid(
    k: usize,
    c: f32,
    row: &[u8],
    cols: usize,
    c0: usize,
    ys: &mut [f32],
) {
    let h = crate::scalar::Hybrid::parse(k, cols, row);
    let nib = &h.nib[c0 / 2..(c0 + ys.len()) / 2];
    let nb = ys.len() / 32;
    assert!(nib.len() >= nb * 16);
    let cs = _mm256_set1_ps(c * h.s);
    for b in 0..nb {
        // SAFETY: b < nb: nibble bytes 16b..16b+16 (asserted) and
        // ys[32b..32b+32] are in bounds.
        unsafe {
            // Prefetch hint (never faults; wrapping_add keeps it UB-free).
            _mm_prefetch::<_MM_HINT_T1>(nib.as_ptr().wrapping_add(16 * b + PREFETCH) as *const i8);
            let w = hybrid_group(nib.as_ptr().add(16 * b));
            let yp = ys.as_mut_ptr().add(32 * b);
            for (i, wv) in w.iter().enumerate() {
                let p = yp.add(8 * i);
                _mm256_storeu_ps(p, _mm256_fmadd_ps(*wv, cs, _mm256_loadu_ps(p)));
            }
        }
    }
    h.outlier_axpy(c, c0, ys);
}
