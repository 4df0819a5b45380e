//! The 8-bit prompt tile of Q4_K/Q5_K/Q6_K weights on AVX2 with the rows in the lanes:
//! `tile_i8.rs`'s layout for the super-blocks of 256. A work item's rows are repacked once into
//! groups of [`LANES`] rows, each 32-bit lane holding one row's four unsigned quants of the same
//! four columns (Q6_K's 0..=63 before its offset of 32), each row's sub-block scales as i16 (twice
//! per lane; 8 a super-block, Q6_K's 16 signed ones), its `d`, and for Q4_K/Q5_K its 8 `dmin * m`
//! in f32. Against a token's four 8-bit activations broadcast to every lane, one `vpmaddubsw`
//! gives 32 products of 8 rows as i16 pair sums; several quads' are added in i16 (Q4_K 8: 16
//! products of at most 15 · 127 per i16 lane, 30480; Q5_K 4: 8 of 31 · 127, 31496; Q6_K 2: 4 of
//! 63 · 127, 32004; `|q_x| <= 127`), and one `vpmaddwd` by the lanes' scale weights and widens
//! them (a super-block's i32 sums stay below 2^29). Q6_K's offset: each row's `32 Σ_j sc_j ·
//! sum16_j(x)`, two sub-blocks to a `vpmaddwd`, subtracted in i32. The K-quant panel
//! (`panel_k8.rs`) needs a `vpmaddwd` per 32 products of one row; here one serves 64-256 of 8 rows.
//!
//! Per super-block and token the i32 sums are converted and multiplied by the rows' `d` and the
//! token's, and for Q4_K/Q5_K the mins' term (`dmin * m_j` times the token's `s_j = d * sum(q)` of
//! sub-block `j`) subtracted, in f32 with 8 rows to an instruction: the integer products of
//! `matvec_int8` (activations of one scale per 256, `QActs::quantize_super`, with sums of 16 for
//! Q6_K), summed in another f32 order.

use std::arch::x86_64::*;
use std::marker::PhantomData;
use std::ops::Range;

use super::kquant::q45k_pair;
use super::kquant_super::q4k_scales_int;
use super::tile_lanes::{drive, LaneTile, LANES};
use crate::quant::QActs;
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
    /// Per group and super-block, per sub-block, each lane's scale twice (16 i16).
    sc: Vec<i16>,
    /// Per group and super-block, per sub-block, each lane's `dmin * m` (8 f32).
    mn: Vec<f32>,
    /// Per group and super-block, each lane's `d` (8 f32).
    d: Vec<f32>,
    /// Super-blocks in a row.
    nsb: usize,
}

/// Format kinds: Q4_K, Q5_K, Q6_K.
const K4: u8 = 0;
const K5: u8 = 1;
const K6: u8 = 2;

/// Scales per super-block: one per 32 columns (Q4_K/Q5_K), per 16 (Q6_K).
const fn scales(k: u8) -> usize {
    if k == K6 {
        16
    } else {
        8
    }
}

/// Rows `r0 .. r0 + nr` of `w` (of kind `K`) repacked.
///
/// # Safety
/// AVX2/FMA/F16C present; `w`'s format is the one `K` names.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pack<const K: u8>(w: &QMatrix, r0: usize, nr: usize) -> Packed {
    let (format, bb) = match K {
        K4 => (WeightFormat::Q4_K, 144),
        K5 => (WeightFormat::Q5_K, 176),
        _ => (WeightFormat::Q6_K, 210),
    };
    let (nsb, ns) = (w.cols() / 256, scales(K));
    let groups = nr.div_ceil(LANES);
    let mut p = Packed {
        q: vec![0; groups * nsb * SB_U8],
        sc: vec![0; groups * nsb * ns * 2 * LANES],
        mn: vec![0.0; if K == K6 { 0 } else { groups * nsb * 8 * LANES }],
        d: vec![0.0; groups * nsb * LANES],
        nsb,
    };
    for i in 0..nr {
        let (g, lane) = (i / LANES, i % LANES);
        for (sb, blk) in w.row_data(r0 + i).chunks_exact(bb).take(nsb).enumerate() {
            let at = g * nsb + sb;
            let mut q = [[0u32; 8]; 8];
            // SAFETY: AVX2 present per this function's contract; `blk` is one whole
            // super-block (the unpackers assert it); each `q` row holds 32 bytes.
            unsafe {
                for half in 0..2 {
                    let v = if K == K6 {
                        super::kquant::q6k_half_u(blk, half)
                    } else {
                        let [a, b] = q45k_pair(format, blk, 2 * half);
                        let [c, d] = q45k_pair(format, blk, 2 * half + 1);
                        [a, b, c, d]
                    };
                    for (k, v) in v.iter().enumerate() {
                        _mm256_storeu_si256(q[4 * half + k].as_mut_ptr().cast(), *v);
                    }
                }
            }
            let dst = &mut p.q[at * SB_U8..(at + 1) * SB_U8];
            for (b, quads) in q.iter().enumerate() {
                for (k, quad) in quads.iter().enumerate() {
                    let o = 32 * (8 * b + k) + 4 * lane;
                    dst[o..o + 4].copy_from_slice(&quad.to_ne_bytes());
                }
            }
            let mut sc = [0i16; 16];
            let d = if K == K6 {
                for (j, v) in sc.iter_mut().enumerate() {
                    *v = i16::from(blk[192 + j] as i8);
                }
                crate::scalar::f16_at(blk, 208)
            } else {
                let mut mn = [0f32; 8];
                // SAFETY: AVX2/F16C present; the block's first 16 bytes exist; the arrays hold
                // 32 bytes each.
                let d = unsafe {
                    let (s, m, d) = q4k_scales_int(blk.as_ptr());
                    _mm256_storeu_si256(sc.as_mut_ptr().cast(), s);
                    _mm256_storeu_ps(mn.as_mut_ptr(), m);
                    d
                };
                for (j, m) in mn.iter().enumerate() {
                    p.mn[(at * 8 + j) * LANES + lane] = *m;
                }
                d
            };
            for (j, v) in sc.iter().take(ns).enumerate() {
                let o = (at * ns + j) * 2 * LANES + 2 * lane;
                p.sc[o] = *v;
                p.sc[o + 1] = *v;
            }
            p.d[at * LANES + lane] = d;
        }
    }
    p
}

