//! The f32 tile kernel of the batched `matmul` on AVX-512F: register blocks of 4 weight rows × 6
//! tokens of 16-wide FMAs (twice the width of the AVX2 tile), over column panels short enough
//! that a token group's activations stay in L1 while every row group of a block runs over them.
//! A block of [`BLOCK_ROWS`] rows runs against every token before the next, from L2: an f32
//! tile's rows where they lie, dequantized rows packed a block at a time (a row group's panel one
//! stream).

use std::arch::x86_64::*;

/// Rows per register block.
const R: usize = 4;
/// Tokens per register block (`R * T` accumulators + `T` activations + 1 weight register ≤ 32).
const T: usize = 6;
/// Columns per panel: 6 tokens × 1024 f32 = 24 KiB of activations, plus 16 KiB of a row group.
const KC: usize = 1024;
/// Rows of a block: its weights (128 KiB a panel of 1024 columns) are read from memory once and
/// then from L2 by every token group, where a pass of six tokens over all of a work item's rows
/// read them from memory again every six tokens. With an F32 tile read in place (no packed copy
/// of the whole item in fresh pages): SYNTHETIC 16x1024x2816, AVX-512, 2 threads, pp256, three
/// interleaved rounds (2026-12-06): F32 399-439 -> 462-493 tok/s, F16 409-422 -> 418-433.
const BLOCK_ROWS: usize = 32;

