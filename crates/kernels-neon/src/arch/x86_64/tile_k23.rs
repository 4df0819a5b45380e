//! The 8-bit prompt tile of Q2_K/Q3_K weights on AVX2 with the rows in the lanes (the register
//! blocks of `tile_lanes.rs`, as `tile_k8_lanes.rs` for Q4_K..Q6_K). Without it these prompts took
//! the f32 tile (each panel dequantized, then FMA), at 0.64x (Q2_K) and 0.81x (Q3_K_M) of
//! llama.cpp's AVX2 prefill.
//!
//! A work item's rows are repacked once into groups of [`LANES`] rows, each 32-bit lane holding
//! one row's four unsigned quants of the same four columns (Q2_K 0..=3, Q3_K `low | h << 2` in
//! 0..=7, its offset of 4 left out), each row's 16 sub-block scales as i16 (twice per lane; Q3_K's
//! `ls - 32` signed), its `d`, and per sub-block the f32 coefficient of the activations' sum over
//! those 16 columns (Q2_K `dmin * m_j`, Q3_K `4 d sc_j`). Against a token's four 8-bit activations
//! broadcast to every lane, one `vpmaddubsw` gives 32 products of 8 rows as i16 pair sums; the 4
//! quads of a sub-block are added in i16 (8 products of at most 7 · 127) and one `vpmaddwd` by
//! the lanes' scales widens them. The activations are `matvec`'s in `Int8` for these formats
//! (`QActs::quantize`: one scale per 32, with sums of 16), so a 32-block's i32 sums are converted
//! and multiplied by the token's scale of that block, a super-block's by the rows' `d`, and the
//! coefficients times the token's `d_x * sum16` subtracted, in f32 with 8 rows to an instruction:
//! the integer products of `matvec_int8` (`kquant_low.rs`), summed in another f32 order.

use std::arch::x86_64::*;
use std::marker::PhantomData;
use std::ops::Range;

use super::tile_lanes::{drive, LaneTile, LANES};
use crate::quant::QActs;
use crate::scalar::f16_at;
use crate::{QMatrix, WeightFormat};

/// Bytes of one group's super-block: 64 column quads × 8 lanes × 4.
const SB_U8: usize = 256 * LANES;
/// Super-blocks of a column panel: two groups' quants of a panel (16 KiB) stay in L1 while every
/// token passes over them.
const PANEL_SB: usize = 4;

/// A work item's rows repacked for the tile.
struct Packed {
    /// Per group and super-block ([`SB_U8`]): quad `k` (columns `4k .. 4k + 4`) at bytes `32k ..`,
    /// lane `j` (row `8g + j`) at `32k + 4j`; rows past the item's end are zero.
    q: Vec<u8>,
    /// Per group and super-block, per sub-block of 16, each lane's scale twice (16 i16).
    sc: Vec<i16>,
    /// Per group and super-block, per sub-block, each lane's coefficient of the activation sum
    /// (8 f32).
    cf: Vec<f32>,
    /// Per group and super-block, each lane's `d` (8 f32).
    d: Vec<f32>,
    /// Super-blocks in a row.
    nsb: usize,
}

/// The 32 unsigned quants of 32-block `b` (0..8) of a Q2_K (`Q3 = false`) or Q3_K super-block
/// `blk` in element order: element `32b + l` is bits `2(b % 4)..` of `qs[32(b / 4) + l]`, with
/// Q3_K's bit `b` of `hmask[l]` as bit 2.
///
/// # Safety
/// AVX2 present.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn quants<const Q3: bool>(blk: &[u8], b: usize) -> __m256i {
    let (bb, qoff) = if Q3 { (110, 32) } else { (84, 16) };
    assert!(blk.len() >= bb && b < 8);
    // SAFETY: bytes `qoff + 32 (b / 4) .. + 32` (at most 96) and the hmask's 0..32 lie in the
    // block (length asserted).
    let (raw, hm) = unsafe {
        (
            _mm256_loadu_si256(blk.as_ptr().add(qoff + 32 * (b / 4)).cast()),
            _mm256_loadu_si256(blk.as_ptr().cast()),
        )
    };
    // 16-bit shifts: the masks drop the bits shifted in from the other byte.
    let q = _mm256_and_si256(
        _mm256_srl_epi16(raw, _mm_cvtsi32_si128(2 * (b % 4) as i32)),
        _mm256_set1_epi8(3),
    );
    if !Q3 {
        return q;
    }
    let h = _mm256_and_si256(
        _mm256_srl_epi16(hm, _mm_cvtsi32_si128(b as i32)),
        _mm256_set1_epi8(1),
    );
    _mm256_or_si256(q, _mm256_slli_epi16::<2>(h))
}

