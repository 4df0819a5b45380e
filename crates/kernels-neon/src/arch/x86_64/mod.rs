//! x86_64 AVX2 + FMA + F16C kernels.
//!
//! All functions are `unsafe fn` with `#[target_feature]`: callers must have
//! checked that AVX2, FMA and F16C are present (`arch::has_avx2_fma`). Slice
//! lengths are re-checked with `assert!` at entry of each row kernel (cheap,
//! once per row) so that every raw-pointer access below stays in bounds even
//! if a caller were wrong.

use std::arch::x86_64::*;

use crate::arch::Rows;
use crate::quant::{QActs, QActs16};
use crate::{QMatrix, WeightFormat};

/// Const-generic format tags (monomorphized inner loops).
const Q8_0: u8 = 0;
const Q4_0: u8 = 1;
const Q4_1: u8 = 2;
const F32: u8 = 3;
const F16: u8 = 4;
const BF16: u8 = 5;

const fn block_bytes(f: u8) -> usize {
    match f {
        Q8_0 => 34,
        Q4_0 => 18,
        Q4_1 => 20,
        F32 => 4,
        _ => 2,
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum(v: __m256) -> f32 {
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
unsafe fn f16_at(p: *const u8) -> f32 {
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
unsafe fn nibbles32(p: *const u8) -> __m256i {
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
fn u8x16_to_f32(v: __m128i, off: __m256i) -> [__m256; 2] {
    [
        _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_cvtepu8_epi32(v), off)),
        _mm256_cvtepi32_ps(_mm256_sub_epi32(
            _mm256_cvtepu8_epi32(_mm_srli_si128::<8>(v)),
            off,
        )),
    ]
}

/// Dequantizes the quantized block at `p` (format `F`) into 4 × f32x8.
///
/// # Safety
/// AVX2/FMA/F16C present; `block_bytes(F)` bytes readable at `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dequant_block<const F: u8>(p: *const u8) -> [__m256; 4] {
    // SAFETY: `p` points at a full block of `block_bytes(F)` bytes (caller
    // contract); all loads below stay within it
    // (Q8_0: 2 + 4*8 = 34; Q4_0: 2 + 16 = 18; Q4_1: 4 + 16 = 20).
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
            _ => [_mm256_setzero_ps(); 4],
        }
    }
}

/// Loads 8 float-format elements (format `F` in F32/F16/BF16) at `p` as f32x8.
///
/// # Safety
/// AVX2/F16C present; `8 * block_bytes(F)` bytes readable at `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load_float8<const F: u8>(p: *const u8) -> __m256 {
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
fn float_at<const F: u8>(row: &[u8], j: usize) -> f32 {
    match F {
        F32 => f32::from_le_bytes([row[4 * j], row[4 * j + 1], row[4 * j + 2], row[4 * j + 3]]),
        F16 => half::f16::from_le_bytes([row[2 * j], row[2 * j + 1]]).to_f32(),
        _ => half::bf16::from_le_bytes([row[2 * j], row[2 * j + 1]]).to_f32(),
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
            WeightFormat::F32 => dequant_float::<F32>(src, dst),
            WeightFormat::F16 => dequant_float::<F16>(src, dst),
            WeightFormat::BF16 => dequant_float::<BF16>(src, dst),
            WeightFormat::Q4_K | WeightFormat::Q6_K => dequant_k(format, src, dst),
            WeightFormat::I4Hybrid { outliers_per_row } => {
                dequant_hybrid(usize::from(outliers_per_row), src, dst)
            }
        }
    }
}

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
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dequant_hybrid(k: usize, src: &[u8], dst: &mut [f32]) {
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
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_exact_hybrid(k: usize, row: &[u8], x: &[f32]) -> f32 {
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
            _mm_prefetch::<_MM_HINT_T0>(nib.as_ptr().wrapping_add(16 * b + PREFETCH) as *const i8);
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

/// Exact dot of a quantized row with f32 `x`.
///
/// # Safety
/// AVX2/FMA/F16C present.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_exact_q<const F: u8>(row: &[u8], x: &[f32]) -> f32 {
    let nb = x.len() / 32;
    let bb = block_bytes(F);
    assert!(row.len() >= nb * bb);
    let mut acc = [_mm256_setzero_ps(); 4];
    for b in 0..nb {
        // SAFETY: b < nb: block b lies inside `row` (asserted) and
        // x[b*32..b*32+32] inside `x`.
        unsafe {
            // Prefetch hint (never faults; wrapping_add keeps it UB-free).
            _mm_prefetch::<_MM_HINT_T0>(row.as_ptr().wrapping_add(b * bb + PREFETCH) as *const i8);
            let w = dequant_block::<F>(row.as_ptr().add(b * bb));
            let xp = x.as_ptr().add(b * 32);
            for i in 0..4 {
                acc[i] = _mm256_fmadd_ps(w[i], _mm256_loadu_ps(xp.add(8 * i)), acc[i]);
            }
        }
    }
    hsum(_mm256_add_ps(
        _mm256_add_ps(acc[0], acc[1]),
        _mm256_add_ps(acc[2], acc[3]),
    ))
}

/// Dequantizes a K-quant row (`Q4_K` or `Q6_K`) super-block by super-block.
///
/// # Safety
/// AVX2/FMA/F16C present.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dequant_k(format: WeightFormat, src: &[u8], dst: &mut [f32]) {
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
/// AVX2 must be available and `blk.len() >= 210`, `n < 2` (the loads read
/// `ql[64n..64n+64]` and `qh[32n..32n+32]`, all below byte 192).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn q6k_half(blk: &[u8], n: usize) -> [__m256i; 4] {
    debug_assert!(blk.len() >= 210 && n < 2);
    let m4 = _mm256_set1_epi8(0x0F);
    let m2 = _mm256_set1_epi8(3);
    let p = blk.as_ptr();
    // SAFETY: the caller guarantees blk.len() >= 210 and n < 2, so every
    // 32-byte load below ends at or before byte 192.
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
    let c32 = _mm256_set1_epi8(32);
    [
        _mm256_sub_epi8(_mm256_or_si256(_mm256_and_si256(ql0, m4), hbits(0)), c32),
        _mm256_sub_epi8(_mm256_or_si256(_mm256_and_si256(ql1, m4), hbits(1)), c32),
        _mm256_sub_epi8(
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m4), hbits(2)),
            c32,
        ),
        _mm256_sub_epi8(
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m4), hbits(3)),
            c32,
        ),
    ]
}

