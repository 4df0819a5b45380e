//! The 8-bit prompt tile of Q2_K/Q3_K weights on AVX-512 VNNI: `tile_k23.rs`'s products with
//! [`LANES`] rows to a group (`tile512_lanes.rs`, as `tile512_k8.rs` for Q4_K..Q6_K). Before it
//! these prompts took the f32 tile on this path (pp512 of the 16-layer SYNTHETIC Q2_K file about
//! 0.65x llama.cpp's native build, 2 threads); AVX2's 8-row tile, tried on the way, about 0.85x;
//! this one 1.2x (docs/benchmarks/dense-vs-llama.md, 2026-12-06).
//!
//! Each 32-bit lane holds one row's four unsigned quants of the same four columns (Q2_K 0..=3,
//! Q3_K `low | h << 2` in 0..=7, its offset of 4 left out), so one `vpdpbusd` against a token's
//! four 8-bit activations broadcast to every lane adds 64 products of 16 rows into per-row i32
//! sums. A sub-block's (16 columns, four quads) sum is converted and multiplied by each lane's
//! `d * sc_j`, a 32-block's two by the token's scale of that block, and per sub-block each lane's
//! coefficient of the activations' sum (Q2_K `dmin * m_j`, Q3_K `4 d sc_j`) times the token's
//! `d_x * sum16` is subtracted. The activations are `matvec_int8`'s for these formats
//! (`QActs::quantize`: one scale per 32, with sums of 16): the integer products of
//! `kquant_low.rs`, summed in another f32 order.

use std::arch::x86_64::*;
use std::ops::Range;

use super::tile512_lanes::{drive, step, Lanes, LANES};
use super::tile_k23::{quants, scales, Tok};
use crate::quant::QActs;
use crate::QMatrix;

/// Bytes of one group's super-block of quants: 64 quads of 16 lanes × 4 bytes.
const SB_BYTES: usize = 64 * LANES * 4;
/// Super-blocks of a column panel: two groups' quants of a panel (32 KiB) stay in L1 while every
/// token passes over them.
const PANEL_SBS: usize = 4;

/// A work item's rows repacked for the tile.
struct Packed {
    /// Per group and super-block ([`SB_BYTES`]): quad `k` (columns `4k .. 4k + 4` of the
    /// super-block) at bytes `64k ..`, lane `j` (row `16g + j`) at `64k + 4j`; rows past the
    /// item's end are zero.
    q: Vec<u8>,
    /// Per group, super-block and sub-block of 16, each lane's `d * sc_j` (16 floats).
    ws: Vec<f32>,
    /// Per group, super-block and sub-block, each lane's coefficient of the activations' sum.
    cf: Vec<f32>,
    /// Super-blocks of a row.
    nsb: usize,
}

impl Packed {
    /// Rows `r0 .. r0 + nr` of `w` (Q3_K where `Q3`, else Q2_K; columns a multiple of 256).
    ///
    /// # Safety
    /// AVX2/FMA/F16C present; `w`'s format is the one `Q3` names.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn new<const Q3: bool>(w: &QMatrix, r0: usize, nr: usize) -> Self {
        let bb = w.format().block_bytes();
        let nsb = w.cols() / 256;
        let groups = nr.div_ceil(LANES);
        let mut p = Packed {
            q: vec![0; groups * nsb * SB_BYTES],
            ws: vec![0.0; groups * nsb * 16 * LANES],
            cf: vec![0.0; groups * nsb * 16 * LANES],
            nsb,
        };
        for i in 0..nr {
            let (g, lane) = (i / LANES, i % LANES);
            let row = w.row_data(r0 + i);
            for (sb, blk) in row.chunks_exact(bb).take(nsb).enumerate() {
                let at = g * nsb + sb;
                let dst = &mut p.q[at * SB_BYTES..(at + 1) * SB_BYTES];
                for b in 0..8 {
                    let mut q = [0u8; 32];
                    // SAFETY: AVX2 present per this function's contract; `blk` is one whole
                    // super-block (asserted by `quants`); `q` holds 32 bytes.
                    unsafe { _mm256_storeu_si256(q.as_mut_ptr().cast(), quants::<Q3>(blk, b)) };
                    for (k, quad) in q.chunks_exact(4).enumerate() {
                        let o = 64 * (8 * b + k) + 4 * lane;
                        dst[o..o + 4].copy_from_slice(quad);
                    }
                }
                let (sc, cf, d) = scales::<Q3>(blk);
                for j in 0..16 {
                    let o = (at * 16 + j) * LANES + lane;
                    p.ws[o] = d * f32::from(sc[j]);
                    p.cf[o] = cf[j];
                }
            }
        }
        p
    }
}

