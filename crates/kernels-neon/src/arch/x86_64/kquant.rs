//! K-quant rows (`Q2_K`, `Q3_K`, `Q4_K`, `Q5_K`, `Q6_K`, `IQ4_XS`): super-block
//! dequantization and the exact dot (the integer dots: `kquant_rows`, `kquant_super`,
//! `kquant_low`, `iq4xs_rows`).

use std::arch::x86_64::*;

use super::kquant_low::k23_scales;
use super::simd::{hsum, iq4nl_values32, PREFETCH};
use super::vector::axpy_f32;
use crate::arch::drivers::axpy_superblocks;
use crate::WeightFormat;

/// Dequantizes a K-quant row (`Q2_K`, `Q3_K`, `Q4_K`, `Q5_K`, `Q6_K` or `IQ4_XS`) super-block
/// by super-block.
///
/// # Safety
/// AVX2/FMA/F16C present.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dequant_k(format: WeightFormat, src: &[u8], dst: &mut [f32]) {
    let bb = format.block_bytes();
    for (blk, out) in src.chunks_exact(bb).zip(dst.chunks_exact_mut(256)) {
        let out: &mut [f32; 256] = out.try_into().expect("chunks of 256");
        // SAFETY: features present per contract.
        unsafe { dequant_superblock(format, blk, out) };
    }
}

/// Unpacks half `n` (0 or 1) of a Q6_K super-block into 4 × 32 signed
/// quants (`q - 32`, in -32..=31): elements 128n + 32k .. 128n + 32k + 32
/// in vector k.
///
/// # Safety
/// AVX2 must be available and `blk.len() >= 210`, `n < 2` (asserted).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn q6k_half(blk: &[u8], n: usize) -> [__m256i; 4] {
    let c32 = _mm256_set1_epi8(32);
    // SAFETY: features present per contract; `q6k_half_u` asserts the length.
    unsafe { q6k_half_u(blk, n) }.map(|q| _mm256_sub_epi8(q, c32))
}

/// Unpacks half `n` (0 or 1) of a Q6_K super-block into 4 × 32 unsigned
/// quants (0..=63, before the offset of 32): elements 128n + 32k ..
/// 128n + 32k + 32 in vector k.
///
/// # Safety
/// AVX2 must be available (`blk.len() >= 210` and `n < 2` are asserted: the
/// loads read `ql[64n..64n+64]` and `qh[32n..32n+32]`, all below byte 192).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn q6k_half_u(blk: &[u8], n: usize) -> [__m256i; 4] {
    assert!(blk.len() >= 210 && n < 2);
    let m4 = _mm256_set1_epi8(0x0F);
    let m2 = _mm256_set1_epi8(3);
    let p = blk.as_ptr();
    // SAFETY: blk.len() >= 210 and n < 2 (asserted), so every 32-byte load
    // below ends at or before byte 192.
    let (ql0, ql1, qh) = unsafe {
        (
            _mm256_loadu_si256(p.add(64 * n) as *const __m256i),
            _mm256_loadu_si256(p.add(64 * n + 32) as *const __m256i),
            _mm256_loadu_si256(p.add(128 + 32 * n) as *const __m256i),
        )
    };
    let hbits = |k: i32| {
        let sh = _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * k));
        _mm256_slli_epi16::<4>(_mm256_and_si256(sh, m2))
    };
    [
        _mm256_or_si256(_mm256_and_si256(ql0, m4), hbits(0)),
        _mm256_or_si256(_mm256_and_si256(ql1, m4), hbits(1)),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m4), hbits(2)),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m4), hbits(3)),
    ]
}

