//! The f32 tile kernel of the batched `matmul` on AVX-512F: register blocks of 4 weight rows × 6
//! tokens of 16-wide FMAs (twice the width of the AVX2 tile), over column panels short enough
//! that a token group's activations stay in L1 while every row group of the tile runs over them.

use std::arch::x86_64::*;

/// Rows per register block.
const R: usize = 4;
/// Tokens per register block (`R * T` accumulators + `T` activations + 1 weight register ≤ 32).
const T: usize = 6;
/// Columns per panel: 6 tokens × 512 f32 = 12 KiB of activations, plus 8 KiB of a row block.
const KC: usize = 1024;

/// Accumulates `w[i0+r][k0..k1] · x[t0+t][k0..k1]` into `acc[r*T + t]` for `r < RR`, `t < TT`.
///
/// # Safety
/// AVX-512F present.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn micro<const RR: usize, const TT: usize>(
    wp_: &[f32],
    x: &[f32],
    cols: usize,
    t0: usize,
    k0: usize,
    k1: usize,
    acc: &mut [__m512],
) {
    assert!(
        k0 <= k1
            && k1 <= cols
            && (k1 - k0).div_ceil(16) * 16 * RR <= wp_.len()
            && (t0 + TT) * cols <= x.len()
            && acc.len() >= R * T
    );
    let mut wp = wp_.as_ptr();
    let xp = x.as_ptr().wrapping_add(t0 * cols);
    let mut a = [[_mm512_setzero_ps(); TT]; RR];
    for (r, ar) in a.iter_mut().enumerate() {
        for (t, v) in ar.iter_mut().enumerate() {
            *v = acc[r * T + t];
        }
    }
    let mut k = k0;
    while k + 16 <= k1 {
        // SAFETY: k + 16 <= k1 <= cols, and rows i0..i0+RR of `w` and tokens t0..t0+TT of `x`
        // are in bounds (asserted), so every 16-float load reads inside them.
        unsafe {
            let mut xv = [_mm512_setzero_ps(); TT];
            for (t, v) in xv.iter_mut().enumerate() {
                *v = _mm512_loadu_ps(xp.add(t * cols + k));
            }
            for (r, ar) in a.iter_mut().enumerate() {
                let wv = _mm512_loadu_ps(wp.add(r * 16));
                for (v, xt) in ar.iter_mut().zip(&xv) {
                    *v = _mm512_fmadd_ps(wv, *xt, *v);
                }
            }
            wp = wp.add(RR * 16);
        }
        k += 16;
    }
    if k < k1 {
        // The last partial vector of a row: masked loads read only lanes k..k1 (masked-off lanes
        // are zero and never touch memory).
        let m: __mmask16 = (1u16 << (k1 - k)) - 1;
        // SAFETY: lanes k..k1 lie inside each row (k1 <= cols); the others are masked off.
        unsafe {
            let mut xv = [_mm512_setzero_ps(); TT];
            for (t, v) in xv.iter_mut().enumerate() {
                *v = _mm512_maskz_loadu_ps(m, xp.add(t * cols + k));
            }
            for (r, ar) in a.iter_mut().enumerate() {
                let wv = _mm512_loadu_ps(wp.add(r * 16));
                for (v, xt) in ar.iter_mut().zip(&xv) {
                    *v = _mm512_fmadd_ps(wv, *xt, *v);
                }
            }
        }
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
/// AVX-512F present.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn rows<const TT: usize>(
    rr: usize,
    w: &[f32],
    x: &[f32],
    cols: usize,
    t0: usize,
    k0: usize,
    k1: usize,
    acc: &mut [__m512],
) {
    // SAFETY: features present per contract; `micro` checks bounds.
    unsafe {
        match rr {
            4 => micro::<4, TT>(w, x, cols, t0, k0, k1, acc),
            3 => micro::<3, TT>(w, x, cols, t0, k0, k1, acc),
            2 => micro::<2, TT>(w, x, cols, t0, k0, k1, acc),
            _ => micro::<1, TT>(w, x, cols, t0, k0, k1, acc),
        }
    }
}

/// Bytes [`tile`] allocates for an `nr × cols` tile: the packed panels and the accumulators.
pub(crate) fn tile_scratch_bytes(nr: usize, cols: usize) -> usize {
    let groups = nr.div_ceil(R);
    let packed = 4 * groups * R * cols.div_ceil(16) * 16;
    packed + groups * R * T * 64
}

/// A tile packed by row group, then 16-column step, then row: a row group's panel is one
/// contiguous stream (zeros past `cols`).
struct Packed {
    /// The packed rows.
    w: Vec<f32>,
    /// 16-column steps of a row.
    steps: usize,
}

impl Packed {
    /// Room for `nr` rows of `cols`, zeroed.
    fn new(nr: usize, cols: usize) -> Self {
        let steps = cols.div_ceil(16);
        Packed {
            w: vec![0f32; nr.div_ceil(R) * R * steps * 16],
            steps,
        }
    }

    /// Where row group `g` starts in `w` (every group before it has `R` rows).
    fn base(&self, g: usize) -> usize {
        g * R * self.steps * 16
    }

    /// Row `i` of the tile (`cols` floats) into its place.
    fn put(&mut self, nr: usize, i: usize, row: &[f32]) {
        let (g, r) = (i / R, i % R);
        let rr = R.min(nr - g * R);
        let base = self.base(g);
        for (s, src) in row.chunks(16).enumerate() {
            let at = base + s * rr * 16 + r * 16;
            self.w[at..at + src.len()].copy_from_slice(src);
        }
    }
}

/// `out[t*nr + i] = dot(w[i], x[t])` for an f32 tile `w` (nr × cols).
///
/// # Safety
/// AVX-512F, AVX2, FMA present.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(crate) unsafe fn tile(w: &[f32], nr: usize, cols: usize, x: &[f32], n: usize, out: &mut [f32]) {
    assert!(w.len() >= nr * cols);
    let mut p = Packed::new(nr, cols);
    for (i, row) in w.chunks_exact(cols).take(nr).enumerate() {
        p.put(nr, i, row);
    }
    // SAFETY: features present per this function's contract.
    unsafe { products(&p, nr, cols, x, n, out) }
}

