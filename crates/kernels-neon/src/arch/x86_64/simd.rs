//! Register-level helpers of the AVX2 kernels: horizontal sum, f16 reads,
//! nibble and byte unpacking, float-format loads, and the prefetch distance.

use std::arch::x86_64::*;

use crate::arch::tags::{F16, F32};

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
    _mm_cvtss_f32(s)
}

/// Reads the f16 at `p` as f32.
///
/// # Safety
/// F16C present; `p..p+2` readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn f16_at(p: *const u8) -> f32 {
    // SAFETY: caller guarantees two readable bytes at `p`; unaligned read.
    let bits = unsafe { std::ptr::read_unaligned(p as *const u16) };
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

/// 16 packed nibble bytes at `p` -> 32 u8 lanes: low nibbles (elements
/// 0..16) then high nibbles (elements 16..32).
///
/// # Safety
/// AVX2 present; `p..p+16` readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn nibbles32(p: *const u8) -> __m256i {
    // SAFETY: caller guarantees 16 readable bytes at `p`; unaligned load.
    let raw = unsafe { _mm_loadu_si128(p as *const __m128i) };
    let hi = _mm_srli_epi16::<4>(raw);
    let v = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(raw), hi);
    _mm256_and_si256(v, _mm256_set1_epi8(0x0F))
}

/// 8 consecutive u8/i8 lanes of `v` starting at lane `8*k`... helpers for
/// converting a 16-byte vector of small integers into two f32x8.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn u8x16_to_f32(v: __m128i, off: __m256i) -> [__m256; 2] {
    [
        _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_cvtepu8_epi32(v), off)),
        _mm256_cvtepi32_ps(_mm256_sub_epi32(
            _mm256_cvtepu8_epi32(_mm_srli_si128::<8>(v)),
            off,
        )),
    ]
}

/// Loads 8 float-format elements (format `F` in F32/F16/BF16) at `p` as f32x8.
///
/// # Safety
/// AVX2/F16C present; `8 * block_bytes(F)` bytes readable at `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn load_float8<const F: u8>(p: *const u8) -> __m256 {
    // SAFETY: caller guarantees 8 elements (32 or 16 bytes) readable at `p`;
    // all loads are unaligned variants.
    unsafe {
        match F {
            F32 => _mm256_loadu_ps(p as *const f32),
            F16 => _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)),
            _ => _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(
                _mm_loadu_si128(p as *const __m128i),
            ))),
        }
    }
}

/// Scalar conversion of one float-format element (tails).
pub(super) fn float_at<const F: u8>(row: &[u8], j: usize) -> f32 {
    match F {
        F32 => f32::from_le_bytes([row[4 * j], row[4 * j + 1], row[4 * j + 2], row[4 * j + 3]]),
        F16 => half::f16::from_le_bytes([row[2 * j], row[2 * j + 1]]).to_f32(),
        _ => half::bf16::from_le_bytes([row[2 * j], row[2 * j + 1]]).to_f32(),
    }
}

/// Software prefetch distance in bytes for streaming weight rows.
pub(super) const PREFETCH: usize = 512;
