//! Dequantization: the `Q8_0`/`Q4_0`/`Q4_1`/`Q5_0`/`Q5_1` block unpacker shared by the
//! other families, float-format rows, and `dequant_row` (every format).

use std::arch::x86_64::*;

use super::hybrid::dequant_hybrid;
use super::kquant::dequant_k;
use super::simd::{f16_at, float_at, iq4nl_values32, load_float8, q5_quants32, u8x16_to_f32};
use crate::arch::tags::{
    block_bytes, quants_offset, BF16, F16, F32, IQ4_NL, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
};
use crate::WeightFormat;

/// Dequantizes the quantized block at `p` (format `F`) into 4 × f32x8.
///
/// # Safety
/// AVX2/FMA/F16C present; `block_bytes(F)` bytes readable at `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dequant_block<const F: u8>(p: *const u8) -> [__m256; 4] {
    // SAFETY: `p` points at a full block of `block_bytes(F)` bytes (caller
    // contract); all loads below stay within it
    // (Q8_0: 2 + 4*8 = 34; Q4_0: 2 + 16 = 18; Q4_1: 4 + 16 = 20;
    // Q5_0: 2 + 4 + 16 = 22; Q5_1: 4 + 4 + 16 = 24; IQ4_NL: 2 + 16 = 18).
    unsafe {
        let d = _mm256_set1_ps(f16_at(p));
        match F {
            Q8_0 => {
                let mut out = [_mm256_setzero_ps(); 4];
                for (i, o) in out.iter_mut().enumerate() {
                    let b = _mm_loadl_epi64(p.add(2 + 8 * i) as *const __m128i);
                    *o = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), d);
                }
                out
            }
            Q4_0 | Q4_1 => {
                let qoff = if F == Q4_0 { 2 } else { 4 };
                let raw = _mm_loadu_si128(p.add(qoff) as *const __m128i);
                let m = _mm_set1_epi8(0x0F);
                let lo = _mm_and_si128(raw, m);
                let hi = _mm_and_si128(_mm_srli_epi16::<4>(raw), m);
                let off = _mm256_set1_epi32(if F == Q4_0 { 8 } else { 0 });
                let [a, b] = u8x16_to_f32(lo, off);
                let [c, e] = u8x16_to_f32(hi, off);
                if F == Q4_0 {
                    [
                        _mm256_mul_ps(a, d),
                        _mm256_mul_ps(b, d),
                        _mm256_mul_ps(c, d),
                        _mm256_mul_ps(e, d),
                    ]
                } else {
                    let mm = _mm256_set1_ps(f16_at(p.add(2)));
                    [
                        _mm256_fmadd_ps(a, d, mm),
                        _mm256_fmadd_ps(b, d, mm),
                        _mm256_fmadd_ps(c, d, mm),
                        _mm256_fmadd_ps(e, d, mm),
                    ]
                }
            }
            Q5_0 | Q5_1 | IQ4_NL => {
                let mut q = if F == IQ4_NL {
                    iq4nl_values32(p.add(2))
                } else {
                    q5_quants32(p.add(quants_offset(F)))
                };
                if F == Q5_0 {
                    q = _mm256_sub_epi8(q, _mm256_set1_epi8(16));
                }
                let lo = _mm256_castsi256_si128(q);
                let hi = _mm256_extracti128_si256::<1>(q);
                let v = [lo, _mm_srli_si128::<8>(lo), hi, _mm_srli_si128::<8>(hi)]
                    .map(|h| _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(h)));
                if F != Q5_1 {
                    v.map(|a| _mm256_mul_ps(a, d))
                } else {
                    let mm = _mm256_set1_ps(f16_at(p.add(2)));
                    v.map(|a| _mm256_fmadd_ps(a, d, mm))
                }
            }
            _ => [_mm256_setzero_ps(); 4],
        }
    }
}

/// # Safety
/// AVX2/FMA/F16C present.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dequant_q<const F: u8>(src: &[u8], dst: &mut [f32]) {
    let nb = dst.len() / 32;
    let bb = block_bytes(F);
    assert!(src.len() >= nb * bb && dst.len() >= nb * 32);
    for b in 0..nb {
        // SAFETY: b < nb, so block b (bytes b*bb..(b+1)*bb) is inside `src`
        // and elements b*32..b*32+32 are inside `dst` (asserted above).
        unsafe {
            let w = dequant_block::<F>(src.as_ptr().add(b * bb));
            let o = dst.as_mut_ptr().add(b * 32);
            for (i, v) in w.iter().enumerate() {
                _mm256_storeu_ps(o.add(8 * i), *v);
            }
        }
    }
}

/// # Safety
/// AVX2/FMA/F16C present.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dequant_float<const F: u8>(src: &[u8], dst: &mut [f32]) {
    let n = dst.len();
    let eb = block_bytes(F);
    assert!(src.len() >= n * eb);
    let n8 = n / 8 * 8;
    let mut j = 0;
    while j < n8 {
        // SAFETY: j + 8 <= n, so 8 elements are readable at byte j*eb of
        // `src` (src.len() >= n*eb) and writable at `dst[j..j+8]`.
        unsafe {
            let v = load_float8::<F>(src.as_ptr().add(j * eb));
            _mm256_storeu_ps(dst.as_mut_ptr().add(j), v);
        }
        j += 8;
    }
    for (jj, d) in dst.iter_mut().enumerate().skip(n8) {
        *d = float_at::<F>(src, jj);
    }
}

/// Dequantizes a row (`src` has exactly `format.row_bytes(dst.len())` bytes).
///
/// # Safety
/// AVX2/FMA/F16C present.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dequant_row(format: WeightFormat, src: &[u8], dst: &mut [f32]) {
    // SAFETY: features present per this function's contract; the callees
    // re-check lengths.
    unsafe {
        match format {
            WeightFormat::Q8_0 => dequant_q::<Q8_0>(src, dst),
            WeightFormat::Q4_0 => dequant_q::<Q4_0>(src, dst),
            WeightFormat::Q4_1 => dequant_q::<Q4_1>(src, dst),
            WeightFormat::Q5_0 => dequant_q::<Q5_0>(src, dst),
            WeightFormat::Q5_1 => dequant_q::<Q5_1>(src, dst),
            WeightFormat::IQ4_NL => dequant_q::<IQ4_NL>(src, dst),
            WeightFormat::F32 => dequant_float::<F32>(src, dst),
            WeightFormat::F16 => dequant_float::<F16>(src, dst),
            WeightFormat::BF16 => dequant_float::<BF16>(src, dst),
            WeightFormat::Q2_K
            | WeightFormat::Q3_K
            | WeightFormat::Q4_K
            | WeightFormat::Q5_K
            | WeightFormat::Q6_K
            | WeightFormat::IQ4_XS => dequant_k(format, src, dst),
            WeightFormat::I4Hybrid { outliers_per_row } => {
                dequant_hybrid(usize::from(outliers_per_row), src, dst)
            }
        }
    }
}
