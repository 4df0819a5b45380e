//! The f32 tile kernel of the batched `matmul`: register-blocked rows × tokens.

use std::arch::x86_64::*;

use super::simd::hsum;

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
