//! The 8-bit prompt tile on AVX-512 VNNI for the formats of 32-element blocks of integer quants
//! ([`has_tile512_i8`]: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, and IQ4_XS with its sub-blocks of 32
//! as blocks), as llama.cpp's prompts multiply them: their `Int8` prompts, and `Fast` ones from
//! `INT_TILE_MIN_TOKENS` tokens of the formats in `fast_prompts_int8` (the K-quants' 8-bit tile is
//! `tile512_k8.rs`).
//!
//! A work item's rows are repacked once into groups of [`LANES`] rows (`tile512_lanes.rs`) as
//! unsigned bytes (the format's quants as stored: Q4_0/Q4_1 0..=15, Q5_0/Q5_1 0..=31, Q8_0 moved
//! up by 128 to 1..=255, IQ4's table values moved up by 128 to 1..=241), so that each 32-bit lane
//! holds one row's four quants of the same four columns. One `vpdpbusd` against four 8-bit
//! activations broadcast to every lane adds 64 products of 16 rows. Each lane's i32 sum over a
//! block, less the format's offset (8, 16 or 128) times the token's sum of the block's quants, is
//! one row's integer dot, exactly; it is converted and weighted by the row's scale and the token's
//! in f32, and a block's min term (Q4_1, Q5_1) is added as `m * s` with the token's
//! `s = d * sum(q)`.
//!
//! The activations are `matvec`'s in [`Precision::Int8`](crate::Precision) for these formats
//! (`QActs::quantize`: one scale per 32, with each 16 quants' sum, `QActs::with_sums16`), so the
//! integer products are those of `matvec_int8`; only the f32 summation order differs. `Fast`
//! prompts of Q4_0, Q4_1, IQ4_NL and IQ4_XS (`fast_prompts_halves`) take activations of one scale
//! per 16 (`QActs::quantize_halves`): each half block's sums converted and weighted on their own
//! ([`halves`]).

use std::arch::x86_64::*;
use std::ops::Range;

use super::tile512_lanes::{drive, step, Lanes, LANES};
use crate::quant::QActs;
use crate::scalar::{f16_at, iq4xs_scales};
use crate::{QMatrix, WeightFormat};

/// Bytes of one group's 32-element block: 8 column quads × 16 lanes × 4.
const BLOCK_U8: usize = 32 * LANES;
/// Blocks of a column panel: two groups' quants of a panel (32 KiB) stay in L1 while every token
/// passes over them.
const PANEL_BLOCKS: usize = 32;

/// Whether [`tile512_i8`] takes weights of `format`.
pub(crate) fn has_tile512_i8(format: WeightFormat) -> bool {
    use WeightFormat::*;
    matches!(format, Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | IQ4_NL | IQ4_XS)
}

/// What the unsigned quants of `format` exceed its signed ones by (0 for the formats with a min).
fn offset(format: WeightFormat) -> i32 {
    use WeightFormat::*;
    match format {
        Q4_0 => 8,
        Q5_0 => 16,
        Q8_0 | IQ4_NL | IQ4_XS => 128,
        _ => 0,
    }
}

/// Whether `format`'s rows add a min term.
fn has_min(format: WeightFormat) -> bool {
    use WeightFormat::*;
    matches!(format, Q4_1 | Q5_1)
}

/// The low nibbles of the 16 bytes `qs` as elements 0..16, the high ones as 16..32.
///
/// # Safety
/// AVX2 present.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn nibbles(qs: &[u8]) -> __m256i {
    let qs: &[u8; 16] = qs.try_into().expect("16 bytes of quants");
    // SAFETY: `qs` holds 16 bytes.
    let v = unsafe { _mm_loadu_si128(qs.as_ptr().cast()) };
    let m = _mm_set1_epi8(0x0F);
    let lo = _mm_and_si128(v, m);
    let hi = _mm_and_si128(_mm_srli_epi16(v, 4), m);
    _mm256_set_m128i(hi, lo)
}