/// Dequantizes one K-quant super-block into 256 f32. Same f32 operations
/// as the scalar reference (`d*sc * q - dmin*m` for Q4_K, `(d*sc) * q` for
/// Q6_K; no FMA), so the results are bit-identical.
///
/// # Safety
/// AVX2/FMA/F16C present.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dequant_superblock(format: WeightFormat, blk: &[u8], out: &mut [f32; 256]) {
    let o = out.as_mut_ptr();
    let m4 = _mm256_set1_epi8(0x0F);
    if format == WeightFormat::Q4_K {
        assert!(blk.len() >= 144);
        let (dl, ml) = crate::scalar::q4k_scales(blk);
        for g in 0..4 {
            // SAFETY: bytes 16+32g..48+32g (g < 4: at most 144) are inside
            // `blk` (asserted); stores write out[64g..64g+64] (<= 256).
            unsafe {
                let raw = _mm256_loadu_si256(blk.as_ptr().add(16 + 32 * g) as *const __m256i);
                let lo = _mm256_and_si256(raw, m4);
                let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(raw), m4);
                for (h, q) in [lo, hi].into_iter().enumerate() {
                    let s = 2 * g + h;
                    let (d, m) = (_mm256_set1_ps(dl[s]), _mm256_set1_ps(ml[s]));
                    store_u8x32_scaled(q, d, m, o.add(32 * s));
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

/// Exact dot of a K-quant row with f32 `x`: each super-block is dequantized
/// into 256 f32 on the stack, then multiplied with FMAs (4 accumulators).
///
/// # Safety
/// AVX2/FMA/F16C present.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_exact_k(format: WeightFormat, row: &[u8], x: &[f32]) -> f32 {
    let bb = format.block_bytes();
    let mut buf = [0f32; 256];
    let mut acc = [_mm256_setzero_ps(); 4];
    for (blk, xs) in row.chunks_exact(bb).zip(x.chunks_exact(256)) {
        // Prefetch hint (never faults; wrapping_add keeps it UB-free).
        _mm_prefetch::<_MM_HINT_T0>(blk.as_ptr().wrapping_add(PREFETCH) as *const i8);
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

/// Exact dot of a float-format row with f32 `x`.
///
/// # Safety
/// AVX2/FMA/F16C present.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_exact_float<const F: u8>(row: &[u8], x: &[f32]) -> f32 {
    let n = x.len();
    let eb = block_bytes(F);
    assert!(row.len() >= n * eb);
    let mut acc = [_mm256_setzero_ps(); 4];
    let n32 = n / 32 * 32;
    let n8 = n / 8 * 8;
    let mut j = 0;
    while j < n32 {
        // Prefetch hint (never faults; wrapping_add keeps it UB-free).
        _mm_prefetch::<_MM_HINT_T0>(row.as_ptr().wrapping_add(j * eb + PREFETCH) as *const i8);
        for (i, a) in acc.iter_mut().enumerate() {
            // SAFETY: j + 32 <= n: elements j+8i..j+8i+8 are in `row` and `x`.
            unsafe {
                let w = load_float8::<F>(row.as_ptr().add((j + 8 * i) * eb));
                *a = _mm256_fmadd_ps(w, _mm256_loadu_ps(x.as_ptr().add(j + 8 * i)), *a);
            }
        }
        j += 32;
    }
    while j < n8 {
        // SAFETY: j + 8 <= n.
        unsafe {
            let w = load_float8::<F>(row.as_ptr().add(j * eb));
            acc[0] = _mm256_fmadd_ps(w, _mm256_loadu_ps(x.as_ptr().add(j)), acc[0]);
        }
        j += 8;
    }
    let mut s = hsum(_mm256_add_ps(
        _mm256_add_ps(acc[0], acc[1]),
        _mm256_add_ps(acc[2], acc[3]),
    ));
    for (jj, xv) in x.iter().enumerate().skip(n8) {
        s += float_at::<F>(row, jj) * xv;
    }
    s
}

/// # Safety
/// AVX2/FMA/F16C present.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn matvec_exact(w: &QMatrix<'_>, sel: Rows<'_>, x: &[f32], y: &mut [f32]) {
    // SAFETY: features present per contract; callees check lengths.
    unsafe {
        match w.format() {
            WeightFormat::Q8_0 => rows_with(w, sel, y, |r| dot_exact_q::<Q8_0>(r, x)),
            WeightFormat::Q4_0 => rows_with(w, sel, y, |r| dot_exact_q::<Q4_0>(r, x)),
            WeightFormat::Q4_1 => rows_with(w, sel, y, |r| dot_exact_q::<Q4_1>(r, x)),
            WeightFormat::F32 => rows_with(w, sel, y, |r| dot_exact_float::<F32>(r, x)),
            WeightFormat::F16 => rows_with(w, sel, y, |r| dot_exact_float::<F16>(r, x)),
            WeightFormat::BF16 => rows_with(w, sel, y, |r| dot_exact_float::<BF16>(r, x)),
            WeightFormat::Q4_K | WeightFormat::Q6_K => {
                let f = w.format();
                rows_with(w, sel, y, |r| dot_exact_k(f, r, x))
            }
            WeightFormat::I4Hybrid { outliers_per_row } => {
                let k = usize::from(outliers_per_row);
                rows_with(w, sel, y, |r| dot_exact_hybrid(k, r, x))
            }
        }
    }
}

#[inline(always)]
fn rows_with(w: &QMatrix<'_>, sel: Rows<'_>, y: &mut [f32], mut f: impl FnMut(&[u8]) -> f32) {
    for (i, yv) in y.iter_mut().enumerate() {
        sel.prefetch(w, i + 2, 1);
        *yv = f(w.row_data(sel.get(i)));
    }
}

/// `y += c * dequant(row)` for a quantized row (format `F`) of `y.len() / 32` blocks.
///
/// # Safety
/// AVX2/FMA/F16C present.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn axpy_q<const F: u8>(c: f32, row: &[u8], y: &mut [f32]) {
    let nb = y.len() / 32;
    let bb = block_bytes(F);
    assert!(row.len() >= nb * bb);
    let cv = _mm256_set1_ps(c);
    for b in 0..nb {
        // SAFETY: b < nb: block b lies inside `row` (asserted) and
        // y[b*32..b*32+32] inside `y`.
        unsafe {
            _mm_prefetch::<_MM_HINT_T0>(row.as_ptr().wrapping_add(b * bb + PREFETCH) as *const i8);
            let w = dequant_block::<F>(row.as_ptr().add(b * bb));
            let yp = y.as_mut_ptr().add(b * 32);
            for (i, wv) in w.iter().enumerate() {
                let p = yp.add(8 * i);
                _mm256_storeu_ps(p, _mm256_fmadd_ps(*wv, cv, _mm256_loadu_ps(p)));
            }
        }
    }
}

/// How far ahead in the row list [`axpy_rows_tiled`] prefetches.
const TILED_PREFETCH_ROWS: usize = 8;

/// `y += Σ_k coeffs[k] · row(rows[k])[blocks]` for a quantized format, where
/// the blocks of each row start at byte `b0` and `y.len() / 32` of them are
/// used: the sparse down projection (`axpy_rows`) in column tiles of 64, whose
/// sums stay in 8 registers across all listed rows (one load and store of `y`
/// per tile instead of one per row). Returns `false` (and does nothing) for
/// formats it does not handle.
///
/// # Safety
/// AVX2/FMA/F16C present.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn axpy_rows_tiled(
    format: WeightFormat,
    data: &[u8],
    row_bytes: usize,
    b0: usize,
    rows: &[u32],
    coeffs: &[f32],
    y: &mut [f32],
) -> bool {
    // SAFETY: features present per contract; the callee checks every bound.
    unsafe {
        match format {
            WeightFormat::Q8_0 => axpy_rows_tiled_q::<Q8_0>(data, row_bytes, b0, rows, coeffs, y),
            WeightFormat::Q4_0 => axpy_rows_tiled_q::<Q4_0>(data, row_bytes, b0, rows, coeffs, y),
            WeightFormat::Q4_1 => axpy_rows_tiled_q::<Q4_1>(data, row_bytes, b0, rows, coeffs, y),
            _ => return false,
        }
    }
    true
}

