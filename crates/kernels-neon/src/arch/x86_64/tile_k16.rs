//! The 16-bit prompt tile on AVX2 ([`Precision::Fast`](crate::Precision) prompts on
//! [`KernelPath::Avx2Fma`](crate::KernelPath)) for the formats of 32-element blocks of integer
//! quants ([`has_tile_k16`]: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL): the AVX2 form of
//! `tile512_k16.rs`. The AVX2 path has no 8-bit tile for these formats, so their `Fast` prompts
//! all keep 16 bits here (without it they took the f32 tile of dequantized weights).
//!
//! A work item's rows are repacked once into groups of [`LANES`] rows, each quant widened to i16,
//! so that each 32-bit lane holds one row's two quants of the same two columns. One `vpmaddwd`
//! against a token's two 16-bit activations broadcast to every lane gives 16 products of 8 rows
//! (the f32 tile's FMA gives 8), one `vpaddd` sums them; each lane's i32 sum over a block is one
//! row's, converted and weighted by the row's scale and the token's in f32, and a block's min term
//! (Q4_1, Q5_1) is added as `m * s` with the token's `s = d * sum(q)`.
//!
//! The activations are `matvec`'s in this precision (`QActs16`: one scale per 32-block), so the
//! integer products are those of `matvec_i16`; only the f32 summation order differs. Overflow as
//! there: |q_w| <= 128 and |q_x| <= 32767, so a block's i32 sum stays below 2^28.

use std::arch::x86_64::*;
use std::ops::Range;

use super::matvec_i16::weights_i16;
use crate::arch::tags::{block_bytes, has_min, IQ4_NL, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};
use crate::quant::QActs16;
use crate::scalar::f16_at;
use crate::{QMatrix, WeightFormat};

/// Rows of a group: one per i32 lane of a 256-bit register.
pub(crate) const LANES: usize = 8;
/// i16 quants of one group's 32-element block: 16 column pairs × 8 lanes × 2.
const BLOCK_I16: usize = 32 * LANES;
/// Blocks of a column panel: [`G_MAX`] groups' quants of a panel (16 KiB) stay in L1 while every
/// token passes over them.
const PANEL_BLOCKS: usize = 16;
/// Groups per register block.
const G_MAX: usize = 2;
/// Tokens per register block: `G_MAX * T_MAX` i32 sums, as many f32 sums, `G_MAX` weight vectors
/// and one broadcast activation pair fill the 16 registers.
const T_MAX: usize = 3;

/// Whether [`tile_k16`] takes weights of `format`: the formats of 32-element blocks of integer
/// quants.
pub(crate) fn has_tile_k16(format: WeightFormat) -> bool {
    use WeightFormat::*;
    matches!(format, Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | IQ4_NL)
}

/// A work item's rows repacked for the tile.
struct Packed {
    /// Per group and block ([`BLOCK_I16`]): pair `k` (columns `2k, 2k + 1` of the block) at
    /// `16k ..`, lane `j` (row `8g + j`) at `16k + 2j`; lanes past the item's end hold the quants of
    /// zero bytes (their sums are never stored).
    q: Vec<i16>,
    /// Per group and block, each lane's scale (0 past the item's end).
    sc: Vec<f32>,
    /// Per group and block, each lane's min factor (empty for formats without one).
    mn: Vec<f32>,
    /// Blocks of 32 in a row.
    nb: usize,
}

/// The transpose of 8 rows of 8 i32: lane `j` of result `k` is lane `k` of `r[j]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn transpose8(r: [__m256i; 8]) -> [__m256i; 8] {
    let t: [__m256i; 8] = std::array::from_fn(|i| {
        let (a, b) = (r[i / 2 * 2], r[i / 2 * 2 + 1]);
        if i % 2 == 0 {
            _mm256_unpacklo_epi32(a, b)
        } else {
            _mm256_unpackhi_epi32(a, b)
        }
    });
    // u[q]: columns (q % 4, q % 4 + 4) of rows 0..4 (q < 4) or 4..8.
    let u: [__m256i; 8] = std::array::from_fn(|q| {
        let base = if q < 4 { 0 } else { 4 };
        let (a, b) = (t[base + (q % 4) / 2], t[base + 2 + (q % 4) / 2]);
        if q % 2 == 0 {
            _mm256_unpacklo_epi64(a, b)
        } else {
            _mm256_unpackhi_epi64(a, b)
        }
    });
    std::array::from_fn(|k| {
        if k < 4 {
            _mm256_permute2x128_si256::<0x20>(u[k], u[k + 4])
        } else {
            _mm256_permute2x128_si256::<0x31>(u[k - 4], u[k])
        }
    })
}