/// IQ4's table values of the 32 indices `idx` (0..=15 each), moved up by 128 (1..=241).
///
/// # Safety
/// AVX2 present.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn iq4_quants(idx: __m256i) -> __m256i {
    // SAFETY: the table holds 16 bytes.
    let kv = unsafe { _mm_loadu_si128(tensor_types::IQ4NL_VALUES.as_ptr().cast()) };
    let kv = _mm256_broadcastsi128_si256(_mm_xor_si128(kv, _mm_set1_epi8(i8::MIN)));
    _mm256_shuffle_epi8(kv, idx)
}

/// Block `b` (elements `32b .. 32b + 32`) of a row `row` of `format` (one of
/// [`has_tile512_i8`]'s): its 32 unsigned quants in element order ([`quants`]), its scale, and its
/// min (0 for the formats without one). IQ4_XS's blocks are its super-blocks' sub-blocks of 32,
/// with the scale `d * (ls - 32)`.
///
/// # Safety
/// AVX2 present.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn block_of(format: WeightFormat, row: &[u8], b: usize) -> (__m256i, f32, f32) {
    if format == WeightFormat::IQ4_XS {
        let sb = &row[136 * (b / 8)..136 * (b / 8 + 1)];
        let at = 8 + 16 * (b % 8);
        // SAFETY: AVX2 present per this function's contract.
        let q = unsafe { iq4_quants(nibbles(&sb[at..at + 16])) };
        return (q, iq4xs_scales(sb)[b % 8], 0.0);
    }
    let bb = format.block_bytes();
    let blk = &row[bb * b..bb * (b + 1)];
    let mn = if has_min(format) { f16_at(blk, 2) } else { 0.0 };
    // SAFETY: AVX2 present per this function's contract; `blk` is one whole block of `format`.
    (unsafe { quants(format, blk) }, f16_at(blk, 0), mn)
}

/// The 32 unsigned quants of one block `blk` of `format` (one of [`has_tile512_i8`]'s), in element
/// order: nibbles split as `scalar.rs` reads them, Q5's fifth bits expanded from their 32-bit mask
/// (bit `e` of byte `e / 8`, compared per byte), Q8_0's signed bytes and IQ4_NL's table values
/// moved up by 128.
///
/// # Safety
/// AVX2 present; `blk` is one whole block of `format`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn quants(format: WeightFormat, blk: &[u8]) -> __m256i {
    use WeightFormat::*;
    assert!(blk.len() >= format.block_bytes());
    // Low nibbles of the 16 bytes at `at` as elements 0..16, high ones as 16..32 (the quants end
    // the block).
    // SAFETY: AVX2 present per this function's contract.
    let nibbles = |at: usize| unsafe { nibbles(&blk[at..at + 16]) };
    match format {
        // SAFETY: the 32 quants at byte 2 lie in the block.
        Q8_0 => unsafe {
            let v = _mm256_loadu_si256(blk.as_ptr().add(2).cast());
            _mm256_xor_si256(v, _mm256_set1_epi8(i8::MIN))
        },
        Q4_0 => nibbles(2),
        Q4_1 => nibbles(4),
        // SAFETY: AVX2 present per this function's contract.
        IQ4_NL => unsafe { iq4_quants(nibbles(2)) },
        _ => {
            let off = if format == Q5_0 { 2 } else { 4 };
            let qh = u32::from_le_bytes([blk[off], blk[off + 1], blk[off + 2], blk[off + 3]]);
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
            _mm256_or_si256(
                nibbles(off + 4),
                _mm256_and_si256(set, _mm256_set1_epi8(0x10)),
            )
        }
    }
}

/// A work item's rows repacked for the tile.
struct Packed {
    /// Per group and block ([`BLOCK_U8`]): quad `k` (columns `4k .. 4k + 4` of the block) at
    /// bytes `64k ..`, lane `j` (row `16g + j`) at `64k + 4j`; rows past the item's end are zero.
    q: Vec<u8>,
    /// Per group and block, each lane's scale.
    sc: Vec<f32>,
    /// Per group and block, each lane's min (empty for formats without one).
    mn: Vec<f32>,
    /// Blocks of 32 in a row.
    nb: usize,
}

