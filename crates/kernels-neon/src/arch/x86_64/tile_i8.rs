//! The 8-bit prompt tile on AVX2 for the formats of 32-element blocks of integer quants
//! ([`has_tile_i8`]: Q4_0, Q4_1, Q5_0, Q5_1): their [`Precision::Int8`](crate::Precision)
//! prompts, and `Fast` ones of the formats of `fast_prompts_int8` (Q5_0) and `fast_prompts_halves`
//! (Q4_0, Q4_1), from
//! `INT_TILE_MIN_TOKENS` tokens, as on AVX-512 (`tile512_i8.rs`, whose layout this follows with
//! `maddubs` where that one has `vpdpbusd`). Without it these prompts took the 16-bit tile
//! (`tile_k16.rs`), whose `vpmaddwd` gives half the products per instruction.
//!
//! Not Q8_0: its signed quants need `maddubs(|q|, sign(x, q))` with each quad's pair sums widened
//! at once (up to 128 · 127 · 2), as many instructions per product as the 16-bit tile's; this tile
//! with them measured 0.96x of that one (`examples/matmul_once`, 2816 × 1024, 128 tokens), so Q8_0
//! keeps it.
//!
//! A work item's rows are repacked once into groups of [`LANES`] rows, each 32-bit lane holding one
//! row's four quants of the same four columns. The quants stay unsigned as stored (0..=15, Q5 0..=31).
//! Against a token's four 8-bit activations broadcast to every lane, one `vpmaddubsw` gives 32
//! products of 8 rows as 16-bit pair sums, and the pair sums of several column quads are added in
//! i16 before one `vpmaddwd` by ones widens them: all 8 quads of a block for the 4-bit formats (16
//! products of at most 15 · 127 per lane: 30480), 4 for the 5-bit ones (8 of at most 31 · 127:
//! 31496), below 2^15 (`|q_x| <= 127`). A lane's i32 sum over a block, less the format's offset
//! (8, 16) times the token's sum of the block's quants, is one row's integer dot, exactly.
//!
//! Each block's sums are converted and weighted by the rows' scales and the token's in f32, and a
//! block's min term (Q4_1, Q5_1) is added as `m * s` with the token's `s = d * sum(q)`. The
//! activations are `matvec`'s in `Int8` for these formats (`QActs::quantize`: one scale per 32,
//! with the sums of 16, `QActs::with_sums16`), so the integer products are those of
//! `matvec_int8`; only the f32 summation order differs. `Fast` prompts of Q4_0 and Q4_1
//! (`fast_prompts_halves`) take activations of one scale per 16 (`QActs::quantize_halves`): each
//! half block's sums converted and weighted on their own ([`halves`]).

use std::arch::x86_64::*;
use std::marker::PhantomData;
use std::ops::Range;

use super::tile_lanes::{drive, LaneTile, LANES};
use crate::arch::tags::{block_bytes, has_min, quants_offset, Q4_0, Q4_1, Q5_0, Q5_1};
use crate::quant::QActs;
use crate::scalar::f16_at;
use crate::{QMatrix, WeightFormat};

/// Bytes of one group's 32-element block: 8 column quads × 8 lanes × 4.
const BLOCK_U8: usize = 32 * LANES;
/// Blocks of a column panel: two groups' quants of a panel (16 KiB) stay in L1 while every token
/// passes over them.
const PANEL_BLOCKS: usize = 32;

/// Whether [`tile_i8`] takes weights of `format`.
pub(crate) fn has_tile_i8(format: WeightFormat) -> bool {
    use WeightFormat::*;
    matches!(format, Q4_0 | Q4_1 | Q5_0 | Q5_1)
}

/// What the unsigned quants of format tag `F` exceed its signed ones by (0 for the formats with a
/// min).
const fn offset(f: u8) -> i32 {
    match f {
        Q4_0 => 8,
        Q5_0 => 16,
        _ => 0,
    }
}