/// One token's activations as the kernel reads them.
#[derive(Clone, Copy)]
struct Tok<'a> {
    /// Quants in element order.
    x: &'a [i8],
    /// Scale per 32-block (one per super-block, repeated).
    d: &'a [f32],
    /// `d * sum(q)` per 32-block.
    s: &'a [f32],
    /// Sum of each 16 quants (Q6_K; else empty).
    sum16: &'a [i32],
}

/// The i32 sums of super-block `sb` of groups `at` (their super-block indices in `p`) against
/// tokens `toks`, weighted by the sub-block scales: per group and token, each lane's (row's).
///
/// # Safety
/// AVX2 present; `at[g] < groups * nsb` of `p`; element `256 sb + 255` of every token exists.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn sb_sums<const G: usize, const T: usize, const K: u8>(
    p: &Packed,
    at: [usize; G],
    toks: &[Tok; T],
    sb: usize,
) -> [[__m256i; T]; G] {
    // Quads summed in i16 before a widening: Q4_K 8 (16 products of at most 15 · 127), Q5_K 4
    // (8 of 31 · 127), Q6_K 2 (4 of 63 · 127: 32004).
    let per = match K {
        K4 => 8,
        K5 => 4,
        _ => 2,
    };
    let ns = scales(K);
    let mut isum = [[_mm256_setzero_si256(); T]; G];
    for q0 in (0..64).step_by(per) {
        let mut s16 = [[_mm256_setzero_si256(); T]; G];
        for quad in q0..q0 + per {
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
        let j = q0 * ns / 64;
        for g in 0..G {
            // SAFETY: `sc` holds 16 i16 per group super-block and scale, `j < ns`.
            let sc = unsafe {
                _mm256_loadu_si256(p.sc.as_ptr().add((at[g] * ns + j) * 2 * LANES).cast())
            };
            for t in 0..T {
                isum[g][t] = _mm256_add_epi32(isum[g][t], _mm256_madd_epi16(s16[g][t], sc));
            }
        }
    }
    if K == K6 {
        // The offset of 32: each row's `32 Σ_j sc_j · (sum of the token's 16 quants j)`, the
        // scales of two sub-blocks at a time against the two sums broadcast as i16 pairs (sums
        // within ±2032, scales ±128).
        for t in 0..T {
            for pair in 0..8 {
                // SAFETY: sums of 16 `16 sb .. 16 sb + 16` of the token exist per the contract.
                let (a, b) = unsafe {
                    let s = toks[t].sum16.as_ptr().add(16 * sb + 2 * pair);
                    (*s, *s.add(1))
                };
                let xs = _mm256_set1_epi32((a & 0xFFFF) | (b << 16));
                for g in 0..G {
                    // SAFETY: as above; scales `2 pair, 2 pair + 1 < 16`: lanes' pairs read as
                    // (sc_2p of lane 0, its copy, ...): take the even i16 of two scale vectors.
                    let (s0, s1) = unsafe {
                        let base = p.sc.as_ptr().add((at[g] * ns + 2 * pair) * 2 * LANES);
                        (
                            _mm256_loadu_si256(base.cast()),
                            _mm256_loadu_si256(base.add(2 * LANES).cast()),
                        )
                    };
                    // Lane: (sc_2p, sc_2p+1) as its low and high i16.
                    let sp = _mm256_blend_epi16::<0xAA>(s0, s1);
                    let off = _mm256_slli_epi32::<5>(_mm256_madd_epi16(sp, xs));
                    isum[g][t] = _mm256_sub_epi32(isum[g][t], off);
                }
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
/// slices cover the row's columns.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block<const G: usize, const T: usize, const K: u8>(
    p: &Packed,
    g0: usize,
    toks: [Tok; T],
    sbs: Range<usize>,
    mut acc: [[__m256; T]; G],
) -> [[__m256; T]; G] {
    let nsb = p.nsb;
    for sb in sbs {
        let at: [usize; G] = std::array::from_fn(|g| (g0 + g) * nsb + sb);
        // SAFETY: per this function's contract.
        let isum = unsafe { sb_sums::<G, T, K>(p, at, &toks, sb) };
        for g in 0..G {
            // SAFETY: `d` holds 8 f32 and `mn` 64 (Q4_K/Q5_K) per group super-block;
            // `at[g] < groups * nsb`;
            // the tokens' scales and sums `8 sb .. 8 sb + 8` exist per the contract.
            unsafe {
                let dw = _mm256_loadu_ps(p.d.as_ptr().add(at[g] * LANES));
                for t in 0..T {
                    let dx = _mm256_set1_ps(*toks[t].d.get_unchecked(8 * sb));
                    let v = _mm256_mul_ps(_mm256_cvtepi32_ps(isum[g][t]), dw);
                    acc[g][t] = _mm256_fmadd_ps(v, dx, acc[g][t]);
                }
                for j in 0..if K == K6 { 0 } else { 8 } {
                    let m = _mm256_loadu_ps(p.mn.as_ptr().add((at[g] * 8 + j) * LANES));
                    for t in 0..T {
                        let s = _mm256_set1_ps(*toks[t].s.get_unchecked(8 * sb + j));
                        acc[g][t] = _mm256_fnmadd_ps(m, s, acc[g][t]);
                    }
                }
            }
        }
    }
    acc
}

/// A work item's rows packed for kind `K`, as [`drive`] runs them.
struct Tile<'a, const K: u8>(Packed, PhantomData<Tok<'a>>);

impl<'a, const K: u8> LaneTile for Tile<'a, K> {
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
        unsafe { block::<G, T, K>(&self.0, g0, toks, units, acc) }
    }
}

/// [`tile_k8_lanes`] for kind `K`: its rows packed, then [`drive`]n.
///
/// # Safety
/// AVX2/FMA/F16C present; `w`'s format is the one `K` names; the lengths checked by
/// [`tile_k8_lanes`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_q<const K: u8>(w: &QMatrix, r0: usize, nr: usize, toks: &[Tok], out: &mut [f32]) {
    // SAFETY: AVX2/FMA/F16C present and the format `K`'s per this function's contract; each chunk
    // packed holds its rows' groups; the tokens cover the columns.
    unsafe {
        drive((w, r0), nr, toks, out, |first, count| {
            Tile::<K>(pack::<K>(w, r0 + first, count), PhantomData)
        })
    }
}

/// `out[t * nr + i]` = row `r0 + i` of `w` (Q4_K or Q5_K) · token `t` (activations `acts[t]`,
/// quantized by `QActs::quantize_super`): the integer products of `matvec_int8` for that token,
/// summed in another f32 order.
///
/// # Safety
/// AVX2/FMA/F16C present; `w` is Q4_K or Q5_K.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn tile_k8_lanes(
    w: &QMatrix,
    r0: usize,
    nr: usize,
    acts: &[QActs],
    out: &mut [f32],
) {
    let (n, cols, format) = (acts.len(), w.cols(), w.format());
    let k = match format {
        WeightFormat::Q4_K => K4,
        WeightFormat::Q5_K => K5,
        WeightFormat::Q6_K => K6,
        _ => panic!("tile_k8_lanes: {format:?}"),
    };
    assert!(out.len() >= n * nr && r0 + nr <= w.rows() && cols % 256 == 0);
    assert!(acts.iter().all(|a| a.per_super
        && a.qs.len() >= cols
        && a.d.len() >= cols / 32
        && a.s.len() >= cols / 32
        && (k != K6 || a.sum16.len() >= cols / 16)));
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
        })
        .collect();
    // SAFETY: AVX2/FMA/F16C present per this function's contract; the format checked; the
    // lengths asserted above.
    unsafe {
        match k {
            K4 => tile_q::<K4>(w, r0, nr, &toks, out),
            K5 => tile_q::<K5>(w, r0, nr, &toks, out),
            _ => tile_q::<K6>(w, r0, nr, &toks, out),
        }
    }
}