impl Packed {
    /// Rows `r0 .. r0 + nr` of `w` (a [`has_tile512_i8`] format).
    ///
    /// # Safety
    /// AVX2 present.
    unsafe fn new(w: &QMatrix, r0: usize, nr: usize) -> Self {
        let (format, cols) = (w.format(), w.cols());
        let nb = cols / 32;
        let groups = nr.div_ceil(LANES);
        let min = has_min(format);
        let mut p = Packed {
            q: vec![0; groups * nb * BLOCK_U8],
            sc: vec![0.0; groups * nb * LANES],
            mn: vec![0.0; if min { groups * nb * LANES } else { 0 }],
            nb,
        };
        for i in 0..nr {
            let (g, lane) = (i / LANES, i % LANES);
            let row = w.row_data(r0 + i);
            for b in 0..nb {
                let at = g * nb + b;
                let dst = &mut p.q[at * BLOCK_U8..(at + 1) * BLOCK_U8];
                // SAFETY: AVX2 present per this function's contract.
                let (q, sc, mn) = unsafe { block_of(format, row, b) };
                let mut quads = [0u32; 8];
                // SAFETY: AVX2 present; 32 bytes written to `quads`.
                unsafe { _mm256_storeu_si256(quads.as_mut_ptr().cast(), q) };
                for (k, quad) in quads.iter().enumerate() {
                    dst[64 * k + 4 * lane..64 * k + 4 * lane + 4]
                        .copy_from_slice(&quad.to_ne_bytes());
                }
                p.sc[at * LANES + lane] = sc;
                if min {
                    p.mn[at * LANES + lane] = mn;
                }
            }
        }
        p
    }
}

impl Packed {
    /// The transpose of `nr` columns of a matrix `W` of `rows` rows (`rows` a multiple of 32): row
    /// `i` of the result is column `i` of `W`, each of its blocks of 32 (32 consecutive rows of
    /// `W`) quantized as 8-bit activations are (`QActs::quantize`: `d = amax / 127`, quants
    /// `round_ties_even(v · 127 / amax)`), packed as Q8_0 rows with f32 scales: quants moved up by
    /// 128. `fill(j0, panel)` writes rows `j0 .. j0 + 32` of those columns into `panel`
    /// (row-major, 32 rows of `nr` rounded up to [`LANES`]; it leaves the columns past `nr` at
    /// zero), for `j0` = 0, 32, ... in turn.
    ///
    /// # Safety
    /// AVX-512F/BW and AVX2 present.
    #[target_feature(enable = "avx512f,avx512bw,avx2")]
    unsafe fn transposed(nr: usize, rows: usize, mut fill: impl FnMut(usize, &mut [f32])) -> Self {
        assert!(rows % 32 == 0);
        let width = nr.next_multiple_of(LANES);
        let (groups, nb) = (width / LANES, rows / 32);
        let mut p = Packed {
            q: vec![0; groups * nb * BLOCK_U8],
            sc: vec![0.0; groups * nb * LANES],
            mn: Vec::new(),
            nb,
        };
        let mut panel = vec![0f32; 32 * width];
        for b in 0..nb {
            fill(32 * b, &mut panel);
            for g in 0..groups {
                let at = g * nb + b;
                // SAFETY: features present per this function's contract; `panel` holds 32 rows of
                // `width` floats, group `g`'s 16 columns end by `width`; block `at`'s 512 bytes and
                // 16 scales lie in `p` (sized above).
                unsafe {
                    quantize_columns(
                        panel.as_ptr().add(g * LANES),
                        width,
                        p.q.as_mut_ptr().add(at * BLOCK_U8),
                        p.sc.as_mut_ptr().add(at * LANES),
                    )
                };
            }
        }
        p
    }