/// Column quads whose pair sums add in i16 before widening: all 8 of a block for the 4-bit
/// formats, 4 for the 5-bit ones (see the module's bounds).
const fn quads_per_i16(f: u8) -> usize {
    match f {
        Q4_0 | Q4_1 => 8,
        _ => 4,
    }
}

/// The 32 unsigned quants of one block `blk` of format tag `F` in element order: nibbles split as
/// `scalar.rs` reads them, Q5's fifth bits expanded from their 32-bit mask (bit `e` of byte
/// `e / 8`, compared per byte).
///
/// # Safety
/// AVX2 present.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quants<const F: u8>(blk: &[u8]) -> __m256i {
    assert!(blk.len() >= block_bytes(F));
    let q = quants_offset(F);
    let at = if F == Q5_0 || F == Q5_1 { q + 4 } else { q };
    // SAFETY: the 16 nibble bytes at `at` end the block (length asserted).
    let v = unsafe { _mm_loadu_si128(blk.as_ptr().add(at).cast()) };
    let m = _mm_set1_epi8(0x0F);
    let nib = _mm256_set_m128i(
        _mm_and_si128(_mm_srli_epi16::<4>(v), m),
        _mm_and_si128(v, m),
    );
    if F == Q4_0 || F == Q4_1 {
        return nib;
    }
    let qh = u32::from_le_bytes([blk[q], blk[q + 1], blk[q + 2], blk[q + 3]]);
    // Byte `e` of `b` is byte `e / 8` of `qh` (each 128-bit lane holds `qh` four times).
    let spread = _mm256_setr_epi64x(
        0,
        0x0101_0101_0101_0101,
        0x0202_0202_0202_0202,
        0x0303_0303_0303_0303,
    );
    let b = _mm256_shuffle_epi8(_mm256_set1_epi32(qh as i32), spread);
    let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201_u64 as i64);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(b, bit), bit);
    _mm256_or_si256(nib, _mm256_and_si256(set, _mm256_set1_epi8(0x10)))
}

/// A work item's rows repacked for the tile.
struct Packed {
    /// Per group and block ([`BLOCK_U8`]): quad `k` (columns `4k .. 4k + 4` of the block) at bytes
    /// `32k ..`, lane `j` (row `8g + j`) at `32k + 4j`; rows past the item's end are zero.
    q: Vec<u8>,
    /// Per group and block, each lane's scale (0 past the item's end).
    sc: Vec<f32>,
    /// Per group and block, each lane's min (empty for formats without one).
    mn: Vec<f32>,
    /// Blocks of 32 in a row.
    nb: usize,
}

/// Rows `r0 .. r0 + nr` of `w` (of format tag `F`, one of [`has_tile_i8`]'s, whole blocks)
/// repacked.
///
/// # Safety
/// AVX2/FMA/F16C present; `w`'s format is `F`'s.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pack<const F: u8>(w: &QMatrix, r0: usize, nr: usize) -> Packed {
    let (nb, bb) = (w.cols() / 32, block_bytes(F));
    let groups = nr.div_ceil(LANES);
    let min = has_min(F);
    let mut p = Packed {
        q: vec![0; groups * nb * BLOCK_U8],
        sc: vec![0.0; groups * nb * LANES],
        mn: vec![0.0; if min { groups * nb * LANES } else { 0 }],
        nb,
    };
    for i in 0..nr {
        let (g, lane) = (i / LANES, i % LANES);
        for (b, blk) in w.row_data(r0 + i).chunks_exact(bb).take(nb).enumerate() {
            let at = g * nb + b;
            let mut quads = [0u32; 8];
            // SAFETY: AVX2 present per this function's contract; `blk` is one whole block of
            // `F`; `quads` holds 32 bytes.
            unsafe { _mm256_storeu_si256(quads.as_mut_ptr().cast(), quants::<F>(blk)) };
            let dst = &mut p.q[at * BLOCK_U8..(at + 1) * BLOCK_U8];
            for (k, quad) in quads.iter().enumerate() {
                dst[32 * k + 4 * lane..32 * k + 4 * lane + 4].copy_from_slice(&quad.to_ne_bytes());
            }
            p.sc[at * LANES + lane] = f16_at(blk, 0);
            if min {
                p.mn[at * LANES + lane] = f16_at(blk, 2);
            }
        }
    }
    p
}