/// Rows `r0 .. r0 + nr` of `w` (of format tag `F`, one of [`has_tile_k16`]'s, whole blocks)
/// repacked: each block of 8 rows widened to i16 by `matvec_i16`'s own unpacking and transposed
/// as 8 × 16 column pairs.
///
/// # Safety
/// AVX2/FMA/F16C present; `w`'s format is `F`'s.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pack<const F: u8>(w: &QMatrix, r0: usize, nr: usize) -> Packed {
    let (nb, bb) = (w.cols() / 32, block_bytes(F));
    let groups = nr.div_ceil(LANES);
    let min = has_min(F);
    let mut p = Packed {
        q: vec![0; groups * nb * BLOCK_I16],
        sc: vec![0.0; groups * nb * LANES],
        mn: vec![0.0; if min { groups * nb * LANES } else { 0 }],
        nb,
    };
    let zero = vec![0u8; nb * bb];
    for g in 0..groups {
        let rows: [&[u8]; LANES] = std::array::from_fn(|j| {
            let i = g * LANES + j;
            if i < nr {
                w.row_data(r0 + i)
            } else {
                &zero
            }
        });
        for b in 0..nb {
            let at = g * nb + b;
            let mut lo = [_mm256_setzero_si256(); LANES];
            let mut hi = [_mm256_setzero_si256(); LANES];
            for j in 0..LANES {
                let blk = &rows[j][b * bb..(b + 1) * bb];
                // SAFETY: `blk` is a whole block of `F` (sliced above, bounds-checked).
                (lo[j], hi[j]) = unsafe { weights_i16::<F>(blk.as_ptr()) };
                p.sc[at * LANES + j] = f16_at(blk, 0);
                if min {
                    p.mn[at * LANES + j] = f16_at(blk, 2);
                }
            }
            let dst = &mut p.q[at * BLOCK_I16..(at + 1) * BLOCK_I16];
            for (half, v) in [transpose8(lo), transpose8(hi)].iter().enumerate() {
                for (k, pair) in v.iter().enumerate() {
                    let o = 16 * (8 * half + k);
                    // SAFETY: `dst` holds 16 pairs of 16 i16; pair `8 * half + k < 16`.
                    unsafe {
                        _mm256_storeu_si256(dst[o..o + 16].as_mut_ptr() as *mut __m256i, *pair)
                    };
                }
            }
        }
    }
    p
}

/// One token's activations as the kernel reads them.
#[derive(Clone, Copy)]
struct Tok<'a> {
    /// Quants in element order.
    x: &'a [i16],
    /// Scale per 32-block.
    d: &'a [f32],
    /// `d * sum(q)` per 32-block.
    s: &'a [f32],
}