/// Groups `g0 .. g0 + G` against tokens `toks` over super-blocks `sbs`: per group and token, each
/// lane's (row's) dot added to `acc`.
///
/// # Safety
/// AVX-512F/BW/VNNI and AVX2/FMA present; `g0 + G` groups in `p`; `sbs` within the row; each
/// token's slices cover the row's columns (`p.nsb * 256` quants, `p.nsb * 8` scales, `p.nsb * 16`
/// sums).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn block<const G: usize, const T: usize>(
    p: &Packed,
    g0: usize,
    toks: [Tok; T],
    sbs: Range<usize>,
    mut acc: [[__m512; T]; G],
) -> [[__m512; T]; G] {
    let nsb = p.nsb;
    for sb in sbs {
        let mut at = [0usize; G];
        for (g, a) in at.iter_mut().enumerate() {
            *a = (g0 + g) * nsb + sb;
        }
        for b in 0..8 {
            // Per group and token, the 32-block's two sub-blocks weighted by the lanes' scales.
            let mut tb = [[_mm512_setzero_ps(); T]; G];
            for sub in 2 * b..2 * b + 2 {
                let mut isum = [[_mm512_setzero_si512(); T]; G];
                for quad in 4 * sub..4 * sub + 4 {
                    let mut w = [std::ptr::null(); G];
                    for g in 0..G {
                        // In bounds: group `g0 + g`'s super-block `sb` lies in `p.q` (`at[g] <
                        // groups * nsb`), quad < 64: 64 bytes at `at * SB_BYTES + 64 * quad`.
                        w[g] = p.q.as_ptr().wrapping_add(at[g] * SB_BYTES + 64 * quad);
                    }
                    let mut x = [std::ptr::null(); T];
                    for t in 0..T {
                        // In bounds: element `sb * 256 + 4 * quad + 3 < nsb * 256` per the
                        // contract.
                        x[t] = toks[t]
                            .x
                            .as_ptr()
                            .wrapping_add(sb * 256 + 4 * quad)
                            .cast::<u8>();
                    }
                    // SAFETY: 64 bytes at each `w[g]` and 4 at each `x[t]` (above).
                    unsafe { step(&mut isum, w, x, |a, w, x| _mm512_dpbusd_epi32(a, w, x)) };
                }
                for g in 0..G {
                    let i = (at[g] * 16 + sub) * LANES;
                    // SAFETY: `ws` and `cf` hold `groups * nsb * 16 * LANES` floats; `i + LANES`
                    // is within; sum `sb * 16 + sub < nsb * 16` per the contract.
                    unsafe {
                        let ws = _mm512_loadu_ps(p.ws.as_ptr().add(i));
                        let cf = _mm512_loadu_ps(p.cf.as_ptr().add(i));
                        for t in 0..T {
                            tb[g][t] =
                                _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[g][t]), ws, tb[g][t]);
                            let s = _mm512_set1_ps(*toks[t].s16.get_unchecked(sb * 16 + sub));
                            acc[g][t] = _mm512_fnmadd_ps(cf, s, acc[g][t]);
                        }
                    }
                }
            }
            for t in 0..T {
                // SAFETY: scale `sb * 8 + b < nsb * 8` per the contract.
                let dx = _mm512_set1_ps(unsafe { *toks[t].d.get_unchecked(sb * 8 + b) });
                for g in 0..G {
                    acc[g][t] = _mm512_fmadd_ps(tb[g][t], dx, acc[g][t]);
                }
            }
        }
    }
    acc
}

/// The tile of one work item: its repacked rows and the prompt's tokens.
struct K23<'a> {
    p: Packed,
    toks: Vec<Tok<'a>>,
}

impl Lanes for K23<'_> {
    fn units(&self) -> (usize, usize) {
        (self.p.nsb, PANEL_SBS)
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
        // SAFETY: per this method's contract (groups `g0 .. g0 + G` in `p`, super-blocks `units`
        // within the row), and every token covers the row's columns (`tile_k23::checked` in
        // `tile512_k23`).
        unsafe { block::<G, T>(&self.p, g0, tk, units, acc) }
    }
}

/// `out[t * nr + i]` = row `r0 + i` of `w` (Q2_K or Q3_K) · token `t` (activations `acts[t]`,
/// quantized by `QActs::quantize` with sums of 16): the integer products of `matvec_int8` for
/// that token, summed in another f32 order.
///
/// # Safety
/// AVX-512F/BW/VNNI and AVX2/FMA/F16C present.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn tile512_k23(
    w: &QMatrix,
    r0: usize,
    nr: usize,
    acts: &[QActs],
    out: &mut [f32],
) {
    let Some(q3) = super::tile_k23::checked("tile512_k23", w, r0, nr, acts, out) else {
        return;
    };
    let (n, cols) = (acts.len(), w.cols());
    let s16 = super::tile_k23::sums16(acts, cols);
    let toks = super::tile_k23::toks(acts, &s16);
    // SAFETY: AVX2/FMA/F16C present per this function's contract; the format checked.
    let p = unsafe {
        if q3 {
            Packed::new::<true>(w, r0, nr)
        } else {
            Packed::new::<false>(w, r0, nr)
        }
    };
    let k = K23 { p, toks };
    // SAFETY: features present per this function's contract; `k.p` holds `nr` rows, every token
    // covers the columns (`checked`).
    unsafe { drive(&k, nr, n, out) };
}