/// One token's activations as the kernel reads them.
#[derive(Clone, Copy)]
struct Tok<'a> {
    /// Quants in element order.
    x: &'a [i8],
    /// Scale per 32-block (empty with [`Tok::d16`]).
    d: &'a [f32],
    /// `d * sum(q)` per 32-block (with halves: the sum of each half's).
    s: &'a [f32],
    /// Sum of each 16 quants (empty with [`Tok::d16`]).
    sum16: &'a [i32],
    /// Scale per 16 values, where the activations take one (`QActs::quantize_halves`); else
    /// empty.
    d16: &'a [f32],
}

/// The i32 sums of column quads `quads` (of 8) of block `b` of groups `at` (their block indices
/// in `p`) against tokens `toks`: per group and token, each lane's (row's) integer dot with the
/// quants as packed over those columns.
///
/// # Safety
/// AVX2 present; `at[g] < groups * nb` of `p`; element `32 b + 31` of every token exists;
/// `quads` within `0..8` and whole parts of [`quads_per_i16`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block_sums<const G: usize, const T: usize, const F: u8>(
    p: &Packed,
    at: [usize; G],
    toks: &[Tok; T],
    (b, quads): (usize, Range<usize>),
) -> [[__m256i; T]; G] {
    let ones = _mm256_set1_epi16(1);
    let per = quads_per_i16(F).min(quads.len());
    let mut isum = [[_mm256_setzero_si256(); T]; G];
    for part in quads.start / per..quads.end / per {
        let mut s16 = [[_mm256_setzero_si256(); T]; G];
        for quad in part * per..(part + 1) * per {
            let mut wv = [_mm256_setzero_si256(); G];
            for g in 0..G {
                // SAFETY: group block `at[g]` lies in `p.q` per the contract, quad `< 8`.
                wv[g] = unsafe {
                    _mm256_loadu_si256(p.q.as_ptr().add(at[g] * BLOCK_U8 + 32 * quad).cast())
                };
            }
            for t in 0..T {
                // SAFETY: elements `32 b + 4 quad .. + 4` of the token exist per the contract.
                let xv = _mm256_set1_epi32(unsafe {
                    std::ptr::read_unaligned(toks[t].x.as_ptr().add(32 * b + 4 * quad).cast())
                });
                for g in 0..G {
                    s16[g][t] = _mm256_add_epi16(s16[g][t], _mm256_maddubs_epi16(wv[g], xv));
                }
            }
        }
        for g in 0..G {
            for t in 0..T {
                isum[g][t] = _mm256_add_epi32(isum[g][t], _mm256_madd_epi16(s16[g][t], ones));
            }
        }
    }
    isum
}