/// # Safety
/// AVX2/FMA/F16C present.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn axpy_rows_tiled_q<const F: u8>(
    data: &[u8],
    row_bytes: usize,
    b0: usize,
    rows: &[u32],
    coeffs: &[f32],
    y: &mut [f32],
) {
    let bb = block_bytes(F);
    let nb = y.len() / 32;
    assert_eq!(rows.len(), coeffs.len());
    assert!(b0 + nb * bb <= row_bytes);
    let max_row = rows.iter().copied().max().unwrap_or(0) as usize;
    assert!(rows.is_empty() || (max_row + 1) * row_bytes <= data.len());
    let base = data.as_ptr();
    // Rows go in groups whose column ranges fit in L2, so the later tile
    // passes of a group find its rows there (one pass over all rows of a
    // large matrix would fetch them from DRAM once per tile).
    let group = (TILED_GROUP_BYTES / (nb * bb).max(1)).max(16);
    let mut g0 = 0;
    while g0 < rows.len() {
        let g1 = (g0 + group).min(rows.len());
        // SAFETY: features present per contract; every listed row lies in
        // `data` and b0 + nb * bb <= row_bytes (asserted above).
        unsafe { axpy_tiles::<F>(base, row_bytes, b0, nb, rows, g0..g1, coeffs, y) };
        g0 = g1;
    }
}

/// Bytes of row ranges per group in [`axpy_rows_tiled_q`] (a share of a
/// 512 KiB L2, leaving room for the prefetched next rows).
const TILED_GROUP_BYTES: usize = 192 * 1024;

/// The tile passes of [`axpy_rows_tiled_q`] over `rows[group]`.
///
/// # Safety
/// AVX2/FMA/F16C present; every listed row lies in the matrix at `base`
/// and `b0 + nb * bb <= row_bytes` (checked by the caller).
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn axpy_tiles<const F: u8>(
    base: *const u8,
    row_bytes: usize,
    b0: usize,
    nb: usize,
    all_rows: &[u32],
    group: std::ops::Range<usize>,
    coeffs: &[f32],
    y: &mut [f32],
) {
    let bb = block_bytes(F);
    let g0 = group.start;
    let rows = &all_rows[group.clone()];
    let coeffs = &coeffs[group];
    let mut b = 0;
    while b < nb {
        let two = nb - b >= 2;
        let off = b0 + b * bb;
        let span = if two { 2 * bb } else { bb };
        let mut acc = [_mm256_setzero_ps(); 8];
        for (k, (&r, &c)) in rows.iter().zip(coeffs).enumerate() {
            // Listed rows are scattered, so the hardware prefetcher cannot
            // follow them: the first tile pass fetches each upcoming row's
            // whole range (later passes find it in L2), later ones their tile.
            if let Some(&next) = all_rows.get(g0 + k + TILED_PREFETCH_ROWS) {
                if b == 0 {
                    let q = base.wrapping_add(next as usize * row_bytes + b0);
                    let mut o = 0;
                    while o < nb * bb {
                        _mm_prefetch::<_MM_HINT_T0>(q.wrapping_add(o) as *const i8);
                        o += 64;
                    }
                    _mm_prefetch::<_MM_HINT_T0>(q.wrapping_add(nb * bb - 1) as *const i8);
                } else {
                    let q = base.wrapping_add(next as usize * row_bytes + off);
                    _mm_prefetch::<_MM_HINT_T0>(q as *const i8);
                    _mm_prefetch::<_MM_HINT_T0>(q.wrapping_add(span - 1) as *const i8);
                }
            }
            if c == 0.0 {
                continue;
            }
            let cv = _mm256_set1_ps(c);
            // SAFETY: row r lies in the matrix at `base` (caller contract),
            // and its bytes off..off + span lie in the row (b + 2 <= nb when
            // `two`, b0 + nb * bb <= row_bytes).
            unsafe {
                let p = base.add(r as usize * row_bytes + off);
                let w = dequant_block::<F>(p);
                for i in 0..4 {
                    acc[i] = _mm256_fmadd_ps(w[i], cv, acc[i]);
                }
                if two {
                    let w = dequant_block::<F>(p.add(bb));
                    for i in 0..4 {
                        acc[4 + i] = _mm256_fmadd_ps(w[i], cv, acc[4 + i]);
                    }
                }
            }
        }
        let lanes = if two { 8 } else { 4 };
        for (i, a) in acc.iter().take(lanes).enumerate() {
            // SAFETY: (b * 32 + 8 * i) + 8 <= (b + lanes / 4) * 32 <= nb * 32 <= y.len().
            unsafe {
                let yp = y.as_mut_ptr().add(b * 32 + 8 * i);
                _mm256_storeu_ps(yp, _mm256_add_ps(_mm256_loadu_ps(yp), *a));
            }
        }
        b += if two { 2 } else { 1 };
    }
}