    /// Bytes [`Packed::transposed`] allocates for `nr` columns of `rows` rows.
    fn transposed_bytes(nr: usize, rows: usize) -> usize {
        let (groups, nb) = (nr.div_ceil(LANES), rows / 32);
        groups * nb * (BLOCK_U8 + 4 * LANES) + 4 * 32 * groups * LANES
    }
}

/// Quantizes 16 columns of a `32 × stride` f32 panel at `src` (one lane a column), each column's 32
/// values as one 8-bit activation block (the same f32 operations as `QBlocks::quantize_groups`:
/// the scale `amax / 127` to `sc`, quants `round_ties_even(v · (127 / amax))`), and writes the
/// quants moved up by 128 to the 512 bytes at `q` in [`Packed`]'s order: quad `k` (rows
/// `4k .. 4k + 4`) at bytes `64k ..`, column `j`'s four at `64k + 4j`.
///
/// # Safety
/// AVX-512F/BW present; 32 rows of 16 floats readable at `src + r * stride`; 512 bytes writable at
/// `q` and 16 floats at `sc`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx2")]
unsafe fn quantize_columns(src: *const f32, stride: usize, q: *mut u8, sc: *mut f32) {
    // SAFETY: 32 rows of 16 floats at `src` per the contract.
    let v: [__m512; 32] = std::array::from_fn(|r| unsafe { _mm512_loadu_ps(src.add(r * stride)) });
    let amax = v.iter().fold(_mm512_setzero_ps(), |m, &x| {
        _mm512_max_ps(m, _mm512_abs_ps(x))
    });
    let max = _mm512_set1_ps(127.0);
    let live = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(amax, _mm512_setzero_ps());
    let id = _mm512_maskz_div_ps(live, max, amax);
    // SAFETY: 16 floats writable at `sc` per the contract.
    unsafe { _mm512_storeu_ps(sc, _mm512_div_ps(amax, max)) };
    let up = _mm512_set1_epi32(128);
    for k in 0..8 {
        let mut quad = _mm512_setzero_si512();
        for i in 0..4 {
            let r = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                _mm512_mul_ps(v[4 * k + i], id),
            );
            // 1..=255 after the move: one byte of the lane, no carry into the next.
            let b = _mm512_add_epi32(_mm512_cvtps_epi32(r), up);
            quad = _mm512_or_si512(quad, _mm512_sllv_epi32(b, _mm512_set1_epi32(8 * i as i32)));
        }
        // SAFETY: 64 bytes at `q + 64k` within the 512 the contract gives.
        unsafe { _mm512_storeu_si512(q.add(64 * k).cast(), quad) };
    }
}

/// One token's activations as the kernel reads them.
#[derive(Clone, Copy)]
struct Tok<'a> {
    /// Quants in element order.
    x: &'a [i8],
    /// Scale per 32-block (empty with [`Tok::d16`]).
    d: &'a [f32],
    /// `d * sum(q)` per 32-block (with [`Tok::d16`]: the sum of each half's).
    s: &'a [f32],
    /// The sum of each 16 quants (two per block; empty with [`Tok::d16`]).
    sum16: &'a [i32],
    /// Scale per 16 values, where the activations take one (`QActs::quantize_halves`); else
    /// empty.
    d16: &'a [f32],
}

/// Every token of `acts` as the kernel reads it.
fn tokens(acts: &[QActs]) -> Vec<Tok<'_>> {
    acts.iter()
        .map(|a| Tok {
            x: &a.qs,
            d: &a.d,
            s: &a.s,
            sum16: &a.sum16,
            d16: &a.d16,
        })
        .collect()
}