/// Block `b` of groups `at` against tokens `toks` whose activations take a scale per 16
/// ([`Tok::d16`]): per group and token, each lane's (row's) dot added to `acc`. Each half's i32
/// sums (quads 0..4, 4..8) converted and weighted by its scale, the format's offset taken as
/// `offset · s` (`s` the block's dequantized sum: `Σ_h d16_h · offset · sum_h`), then the rows'
/// scales: `acc += sc · (d16_a · i_a + d16_b · i_b - offset · s)`, and the min term as in
/// [`block`]. About the instructions of one scale per 32: two `vpmaddwd` by ones and two
/// conversions where that has one of each and an i32 offset subtracted.
///
/// # Safety
/// As [`block`]'s, with `2 p.nb` scales of 16 in each token and no scales of 32 or sums of 16.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn halves<const G: usize, const T: usize, const F: u8>(
    p: &Packed,
    at: [usize; G],
    toks: &[Tok; T],
    b: usize,
    acc: &mut [[__m256; T]; G],
) {
    // SAFETY: per this function's contract.
    let (ia, ib) = unsafe {
        (
            block_sums::<G, T, F>(p, at, toks, (b, 0..4)),
            block_sums::<G, T, F>(p, at, toks, (b, 4..8)),
        )
    };
    // SAFETY: scales of 16 `2b, 2b + 1` and sum `b` of every token exist per the contract.
    let (da, db, off) = unsafe {
        (
            toks.map(|t| _mm256_set1_ps(*t.d16.get_unchecked(2 * b))),
            toks.map(|t| _mm256_set1_ps(*t.d16.get_unchecked(2 * b + 1))),
            toks.map(|t| _mm256_set1_ps(-(offset(F) as f32) * *t.s.get_unchecked(b))),
        )
    };
    for g in 0..G {
        // SAFETY: `sc` holds `groups * nb * LANES` floats; `at[g] < groups * nb`.
        let sc = unsafe { _mm256_loadu_ps(p.sc.as_ptr().add(at[g] * LANES)) };
        for t in 0..T {
            let v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia[g][t]), da[t], off[t]);
            let v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ib[g][t]), db[t], v);
            acc[g][t] = _mm256_fmadd_ps(v, sc, acc[g][t]);
        }
    }
    if has_min(F) {
        // SAFETY: per this function's contract.
        unsafe { min_term::<G, T>(p, at, toks, b, acc) };
    }
}

/// The min term of block `b` (Q4_1, Q5_1) added to `acc`: each row's min times each token's
/// dequantized sum of the block, `m · s`.
///
/// # Safety
/// AVX2/FMA present; the format has a min (`p.mn` filled); `at[g] < groups * nb` of `p`; sum `b`
/// of every token exists.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn min_term<const G: usize, const T: usize>(
    p: &Packed,
    at: [usize; G],
    toks: &[Tok; T],
    b: usize,
    acc: &mut [[__m256; T]; G],
) {
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

/// Groups `g0 .. g0 + G` against tokens `toks` over blocks `blocks`: per group and token, each
/// lane's (row's) dot added to `acc`; with `H`, activations of a scale per 16 ([`halves`]).
///
/// # Safety
/// AVX2/FMA present; `g0 + G` groups in `p`; `blocks` within the row (`end <= p.nb`); each
/// token's slices cover the row's columns (`p.nb * 32` quants, `p.nb` sums, and `p.nb` scales
/// and `2 p.nb` sums of 16, or with `H` `2 p.nb` scales of 16).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block<const G: usize, const T: usize, const F: u8, const H: bool>(
    p: &Packed,
    g0: usize,
    toks: [Tok; T],
    blocks: Range<usize>,
    mut acc: [[__m256; T]; G],
) -> [[__m256; T]; G] {
    let nb = p.nb;
    for b in blocks {
        let at: [usize; G] = std::array::from_fn(|g| (g0 + g) * nb + b);
        if H {
            // SAFETY: per this function's contract.
            unsafe { halves::<G, T, F>(p, at, &toks, b, &mut acc) };
            continue;
        }
        // SAFETY: per this function's contract.
        let mut isum = unsafe { block_sums::<G, T, F>(p, at, &toks, (b, 0..8)) };
        if offset(F) != 0 {
            for t in 0..T {
                // SAFETY: sums of 16 `2b, 2b + 1 < 2 nb` per the contract.
                let sx = unsafe {
                    toks[t].sum16.get_unchecked(2 * b) + toks[t].sum16.get_unchecked(2 * b + 1)
                };
                let c = _mm256_set1_epi32(offset(F) * sx);
                for row in isum.iter_mut() {
                    row[t] = _mm256_sub_epi32(row[t], c);
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
        if has_min(F) {
            // SAFETY: per this function's contract.
            unsafe { min_term::<G, T>(p, at, &toks, b, &mut acc) };
        }
    }
    acc
}

/// A work item's rows packed for format tag `F`, as [`drive`] runs them; with `H`, against
/// activations of a scale per 16.
struct Tile<'a, const F: u8, const H: bool>(Packed, PhantomData<Tok<'a>>);

impl<'a, const F: u8, const H: bool> LaneTile for Tile<'a, F, H> {
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
        unsafe { block::<G, T, F, H>(&self.0, g0, toks, units, acc) }
    }
}

/// [`tile_i8`] for format tag `F`: its rows packed, then [`drive`]n (with `H`, against
/// activations of a scale per 16).
///
/// # Safety
/// AVX2/FMA/F16C present; `w`'s format is `F`'s; the lengths checked by [`tile_i8`], the
/// tokens' scales of 16 present with `H`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_f<const F: u8, const H: bool>(
    w: &QMatrix,
    r0: usize,
    nr: usize,
    toks: &[Tok],
    out: &mut [f32],
) {
    // SAFETY: AVX2/FMA/F16C present and the format `F`'s per this function's contract; each chunk
    // packed holds its rows' groups; the tokens cover the columns.
    unsafe {
        drive((w, r0), nr, toks, out, |first, count| {
            Tile::<F, H>(pack::<F>(w, r0 + first, count), PhantomData)
        })
    }
}

