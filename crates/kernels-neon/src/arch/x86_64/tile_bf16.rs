//! The bf16 tile kernel of the batched `matmul` in the quantized-activation precisions, on
//! AVX-512 BF16: weights and activations rounded to bf16 (8 significant bits, as llama.cpp's 8-bit
//! activations have), products summed in f32 by `vdpbf16ps`, 32 multiply-adds per instruction:
//! twice the f32 tile's rate. Register blocks of 4 rows × 6 tokens over column panels, as in
//! `tile512`.

use std::arch::x86_64::*;

/// Rows per register block.
const R: usize = 4;
/// Tokens per register block.
const T: usize = 6;
/// Columns per panel (a multiple of 32).
const KC: usize = 2048;

/// Columns of a bf16 row: `cols` rounded up to whole 32-element steps (the padding is zero).
pub(crate) fn padded(cols: usize) -> usize {
    cols.div_ceil(32) * 32
}

/// Rounds 32 floats (`src`, at most 32; missing ones are zero) to bf16 and stores them at `dst`
/// (in `vdpbf16ps` pair order: the same permutation for weights and activations, so dot
/// products are unchanged).
///
/// # Safety
/// AVX-512F and AVX-512 BF16 present; `dst` has 32 elements.
#[inline]
#[target_feature(enable = "avx512f,avx512bf16,avx2,fma,f16c")]
unsafe fn round32(src: &[f32], dst: &mut [u16]) {
    assert!(src.len() <= 32 && dst.len() >= 32);
    let (n0, n1) = (src.len().min(16), src.len().saturating_sub(16));
    let m0: __mmask16 = ((1u32 << n0) - 1) as u16;
    let m1: __mmask16 = ((1u32 << n1) - 1) as u16;
    // SAFETY: the masks enable only lanes inside `src` (`n0 + n1 == src.len()`); masked-off
    // lanes read nothing. `dst` holds 32 u16 = 64 bytes (asserted).
    unsafe {
        let lo = _mm512_maskz_loadu_ps(m0, src.as_ptr());
        let hi = _mm512_maskz_loadu_ps(m1, src.as_ptr().wrapping_add(16));
        let b = std::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(hi, lo));
        _mm512_storeu_si512(dst.as_mut_ptr() as *mut __m512i, b);
    }
}

/// Rounds `n` rows of `cols` floats to bf16 rows of [`padded`]`(cols)` elements.
///
/// # Safety
/// AVX-512F and AVX-512 BF16 present.
#[target_feature(enable = "avx512f,avx512bf16,avx2,fma,f16c")]
pub(crate) unsafe fn to_bf16(x: &[f32], n: usize, cols: usize) -> Vec<u16> {
    assert!(x.len() >= n * cols);
    let cp = padded(cols);
    let mut out = vec![0u16; n * cp];
    for (src, dst) in x
        .chunks_exact(cols.max(1))
        .take(n)
        .zip(out.chunks_exact_mut(cp))
    {
        for (s, d) in src.chunks(32).zip(dst.chunks_exact_mut(32)) {
            // SAFETY: features present per contract; `d` has 32 elements.
            unsafe { round32(s, d) };
        }
    }
    out
}

/// Loads 32 bf16 values from `p`.
///
/// # Safety
/// AVX-512F present; `p..p+32` readable.
#[inline]
#[target_feature(enable = "avx512f,avx512bf16,avx2,fma,f16c")]
unsafe fn load_bh(p: *const u16) -> __m512bh {
    // SAFETY: the caller guarantees 64 readable bytes at `p` (unaligned load); a `__m512i` and a
    // `__m512bh` are the same 64 bytes.
    unsafe { std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(p as *const __m512i)) }
}

/// Accumulates the bf16 dot products of a row block's packed panel `wp` (for each 32-column step
/// from `k0` to `k1`, `RR` rows of 32) with tokens `t0..t0+TT` of `xb` into `acc[r*T + t]`.
///
/// # Safety
/// AVX-512F and AVX-512 BF16 present.
#[inline]
#[target_feature(enable = "avx512f,avx512bf16,avx2,fma,f16c")]
unsafe fn micro<const RR: usize, const TT: usize>(
    wp: &[u16],
    xb: &[u16],
    cp: usize,
    t0: usize,
    (k0, k1): (usize, usize),
    acc: &mut [__m512],
) {
    assert!(
        k0 <= k1
            && k1 <= cp
            && (k1 - k0) % 32 == 0
            && (k1 - k0) * RR <= wp.len()
            && (t0 + TT) * cp <= xb.len()
            && acc.len() >= R * T
    );
    let mut w = wp.as_ptr();
    let xp = xb.as_ptr().wrapping_add(t0 * cp);
    let mut a = [[_mm512_setzero_ps(); TT]; RR];
    for (r, ar) in a.iter_mut().enumerate() {
        for (t, v) in ar.iter_mut().enumerate() {
            *v = acc[r * T + t];
        }
    }
    let mut k = k0;
    while k < k1 {
        // SAFETY: k + 32 <= k1 <= cp, tokens t0..t0+TT of `xb` and the panel's `RR * (k1 - k0)`
        // elements are in bounds (asserted), so every 64-byte load reads inside them.
        unsafe {
            let mut xv = [load_bh(xp.add(k)); TT];
            for (t, v) in xv.iter_mut().enumerate().skip(1) {
                *v = load_bh(xp.add(t * cp + k));
            }
            for (r, ar) in a.iter_mut().enumerate() {
                let wv = load_bh(w.add(r * 32));
                for (v, xt) in ar.iter_mut().zip(&xv) {
                    *v = _mm512_dpbf16_ps(*v, wv, *xt);
                }
            }
            w = w.add(RR * 32);
        }
        k += 32;
    }
    for (r, ar) in a.iter().enumerate() {
        for (t, v) in ar.iter().enumerate() {
            acc[r * T + t] = *v;
        }
    }
}