/// The i32 sums of column quads `quads` (of 8) of block `b` of groups `at` (their block indices
/// in `p`) against tokens `toks`: per group and token, each lane's (row's) integer dot with the
/// quants as packed over those columns.
///
/// # Safety
/// AVX-512F/BW/VNNI present; `at[g] < groups * nb` of `p`; element `32 b + 31` of every token
/// exists; `quads` within `0..8`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn block_sums<const G: usize, const T: usize>(
    p: &Packed,
    at: [usize; G],
    toks: &[Tok; T],
    (b, quads): (usize, Range<usize>),
) -> [[__m512i; T]; G] {
    let mut isum = [[_mm512_setzero_si512(); T]; G];
    for quad in quads {
        // In bounds: group block `at[g]` lies in `p.q`, quad `quad < 8`: 64 bytes at
        // `at * BLOCK_U8 + 64 * quad`.
        let w = at.map(|a| p.q.as_ptr().wrapping_add(a * BLOCK_U8 + 64 * quad));
        // In bounds: elements `b * 32 + 4 * quad + 3 < nb * 32` per the contract.
        let x = toks.map(|t| t.x.as_ptr().wrapping_add(32 * b + 4 * quad).cast::<u8>());
        // SAFETY: 64 bytes at each `w[g]` and 4 at each `x[t]` (above).
        unsafe { step(&mut isum, w, x, |a, w, x| _mm512_dpbusd_epi32(a, w, x)) };
    }
    isum
}

/// Block `b` of groups `at` against tokens `toks` whose activations take a scale per 16
/// ([`Tok::d16`]): per group and token, each lane's (row's) dot added to `acc`. Each half's i32
/// sums (quads 0..4, 4..8) converted and weighted by its scale, the format's offset `OFF` taken
/// as `OFF · s` (`s` the block's dequantized sum: `Σ_h d16_h · sum_h`), then the rows' scales:
/// `acc += sc · (d16_a · i_a + d16_b · i_b - OFF · s)`, and the min term as in [`block`]. Five
/// f32 operations a group and token where one scale per 32 takes three and an i32 subtraction.
///
/// # Safety
/// As [`block`]'s, with `2 p.nb` scales of 16 in each token and no scales of 32 or sums of 16.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn halves<const G: usize, const T: usize, const OFF: i32>(
    p: &Packed,
    at: [usize; G],
    toks: &[Tok; T],
    b: usize,
    acc: &mut [[__m512; T]; G],
) {
    // SAFETY: per this function's contract.
    let ia = unsafe { block_sums::<G, T>(p, at, toks, (b, 0..4)) };
    // SAFETY: scale of 16 `2b` and sum `b` of every token exist per the contract.
    let (da, off) = unsafe {
        (
            toks.map(|t| _mm512_set1_ps(*t.d16.get_unchecked(2 * b))),
            toks.map(|t| _mm512_set1_ps(-(OFF as f32) * *t.s.get_unchecked(b))),
        )
    };
    let mut v = [[_mm512_setzero_ps(); T]; G];
    for g in 0..G {
        for t in 0..T {
            v[g][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[g][t]), da[t], off[t]);
        }
    }
    // SAFETY: per this function's contract.
    let ib = unsafe { block_sums::<G, T>(p, at, toks, (b, 4..8)) };
    // SAFETY: scale of 16 `2b + 1` of every token exists per the contract.
    let db = unsafe { toks.map(|t| _mm512_set1_ps(*t.d16.get_unchecked(2 * b + 1))) };
    for g in 0..G {
        // SAFETY: `sc` holds `groups * nb * LANES` floats; `at[g] < groups * nb`.
        let sc = unsafe { _mm512_loadu_ps(p.sc.as_ptr().add(at[g] * LANES)) };
        for t in 0..T {
            let w = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ib[g][t]), db[t], v[g][t]);
            acc[g][t] = _mm512_fmadd_ps(w, sc, acc[g][t]);
        }
    }
}