/// Unpacks half `n` (0 or 1) of a `Q2_K` or `Q3_K` super-block into 4 × 32
/// quants (Q2_K: 0..=3; Q3_K: -4..=3, its `hmask` bit clear meaning -4):
/// elements 128n + 32k .. 128n + 32k + 32 in vector k, whose low 16 lanes
/// are sub-block `8n + 2k` and high 16 lanes sub-block `8n + 2k + 1`.
///
/// # Safety
/// AVX2 present; `blk` is a full block of `format` (asserted), `n < 2`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn k23_half(format: WeightFormat, blk: &[u8], n: usize) -> [__m256i; 4] {
    let q3 = format == WeightFormat::Q3_K;
    assert!(n < 2 && blk.len() >= if q3 { 110 } else { 84 });
    let qoff = if q3 { 32 } else { 16 };
    // SAFETY: bytes qoff+32n .. qoff+32n+32 <= 96 (Q3_K) or 80 (Q2_K), and
    // Q3_K's hmask bytes 0..32, are inside `blk` (asserted).
    let (qs, hm) = unsafe {
        (
            _mm256_loadu_si256(blk.as_ptr().add(qoff + 32 * n) as *const __m256i),
            _mm256_loadu_si256(blk.as_ptr() as *const __m256i),
        )
    };
    let m3 = _mm256_set1_epi8(3);
    std::array::from_fn(|k| {
        // 16-bit shifts: the mask drops the bits shifted in from the other byte.
        let lo = _mm256_and_si256(_mm256_srl_epi16(qs, _mm_cvtsi32_si128(2 * k as i32)), m3);
        if q3 {
            let sh = _mm_cvtsi32_si128((4 * n + k) as i32);
            let h = _mm256_and_si256(_mm256_srl_epi16(hm, sh), _mm256_set1_epi8(1));
            _mm256_sub_epi8(
                _mm256_or_si256(lo, _mm256_slli_epi16::<2>(h)),
                _mm256_set1_epi8(4),
            )
        } else {
            lo
        }
    })
}

/// The unsigned quants of sub-blocks `2g` and `2g + 1` of a `Q4_K` or
/// `Q5_K` super-block (4-bit, or 5-bit with Q5_K's `qh` bits), 32 u8 lanes
/// each.
///
/// # Safety
/// AVX2 present; `blk` is a full block of `format` (asserted).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q45k_pair(format: WeightFormat, blk: &[u8], g: usize) -> [__m256i; 2] {
    let q5 = format == WeightFormat::Q5_K;
    assert!(g < 4 && blk.len() >= if q5 { 176 } else { 144 });
    let m4 = _mm256_set1_epi8(0x0F);
    let qoff = if q5 { 48 } else { 16 };
    // SAFETY: bytes qoff+32g .. qoff+32g+32 <= 176 (Q5_K) or 144 (Q4_K),
    // and Q5_K's qh bytes 16..48, are inside `blk` (asserted).
    let raw = unsafe { _mm256_loadu_si256(blk.as_ptr().add(qoff + 32 * g) as *const __m256i) };
    let mut q = [
        _mm256_and_si256(raw, m4),
        _mm256_and_si256(_mm256_srli_epi16::<4>(raw), m4),
    ];
    if q5 {
        // SAFETY: as above (bytes 16..48).
        let qh = unsafe { _mm256_loadu_si256(blk.as_ptr().add(16) as *const __m256i) };
        let one = _mm256_set1_epi8(1);
        for (h, v) in q.iter_mut().enumerate() {
            // Bit `2g + h` of every qh byte, moved to bit 4.
            let sh = _mm_cvtsi32_si128((2 * g + h) as i32);
            let bit = _mm256_and_si256(_mm256_srl_epi16(qh, sh), one);
            *v = _mm256_or_si256(*v, _mm256_slli_epi16::<4>(bit));
        }
    }
    q
}

