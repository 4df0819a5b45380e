//! Activation quantizers (8- and 16-bit), the same f32 operations as the
//! scalar reference `QBlocks::quantize_scalar`.

use std::arch::x86_64::*;

use super::simd::hsum_i32;
use crate::quant::QActs;
use crate::quant::{QActs16, Quant};

/// The largest |x| of the `len` floats at `xp` (`len` a multiple of 8).
///
/// # Safety
/// AVX2 present; `len` floats readable at `xp`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn amax(xp: *const f32, len: usize) -> f32 {
    let sign = _mm256_set1_ps(-0.0);
    let mut m = _mm256_setzero_ps();
    for i in (0..len).step_by(8) {
        // SAFETY: `i + 8 <= len` floats at `xp` per the contract.
        m = _mm256_max_ps(
            m,
            _mm256_andnot_ps(sign, unsafe { _mm256_loadu_ps(xp.add(i)) }),
        );
    }
    let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
    let m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    let m4 = _mm_max_ss(m4, _mm_shuffle_ps::<1>(m4, m4));
    _mm_cvtss_f32(m4)
}

/// Quantizes the 32 floats at `xp` to `round_ties_even(x * id)` into the 32 i8 at `qp` (`|x *
/// id|` at most 127 and a rounding error, so no saturation), `id` being `ids[0]` for the first 16
/// and `ids[1]` for the last, and returns the quants of each half as i32 partial sums (8 lanes).
///
/// # Safety
/// AVX2 present; 32 floats readable at `xp`, 32 bytes writable at `qp`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block_i8_halves(xp: *const f32, ids: [__m256; 2], qp: *mut i8) -> [__m256i; 2] {
    // SAFETY: 32 floats at `xp` per the contract.
    let v: [__m256; 4] = std::array::from_fn(|i| unsafe { _mm256_loadu_ps(xp.add(8 * i)) });
    let q: [__m256i; 4] = std::array::from_fn(|i| {
        _mm256_cvtps_epi32(_mm256_round_ps::<
            { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
        >(_mm256_mul_ps(v[i], ids[i / 2])))
    });
    // pack i32 -> i16 -> i8 (values are within -127..=127, no saturation)
    let p0 = _mm256_packs_epi32(q[0], q[1]);
    let p1 = _mm256_packs_epi32(q[2], q[3]);
    let p = _mm256_packs_epi16(p0, p1);
    // undo the lane interleaving of the two packs
    let p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    // SAFETY: 32 bytes at `qp` per the contract.
    unsafe { _mm256_storeu_si256(qp.cast::<__m256i>(), p) };
    [_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])]
}

/// [`block_i8_halves`] with one `id` for the whole block: the sum of its quants.
///
/// # Safety
/// As [`block_i8_halves`]'s.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block_i8(xp: *const f32, id: __m256, qp: *mut i8) -> i32 {
    // SAFETY: per this function's contract.
    let [a, b] = unsafe { block_i8_halves(xp, [id; 2], qp) };
    hsum_i32(_mm256_add_epi32(a, b))
}

/// Quantizes blocks `b0 .. b0 + blocks` of `x` with one scale over them all (same f32
/// operations as `QBlocks::quantize_groups`: d = amax/127, q = round-half-even(x * 127/amax),
/// s = d * sum(q) per block).
///
/// # Safety
/// AVX2/FMA present; the blocks lie within `x`, `out.d`, `out.s` and `out.qs`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn group_i8(x: &[f32], out: &mut QActs, b0: usize, blocks: usize) {
    // SAFETY: the blocks' `blocks * 32` floats lie within `x` per the contract.
    let amax = unsafe { amax(x.as_ptr().add(b0 * 32), blocks * 32) };
    let d = amax / 127.0;
    let id = _mm256_set1_ps(if amax > 0.0 { 127.0 / amax } else { 0.0 });
    for b in b0..b0 + blocks {
        // SAFETY: block `b`'s 32 floats and 32 quants lie within `x` and `out.qs` per the
        // contract.
        let sum = unsafe { block_i8(x.as_ptr().add(b * 32), id, out.qs.as_mut_ptr().add(b * 32)) };
        out.d[b] = d;
        out.s[b] = d * sum as f32;
    }
}

/// Quantizes `x` with one scale per `blocks` 32-element blocks (the last group may be shorter),
/// group by group ([`group_i8`]), as `QBlocks::quantize_groups` does.
///
/// # Safety
/// AVX2/FMA present.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn groups_i8(x: &[f32], out: &mut QActs, blocks: usize) {
    let nb = x.len() / 32;
    assert!(out.d.len() >= nb && out.s.len() >= nb && out.qs.len() >= nb * 32);
    for b0 in (0..nb).step_by(blocks) {
        // SAFETY: blocks `b0 .. b0 + blocks <= nb` lie within `x` (by definition of `nb`) and
        // `out` (asserted).
        unsafe { group_i8(x, out, b0, (nb - b0).min(blocks)) };
    }
}