/// The min term of block `b` (Q4_1, Q5_1) added to `acc`: each row's min times each token's
/// dequantized sum of the block, `m · s`.
///
/// # Safety
/// AVX-512F and FMA present; the format has a min (`p.mn` filled); `at[g] < groups * nb` of
/// `p`; sum `b` of every token exists.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn min_term<const G: usize, const T: usize>(
    p: &Packed,
    at: [usize; G],
    toks: &[Tok; T],
    b: usize,
    acc: &mut [[__m512; T]; G],
) {
    for g in 0..G {
        // SAFETY: `mn` holds `groups * nb * LANES` floats for these formats.
        let m = unsafe { _mm512_loadu_ps(p.mn.as_ptr().add(at[g] * LANES)) };
        for t in 0..T {
            // SAFETY: block `b < nb` per the contract.
            let s = _mm512_set1_ps(unsafe { *toks[t].s.get_unchecked(b) });
            acc[g][t] = _mm512_fmadd_ps(m, s, acc[g][t]);
        }
    }
}

/// Groups `g0 .. g0 + G` against tokens `toks` over blocks `blocks`: per group and token, each
/// lane's (row's) dot added to `acc`. `OFF`: the quants' offset, taken off each block's sums
/// (0: the format has a min, [`min_term`]); with `H`, activations of a scale per 16
/// ([`halves`]).
///
/// # Safety
/// AVX-512F/BW/VNNI and AVX2/FMA present; `g0 + G` groups in `p`; `blocks` within the row; each
/// token's slices cover the row's columns (`p.nb * 32` quants and `p.nb` sums, and `p.nb` scales
/// and `2 * p.nb` sums of 16 where `OFF != 0`, or with `H` `2 * p.nb` scales of 16).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn block<const G: usize, const T: usize, const OFF: i32, const H: bool>(
    p: &Packed,
    g0: usize,
    toks: [Tok; T],
    blocks: Range<usize>,
    mut acc: [[__m512; T]; G],
) -> [[__m512; T]; G] {
    let nb = p.nb;
    for b in blocks {
        let at: [usize; G] = std::array::from_fn(|g| (g0 + g) * nb + b);
        if H {
            // SAFETY: per this function's contract.
            unsafe { halves::<G, T, OFF>(p, at, &toks, b, &mut acc) };
        } else {
            // SAFETY: per this function's contract.
            let mut isum = unsafe { block_sums::<G, T>(p, at, &toks, (b, 0..8)) };
            if OFF != 0 {
                for t in 0..T {
                    // SAFETY: sums `2b + 1 < 2 * nb` per the contract.
                    let sx = unsafe {
                        toks[t].sum16.get_unchecked(2 * b) + toks[t].sum16.get_unchecked(2 * b + 1)
                    };
                    let c = _mm512_set1_epi32(OFF * sx);
                    for row in isum.iter_mut() {
                        row[t] = _mm512_sub_epi32(row[t], c);
                    }
                }
            }
            // SAFETY: block `b < nb` per the contract.
            let dx = unsafe { toks.map(|t| _mm512_set1_ps(*t.d.get_unchecked(b))) };
            for g in 0..G {
                // SAFETY: `sc` holds `groups * nb * LANES` floats; `at[g] < groups * nb`.
                let sc = unsafe { _mm512_loadu_ps(p.sc.as_ptr().add(at[g] * LANES)) };
                for t in 0..T {
                    let v = _mm512_mul_ps(_mm512_cvtepi32_ps(isum[g][t]), sc);
                    acc[g][t] = _mm512_fmadd_ps(v, dx[t], acc[g][t]);
                }
            }
        }
        if OFF == 0 {
            // SAFETY: per this function's contract (`OFF` 0: a format with a min).
            unsafe { min_term::<G, T>(p, at, &toks, b, &mut acc) };
        }
    }
    acc
}

/// The tile of one work item: its repacked rows and the prompt's tokens.
struct I8<'a> {
    p: Packed,
    off: i32,
    /// Whether the tokens take a scale per 16 ([`halves`]).
    halves: bool,
    toks: Vec<Tok<'a>>,
}