/// `y += c * row` for a float-format row (format `F`) of `y.len()` elements.
///
/// # Safety
/// AVX2/FMA/F16C present.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn axpy_float<const F: u8>(c: f32, row: &[u8], y: &mut [f32]) {
    let n = y.len();
    let eb = block_bytes(F);
    assert!(row.len() >= n * eb);
    let n8 = n / 8 * 8;
    let cv = _mm256_set1_ps(c);
    let mut j = 0;
    while j < n8 {
        // SAFETY: j + 8 <= n: elements j..j+8 are in `row` and `y`.
        unsafe {
            let w = load_float8::<F>(row.as_ptr().add(j * eb));
            let p = y.as_mut_ptr().add(j);
            _mm256_storeu_ps(p, _mm256_fmadd_ps(w, cv, _mm256_loadu_ps(p)));
        }
        j += 8;
    }
    for (jj, yv) in y.iter_mut().enumerate().skip(n8) {
        *yv += c * float_at::<F>(row, jj);
    }
}

/// `y += c * dequant(row)` (`row` has exactly `format.row_bytes(y.len())` bytes).
///
/// # Safety
/// AVX2/FMA/F16C present.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn axpy_row(format: WeightFormat, c: f32, row: &[u8], y: &mut [f32]) {
    // SAFETY: features present per contract; the callees assert lengths.
    unsafe {
        match format {
            WeightFormat::Q8_0 => axpy_q::<Q8_0>(c, row, y),
            WeightFormat::Q4_0 => axpy_q::<Q4_0>(c, row, y),
            WeightFormat::Q4_1 => axpy_q::<Q4_1>(c, row, y),
            WeightFormat::F32 => axpy_float::<F32>(c, row, y),
            WeightFormat::F16 => axpy_float::<F16>(c, row, y),
            WeightFormat::BF16 => axpy_float::<BF16>(c, row, y),
            WeightFormat::Q4_K | WeightFormat::Q6_K => {
                // Dequantize each 256-element super-block, then FMA it in.
                let mut buf = [0f32; 256];
                for (blk, ys) in row
                    .chunks_exact(format.block_bytes())
                    .zip(y.chunks_exact_mut(256))
                {
                    dequant_superblock(format, blk, &mut buf);
                    axpy_f32(c, &buf, ys);
                }
            }
            WeightFormat::I4Hybrid { outliers_per_row } => {
                axpy_hybrid(usize::from(outliers_per_row), c, row, y.len(), 0, y)
            }
        }
    }
}

/// Signed i8 × i8 dot of 32 lanes, as 8 partial i32 sums converted to f32
/// (llama.cpp `mul_sum_i8_pairs_float`). `x` must be in -127..=127.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn mul_sum_i8(w: __m256i, x: __m256i) -> __m256 {
    let aw = _mm256_sign_epi8(w, w);
    let sx = _mm256_sign_epi8(x, w);
    let p16 = _mm256_maddubs_epi16(aw, sx);
    _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)))
}

/// Unsigned u8 (0..=15) × i8 dot of 32 lanes as 8 f32 partial sums.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn mul_sum_u8_i8(w: __m256i, x: __m256i) -> __m256 {
    let p16 = _mm256_maddubs_epi16(w, x);
    _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)))
}

/// Integer dot of block `b` of the row at `p` with the activation block at
/// `xq`: returns (d_w * d_x * isum lanes, extra scalar term).
///
/// # Safety
/// AVX2/FMA/F16C present; a full block at `p`, 32 i8 at `xq`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block_fast<const F: u8>(
    p: *const u8,
    xq: *const i8,
    dx: f32,
    sx: f32,
    acc: __m256,
    extra: &mut f32,
) -> __m256 {
    // SAFETY: caller guarantees a full block at `p` (34/18/20 bytes: the
    // loads below read at most that) and 32 readable i8 at `xq`.
    unsafe {
        let xv = _mm256_loadu_si256(xq as *const __m256i);
        let (d, prod) = match F {
            Q8_0 => (
                f16_at(p) * dx,
                mul_sum_i8(_mm256_loadu_si256(p.add(2) as *const __m256i), xv),
            ),
            Q4_0 => (
                f16_at(p) * dx,
                mul_sum_i8(
                    _mm256_sub_epi8(nibbles32(p.add(2)), _mm256_set1_epi8(8)),
                    xv,
                ),
            ),
            _ => {
                // d and m are adjacent f16s: one conversion for both.
                let dm = _mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(p as *const i32)));
                *extra += _mm_cvtss_f32(_mm_movehdup_ps(dm)) * sx;
                (
                    _mm_cvtss_f32(dm) * dx,
                    mul_sum_u8_i8(nibbles32(p.add(4)), xv),
                )
            }
        };
        _mm256_fmadd_ps(_mm256_set1_ps(d), prod, acc)
    }
}

/// Software prefetch distance in bytes for streaming weight rows.
const PREFETCH: usize = 512;