/// [`micro`] for `rr` rows (1..=4) of `TT` tokens.
///
/// # Safety
/// AVX-512F and AVX-512 BF16 present.
#[inline]
#[target_feature(enable = "avx512f,avx512bf16,avx2,fma,f16c")]
unsafe fn rows<const TT: usize>(
    rr: usize,
    wp: &[u16],
    xb: &[u16],
    cp: usize,
    t0: usize,
    ks: (usize, usize),
    acc: &mut [__m512],
) {
    // SAFETY: features present per contract; `micro` checks bounds.
    unsafe {
        match rr {
            4 => micro::<4, TT>(wp, xb, cp, t0, ks, acc),
            3 => micro::<3, TT>(wp, xb, cp, t0, ks, acc),
            2 => micro::<2, TT>(wp, xb, cp, t0, ks, acc),
            _ => micro::<1, TT>(wp, xb, cp, t0, ks, acc),
        }
    }
}

/// `out[t*nr + i] ≈ dot(w[i], x[t])` for an f32 tile `w` (nr × cols) and activations `xb` already
/// rounded by [`to_bf16`] (n rows of [`padded`]`(cols)`): the tile is rounded to bf16 here.
///
/// # Safety
/// AVX-512F and AVX-512 BF16 present.
#[target_feature(enable = "avx512f,avx512bf16,avx2,fma,f16c")]
pub(crate) unsafe fn tile_bf16(
    w: &[f32],
    nr: usize,
    cols: usize,
    xb: &[u16],
    n: usize,
    out: &mut [f32],
) {
    let cp = padded(cols);
    assert!(w.len() >= nr * cols && xb.len() >= n * cp && out.len() >= n * nr);
    let groups = nr.div_ceil(R);
    // The tile packed by row block, then 32-column step, then row: a block's panel is one
    // contiguous stream.
    let mut packed = vec![0u16; nr * cp];
    let mut base = Vec::with_capacity(groups);
    let mut off = 0;
    for g in 0..groups {
        base.push(off);
        let i0 = g * R;
        let rr = R.min(nr - i0);
        for k in (0..cp).step_by(32) {
            for r in 0..rr {
                let row = &w[(i0 + r) * cols..(i0 + r + 1) * cols];
                let src = &row[k.min(cols)..(k + 32).min(cols)];
                // SAFETY: features present per contract; the slice has 32 elements.
                unsafe { round32(src, &mut packed[off..off + 32]) };
                off += 32;
            }
        }
    }
    let mut acc = vec![_mm512_setzero_ps(); groups * R * T];
    let mut t0 = 0;
    while t0 < n {
        let tt = T.min(n - t0);
        acc.fill(_mm512_setzero_ps());
        let mut k0 = 0;
        while k0 < cp {
            let k1 = (k0 + KC).min(cp);
            for (g, a) in acc.chunks_exact_mut(R * T).enumerate() {
                let rr = R.min(nr - g * R);
                let p = &packed[base[g] + k0 * rr..];
                let ks = (k0, k1);
                // SAFETY: features present per contract; `micro` checks bounds.
                unsafe {
                    match tt {
                        6 => rows::<6>(rr, p, xb, cp, t0, ks, a),
                        5 => rows::<5>(rr, p, xb, cp, t0, ks, a),
                        4 => rows::<4>(rr, p, xb, cp, t0, ks, a),
                        3 => rows::<3>(rr, p, xb, cp, t0, ks, a),
                        2 => rows::<2>(rr, p, xb, cp, t0, ks, a),
                        _ => rows::<1>(rr, p, xb, cp, t0, ks, a),
                    }
                }
            }
            k0 = k1;
        }
        for (g, a) in acc.chunks_exact(R * T).enumerate() {
            let i0 = g * R;
            for r in 0..R.min(nr - i0) {
                for t in 0..tt {
                    out[(t0 + t) * nr + i0 + r] = _mm512_reduce_add_ps(a[r * T + t]);
                }
            }
        }
        t0 += tt;
    }
}