impl Lanes for I8<'_> {
    fn units(&self) -> (usize, usize) {
        (self.p.nb, PANEL_BLOCKS)
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
    unsafe fn sums<const G: usize, const T: usize>(
        &self,
        g0: usize,
        t0: usize,
        units: Range<usize>,
        acc: [[__m512; T]; G],
    ) -> [[__m512; T]; G] {
        let mut tk = [self.toks[t0]; T];
        tk.copy_from_slice(&self.toks[t0..t0 + T]);
        let p = &self.p;
        // SAFETY: per this method's contract (groups `g0 .. g0 + G` in `p`, blocks `units` within
        // the row), and every token covers the row's columns (asserted in `tile512_i8`).
        unsafe {
            match (self.off, self.halves) {
                (8, false) => block::<G, T, 8, false>(p, g0, tk, units, acc),
                (16, false) => block::<G, T, 16, false>(p, g0, tk, units, acc),
                (128, false) => block::<G, T, 128, false>(p, g0, tk, units, acc),
                (_, false) => block::<G, T, 0, false>(p, g0, tk, units, acc),
                (8, true) => block::<G, T, 8, true>(p, g0, tk, units, acc),
                (128, true) => block::<G, T, 128, true>(p, g0, tk, units, acc),
                // Q4_1 (`tile512_i8` takes scales of 16 for Q4_0, Q4_1 and the IQ4s only).
                (_, true) => block::<G, T, 0, true>(p, g0, tk, units, acc),
            }
        }
    }
}

/// `out[t * nr + i]` = row `r0 + i` of `w` · token `t` (activations `acts[t]`, quantized as
/// `matvec` quantizes them in [`Precision::Int8`](crate::Precision) for `w`'s format, with their
/// sums of 16 where the format has an offset).
///
/// # Safety
/// AVX-512F/BW/VNNI and AVX2/FMA/F16C present; `w`'s format is one of [`has_tile512_i8`]'s.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn tile512_i8(
    w: &QMatrix,
    r0: usize,
    nr: usize,
    acts: &[QActs],
    out: &mut [f32],
) {
    let (n, cols, format) = (acts.len(), w.cols(), w.format());
    assert!(has_tile512_i8(format) && out.len() >= n * nr && r0 + nr <= w.rows());
    assert!(cols % 32 == 0);
    let off = offset(format);
    let halves = acts.first().is_some_and(|a| !a.d16.is_empty());
    // The 5-bit formats' and Q8_0's prompts take no scales of 16 (`fast_prompts_halves`).
    use WeightFormat::*;
    assert!(!halves || matches!(format, Q4_0 | Q4_1 | IQ4_NL | IQ4_XS));
    assert!(acts.iter().all(|a| !a.per_super
        && a.qs.len() >= cols
        && a.s.len() >= cols / 32
        && if halves {
            a.d16.len() >= cols / 16
        } else {
            a.d.len() >= cols / 32 && (off == 0 || a.sum16.len() >= cols / 16)
        }));
    if n == 0 || nr == 0 {
        return;
    }
    let toks = tokens(acts);
    let k = I8 {
        // SAFETY: AVX2 present per this function's contract.
        p: unsafe { Packed::new(w, r0, nr) },
        off,
        halves,
        toks,
    };
    // SAFETY: features present per this function's contract; `k.p` holds `nr` rows.
    unsafe { drive(&k, nr, n, out) };
}