/// Integer dot of `R` rows (starting at row pointers `rows[i]`) with the
/// 8-bit activations, sharing each activation block's load between the
/// rows (per row the same operations in the same order as for `R == 1`,
/// so results do not depend on `R`).
///
/// # Safety
/// AVX2/FMA/F16C present.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_int8_rows<const F: u8, const R: usize>(rows: [&[u8]; R], xq: &QActs) -> [f32; R] {
    let nb = xq.d.len();
    let bb = block_bytes(F);
    assert!(rows.iter().all(|r| r.len() >= nb * bb) && xq.qs.len() >= nb * 32 && xq.s.len() >= nb);
    let mut acc = [_mm256_setzero_ps(); R];
    let mut extra = [0f32; R];
    for b in 0..nb {
        // SAFETY: b < nb: block b of every row and activation block b are in
        // bounds (asserted above).
        unsafe {
            let xp = xq.qs.as_ptr().add(b * 32);
            let (dx, sx) = (*xq.d.get_unchecked(b), *xq.s.get_unchecked(b));
            for i in 0..R {
                let p = rows[i].as_ptr().add(b * bb);
                // Prefetch ahead of each weight stream (a hint: never faults,
                // so an address past the row is harmless; wrapping_add avoids UB).
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH) as *const i8);
                acc[i] = block_fast::<F>(p, xp, dx, sx, acc[i], &mut extra[i]);
            }
        }
    }
    std::array::from_fn(|i| hsum(acc[i]) + extra[i])
}

/// `R` rows per iteration (sharing the activation loads), then pairs, then
/// single rows.
///
/// # Safety
/// AVX2/FMA/F16C present.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn matvec_int8_q<const F: u8, const R: usize>(
    w: &QMatrix<'_>,
    sel: Rows<'_>,
    xq: &QActs,
    y: &mut [f32],
) {
    let mut i = 0;
    while i + R <= y.len() {
        sel.prefetch(w, i + R, R);
        let rows = std::array::from_fn(|k| w.row_data(sel.get(i + k)));
        // SAFETY: features present per contract; the callee asserts lengths.
        let s = unsafe { dot_int8_rows::<F, R>(rows, xq) };
        y[i..i + R].copy_from_slice(&s);
        i += R;
    }
    while R > 2 && i + 2 <= y.len() {
        let rows = [w.row_data(sel.get(i)), w.row_data(sel.get(i + 1))];
        // SAFETY: features present per contract; the callee asserts lengths.
        let s = unsafe { dot_int8_rows::<F, 2>(rows, xq) };
        y[i..i + 2].copy_from_slice(&s);
        i += 2;
    }
    while i < y.len() {
        // SAFETY: features present per contract; the callee asserts lengths.
        y[i] = unsafe { dot_int8_rows::<F, 1>([w.row_data(sel.get(i))], xq) }[0];
        i += 1;
    }
}

/// # Safety
/// AVX2/FMA/F16C present.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn matvec_int8(w: &QMatrix<'_>, sel: Rows<'_>, xq: &QActs, y: &mut [f32]) {
    // Rows per step (see `matvec_i16_q`): dense rows stream from memory, where fewer concurrent
    // row streams per thread measured faster end to end; listed rows are scattered, where more rows
    // in flight hide their latency.
    let dense = matches!(sel, Rows::From(_));
    // SAFETY: features present per contract.
    unsafe {
        match w.format() {
            WeightFormat::Q8_0 if dense => matvec_int8_q::<Q8_0, 1>(w, sel, xq, y),
            WeightFormat::Q8_0 => matvec_int8_q::<Q8_0, 2>(w, sel, xq, y),
            WeightFormat::Q4_0 if dense => matvec_int8_q::<Q4_0, 2>(w, sel, xq, y),
            WeightFormat::Q4_0 => matvec_int8_q::<Q4_0, 4>(w, sel, xq, y),
            WeightFormat::Q4_1 if dense => matvec_int8_q::<Q4_1, 2>(w, sel, xq, y),
            WeightFormat::Q4_1 => matvec_int8_q::<Q4_1, 4>(w, sel, xq, y),
            WeightFormat::Q4_K | WeightFormat::Q6_K => {
                let (f, qs) = (w.format(), xq.qs.as_ptr() as *const u8);
                rows_with(w, sel, y, |r| {
                    dot_k_int::<true>(f, r, qs, xq.qs.len(), &xq.d, &xq.s)
                })
            }
            _ => crate::scalar::matvec_int8(w, sel, xq, y),
        }
    }
}

/// The 32 weights of the quantized block at `p` as two i16x16 vectors
/// (elements 0..16 and 16..32; Q4_0 already offset by -8).
///
/// # Safety
/// AVX2 present; a full block of `block_bytes(F)` bytes readable at `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn weights_i16<const F: u8>(p: *const u8) -> (__m256i, __m256i) {
    // SAFETY: caller guarantees a full block at `p`; the loads read bytes
    // 2..34 (Q8_0), 2..18 (Q4_0) or 4..20 (Q4_1), all inside it.
    unsafe {
        match F {
            Q8_0 => (
                _mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(2) as *const __m128i)),
                _mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(18) as *const __m128i)),
            ),
            _ => {
                let qoff = if F == Q4_0 { 2 } else { 4 };
                let raw = _mm_loadu_si128(p.add(qoff) as *const __m128i);
                let m = _mm_set1_epi8(0x0F);
                let lo = _mm256_cvtepu8_epi16(_mm_and_si128(raw, m));
                let hi = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(raw), m));
                if F == Q4_0 {
                    let eight = _mm256_set1_epi16(8);
                    (_mm256_sub_epi16(lo, eight), _mm256_sub_epi16(hi, eight))
                } else {
                    (lo, hi)
                }
            }
        }
    }
}

