//! The 16-bit prompt tile on AVX2 ([`Precision::Fast`](crate::Precision) prompts on
//! [`KernelPath::Avx2Fma`](crate::KernelPath)) for the formats of 32-element blocks of integer
//! quants ([`has_tile_k16`]: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL) and IQ4_XS (whose sub-blocks of
//! 32 are IQ4_NL blocks with the scale `d * (ls - 32)`): the AVX2 form of `tile512_k16.rs`, driven
//! by `tile_lanes.rs`. The `Fast` prompts of these formats but Q5_0 (8-bit, `tile_i8.rs`) keep 16
//! bits here (without it they took the f32 tile of dequantized weights). The signed quants of
//! Q8_0, IQ4_NL and IQ4_XS take no fewer instructions a product with `maddubs` (its sign trick, a
//! `vpsign` and a widening per 32 products) than here, so they have no 8-bit tile on AVX2.
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
use std::marker::PhantomData;
use std::ops::Range;

use super::matvec_i16::weights_i16;
use super::tile_lanes::{drive, LaneTile};
use crate::arch::tags::{block_bytes, has_min, IQ4_NL, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};
use crate::quant::QActs16;
use crate::scalar::f16_at;
use crate::{QMatrix, WeightFormat};

/// Rows of a group: one per i32 lane of a 256-bit register.
pub(crate) const LANES: usize = super::tile_lanes::LANES;
/// i16 quants of one group's 32-element block: 16 column pairs × 8 lanes × 2.
const BLOCK_I16: usize = 32 * LANES;
/// Blocks of a column panel: two groups' quants of a panel (16 KiB) stay in L1 while every token
/// passes over them.
const PANEL_BLOCKS: usize = 16;

/// Whether [`tile_k16`] takes weights of `format`: the formats of 32-element blocks of integer
/// quants, and IQ4_XS.
pub(crate) fn has_tile_k16(format: WeightFormat) -> bool {
    use WeightFormat::*;
    matches!(format, Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | IQ4_NL | IQ4_XS)
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

/// Block `b` of an IQ4_XS row `row` as an IQ4_NL block (its 16 quant bytes after two bytes of
/// scale, which [`weights_i16`] does not read).
fn iq4xs_block(row: &[u8], b: usize) -> [u8; 18] {
    let at = (b / 8) * 136 + 8 + 16 * (b % 8);
    let mut nl = [0u8; 18];
    nl[2..].copy_from_slice(&row[at..at + 16]);
    nl
}

/// Rows `r0 .. r0 + nr` of `w` (of format tag `F`, one of [`has_tile_k16`]'s, whole blocks;
/// IQ4_XS where `XS`, with `F` IQ4_NL's) repacked: each block of 8 rows widened to i16 by
/// `matvec_i16`'s own unpacking and transposed as 8 × 16 column pairs.
///
/// # Safety
/// AVX2/FMA/F16C present; `w`'s format is `F`'s (IQ4_XS where `XS`).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pack<const F: u8, const XS: bool>(w: &QMatrix, r0: usize, nr: usize) -> Packed {
    // IQ4_XS: 136 bytes per 8 blocks, so that the zero row below is as long as a row.
    let (nb, bb) = (w.cols() / 32, if XS { 17 } else { block_bytes(F) });
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
        let mut xs_sc = [[0f32; 8]; LANES];
        for b in 0..nb {
            let at = g * nb + b;
            let mut lo = [_mm256_setzero_si256(); LANES];
            let mut hi = [_mm256_setzero_si256(); LANES];
            for j in 0..LANES {
                if XS {
                    if b % 8 == 0 {
                        // Each lane's 8 scales `d * (ls - 32)` once per super-block.
                        xs_sc[j] = crate::scalar::iq4xs_scales(&rows[j][b / 8 * 136..]);
                    }
                    let nl = iq4xs_block(rows[j], b);
                    // SAFETY: `nl` is a whole IQ4_NL block (`F` is IQ4_NL's tag with `XS`).
                    (lo[j], hi[j]) = unsafe { weights_i16::<F>(nl.as_ptr()) };
                    p.sc[at * LANES + j] = xs_sc[j][b % 8];
                    continue;
                }
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

/// A work item's rows packed (formats with a min where `MIN`), as [`drive`] runs them.
struct Tile<'a, const MIN: bool>(Packed, PhantomData<Tok<'a>>);

impl<'a, const MIN: bool> LaneTile for Tile<'a, MIN> {
    type Tok = Tok<'a>;
    const PANEL: usize = PANEL_BLOCKS;
    fn units(&self) -> usize {
        self.0.nb
    }
    #[inline(always)]
    unsafe fn block<const G: usize, const T: usize>(
        &self,
        g0: usize,
        toks: [Tok<'a>; T],
        units: Range<usize>,
        acc: [[__m256; T]; G],
    ) -> [[__m256; T]; G] {
        // SAFETY: per the trait method's contract.
        unsafe { block::<G, T, MIN>(&self.0, g0, toks, units, acc) }
    }
}

/// `out[t * nr + i]` = row `r0 + i` of `w` · token `t` (activations `acts[t]`, quantized as
/// `matvec` quantizes them in [`Precision::Fast`](crate::Precision)), through [`drive`].
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
    assert!(
        cols % if format == WeightFormat::IQ4_XS {
            256
        } else {
            32
        } == 0
    );
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
    let pack_rows = |first: usize, count: usize| unsafe {
        let r = r0 + first;
        match format {
            W::Q4_0 => pack::<Q4_0, false>(w, r, count),
            W::Q4_1 => pack::<Q4_1, false>(w, r, count),
            W::Q5_0 => pack::<Q5_0, false>(w, r, count),
            W::Q5_1 => pack::<Q5_1, false>(w, r, count),
            W::Q8_0 => pack::<Q8_0, false>(w, r, count),
            W::IQ4_XS => pack::<IQ4_NL, true>(w, r, count),
            _ => pack::<IQ4_NL, false>(w, r, count),
        }
    };
    // SAFETY: AVX2/FMA/F16C present per this function's contract; each chunk packed holds its
    // rows' groups; the tokens cover the columns (asserted above); `out` holds `n * nr` floats
    // (asserted above).
    unsafe {
        if matches!(format, W::Q4_1 | W::Q5_1) {
            drive((w, r0), nr, &toks, out, |f, c| {
                Tile::<true>(pack_rows(f, c), PhantomData)
            })
        } else {
            drive((w, r0), nr, &toks, out, |f, c| {
                Tile::<false>(pack_rows(f, c), PhantomData)
            })
        }
    }
}