/// Dequantizes one K-quant super-block into 256 f32. Same f32 operations
/// as the scalar reference (`d*sc * q - dmin*m` for Q2_K, Q4_K and Q5_K, `(d*sc) * q` for
/// Q3_K and Q6_K, `d*(ls - 32) * v` for IQ4_XS; no FMA), so the results are bit-identical.
///
/// # Safety
/// AVX2/FMA/F16C present.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dequant_superblock(format: WeightFormat, blk: &[u8], out: &mut [f32; 256]) {
    let o = out.as_mut_ptr();
    if format == WeightFormat::Q4_K || format == WeightFormat::Q5_K {
        let (dl, ml) = crate::scalar::q4k_scales(blk);
        for g in 0..4 {
            // SAFETY: `q45k_pair` asserts the block length; stores write
            // out[64g..64g+64] (g < 4: <= 256).
            unsafe {
                for (h, q) in q45k_pair(format, blk, g).into_iter().enumerate() {
                    let s = 2 * g + h;
                    let (d, m) = (_mm256_set1_ps(dl[s]), _mm256_set1_ps(ml[s]));
                    store_u8x32_scaled(q, d, m, o.add(32 * s));
                }
            }
        }
    } else if format == WeightFormat::IQ4_XS {
        assert!(blk.len() >= 136);
        let dl = crate::scalar::iq4xs_scales(blk);
        for (s, &dls) in dl.iter().enumerate() {
            // SAFETY: the nibbles of sub-block s are bytes 8+16s .. 24+16s
            // <= 136 of `blk` (asserted); stores write out[32s..32s+32] (s < 8).
            unsafe {
                let q = iq4nl_values32(blk.as_ptr().add(8 + 16 * s));
                let d = _mm256_set1_ps(dls);
                let (lo, hi) = (_mm256_castsi256_si128(q), _mm256_extracti128_si256::<1>(q));
                for (e, w) in [lo, _mm_srli_si128::<8>(lo), hi, _mm_srli_si128::<8>(hi)]
                    .into_iter()
                    .enumerate()
                {
                    let a = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(w));
                    _mm256_storeu_ps(o.add(32 * s + 8 * e), _mm256_mul_ps(a, d));
                }
            }
        }
    } else if format == WeightFormat::Q2_K || format == WeightFormat::Q3_K {
        // The scalar reference's products `d * sc` and `dmin * m` (Q3_K: no min), from the
        // vector scale decoder.
        let (mut dl, mut ml) = ([0f32; 16], [0f32; 16]);
        // SAFETY: features present per contract; `k23_scales` asserts the block length; the
        // stores write 16 floats into each array.
        unsafe {
            let (sc, m, d, dmin) = if format == WeightFormat::Q2_K {
                k23_scales::<false>(blk)
            } else {
                k23_scales::<true>(blk)
            };
            for h in 0..2 {
                let (dp, mp) = (dl.as_mut_ptr().add(8 * h), ml.as_mut_ptr().add(8 * h));
                _mm256_storeu_ps(dp, _mm256_mul_ps(_mm256_set1_ps(d), sc[h]));
                if format == WeightFormat::Q2_K {
                    _mm256_storeu_ps(mp, _mm256_mul_ps(_mm256_set1_ps(dmin), m[h]));
                }
            }
        }
        for n in 0..2 {
            // SAFETY: `k23_half` asserts the block length; stores write
            // out[128n + 32k + 16h .. + 16] (n < 2, k < 4, h < 2: <= 256).
            unsafe {
                for (k, q) in k23_half(format, blk, n).into_iter().enumerate() {
                    for h in 0..2 {
                        let s = 8 * n + 2 * k + h;
                        let v = if h == 0 {
                            _mm256_castsi256_si128(q)
                        } else {
                            _mm256_extracti128_si256::<1>(q)
                        };
                        let (d, m) = (_mm256_set1_ps(dl[s]), _mm256_set1_ps(ml[s]));
                        let base = o.add(128 * n + 32 * k + 16 * h);
                        for (e, w) in [v, _mm_srli_si128::<8>(v)].into_iter().enumerate() {
                            let a = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(w));
                            let a = if format == WeightFormat::Q2_K {
                                _mm256_sub_ps(_mm256_mul_ps(a, d), m)
                            } else {
                                _mm256_mul_ps(a, d)
                            };
                            _mm256_storeu_ps(base.add(8 * e), a);
                        }
                    }
                }
            }
        }
    } else {
        assert!(blk.len() >= 210);
        let ds = crate::scalar::q6k_scales(blk);
        for n in 0..2 {
            // SAFETY: loads read ql[64n..64n+64] and qh[32n..32n+32]
            // (bytes < 192 <= 210, asserted); stores write
            // out[128n..128n+128] (<= 256).
            unsafe {
                for (k, qk) in q6k_half(blk, n).into_iter().enumerate() {
                    let s = 8 * n + 2 * k;
                    let base = o.add(128 * n + 32 * k);
                    for half in 0..2 {
                        let d = _mm256_set1_ps(ds[s + half]);
                        let v = if half == 0 {
                            _mm256_castsi256_si128(qk)
                        } else {
                            _mm256_extracti128_si256::<1>(qk)
                        };
                        let a = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
                        let b = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128::<8>(v)));
                        _mm256_storeu_ps(base.add(16 * half), _mm256_mul_ps(a, d));
                        _mm256_storeu_ps(base.add(16 * half + 8), _mm256_mul_ps(b, d));
                    }
                }
            }
        }
    }
}