/// Integer dot of `R` rows (starting at row pointers `rows[i]`) with the
/// 16-bit activations: per block, weights widened to i16, `madd_epi16`
/// with the i16 quants into i32 lanes, one `cvtepi32_ps` and one FMA with
/// `d_w * d_x`. Overflow: |q_x| <= 32767, |q_w| <= 128, so a `madd` pair is
/// below 2^23 and the 8-lane sum of a block below 2^26.
///
/// # Safety
/// AVX2/FMA/F16C present; every `rows[i]` has at least `xq.d.len()`
/// blocks of `block_bytes(F)` bytes; `xq` is consistent (`qs.len() ==
/// 32 * d.len()`, `s.len() == d.len()`), as asserted.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_i16_rows<const F: u8, const R: usize>(rows: [&[u8]; R], xq: &QActs16) -> [f32; R] {
    let nb = xq.d.len();
    let bb = block_bytes(F);
    assert!(rows.iter().all(|r| r.len() >= nb * bb) && xq.qs.len() >= nb * 32 && xq.s.len() >= nb);
    let mut acc = [_mm256_setzero_ps(); R];
    let mut extra = [0f32; R];
    for b in 0..nb {
        // SAFETY: b < nb: block b of every row (bytes b*bb..(b+1)*bb) and
        // activation block b (qs[b*32..b*32+32], d[b], s[b]) are in bounds
        // (asserted above).
        unsafe {
            let xp = xq.qs.as_ptr().add(b * 32);
            let x0 = _mm256_loadu_si256(xp as *const __m256i);
            let x1 = _mm256_loadu_si256(xp.add(16) as *const __m256i);
            let (dx, sx) = (*xq.d.get_unchecked(b), *xq.s.get_unchecked(b));
            for i in 0..R {
                let p = rows[i].as_ptr().add(b * bb);
                // Prefetch hint (never faults; wrapping_add keeps it UB-free).
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH) as *const i8);
                let (w0, w1) = weights_i16::<F>(p);
                let isum = _mm256_add_epi32(_mm256_madd_epi16(w0, x0), _mm256_madd_epi16(w1, x1));
                let dw = if F == Q4_1 {
                    // d and m are adjacent f16s: one conversion for both.
                    let dm =
                        _mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(p as *const i32)));
                    extra[i] += _mm_cvtss_f32(_mm_movehdup_ps(dm)) * sx;
                    _mm_cvtss_f32(dm)
                } else {
                    f16_at(p)
                };
                acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(dw * dx), acc[i]);
            }
        }
    }
    std::array::from_fn(|i| hsum(acc[i]) + extra[i])
}

/// `R` rows per iteration (sharing the activation loads), then single rows.
/// Measured (AVX2, 2026-11-23): with the matrix in cache, 4 rows is best
/// for the 4-bit formats and 2 for Q8_0 (1 thread, criterion); streaming
/// SmolLM2's 92 MiB per token from DRAM on 2 threads (`sparrow bench`,
/// interleaved with llama-bench), 2 rows for the 4-bit formats and 1 for
/// Q8_0 decode about 9% faster than 4 and 2. The callers use the latter
/// for dense matrices and the former for row lists.
///
/// # Safety
/// AVX2/FMA/F16C present.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn matvec_i16_q<const F: u8, const R: usize>(
    w: &QMatrix<'_>,
    sel: Rows<'_>,
    xq: &QActs16,
    y: &mut [f32],
) {
    let mut i = 0;
    while i + R <= y.len() {
        sel.prefetch(w, i + R, R);
        let rows = std::array::from_fn(|k| w.row_data(sel.get(i + k)));
        // SAFETY: features present per contract; the callee asserts lengths.
        let s = unsafe { dot_i16_rows::<F, R>(rows, xq) };
        y[i..i + R].copy_from_slice(&s);
        i += R;
    }
    // Short lists (a few rows of a neuron-store unit) and tails: pairs still share the activations.
    while R > 2 && i + 2 <= y.len() {
        let rows = [w.row_data(sel.get(i)), w.row_data(sel.get(i + 1))];
        // SAFETY: features present per contract; the callee asserts lengths.
        let s = unsafe { dot_i16_rows::<F, 2>(rows, xq) };
        y[i..i + 2].copy_from_slice(&s);
        i += 2;
    }
    while i < y.len() {
        // SAFETY: features present per contract; the callee asserts lengths.
        y[i] = unsafe { dot_i16_rows::<F, 1>([w.row_data(sel.get(i))], xq) }[0];
        i += 1;
    }
}

/// Quantized weights × 16-bit activations ([`Precision::Fast`](crate::Precision::Fast)).
///
/// # Safety
/// AVX2/FMA/F16C present.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn matvec_i16(w: &QMatrix<'_>, sel: Rows<'_>, xq: &QActs16, y: &mut [f32]) {
    // Rows per step (see `matvec_i16_q`): dense rows stream from memory, where fewer concurrent
    // row streams per thread measured faster end to end; listed rows are scattered, where more rows
    // in flight hide their latency.
    let dense = matches!(sel, Rows::From(_));
    // SAFETY: features present per contract.
    unsafe {
        match w.format() {
            WeightFormat::Q8_0 if dense => matvec_i16_q::<Q8_0, 1>(w, sel, xq, y),
            WeightFormat::Q8_0 => matvec_i16_q::<Q8_0, 2>(w, sel, xq, y),
            WeightFormat::Q4_0 if dense => matvec_i16_q::<Q4_0, 2>(w, sel, xq, y),
            WeightFormat::Q4_0 => matvec_i16_q::<Q4_0, 4>(w, sel, xq, y),
            WeightFormat::Q4_1 if dense => matvec_i16_q::<Q4_1, 2>(w, sel, xq, y),
            WeightFormat::Q4_1 => matvec_i16_q::<Q4_1, 4>(w, sel, xq, y),
            WeightFormat::Q4_K | WeightFormat::Q6_K => {
                let (f, qs) = (w.format(), xq.qs.as_ptr() as *const u8);
                rows_with(w, sel, y, |r| {
                    dot_k_int::<false>(f, r, qs, xq.qs.len(), &xq.d, &xq.s)
                })
            }
            _ => crate::scalar::matvec_i16(w, sel, xq, y),
        }
    }
}

/// 16 activation quants starting at element `e` of the quantized activation
/// vector at `qs` (i8 if `A8`, else i16), widened to i16x16.
///
/// # Safety
/// AVX2 present; elements `e..e+16` readable at `qs`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn acts16<const A8: bool>(qs: *const u8, e: usize) -> __m256i {
    // SAFETY: caller guarantees elements e..e+16 (16 or 32 bytes) readable.
    unsafe {
        if A8 {
            _mm256_cvtepi8_epi16(_mm_loadu_si128(qs.add(e) as *const __m128i))
        } else {
            _mm256_loadu_si256(qs.add(2 * e) as *const __m256i)
        }
    }
}