/// Groups `g0 .. g0 + G` against tokens `toks` over blocks `blocks`: per group and token, each
/// lane's (row's) dot added to `acc`.
///
/// # Safety
/// AVX2/FMA present; `g0 + G` groups in `p`; `blocks` within the row (`end <= p.nb`); each
/// token's slices cover the row's columns (`p.nb * 32` quants, `p.nb` scales and sums).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block<const G: usize, const T: usize, const MIN: bool>(
    p: &Packed,
    g0: usize,
    toks: [Tok; T],
    blocks: Range<usize>,
    mut acc: [[__m256; T]; G],
) -> [[__m256; T]; G] {
    let nb = p.nb;
    for b in blocks {
        let at: [usize; G] = std::array::from_fn(|g| (g0 + g) * nb + b);
        let mut isum = [[_mm256_setzero_si256(); T]; G];
        for pair in 0..16 {
            let mut wv = [_mm256_setzero_si256(); G];
            for g in 0..G {
                // SAFETY: group `g0 + g`'s block `b` lies in `p.q` (`at[g] < groups * nb` per the
                // contract) and pair `< 16`: 16 i16 at `at * BLOCK_I16 + 16 * pair`.
                wv[g] = unsafe {
                    _mm256_loadu_si256(
                        p.q.as_ptr().add(at[g] * BLOCK_I16 + 16 * pair) as *const __m256i
                    )
                };
            }
            for t in 0..T {
                // SAFETY: elements `32 b + 2 pair + 1 < nb * 32` of the token per the contract.
                let xv = _mm256_set1_epi32(unsafe {
                    std::ptr::read_unaligned(toks[t].x.as_ptr().add(32 * b + 2 * pair) as *const i32)
                });
                for g in 0..G {
                    isum[g][t] = _mm256_add_epi32(isum[g][t], _mm256_madd_epi16(wv[g], xv));
                }
            }
        }
        for g in 0..G {
            // SAFETY: `sc` holds `groups * nb * LANES` floats; `at[g] < groups * nb`.
            let sc = unsafe { _mm256_loadu_ps(p.sc.as_ptr().add(at[g] * LANES)) };
            for t in 0..T {
                // SAFETY: block `b < nb` per the contract.
                let dx = _mm256_set1_ps(unsafe { *toks[t].d.get_unchecked(b) });
                let v = _mm256_mul_ps(_mm256_cvtepi32_ps(isum[g][t]), sc);
                acc[g][t] = _mm256_fmadd_ps(v, dx, acc[g][t]);
            }
        }
        if MIN {
            for g in 0..G {
                // SAFETY: `mn` holds `groups * nb * LANES` floats for these formats.
                let m = unsafe { _mm256_loadu_ps(p.mn.as_ptr().add(at[g] * LANES)) };
                for t in 0..T {
                    // SAFETY: block `b < nb` per the contract.
                    let s = _mm256_set1_ps(unsafe { *toks[t].s.get_unchecked(b) });
                    acc[g][t] = _mm256_fmadd_ps(m, s, acc[g][t]);
                }
            }
        }
    }
    acc
}

/// One register block (groups `g0 .. g0 + G`, tokens `t0 .. t0 + T`) over the blocks `units`:
/// its sums so far read from `out` (zero for the first panel), the panel's added, written back.
///
/// # Safety
/// AVX2/FMA present; the groups exist in `p` and start below `nr`; `units` within the row; the
/// tokens exist in `toks` and cover the row's columns; `out` holds `(t0 + T) * nr` floats.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn panel_step<const G: usize, const T: usize>(
    p: &Packed,
    min: bool,
    toks: &[Tok],
    (g0, t0): (usize, usize),
    units: Range<usize>,
    nr: usize,
    out: &mut [f32],
) {
    assert!(out.len() >= (t0 + T) * nr && toks.len() >= t0 + T);
    let mut acc = [[_mm256_setzero_ps(); T]; G];
    if units.start > 0 {
        for (g, row) in acc.iter_mut().enumerate() {
            let (first, m) = lanes(g0 + g, nr);
            for (t, v) in row.iter_mut().enumerate() {
                let mut buf = [0f32; LANES];
                let at = (t0 + t) * nr + first;
                buf[..m].copy_from_slice(&out[at..at + m]);
                // SAFETY: `buf` holds 8 floats.
                *v = unsafe { _mm256_loadu_ps(buf.as_ptr()) };
            }
        }
    }
    let tk: [Tok; T] = std::array::from_fn(|t| toks[t0 + t]);
    // SAFETY: per this function's contract.
    let acc = unsafe {
        if min {
            block::<G, T, true>(p, g0, tk, units, acc)
        } else {
            block::<G, T, false>(p, g0, tk, units, acc)
        }
    };
    for (g, row) in acc.iter().enumerate() {
        let (first, m) = lanes(g0 + g, nr);
        for (t, v) in row.iter().enumerate() {
            let mut buf = [0f32; LANES];
            // SAFETY: `buf` holds 8 floats.
            unsafe { _mm256_storeu_ps(buf.as_mut_ptr(), *v) };
            let at = (t0 + t) * nr + first;
            out[at..at + m].copy_from_slice(&buf[..m]);
        }
    }
}