/// Stores `d * q - m` for the 32 u8 lanes of `q` as 32 f32 at `o`.
///
/// # Safety
/// AVX2 present; 32 f32 writable at `o`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn store_u8x32_scaled(q: __m256i, d: __m256, m: __m256, o: *mut f32) {
    let halves = [_mm256_castsi256_si128(q), _mm256_extracti128_si256::<1>(q)];
    for (h, v) in halves.into_iter().enumerate() {
        let a = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
        let b = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128::<8>(v)));
        // SAFETY: caller guarantees o[0..32] writable; h < 2.
        unsafe {
            _mm256_storeu_ps(o.add(16 * h), _mm256_sub_ps(_mm256_mul_ps(a, d), m));
            _mm256_storeu_ps(o.add(16 * h + 8), _mm256_sub_ps(_mm256_mul_ps(b, d), m));
        }
    }
}

/// `y += c * dequant(row)` for a K-quant row: each 256-element super-block
/// dequantized on the stack, then FMA'd in with `axpy_f32`.
///
/// # Safety
/// AVX2/FMA/F16C present.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn axpy_k(format: WeightFormat, c: f32, row: &[u8], y: &mut [f32]) {
    // SAFETY: features present per contract (all the callees need).
    unsafe {
        let dequant = |blk: &[u8], buf: &mut [f32; 256]| dequant_superblock(format, blk, buf);
        axpy_superblocks(format, c, row, y, dequant, |c, buf, ys| {
            axpy_f32(c, buf, ys)
        });
    }
}

/// Exact dot of a K-quant row with f32 `x`: each super-block is dequantized
/// into 256 f32 on the stack, then multiplied with FMAs (4 accumulators).
///
/// # Safety
/// AVX2/FMA/F16C present.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_exact_k(format: WeightFormat, row: &[u8], x: &[f32]) -> f32 {
    let bb = format.block_bytes();
    let mut buf = [0f32; 256];
    let mut acc = [_mm256_setzero_ps(); 4];
    for (blk, xs) in row.chunks_exact(bb).zip(x.chunks_exact(256)) {
        // Prefetch hint (never faults; wrapping_add keeps it UB-free).
        _mm_prefetch::<_MM_HINT_T1>(blk.as_ptr().wrapping_add(PREFETCH) as *const i8);
        // SAFETY: features present per contract.
        unsafe { dequant_superblock(format, blk, &mut buf) };
        for j in (0..256).step_by(32) {
            for (i, a) in acc.iter_mut().enumerate() {
                // SAFETY: j + 8i + 8 <= 256 = buf.len() = xs.len().
                unsafe {
                    let w = _mm256_loadu_ps(buf.as_ptr().add(j + 8 * i));
                    *a = _mm256_fmadd_ps(w, _mm256_loadu_ps(xs.as_ptr().add(j + 8 * i)), *a);
                }
            }
        }
    }
    hsum(_mm256_add_ps(
        _mm256_add_ps(acc[0], acc[1]),
        _mm256_add_ps(acc[2], acc[3]),
    ))
}