/// `out[t * nr + i]` = column `i` of `W` · token `t`, for `nr` columns of a matrix `W` of `rows`
/// rows (a multiple of 32) that `fill` hands over 32 rows at a time ([`Packed::transposed`]), each column's 32-row blocks quantized as 8-bit activations are, and
/// tokens `acts` quantized the same way (`rows` values each) with their sums of 16: 8-bit products
/// of two quantized operands, as a Q8_0 matrix `Wᵀ` with f32 scales would give them.
///
/// # Safety
/// AVX-512F/BW/VNNI and AVX2/FMA/F16C present.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn tile512_i8_t(
    nr: usize,
    rows: usize,
    fill: impl FnMut(usize, &mut [f32]),
    acts: &[QActs],
    out: &mut [f32],
) {
    let n = acts.len();
    assert!(rows % 32 == 0 && out.len() >= n * nr);
    assert!(acts.iter().all(|a| !a.per_super
        && a.qs.len() >= rows
        && a.d.len() >= rows / 32
        && a.sum16.len() >= rows / 16));
    if n == 0 || nr == 0 {
        return;
    }
    let toks = tokens(acts);
    let k = I8 {
        // SAFETY: AVX-512F/BW and AVX2 present per this function's contract; `rows` a multiple
        // of 32 (asserted).
        p: unsafe { Packed::transposed(nr, rows, fill) },
        off: 128,
        halves: false,
        toks,
    };
    // SAFETY: features present per this function's contract; `k.p` holds `nr` rows.
    unsafe { drive(&k, nr, n, out) };
}

/// Bytes [`tile512_i8_t`] allocates for `nr` columns of `rows` rows and `n` tokens.
pub(crate) fn tile512_i8_t_bytes(nr: usize, rows: usize, n: usize) -> usize {
    Packed::transposed_bytes(nr, rows) + n * std::mem::size_of::<Tok>()
}

#[cfg(test)]
mod tests {
    use super::{Packed, BLOCK_U8, LANES};
    use crate::quant::QActs;
    use crate::KernelPath;

    /// The transposing packer quantizes each column's blocks of 32 rows exactly as
    /// `QActs::quantize` quantizes that column laid out as a vector (the same scales, the same
    /// quants, ties to even), and puts them where `Packed`'s layout says: a column count that
    /// is not a multiple of 16, an all-zero block, a column of ties and an outlier included.
    #[test]
    fn transposed_columns_quantize_as_activations() {
        if !KernelPath::Avx512.is_available() {
            eprintln!("no AVX-512 here: the packer is not compiled in for this machine's path");
            return;
        }
        let (nr, rows) = (21usize, 96usize);
        // W[j][i], row-major.
        let mut w: Vec<f32> = (0..rows * nr)
            .map(|k| ((k * 7919 % 1013) as f32 - 506.0) / 97.0)
            .collect();
        for j in 32..64 {
            w[j * nr + 3] = 0.0; // column 3's second block: all zero
        }
        for j in 0..32 {
            // Column 5's first block: a scale of 1, every other value half a step off.
            w[j * nr + 5] = if j == 0 { 127.0 } else { j as f32 + 0.5 };
        }
        w[70 * nr + 20] = 1e4; // an outlier in the last column's third block
                               // SAFETY: AVX-512F/BW and AVX2 present (checked above); `rows` a multiple of 32.
        let p = unsafe {
            Packed::transposed(nr, rows, |j0, panel| {
                let width = panel.len() / 32;
                assert_eq!(width, nr.next_multiple_of(LANES));
                for (r, row) in panel.chunks_exact_mut(width).enumerate() {
                    row[..nr].copy_from_slice(&w[(j0 + r) * nr..(j0 + r + 1) * nr]);
                }
            })
        };
        let nb = rows / 32;
        assert_eq!(p.nb, nb);
        for i in 0..nr {
            let col: Vec<f32> = (0..rows).map(|j| w[j * nr + i]).collect();
            let q = QActs::quantize(KernelPath::Scalar, &col);
            let (g, lane) = (i / LANES, i % LANES);
            for b in 0..nb {
                let at = g * nb + b;
                assert_eq!(
                    p.sc[at * LANES + lane].to_bits(),
                    q.d[b].to_bits(),
                    "column {i} block {b}"
                );
                for e in 0..32 {
                    let got = p.q[at * BLOCK_U8 + 64 * (e / 4) + 4 * lane + e % 4];
                    let want = (i32::from(q.qs[b * 32 + e]) + 128) as u8;
                    assert_eq!(got, want, "column {i} block {b} row {e}");
                }
            }
        }
    }
}
