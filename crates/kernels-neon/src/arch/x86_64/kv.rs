//! KV-cache row kernels (attention over an f32, f16 or `q8_0` cache): `q · row` and
//! `out += alpha · row`, with f16 converted by F16C and `q8_0` quants widened to f32 and scaled
//! once per 32-element block. The f32 kernels sum in the order of `vector.rs`, so an f32 cache gives
//! the numbers the f32 attention did.

use std::arch::x86_64::*;

use super::simd::{f16_at, hsum};
use crate::KvFormat;

/// Bytes of a `q8_0` block.
const Q8: usize = 34;

/// 8 elements of a float row (f32 or f16 bytes) at element `j`.
///
/// # Safety
/// AVX2/F16C present; the 8 elements at `j` are inside `row`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load8<const HALF: bool>(row: &[u8], j: usize) -> __m256 {
    // SAFETY: caller guarantees the 8 elements (32 or 16 bytes) at `j` are in `row`; unaligned
    // loads.
    unsafe {
        if HALF {
            _mm256_cvtph_ps(_mm_loadu_si128(row.as_ptr().add(2 * j) as *const __m128i))
        } else {
            _mm256_loadu_ps(row.as_ptr().add(4 * j) as *const f32)
        }
    }
}

fn elem<const HALF: bool>(row: &[u8], j: usize) -> f32 {
    if HALF {
        half::f16::from_le_bytes([row[2 * j], row[2 * j + 1]]).to_f32()
    } else {
        f32::from_le_bytes([row[4 * j], row[4 * j + 1], row[4 * j + 2], row[4 * j + 3]])
    }
}

/// `q · row` for a float row of `q.len()` elements (as `vector::dot_f32`).
///
/// # Safety
/// AVX2/FMA/F16C present.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_float<const HALF: bool>(q: &[f32], row: &[u8]) -> f32 {
    let n = q.len();
    assert!(row.len() >= n * if HALF { 2 } else { 4 });
    let mut acc = [_mm256_setzero_ps(); 4];
    let (n32, n8) = (n / 32 * 32, n / 8 * 8);
    let mut j = 0;
    while j < n32 {
        for (i, ac) in acc.iter_mut().enumerate() {
            // SAFETY: j + 32 <= n: in bounds of `q` and (asserted) of `row`.
            unsafe {
                *ac = _mm256_fmadd_ps(
                    _mm256_loadu_ps(q.as_ptr().add(j + 8 * i)),
                    load8::<HALF>(row, j + 8 * i),
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
                _mm256_loadu_ps(q.as_ptr().add(j)),
                load8::<HALF>(row, j),
                acc[0],
            );
        }
        j += 8;
    }
    let mut s = hsum(_mm256_add_ps(
        _mm256_add_ps(acc[0], acc[1]),
        _mm256_add_ps(acc[2], acc[3]),
    ));
    for (k, x) in q.iter().enumerate().skip(n8) {
        s += x * elem::<HALF>(row, k);
    }
    s
}

/// 8 quants of a `q8_0` block at `p` as f32.
///
/// # Safety
/// AVX2 present; 8 bytes readable at `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8x8(p: *const u8) -> __m256 {
    // SAFETY: caller guarantees 8 readable bytes at `p`; `_mm_loadl_epi64` reads exactly 8,
    // unaligned.
    unsafe { _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(p as *const __m128i))) }
}

/// `q · row` for a `q8_0` row of `q.len()` elements (a multiple of 32).
///
/// # Safety
/// AVX2/FMA/F16C present.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q8(q: &[f32], row: &[u8]) -> f32 {
    let blocks = q.len() / 32;
    assert!(row.len() >= blocks * Q8);
    let mut acc = _mm256_setzero_ps();
    for b in 0..blocks {
        // SAFETY: block b is inside `row` (asserted) and its 32 activations inside `q`.
        unsafe {
            let p = row.as_ptr().add(b * Q8);
            let x = q.as_ptr().add(32 * b);
            let mut s = _mm256_mul_ps(_mm256_loadu_ps(x), q8x8(p.add(2)));
            for i in 1..4 {
                s = _mm256_fmadd_ps(_mm256_loadu_ps(x.add(8 * i)), q8x8(p.add(2 + 8 * i)), s);
            }
            acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_at(p)), s, acc);
        }
    }
    hsum(acc)
}