/// A super-block's 16 sub-block scales, the coefficients of the activation sums and `d`.
pub(super) fn scales<const Q3: bool>(blk: &[u8]) -> ([i16; 16], [f32; 16], f32) {
    if Q3 {
        let sc = &blk[96..108];
        let d = f16_at(blk, 108);
        let s: [i16; 16] = std::array::from_fn(|s| {
            let lo = (sc[s % 8] >> (4 * (s / 8))) & 0xF;
            let hi = (sc[8 + s % 4] >> (2 * (s / 4))) & 3;
            i16::from(lo | hi << 4) - 32
        });
        (s, s.map(|v| 4.0 * d * f32::from(v)), d)
    } else {
        let (d, dmin) = (f16_at(blk, 80), f16_at(blk, 82));
        let s = std::array::from_fn(|j| i16::from(blk[j] & 0xF));
        (s, std::array::from_fn(|j| dmin * f32::from(blk[j] >> 4)), d)
    }
}

/// Rows `r0 .. r0 + nr` of `w` (Q3_K where `Q3`, else Q2_K) repacked.
///
/// # Safety
/// AVX2/FMA/F16C present; `w`'s format is the one `Q3` names.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pack<const Q3: bool>(w: &QMatrix, r0: usize, nr: usize) -> Packed {
    let bb = if Q3 { 110 } else { 84 };
    let nsb = w.cols() / 256;
    let groups = nr.div_ceil(LANES);
    let mut p = Packed {
        q: vec![0; groups * nsb * SB_U8],
        sc: vec![0; groups * nsb * 16 * 2 * LANES],
        cf: vec![0.0; groups * nsb * 16 * LANES],
        d: vec![0.0; groups * nsb * LANES],
        nsb,
    };
    for i in 0..nr {
        let (g, lane) = (i / LANES, i % LANES);
        for (sb, blk) in w.row_data(r0 + i).chunks_exact(bb).take(nsb).enumerate() {
            let at = g * nsb + sb;
            let dst = &mut p.q[at * SB_U8..(at + 1) * SB_U8];
            for b in 0..8 {
                let mut quads = [0u32; 8];
                // SAFETY: AVX2 present per this function's contract; `blk` is one whole
                // super-block (asserted by `quants`); `quads` holds 32 bytes.
                unsafe { _mm256_storeu_si256(quads.as_mut_ptr().cast(), quants::<Q3>(blk, b)) };
                for (k, quad) in quads.iter().enumerate() {
                    let o = 32 * (8 * b + k) + 4 * lane;
                    dst[o..o + 4].copy_from_slice(&quad.to_ne_bytes());
                }
            }
            let (sc, cf, d) = scales::<Q3>(blk);
            for j in 0..16 {
                let o = (at * 16 + j) * 2 * LANES + 2 * lane;
                p.sc[o] = sc[j];
                p.sc[o + 1] = sc[j];
                p.cf[(at * 16 + j) * LANES + lane] = cf[j];
            }
            p.d[at * LANES + lane] = d;
        }
    }
    p
}

/// One token's activations as the kernel (and `tile512_k23.rs`'s) reads them.
#[derive(Clone, Copy)]
pub(super) struct Tok<'a> {
    /// Quants in element order.
    pub(super) x: &'a [i8],
    /// Scale per 32-block.
    pub(super) d: &'a [f32],
    /// Per 16 quants, `d_x * sum(q)` of their 32-block's scale.
    pub(super) s16: &'a [f32],
}