/// Integer dot of a K-quant row (`Q4_K` or `Q6_K`) with quantized
/// activations (`A8`: 8-bit `QActs`, else 16-bit `QActs16`, passed as raw
/// quants `qs` of `qs_len` elements, per-32 scales `d`, `s = d*sum(q)`).
/// Weights are widened to i16 and multiplied with `madd_epi16` into i32
/// lanes (|q_w| <= 63, |q_x| <= 32767: a pair is below 2^22), then per
/// sub-block one convert and one FMA with `(d*sc) * d_x`; the Q4_K min term
/// `(dmin*m) * s_x` is accumulated separately (see the crate docs).
///
/// # Safety
/// AVX2/FMA/F16C present; `qs` points at `qs_len` readable quants.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_k_int<const A8: bool>(
    format: WeightFormat,
    row: &[u8],
    qs: *const u8,
    qs_len: usize,
    d: &[f32],
    s: &[f32],
) -> f32 {
    let nsb = d.len() / 8;
    let bb = format.block_bytes();
    assert!(row.len() >= nsb * bb && qs_len >= nsb * 256 && s.len() >= nsb * 8);
    let m4 = _mm256_set1_epi8(0x0F);
    let mut acc = _mm256_setzero_ps();
    let mut extra = 0f32;
    for sb in 0..nsb {
        let blk = &row[sb * bb..(sb + 1) * bb];
        // Prefetch hint (never faults; wrapping_add keeps it UB-free).
        _mm_prefetch::<_MM_HINT_T0>(blk.as_ptr().wrapping_add(PREFETCH) as *const i8);
        if format == WeightFormat::Q4_K {
            let (dl, ml) = crate::scalar::q4k_scales(blk);
            for g in 0..4 {
                // SAFETY: bytes 16+32g..48+32g <= 144 of `blk`; activation
                // elements (sb*8 + 2g + h)*32 + 0..32 < nsb*256 <= qs_len
                // and b < nsb*8 <= d.len(), s.len() (asserted).
                unsafe {
                    let raw = _mm256_loadu_si256(blk.as_ptr().add(16 + 32 * g) as *const __m256i);
                    let lo = _mm256_and_si256(raw, m4);
                    let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(raw), m4);
                    for (h, q) in [lo, hi].into_iter().enumerate() {
                        let j = 2 * g + h;
                        let b = sb * 8 + j;
                        let w0 = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(q));
                        let w1 = _mm256_cvtepu8_epi16(_mm256_extracti128_si256::<1>(q));
                        let isum = _mm256_add_epi32(
                            _mm256_madd_epi16(w0, acts16::<A8>(qs, 32 * b)),
                            _mm256_madd_epi16(w1, acts16::<A8>(qs, 32 * b + 16)),
                        );
                        let (dx, sx) = (*d.get_unchecked(b), *s.get_unchecked(b));
                        acc = _mm256_fmadd_ps(
                            _mm256_cvtepi32_ps(isum),
                            _mm256_set1_ps(dl[j] * dx),
                            acc,
                        );
                        extra -= ml[j] * sx;
                    }
                }
            }
        } else {
            let ds = crate::scalar::q6k_scales(blk);
            for n in 0..2 {
                // SAFETY: loads read ql[64n..64n+64], qh[32n..32n+32]
                // (< 192 <= 210 bytes of `blk`); activation elements
                // (sb*8 + 4n + k)*32 + 0..32 < nsb*256 <= qs_len and
                // b < nsb*8 <= d.len() (asserted).
                unsafe {
                    for (k, qk) in q6k_half(blk, n).into_iter().enumerate() {
                        let b = sb * 8 + 4 * n + k;
                        let j = 8 * n + 2 * k;
                        let w0 = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(qk));
                        let w1 = _mm256_cvtepi8_epi16(_mm256_extracti128_si256::<1>(qk));
                        let i0 = _mm256_madd_epi16(w0, acts16::<A8>(qs, 32 * b));
                        let i1 = _mm256_madd_epi16(w1, acts16::<A8>(qs, 32 * b + 16));
                        let dx = *d.get_unchecked(b);
                        acc = _mm256_fmadd_ps(
                            _mm256_cvtepi32_ps(i0),
                            _mm256_set1_ps(ds[j] * dx),
                            acc,
                        );
                        acc = _mm256_fmadd_ps(
                            _mm256_cvtepi32_ps(i1),
                            _mm256_set1_ps(ds[j + 1] * dx),
                            acc,
                        );
                    }
                }
            }
        }
    }
    hsum(acc) + extra
}

/// Register-blocked microkernel: `R` weight rows × `T` tokens.
///
/// # Safety
/// AVX2/FMA present; `w` has rows `i0..i0+R` and `x` tokens `t0..t0+T` of `cols`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn micro<const R: usize, const T: usize>(
    w: &[f32],
    x: &[f32],
    cols: usize,
    i0: usize,
    t0: usize,
    nr: usize,
    out: &mut [f32],
) {
    assert!(
        (i0 + R) * cols <= w.len()
            && (t0 + T) * cols <= x.len()
            && (t0 + T - 1) * nr + i0 + R <= out.len()
    );
    let wp = w.as_ptr().wrapping_add(i0 * cols);
    let xp = x.as_ptr().wrapping_add(t0 * cols);
    let mut acc = [[_mm256_setzero_ps(); T]; R];
    let k8 = cols / 8 * 8;
    let mut k = 0;
    while k < k8 {
        // SAFETY: k + 8 <= cols, rows i0..i0+R of `w` and tokens t0..t0+T of
        // `x` are in bounds (asserted), so every load reads inside them.
        unsafe {
            let mut xv = [_mm256_setzero_ps(); T];
            for (t, v) in xv.iter_mut().enumerate() {
                *v = _mm256_loadu_ps(xp.add(t * cols + k));
            }
            for (r, ar) in acc.iter_mut().enumerate() {
                let wv = _mm256_loadu_ps(wp.add(r * cols + k));
                for (a, v) in ar.iter_mut().zip(&xv) {
                    *a = _mm256_fmadd_ps(wv, *v, *a);
                }
            }
        }
        k += 8;
    }
    for (r, ar) in acc.iter().enumerate() {
        let wr = &w[(i0 + r) * cols..(i0 + r + 1) * cols];
        for (t, a) in ar.iter().enumerate() {
            let xt = &x[(t0 + t) * cols..(t0 + t + 1) * cols];
            let mut s = hsum(*a);
            for kk in k8..cols {
                s += wr[kk] * xt[kk];
            }
            out[(t0 + t) * nr + i0 + r] = s;
        }
    }
}