/// `out += alpha · row` for a float row (as `vector::axpy_f32`).
///
/// # Safety
/// AVX2/FMA/F16C present.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn axpy_float<const HALF: bool>(alpha: f32, row: &[u8], out: &mut [f32]) {
    let n = out.len();
    assert!(row.len() >= n * if HALF { 2 } else { 4 });
    let n8 = n / 8 * 8;
    let av = _mm256_set1_ps(alpha);
    let mut j = 0;
    while j < n8 {
        // SAFETY: j + 8 <= n: in bounds of `out` and (asserted) of `row`.
        unsafe {
            let yp = out.as_mut_ptr().add(j);
            _mm256_storeu_ps(
                yp,
                _mm256_fmadd_ps(av, load8::<HALF>(row, j), _mm256_loadu_ps(yp)),
            );
        }
        j += 8;
    }
    for (k, o) in out.iter_mut().enumerate().skip(n8) {
        *o += alpha * elem::<HALF>(row, k);
    }
}

/// `out += alpha · row` for a `q8_0` row of `out.len()` elements (a multiple of 32).
///
/// # Safety
/// AVX2/FMA/F16C present.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn axpy_q8(alpha: f32, row: &[u8], out: &mut [f32]) {
    let blocks = out.len() / 32;
    assert!(row.len() >= blocks * Q8);
    for b in 0..blocks {
        // SAFETY: block b is inside `row` (asserted) and its 32 outputs inside `out`.
        unsafe {
            let p = row.as_ptr().add(b * Q8);
            let c = _mm256_set1_ps(alpha * f16_at(p));
            for i in 0..4 {
                let yp = out.as_mut_ptr().add(32 * b + 8 * i);
                _mm256_storeu_ps(
                    yp,
                    _mm256_fmadd_ps(c, q8x8(p.add(2 + 8 * i)), _mm256_loadu_ps(yp)),
                );
            }
        }
    }
}

/// `scores[p] = scale * (q · row p)` (see `arch::kv::scores`).
///
/// # Safety
/// AVX2/FMA/F16C present.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn kv_scores(
    format: KvFormat,
    q: &[f32],
    rows: &[u8],
    pos_bytes: usize,
    off: usize,
    scale: f32,
    scores: &mut [f32],
) {
    let Some(hb) = format.row_bytes(q.len()) else {
        return;
    };
    for (p, s) in scores.iter_mut().enumerate() {
        let row = &rows[p * pos_bytes + off..][..hb];
        // SAFETY: AVX2/FMA/F16C present (this function's contract); each kernel asserts the row
        // length it reads.
        *s = scale
            * unsafe {
                match format {
                    KvFormat::F32 => dot_float::<false>(q, row),
                    KvFormat::F16 => dot_float::<true>(q, row),
                    KvFormat::Q8_0 => dot_q8(q, row),
                }
            };
    }
}

/// `out += Σ_p weights[p] · row p` (see `arch::kv::accumulate`).
///
/// # Safety
/// AVX2/FMA/F16C present.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn kv_accumulate(
    format: KvFormat,
    weights: &[f32],
    rows: &[u8],
    pos_bytes: usize,
    off: usize,
    out: &mut [f32],
) {
    let Some(hb) = format.row_bytes(out.len()) else {
        return;
    };
    for (p, &w) in weights.iter().enumerate() {
        let row = &rows[p * pos_bytes + off..][..hb];
        // SAFETY: AVX2/FMA/F16C present (this function's contract); each kernel asserts the row
        // length it reads.
        unsafe {
            match format {
                KvFormat::F32 => axpy_float::<false>(w, row, out),
                KvFormat::F16 => axpy_float::<true>(w, row, out),
                KvFormat::Q8_0 => axpy_q8(w, row, out),
            }
        }
    }
}