/// Checks the arguments of a Q2_K/Q3_K tile (`tile`: its name), panicking where they break its
/// contract (another format, short activations or output, rows past the matrix, columns not a
/// multiple of 256): whether `w` is Q3_K, or `None` where there is nothing to compute.
pub(super) fn checked(
    tile: &str,
    w: &QMatrix,
    r0: usize,
    nr: usize,
    acts: &[QActs],
    out: &[f32],
) -> Option<bool> {
    let (n, cols, format) = (acts.len(), w.cols(), w.format());
    let q3 = match format {
        WeightFormat::Q2_K => false,
        WeightFormat::Q3_K => true,
        _ => panic!("{tile}: {format:?}"),
    };
    assert!(out.len() >= n * nr && r0 + nr <= w.rows() && cols % 256 == 0);
    assert!(acts.iter().all(|a| !a.per_super
        && a.qs.len() >= cols
        && a.d.len() >= cols / 32
        && a.sum16.len() >= cols / 16));
    (n > 0 && nr > 0).then_some(q3)
}

/// Per token, `d_x * sum(q)` of each 16 of its first `cols` quants ([`Tok::s16`]).
pub(super) fn sums16(acts: &[QActs], cols: usize) -> Vec<Vec<f32>> {
    acts.iter()
        .map(|a| {
            let s = a.sum16[..cols / 16].iter().enumerate();
            s.map(|(h, &v)| a.d[h / 2] * v as f32).collect()
        })
        .collect()
}

/// The tokens `acts` as the kernels read them, with their [`sums16`] `s16`.
pub(super) fn toks<'a>(acts: &'a [QActs], s16: &'a [Vec<f32>]) -> Vec<Tok<'a>> {
    acts.iter()
        .zip(s16)
        .map(|(a, s16)| Tok {
            x: &a.qs,
            d: &a.d,
            s16,
        })
        .collect()
}

/// The i32 sums of 32-block `b` of super-block `sb` of groups `at` (their super-block indices in
/// `p`) against tokens `toks`, each sub-block's weighted by its scale: per group and token, each
/// lane's (row's).
///
/// # Safety
/// AVX2 present; `at[g] < groups * nsb` of `p`; element `256 sb + 255` of every token exists.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block_sums<const G: usize, const T: usize>(
    p: &Packed,
    at: [usize; G],
    toks: &[Tok; T],
    (sb, b): (usize, usize),
) -> [[__m256i; T]; G] {
    let mut isum = [[_mm256_setzero_si256(); T]; G];
    for h in 0..2 {
        let mut s16 = [[_mm256_setzero_si256(); T]; G];
        for quad in 8 * b + 4 * h..8 * b + 4 * h + 4 {
            let mut wv = [_mm256_setzero_si256(); G];
            for g in 0..G {
                // SAFETY: group super-block `at[g]` lies in `p.q` per the contract, quad < 64.
                wv[g] = unsafe {
                    _mm256_loadu_si256(p.q.as_ptr().add(at[g] * SB_U8 + 32 * quad).cast())
                };
            }
            for t in 0..T {
                // SAFETY: elements `256 sb + 4 quad .. + 4` of the token exist per the contract.
                let xv = _mm256_set1_epi32(unsafe {
                    std::ptr::read_unaligned(toks[t].x.as_ptr().add(256 * sb + 4 * quad).cast())
                });
                for g in 0..G {
                    s16[g][t] = _mm256_add_epi16(s16[g][t], _mm256_maddubs_epi16(wv[g], xv));
                }
            }
        }
        for g in 0..G {
            // SAFETY: `sc` holds 16 i16 per group super-block and sub-block, `2b + h < 16`.
            let sc = unsafe {
                _mm256_loadu_si256(
                    p.sc.as_ptr()
                        .add((at[g] * 16 + 2 * b + h) * 2 * LANES)
                        .cast(),
                )
            };
            for t in 0..T {
                isum[g][t] = _mm256_add_epi32(isum[g][t], _mm256_madd_epi16(s16[g][t], sc));
            }
        }
    }
    isum
}

