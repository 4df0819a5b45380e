//! The f32 tile kernel of the batched `matmul`: register-blocked rows × tokens.

use std::arch::aarch64::*;

/// Register-blocked microkernel: `R` rows × `T` tokens of f32x4 accumulators.
#[inline]
#[target_feature(enable = "neon")]
fn micro<const R: usize, const T: usize>(
    w: &[f32],
    x: &[f32],
    cols: usize,
    i0: usize,
    t0: usize,
    nr: usize,
    out: &mut [f32],
) {
    let wr: [&[f32]; R] = std::array::from_fn(|r| &w[(i0 + r) * cols..(i0 + r + 1) * cols]);
    let xt: [&[f32]; T] = std::array::from_fn(|t| &x[(t0 + t) * cols..(t0 + t + 1) * cols]);
    let mut acc = [[vdupq_n_f32(0.0); T]; R];
    let k4 = cols / 4 * 4;
    let mut k = 0;
    while k < k4 {
        let mut xv = [vdupq_n_f32(0.0); T];
        for (v, s) in xv.iter_mut().zip(&xt) {
            // SAFETY: k + 4 <= cols == s.len().
            *v = unsafe { vld1q_f32(s.as_ptr().add(k)) };
        }
        for (ar, s) in acc.iter_mut().zip(&wr) {
            // SAFETY: k + 4 <= cols == s.len().
            let wv = unsafe { vld1q_f32(s.as_ptr().add(k)) };
            for (a, v) in ar.iter_mut().zip(&xv) {
                *a = vfmaq_f32(*a, wv, *v);
            }
        }
        k += 4;
    }
    for (r, ar) in acc.iter().enumerate() {
        for (t, a) in ar.iter().enumerate() {
            let mut s = vaddvq_f32(*a);
            for kk in k4..cols {
                s += wr[r][kk] * xt[t][kk];
            }
            out[(t0 + t) * nr + i0 + r] = s;
        }
    }
}

/// `out[t*nr + i] = dot(w[i], x[t])` for an f32 tile `w` (nr × cols).
#[target_feature(enable = "neon")]
pub(crate) fn tile(w: &[f32], nr: usize, cols: usize, x: &[f32], n: usize, out: &mut [f32]) {
    let mut t0 = 0;
    while t0 < n {
        let tt = 4.min(n - t0);
        let mut i0 = 0;
        while i0 < nr {
            let rr = 4.min(nr - i0);
            match (rr, tt) {
                (4, 4) => micro::<4, 4>(w, x, cols, i0, t0, nr, out),
                (4, 3) => micro::<4, 3>(w, x, cols, i0, t0, nr, out),
                (4, 2) => micro::<4, 2>(w, x, cols, i0, t0, nr, out),
                (4, _) => micro::<4, 1>(w, x, cols, i0, t0, nr, out),
                (3, 4) => micro::<3, 4>(w, x, cols, i0, t0, nr, out),
                (3, 3) => micro::<3, 3>(w, x, cols, i0, t0, nr, out),
                (3, 2) => micro::<3, 2>(w, x, cols, i0, t0, nr, out),
                (3, _) => micro::<3, 1>(w, x, cols, i0, t0, nr, out),
                (2, 4) => micro::<2, 4>(w, x, cols, i0, t0, nr, out),
                (2, 3) => micro::<2, 3>(w, x, cols, i0, t0, nr, out),
                (2, 2) => micro::<2, 2>(w, x, cols, i0, t0, nr, out),
                (2, _) => micro::<2, 1>(w, x, cols, i0, t0, nr, out),
                (_, 4) => micro::<1, 4>(w, x, cols, i0, t0, nr, out),
                (_, 3) => micro::<1, 3>(w, x, cols, i0, t0, nr, out),
                (_, 2) => micro::<1, 2>(w, x, cols, i0, t0, nr, out),
                (_, _) => micro::<1, 1>(w, x, cols, i0, t0, nr, out),
            }
            i0 += rr;
        }
        t0 += tt;
    }
}