/// `out[t*nr + i] = dot(w[i], x[t])` for an f32 tile `w` (nr × cols).
///
/// # Safety
/// AVX2/FMA present.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn tile(w: &[f32], nr: usize, cols: usize, x: &[f32], n: usize, out: &mut [f32]) {
    const TR: usize = 4;
    const TT: usize = 3;
    let mut t0 = 0;
    while t0 < n {
        let tt = TT.min(n - t0);
        let mut i0 = 0;
        while i0 < nr {
            let rr = TR.min(nr - i0);
            // SAFETY: features present per contract; `micro` checks bounds.
            unsafe {
                match (rr, tt) {
                    (4, 3) => micro::<4, 3>(w, x, cols, i0, t0, nr, out),
                    (4, 2) => micro::<4, 2>(w, x, cols, i0, t0, nr, out),
                    (4, _) => micro::<4, 1>(w, x, cols, i0, t0, nr, out),
                    (3, 3) => micro::<3, 3>(w, x, cols, i0, t0, nr, out),
                    (3, 2) => micro::<3, 2>(w, x, cols, i0, t0, nr, out),
                    (3, _) => micro::<3, 1>(w, x, cols, i0, t0, nr, out),
                    (2, 3) => micro::<2, 3>(w, x, cols, i0, t0, nr, out),
                    (2, 2) => micro::<2, 2>(w, x, cols, i0, t0, nr, out),
                    (2, _) => micro::<2, 1>(w, x, cols, i0, t0, nr, out),
                    (_, 3) => micro::<1, 3>(w, x, cols, i0, t0, nr, out),
                    (_, 2) => micro::<1, 2>(w, x, cols, i0, t0, nr, out),
                    (_, _) => micro::<1, 1>(w, x, cols, i0, t0, nr, out),
                }
            }
            i0 += rr;
        }
        t0 += tt;
    }
}

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

/// AVX2 activation quantizer (same math as `QActs::quantize_scalar`:
/// d = amax/127, q = round-half-even(x * 127/amax), s = d * sum(q)).
///
/// # Safety
/// AVX2/FMA present.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn quantize(x: &[f32], out: &mut QActs) {
    let nb = x.len() / 32;
    assert!(out.d.len() >= nb && out.s.len() >= nb && out.qs.len() >= nb * 32);
    let sign = _mm256_set1_ps(-0.0);
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
            let mut m = _mm256_andnot_ps(sign, v[0]);
            for vi in &v[1..] {
                m = _mm256_max_ps(m, _mm256_andnot_ps(sign, *vi));
            }
            let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
            let m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            let m4 = _mm_max_ss(m4, _mm_shuffle_ps::<1>(m4, m4));
            let amax = _mm_cvtss_f32(m4);
            let d = amax / 127.0;
            let id = _mm256_set1_ps(if amax > 0.0 { 127.0 / amax } else { 0.0 });
            let q: [__m256i; 4] = std::array::from_fn(|i| {
                _mm256_cvtps_epi32(_mm256_round_ps::<
                    { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
                >(_mm256_mul_ps(v[i], id)))
            });
            let s32 = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
            let s4 = _mm_add_epi32(
                _mm256_castsi256_si128(s32),
                _mm256_extracti128_si256::<1>(s32),
            );
            let s4 = _mm_hadd_epi32(s4, s4);
            let s4 = _mm_hadd_epi32(s4, s4);
            let sum = _mm_cvtsi128_si32(s4);
            // pack i32 -> i16 -> i8 (values are within -127..=127, no saturation)
            let p0 = _mm256_packs_epi32(q[0], q[1]);
            let p1 = _mm256_packs_epi32(q[2], q[3]);
            let p = _mm256_packs_epi16(p0, p1);
            // undo the lane interleaving of the two packs
            let p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256(out.qs.as_mut_ptr().add(b * 32) as *mut __m256i, p);
            *out.d.get_unchecked_mut(b) = d;
            *out.s.get_unchecked_mut(b) = d * sum as f32;
        }
    }
}

/// AVX2 16-bit activation quantizer (same f32 operations as
/// `QActs16::quantize_scalar`: d = amax/32767, id = 32767/amax,
/// q = clamp(round-half-even(x * id), -32767, 32767), s = d * sum(q)).
///
/// # Safety
/// AVX2/FMA present.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn quantize16(x: &[f32], out: &mut QActs16) {
    let nb = x.len() / 32;
    assert!(out.d.len() >= nb && out.s.len() >= nb && out.qs.len() >= nb * 32);
    let sign = _mm256_set1_ps(-0.0);
    let (lo, hi) = (_mm256_set1_ps(-32767.0), _mm256_set1_ps(32767.0));
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
            let mut m = _mm256_andnot_ps(sign, v[0]);
            for vi in &v[1..] {
                m = _mm256_max_ps(m, _mm256_andnot_ps(sign, *vi));
            }
            let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
            let m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            let m4 = _mm_max_ss(m4, _mm_shuffle_ps::<1>(m4, m4));
            let amax = _mm_cvtss_f32(m4);
            let d = amax / 32767.0;
            let id = _mm256_set1_ps(if amax > 0.0 { 32767.0 / amax } else { 0.0 });
            let q: [__m256i; 4] = std::array::from_fn(|i| {
                let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                    _mm256_mul_ps(v[i], id),
                );
                _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(r, lo), hi))
            });
            let s32 = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
            let s4 = _mm_add_epi32(
                _mm256_castsi256_si128(s32),
                _mm256_extracti128_si256::<1>(s32),
            );
            let s4 = _mm_hadd_epi32(s4, s4);
            let s4 = _mm_hadd_epi32(s4, s4);
            let sum = _mm_cvtsi128_si32(s4);
            // pack i32 -> i16 (values within -32767..=32767, no saturation);
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