/// AVX2 activation quantizer (same math as `QActs::quantize_scalar`:
/// d = amax/127, q = round-half-even(x * 127/amax), s = d * sum(q), per 32-block).
///
/// # Safety
/// AVX2/FMA present.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn quantize(x: &[f32], out: &mut QActs) {
    // SAFETY: AVX2/FMA present per the contract.
    unsafe { groups_i8(x, out, 1) }
}

/// AVX2 activation quantizer with one scale per 256 elements (the last group may be shorter),
/// the same f32 operations as `QActs::quantize_super`'s scalar reference.
///
/// # Safety
/// AVX2/FMA present.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn quantize_super(x: &[f32], out: &mut QActs) {
    // SAFETY: AVX2/FMA present per the contract.
    unsafe { groups_i8(x, out, 8) }
}

/// AVX2 activation quantizer with one scale per 16 elements, the same f32 operations as
/// `QActs::quantize_halves_scalar`: per half block `d16 = amax/127`, q = round-half-even(x *
/// 127/amax), per block `s = d16[2b] * sum(first 16) + d16[2b + 1] * sum(last 16)`.
///
/// # Safety
/// AVX2/FMA present.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn quantize_halves(x: &[f32], out: &mut QActs) {
    let nb = x.len() / 32;
    assert!(out.d16.len() >= 2 * nb && out.s.len() >= nb && out.qs.len() >= nb * 32);
    for b in 0..nb {
        // SAFETY: `b < nb`: the block's 32 floats lie within `x` (by definition of `nb`) and its
        // 32 quants within `out.qs` (asserted).
        unsafe {
            let xp = x.as_ptr().add(b * 32);
            let amax = [amax(xp, 16), amax(xp.add(16), 16)];
            let ids = amax.map(|a| _mm256_set1_ps(if a > 0.0 { 127.0 / a } else { 0.0 }));
            let [ha, hb] = block_i8_halves(xp, ids, out.qs.as_mut_ptr().add(b * 32));
            let sums = [hsum_i32(ha), hsum_i32(hb)];
            let d = amax.map(|a| a / 127.0);
            out.d16[2 * b] = d[0];
            out.d16[2 * b + 1] = d[1];
            out.s[b] = d[0] * sums[0] as f32 + d[1] * sums[1] as f32;
        }
    }
}

/// AVX2 16-bit activation quantizer (same f32 operations as
/// `QActs16::quantize_scalar`: d = amax/MAX, id = MAX/amax,
/// q = clamp(round-half-even(x * id), -MAX, MAX), s = d * sum(q); `MAX` 32639, `<i16 as
/// Quant>::MAX`).
///
/// # Safety
/// AVX2/FMA present.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn quantize16(x: &[f32], out: &mut QActs16) {
    let nb = x.len() / 32;
    assert!(out.d.len() >= nb && out.s.len() >= nb && out.qs.len() >= nb * 32);
    const MAX: f32 = <i16 as Quant>::MAX;
    let (lo, hi) = (_mm256_set1_ps(-MAX), _mm256_set1_ps(MAX));
    for b in 0..nb {
        // SAFETY: b < nb: x[b*32..b*32+32] and qs[b*32..b*32+32] are in
        // bounds (x.len() >= nb*32 by definition of nb, qs asserted).
        unsafe {
            let xp = x.as_ptr().add(b * 32);
            let v = [
                _mm256_loadu_ps(xp),
                _mm256_loadu_ps(xp.add(8)),
                _mm256_loadu_ps(xp.add(16)),
                _mm256_loadu_ps(xp.add(24)),
            ];
            let amax = amax(xp, 32);
            let d = amax / MAX;
            let id = _mm256_set1_ps(if amax > 0.0 { MAX / amax } else { 0.0 });
            let q: [__m256i; 4] = std::array::from_fn(|i| {
                let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                    _mm256_mul_ps(v[i], id),
                );
                _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(r, lo), hi))
            });
            let s32 = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
            let sum = hsum_i32(s32);
            // pack i32 -> i16 (values within -MAX..=MAX, no saturation);
            // packs works per 128-bit lane, so undo the 64-bit interleave.
            let qp = out.qs.as_mut_ptr().add(b * 32);
            for (k, pair) in [(q[0], q[1]), (q[2], q[3])].into_iter().enumerate() {
                let p = _mm256_permute4x64_epi64::<0xD8>(_mm256_packs_epi32(pair.0, pair.1));
                _mm256_storeu_si256(qp.add(16 * k) as *mut __m256i, p);
            }
            *out.d.get_unchecked_mut(b) = d;
            *out.s.get_unchecked_mut(b) = d * sum as f32;
        }
    }
}