/// Group `g`'s first row and how many of its lanes are below `nr`.
fn lanes(g: usize, nr: usize) -> (usize, usize) {
    let first = g * LANES;
    (first, (nr - first).min(LANES))
}

/// `out[t * nr + i]` = row `r0 + i` of `w` · token `t` (activations `acts[t]`, quantized as
/// `matvec` quantizes them in [`Precision::Fast`](crate::Precision)): per [`G_MAX`] groups,
/// column panel by column panel, every token's sums of a panel added to those of the panels
/// before it, kept in `out`.
///
/// # Safety
/// AVX2/FMA/F16C present; `w`'s format is one of [`has_tile_k16`]'s.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn tile_k16(
    w: &QMatrix,
    r0: usize,
    nr: usize,
    acts: &[QActs16],
    out: &mut [f32],
) {
    let (n, cols, format) = (acts.len(), w.cols(), w.format());
    assert!(has_tile_k16(format) && out.len() >= n * nr && r0 + nr <= w.rows());
    assert!(cols % 32 == 0);
    assert!(acts
        .iter()
        .all(|a| a.qs.len() >= cols && a.d.len() >= cols / 32 && a.s.len() >= cols / 32));
    if n == 0 || nr == 0 {
        return;
    }
    let toks: Vec<Tok> = acts
        .iter()
        .map(|a| Tok {
            x: &a.qs,
            d: &a.d,
            s: &a.s,
        })
        .collect();
    use WeightFormat as W;
    // SAFETY: AVX2/FMA/F16C present per this function's contract; each arm's tag is the format's.
    let p = unsafe {
        match format {
            W::Q4_0 => pack::<Q4_0>(w, r0, nr),
            W::Q4_1 => pack::<Q4_1>(w, r0, nr),
            W::Q5_0 => pack::<Q5_0>(w, r0, nr),
            W::Q5_1 => pack::<Q5_1>(w, r0, nr),
            W::Q8_0 => pack::<Q8_0>(w, r0, nr),
            _ => pack::<IQ4_NL>(w, r0, nr),
        }
    };
    let min = matches!(format, W::Q4_1 | W::Q5_1);
    let groups = nr.div_ceil(LANES);
    let mut g0 = 0;
    while g0 < groups {
        let gn = (groups - g0).min(G_MAX);
        for lo in (0..p.nb).step_by(PANEL_BLOCKS) {
            let u = lo..(lo + PANEL_BLOCKS).min(p.nb);
            let mut t0 = 0;
            while t0 < n {
                let tn = (n - t0).min(T_MAX);
                let at = (g0, t0);
                // SAFETY: AVX2/FMA present per this function's contract; groups `g0 .. g0 + gn`
                // exist in `p` (`g0 + gn <= groups`) and start below `nr`; tokens
                // `t0 .. t0 + tn` exist and cover the columns (asserted above); blocks `u` lie
                // within the row; `out` holds `n * nr` floats (asserted above).
                unsafe {
                    match (gn, tn) {
                        (2, 3) => panel_step::<2, 3>(&p, min, &toks, at, u.clone(), nr, out),
                        (2, 2) => panel_step::<2, 2>(&p, min, &toks, at, u.clone(), nr, out),
                        (2, _) => panel_step::<2, 1>(&p, min, &toks, at, u.clone(), nr, out),
                        (_, 3) => panel_step::<1, 3>(&p, min, &toks, at, u.clone(), nr, out),
                        (_, 2) => panel_step::<1, 2>(&p, min, &toks, at, u.clone(), nr, out),
                        _ => panel_step::<1, 1>(&p, min, &toks, at, u.clone(), nr, out),
                    }
                }
                t0 += tn;
            }
        }
        g0 += gn;
    }
}
