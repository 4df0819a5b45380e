//! Register-level helpers of the AVX2 kernels: horizontal sums, f16 reads,
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

/// The sum of the eight i32 lanes of `v`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_hadd_epi32(s, s);
    let s = _mm_hadd_epi32(s, s);
    _mm_cvtsi128_si32(s)
}

/// The quantized activations of the 32-block starting at element `e` of `x`, as two registers:
/// 8-bit ones (`A8`, element order) once in both; 16-bit ones (even/odd order) the 16 even
/// elements, then the 16 odd.
///
/// # Safety
/// AVX2 present; elements `e..e + 32` readable at `x` (1 or 2 bytes each).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn acts_block32<const A8: bool>(x: *const u8, e: usize) -> (__m256i, __m256i) {
    // SAFETY: 32 or 64 bytes readable at x + e or x + 2e per contract.
    unsafe {
        if A8 {
            let v = _mm256_loadu_si256(x.add(e) as *const __m256i);
            (v, v)
        } else {
            let p = x.add(2 * e);
            (
                _mm256_loadu_si256(p as *const __m256i),
                _mm256_loadu_si256(p.add(32) as *const __m256i),
            )
        }
    }
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

/// The 32 unsigned 5-bit quants (0..=31) of a `Q5_0`/`Q5_1` block as u8
/// lanes in element order, from its `qh` (little-endian u32 of fifth bits)
/// at `p` and the 16 nibble bytes at `p + 4`: lane `j` is nibble `j` of
/// [`nibbles32`] with bit `j` of `qh` as its bit 4 (llama.cpp
/// `bytes_from_bits_32`: each byte of `qh` broadcast to 8 lanes, lane `k`
/// of the 8 all ones iff bit `k` is set).
///
/// # Safety
/// AVX2 present; `p..p+20` readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q5_quants32(p: *const u8) -> __m256i {
    // SAFETY: caller guarantees 20 readable bytes at `p`: the 4 `qh` bytes
    // (unaligned read) and the 16 nibble bytes read by `nibbles32`.
    let (qh, nib) = unsafe {
        (
            std::ptr::read_unaligned(p as *const i32),
            nibbles32(p.add(4)),
        )
    };
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(qh),
        _mm256_set_epi64x(
            0x0303_0303_0303_0303,
            0x0202_0202_0202_0202,
            0x0101_0101_0101_0101,
            0,
        ),
    );
    let others = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe);
    let set = _mm256_cmpeq_epi8(_mm256_or_si256(spread, others), _mm256_set1_epi8(-1));
    _mm256_or_si256(nib, _mm256_and_si256(set, _mm256_set1_epi8(0x10)))
}

/// The 16 nibble bytes at `p` as 32 `IQ4_NL` values (i8 lanes, element
/// order as [`nibbles32`]): a table lookup of each nibble in
/// [`IQ4NL_VALUES`](tensor_types::IQ4NL_VALUES).
///
/// # Safety
/// AVX2 present; `p..p+16` readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn iq4nl_values32(p: *const u8) -> __m256i {
    // SAFETY: the table is 16 readable bytes; the caller guarantees 16
    // readable bytes at `p` (read by `nibbles32`).
    unsafe {
        let kv = _mm_loadu_si128(tensor_types::IQ4NL_VALUES.as_ptr() as *const __m128i);
        _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(kv), nibbles32(p))
    }
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
///
/// Every weight prefetch of this path's kernels asks for the line into L2 (`_MM_HINT_T1`), not L1
/// (`_MM_HINT_T0`): the loads that follow a few hundred cycles later find it there, and the L1's
/// few fill buffers stay free for them. (The sparse kernels' prefetch of the next listed rows,
/// `arch::prefetch`, one row ahead of their use, still asks for L1; not measured with L2.)
/// Measured 2026-12-06 on the SYNTHETIC 16-layer d 1024 files (`sparrow bench -p 0 -n 16 -r 2`,
/// both hints' builds alternating, two rounds, Intel Xeon, both x86 paths): with one thread F16
/// decode 25.6-26.7 -> 30.4-30.9 tok/s, BF16 23.2-23.9 -> 31.3-31.6, Q8_0 39.4-40.6 -> 44.3-45.8,
/// Q4_0 64.8-67.8 -> 80.9-84.5, IQ4_NL 60.1-61.2 -> 75.2-76.4; with two F16 43 -> 51-53, BF16
/// 38-39 -> 51-53; no format measured slower beyond the noise (docs: BENCHMARKS' dense-vs-llama
/// history, stop 82).
pub(super) const PREFETCH: usize = 512;

/// Prefetch distance of the kernels that take one row at a time (dense matrices, whose rows lie
/// back to back): a few rows ahead, which keeps more of DRAM's bandwidth busy than [`PREFETCH`]
/// for the two threads' streams. Measured 2026-11-26 (2 threads, `sparrow bench -p 0`, two
/// interleaved rounds, 512 -> 4096 bytes on the 1-row 16-bit kernels): SmolLM2 Q4_1 283/287 ->
/// 318/324 tok/s, Qwen2.5-0.5B 77.7/80.5 -> 81.0/84.1; on the 1.5B-shaped synthetic Q4_K_M file
/// (512-bit K-quant kernels) 35 -> 40 tok/s, with 3072..8192 within noise of 4096.
pub(super) const STREAM_PREFETCH: usize = 4096;

/// The prefetch distance of a kernel stepping `R` rows at a time: [`STREAM_PREFETCH`] for one,
/// [`PREFETCH`] for several (listed rows, scattered: the drivers prefetch the next rows' heads).
pub(super) const fn prefetch_distance<const R: usize>() -> usize {
    if R == 1 {
        STREAM_PREFETCH
    } else {
        PREFETCH
    }
}