/// `out[t * nr + i]` = row `r0 + i` of `w` · token `t` (activations `acts[t]`, quantized by
/// `QActs::quantize` with sums of 16: the integer products of `matvec_int8` for that token, summed
/// in another f32 order; or, for Q4_0 and Q4_1, all by `QActs::quantize_halves`, a scale per 16).
///
/// # Safety
/// AVX2/FMA/F16C present; `w`'s format is one of [`has_tile_i8`]'s.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn tile_i8(w: &QMatrix, r0: usize, nr: usize, acts: &[QActs], out: &mut [f32]) {
    let (n, cols, format) = (acts.len(), w.cols(), w.format());
    assert!(has_tile_i8(format) && out.len() >= n * nr && r0 + nr <= w.rows());
    assert!(cols % 32 == 0);
    let halves = acts.first().is_some_and(|a| !a.d16.is_empty());
    assert!(acts.iter().all(|a| !a.per_super
        && a.qs.len() >= cols
        && a.s.len() >= cols / 32
        && if halves {
            a.d16.len() >= cols / 16
        } else {
            a.d.len() >= cols / 32 && a.sum16.len() >= cols / 16
        }));
    if n == 0 || nr == 0 {
        return;
    }
    let toks: Vec<Tok> = acts
        .iter()
        .map(|a| Tok {
            x: &a.qs,
            d: &a.d,
            s: &a.s,
            sum16: &a.sum16,
            d16: &a.d16,
        })
        .collect();
    use WeightFormat as W;
    // SAFETY: AVX2/FMA/F16C present per this function's contract; each arm's tag is the format's;
    // the lengths asserted above.
    unsafe {
        match (format, halves) {
            (W::Q4_0, false) => tile_f::<Q4_0, false>(w, r0, nr, &toks, out),
            (W::Q4_1, false) => tile_f::<Q4_1, false>(w, r0, nr, &toks, out),
            (W::Q5_0, false) => tile_f::<Q5_0, false>(w, r0, nr, &toks, out),
            (_, false) => tile_f::<Q5_1, false>(w, r0, nr, &toks, out),
            (W::Q4_0, true) => tile_f::<Q4_0, true>(w, r0, nr, &toks, out),
            (W::Q4_1, true) => tile_f::<Q4_1, true>(w, r0, nr, &toks, out),
            // The 5-bit formats' prompts take no scales of 16 (`fast_prompts_halves`).
            (_, true) => panic!("tile_i8: {format:?} with activations of a scale per 16"),
        }
    }
}