/// Groups `g0 .. g0 + G` against tokens `toks` over super-blocks `sbs`: per group and token, each
/// lane's (row's) dot added to `acc`.
///
/// # Safety
/// AVX2/FMA present; `g0 + G` groups in `p`; `sbs` within the row (`end <= p.nsb`); each token's
/// slices cover the row's columns (`256 nsb` quants, `8 nsb` scales, `16 nsb` sums).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block<const G: usize, const T: usize>(
    p: &Packed,
    g0: usize,
    toks: [Tok; T],
    sbs: Range<usize>,
    mut acc: [[__m256; T]; G],
) -> [[__m256; T]; G] {
    let nsb = p.nsb;
    for sb in sbs {
        let at: [usize; G] = std::array::from_fn(|g| (g0 + g) * nsb + sb);
        let mut accs = [[_mm256_setzero_ps(); T]; G];
        for b in 0..8 {
            // SAFETY: per this function's contract.
            let isum = unsafe { block_sums::<G, T>(p, at, &toks, (sb, b)) };
            for t in 0..T {
                // SAFETY: block `8 sb + b < 8 nsb` per the contract.
                let dx = _mm256_set1_ps(unsafe { *toks[t].d.get_unchecked(8 * sb + b) });
                for g in 0..G {
                    accs[g][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[g][t]), dx, accs[g][t]);
                }
            }
        }
        for g in 0..G {
            // SAFETY: `d` holds 8 f32 and `cf` 128 per group super-block, `at[g] < groups * nsb`;
            // the tokens' sums `16 sb .. 16 sb + 16` exist per the contract.
            unsafe {
                let dw = _mm256_loadu_ps(p.d.as_ptr().add(at[g] * LANES));
                for t in 0..T {
                    acc[g][t] = _mm256_fmadd_ps(accs[g][t], dw, acc[g][t]);
                }
                for j in 0..16 {
                    let c = _mm256_loadu_ps(p.cf.as_ptr().add((at[g] * 16 + j) * LANES));
                    for t in 0..T {
                        let s = _mm256_set1_ps(*toks[t].s16.get_unchecked(16 * sb + j));
                        acc[g][t] = _mm256_fnmadd_ps(c, s, acc[g][t]);
                    }
                }
            }
        }
    }
    acc
}

/// A work item's rows packed (Q3_K where `Q3`), as [`drive`] runs them.
struct Tile<'a, const Q3: bool>(Packed, PhantomData<Tok<'a>>);

impl<'a, const Q3: bool> LaneTile for Tile<'a, Q3> {
    type Tok = Tok<'a>;
    const PANEL: usize = PANEL_SB;
    fn units(&self) -> usize {
        self.0.nsb
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
        unsafe { block::<G, T>(&self.0, g0, toks, units, acc) }
    }
}

/// [`tile_k23`] for Q3_K where `Q3`, else Q2_K: its rows packed, then [`drive`]n.
///
/// # Safety
/// AVX2/FMA/F16C present; `w`'s format is the one `Q3` names; the lengths checked by
/// [`tile_k23`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_q<const Q3: bool>(w: &QMatrix, r0: usize, nr: usize, toks: &[Tok], out: &mut [f32]) {
    // SAFETY: AVX2/FMA/F16C present and the format `Q3`'s per this function's contract; each chunk
    // packed holds its rows' groups; the tokens cover the columns.
    unsafe {
        drive((w, r0), nr, toks, out, |first, count| {
            Tile::<Q3>(pack::<Q3>(w, r0 + first, count), PhantomData)
        })
    }
}

/// `out[t * nr + i]` = row `r0 + i` of `w` (Q2_K or Q3_K) · token `t` (activations `acts[t]`,
/// quantized by `QActs::quantize` with sums of 16): the integer products of `matvec_int8` for that
/// token, summed in another f32 order.
///
/// # Safety
/// AVX2/FMA/F16C present.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn tile_k23(w: &QMatrix, r0: usize, nr: usize, acts: &[QActs], out: &mut [f32]) {
    let Some(q3) = checked("tile_k23", w, r0, nr, acts, out) else {
        return;
    };
    let cols = w.cols();
    let s16 = sums16(acts, cols);
    let toks = toks(acts, &s16);
    // SAFETY: AVX2/FMA/F16C present per this function's contract; the format and the lengths
    // checked by `checked`.
    unsafe {
        if q3 {
            tile_q::<true>(w, r0, nr, &toks, out)
        } else {
            tile_q::<false>(w, r0, nr, &toks, out)
        }
    }
}