/// [`tile`] of the `nr` rows that `row(i, dst)` writes (`cols` floats each) one at a time, with no
/// `nr × cols` tile in between: each row lands in the packed panels from a buffer of one row.
///
/// # Safety
/// AVX-512F, AVX2, FMA present.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(crate) unsafe fn tile_rows(
    nr: usize,
    cols: usize,
    mut row: impl FnMut(usize, &mut [f32]),
    x: &[f32],
    n: usize,
    out: &mut [f32],
) {
    let mut p = Packed::new(nr, cols);
    let mut buf = vec![0f32; cols];
    for i in 0..nr {
        row(i, &mut buf);
        p.put(nr, i, &buf);
    }
    // SAFETY: features present per this function's contract.
    unsafe { products(&p, nr, cols, x, n, out) }
}

/// The products of [`tile`] over the packed rows `p` (`nr` of `cols`).
///
/// # Safety
/// AVX-512F, AVX2, FMA present.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn products(p: &Packed, nr: usize, cols: usize, x: &[f32], n: usize, out: &mut [f32]) {
    assert!(x.len() >= n * cols && out.len() >= n * nr);
    let groups = nr.div_ceil(R);
    let mut acc = vec![_mm512_setzero_ps(); groups * R * T];
    let mut t0 = 0;
    while t0 < n {
        let tt = T.min(n - t0);
        acc.fill(_mm512_setzero_ps());
        let mut k0 = 0;
        while k0 < cols {
            let k1 = (k0 + KC).min(cols);
            for (g, a) in acc.chunks_exact_mut(R * T).enumerate() {
                let rr = R.min(nr - g * R);
                let w = &p.w[p.base(g) + k0 / 16 * rr * 16..];
                // SAFETY: features present per contract; `micro` checks bounds.
                unsafe {
                    match tt {
                        6 => rows::<6>(rr, w, x, cols, t0, k0, k1, a),
                        5 => rows::<5>(rr, w, x, cols, t0, k0, k1, a),
                        4 => rows::<4>(rr, w, x, cols, t0, k0, k1, a),
                        3 => rows::<3>(rr, w, x, cols, t0, k0, k1, a),
                        2 => rows::<2>(rr, w, x, cols, t0, k0, k1, a),
                        _ => rows::<1>(rr, w, x, cols, t0, k0, k1, a),
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