/// Accumulates `w[r][k0..k1] · x[t0+t][k0..k1]` into `acc[r*T + t]` for `r < RR`, `t < TT`: the
/// 16 weights of row `r` at column `k0 + 16 j` start at `w[r * rs + j * ks]` (rows of `cols`
/// floats in place: `rs = cols`, `ks = 16`, `w` from column `k0`; a packed row group:
/// `rs = 16`, `ks = 16 * RR`, `w` from its panel at `k0`).
///
/// # Safety
/// AVX-512F present.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn micro<const RR: usize, const TT: usize>(
    (w, rs, ks): (&[f32], usize, usize),
    x: &[f32],
    cols: usize,
    t0: usize,
    k0: usize,
    k1: usize,
    acc: &mut [__m512],
) {
    let steps = (k1 - k0).div_ceil(16).max(1);
    assert!(
        k0 <= k1
            && k1 <= cols
            && (RR - 1) * rs + (steps - 1) * ks + (k1 - k0 - 16 * (steps - 1)) <= w.len()
            && (t0 + TT) * cols <= x.len()
            && acc.len() >= R * T
    );
    let wp = w.as_ptr();
    let xp = x.as_ptr().wrapping_add(t0 * cols);
    let mut a = [[_mm512_setzero_ps(); TT]; RR];
    for (r, ar) in a.iter_mut().enumerate() {
        for (t, v) in ar.iter_mut().enumerate() {
            *v = acc[r * T + t];
        }
    }
    let (mut k, mut j) = (k0, 0);
    while k + 16 <= k1 {
        // SAFETY: k + 16 <= k1 <= cols, and rows 0..RR of `w` (step j's 16 floats at
        // `r * rs + j * ks`) and tokens t0..t0+TT of `x` are in bounds (asserted), so every
        // 16-float load reads inside them.
        unsafe {
            let mut xv = [_mm512_setzero_ps(); TT];
            for (t, v) in xv.iter_mut().enumerate() {
                *v = _mm512_loadu_ps(xp.add(t * cols + k));
            }
            for (r, ar) in a.iter_mut().enumerate() {
                let wv = _mm512_loadu_ps(wp.add(r * rs + j * ks));
                for (v, xt) in ar.iter_mut().zip(&xv) {
                    *v = _mm512_fmadd_ps(wv, *xt, *v);
                }
            }
        }
        k += 16;
        j += 1;
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
                let wv = _mm512_maskz_loadu_ps(m, wp.add(r * rs + j * ks));
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

/// [`micro`] for `rr` rows (1..=4) of `TT` tokens, the rows of `w` in place (`rs = cols`, `ks =
/// 16`) or packed (`rs = 16`, `ks = 16 * rr`).
///
/// # Safety
/// AVX-512F present.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn rows_of<const TT: usize>(
    rr: usize,
    (w, packed): (&[f32], bool),
    x: &[f32],
    cols: usize,
    t0: usize,
    k0: usize,
    k1: usize,
    acc: &mut [__m512],
) {
    let (rs, ks) = if packed { (16, 16 * rr) } else { (cols, 16) };
    let w = (w, rs, ks);
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

/// A block of dequantized rows packed by row group, then 16-column step, then row: a row group's
/// panel is one contiguous stream (zeros past `cols`).
struct Packed {
    /// The packed rows.
    w: Vec<f32>,
    /// 16-column steps of a row.
    steps: usize,
}

impl Packed {
    /// Room for `rows` rows (at most a block's) of `cols`, zeroed.
    fn new(rows: usize, cols: usize) -> Self {
        let steps = cols.div_ceil(16);
        Packed {
            w: vec![0f32; rows.min(BLOCK_ROWS).div_ceil(R) * R * steps * 16],
            steps,
        }
    }

    /// Where row group `g` of a block of `rows` starts in `w` (every group before it has `R`
    /// rows).
    fn base(&self, g: usize) -> usize {
        g * R * self.steps * 16
    }

    /// Row `i` (`cols` floats) of a block of `rows` into its place.
    fn put(&mut self, rows: usize, i: usize, row: &[f32]) {
        let (g, r) = (i / R, i % R);
        let rr = R.min(rows - g * R);
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
    for i0 in (0..nr).step_by(BLOCK_ROWS) {
        let rows = BLOCK_ROWS.min(nr - i0);
        let block = Block::InPlace(&w[i0 * cols..(i0 + rows) * cols]);
        // SAFETY: features present per this function's contract.
        unsafe { products(block, (i0, rows, nr), cols, x, n, out) }
    }
}

/// [`tile`] of the `nr` rows that `row(i, dst)` writes (`cols` floats each), a block of
/// [`BLOCK_ROWS`] at a time packed from a buffer of one row: no `nr × cols` tile in between.
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
    for i0 in (0..nr).step_by(BLOCK_ROWS) {
        let rows = BLOCK_ROWS.min(nr - i0);
        for i in 0..rows {
            row(i0 + i, &mut buf);
            p.put(rows, i, &buf);
        }
        // SAFETY: features present per this function's contract.
        unsafe { products(Block::Packed(&p), (i0, rows, nr), cols, x, n, out) }
    }
}

/// The rows [`products`] runs: an f32 tile's in place (row-major), or a [`Packed`] block.
#[derive(Clone, Copy)]
enum Block<'a> {
    InPlace(&'a [f32]),
    Packed(&'a Packed),
}

/// `out[t*nr + i0 + i] = dot(w[i], x[t])` for the `rows` rows of `w` (at most [`BLOCK_ROWS`], rows
/// `i0 ..` of the `nr` in `out`), every token group against the whole block before the next.
///
/// # Safety
/// AVX-512F, AVX2, FMA present.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn products(
    w: Block,
    (i0, rows, nr): (usize, usize, usize),
    cols: usize,
    x: &[f32],
    n: usize,
    out: &mut [f32],
) {
    assert!(rows <= BLOCK_ROWS && i0 + rows <= nr);
    assert!(x.len() >= n * cols && out.len() >= n * nr);
    let mut acc = [_mm512_setzero_ps(); BLOCK_ROWS / R * R * T];
    let acc = &mut acc[..rows.div_ceil(R) * R * T];
    let mut t0 = 0;
    while t0 < n {
        let tt = T.min(n - t0);
        acc.fill(_mm512_setzero_ps());
        let mut k0 = 0;
        while k0 < cols {
            let k1 = (k0 + KC).min(cols);
            for (g, a) in acc.chunks_exact_mut(R * T).enumerate() {
                let rr = R.min(rows - g * R);
                let wg = match w {
                    Block::InPlace(w) => (&w[g * R * cols + k0..], false),
                    Block::Packed(p) => (&p.w[p.base(g) + k0 / 16 * rr * 16..], true),
                };
                // SAFETY: features present per contract; `micro` checks bounds.
                unsafe {
                    match tt {
                        6 => rows_of::<6>(rr, wg, x, cols, t0, k0, k1, a),
                        5 => rows_of::<5>(rr, wg, x, cols, t0, k0, k1, a),
                        4 => rows_of::<4>(rr, wg, x, cols, t0, k0, k1, a),
                        3 => rows_of::<3>(rr, wg, x, cols, t0, k0, k1, a),
                        2 => rows_of::<2>(rr, wg, x, cols, t0, k0, k1, a),
                        _ => rows_of::<1>(rr, wg, x, cols, t0, k0, k1, a),
                    }
                }
            }
            k0 = k1;
        }
        for (g, a) in acc.chunks_exact(R * T).enumerate() {
            for r in 0..R.min(rows - g * R) {
                for t in 0..tt {
                    out[(t0 + t) * nr + i0 + g * R + r] = _mm512_reduce_add_ps(a[r * T + t]);
                }
            }
        }
        t0 += tt;
    }
}
