//! The 8-bit prompt tile of Q4_K/Q5_K/Q6_K weights on AVX-512 VNNI ([`Precision::Int8`](crate::Precision)
//! prompts on [`KernelPath::Avx512`](crate::KernelPath)).
//!
//! A work item's rows are repacked once, [`LANES`] rows to a group, so that each 32-bit lane of a
//! register holds one row's four quants of the same four columns. One `vpdpbusd` against four
//! activations broadcast to every lane then adds 64 products of 16 rows, and each lane's sum
//! belongs to one row: the sub-block scales apply per lane (one conversion and one multiply-add
//! per sub-block and token), with no horizontal sums. The prompt's tokens reuse the repacked rows,
//! so repacking costs little beside the products. Register blocks of `G` groups × `T` tokens.
//!
//! The activations are `QActs::quantize_super`'s (one scale per 256), as `matvec_int8` takes them
//! for these formats, and the integer products are the decode kernels'; only the f32 summation
//! order differs from `matvec_int8`, as it does in the AVX2 tiles of Q4_K-Q6_K (`tile_k8_lanes.rs`;
//! the AVX2 tile of the other K-quants, `tile_k8.rs`, is bit-identical to it).

use std::arch::x86_64::*;
use std::ops::Range;

use super::tile512_lanes::{drive, step, Lanes, LANES};
use crate::quant::QActs;
use crate::scalar::{q4k_scales, q6k_scales};
use crate::{QMatrix, WeightFormat};

/// Bytes of one group's super-block of quants: 64 quads of 16 lanes × 4 bytes.
const SB_BYTES: usize = 64 * LANES * 4;
/// Super-blocks of a column panel: two groups' quants of a panel (32 KiB) stay in L1 while every
/// token passes over them.
const PANEL_SBS: usize = 4;

/// A work item's rows repacked for the tile.
struct Packed {
    /// Per group and super-block ([`SB_BYTES`]): quad `k` (columns `4k .. 4k + 4` of the
    /// super-block) at bytes `64k ..`, lane `j` (row `16g + j`) at `64k + 4j`; unsigned quants
    /// (Q4_K 0..=15, Q5_K 0..=31, Q6_K 0..=63); rows past the item's end are zero.
    q: Vec<u8>,
    /// Per group, super-block and sub-block, each lane's `d * sc` (16 floats).
    ws: Vec<f32>,
    /// Per group, super-block and sub-block (Q4_K, Q5_K), each lane's `dmin * m`.
    wm: Vec<f32>,
    /// Super-blocks of a row.
    nsb: usize,
    /// Sub-blocks of a super-block (8 of 32 elements, Q6_K's 16 of 16).
    nsub: usize,
}

/// The 256 unsigned quants of the super-block `blk` of `format` (Q6_K's without its offset of
/// 32), in element order, as `scalar.rs`'s `q4k_quant`/`q5k_quant`/`q6k_quant` read them.
fn quants(format: WeightFormat, blk: &[u8], q: &mut [u8; 256]) {
    if format == WeightFormat::Q6_K {
        let (ql, qh) = (&blk[..128], &blk[128..192]);
        for n in 0..2 {
            for l in 0..32 {
                let (a, b, h) = (ql[64 * n + l], ql[64 * n + l + 32], qh[32 * n + l]);
                q[128 * n + l] = (a & 0xF) | ((h & 3) << 4);
                q[128 * n + l + 32] = (b & 0xF) | (((h >> 2) & 3) << 4);
                q[128 * n + l + 64] = (a >> 4) | (((h >> 4) & 3) << 4);
                q[128 * n + l + 96] = (b >> 4) | (((h >> 6) & 3) << 4);
            }
        }
        return;
    }
    let q5 = format == WeightFormat::Q5_K;
    let qs = if q5 { &blk[48..176] } else { &blk[16..144] };
    for g in 0..4 {
        for l in 0..32 {
            let byte = qs[32 * g + l];
            let (mut lo, mut hi) = (byte & 0xF, byte >> 4);
            if q5 {
                let h = blk[16 + l];
                lo |= ((h >> (2 * g)) & 1) << 4;
                hi |= ((h >> (2 * g + 1)) & 1) << 4;
            }
            q[64 * g + l] = lo;
            q[64 * g + 32 + l] = hi;
        }
    }
}

impl Packed {
    /// Rows `r0 .. r0 + nr` of `w` (Q4_K, Q5_K or Q6_K, columns a multiple of 256).
    fn new(w: &QMatrix, r0: usize, nr: usize) -> Self {
        let format = w.format();
        let q6 = format == WeightFormat::Q6_K;
        let nsb = w.cols() / 256;
        let nsub = if q6 { 16 } else { 8 };
        let groups = nr.div_ceil(LANES);
        let bb = format.block_bytes();
        let mut p = Packed {
            q: vec![0; groups * nsb * SB_BYTES],
            ws: vec![0.0; groups * nsb * nsub * LANES],
            wm: vec![0.0; if q6 { 0 } else { groups * nsb * 8 * LANES }],
            nsb,
            nsub,
        };
        let mut q = [0u8; 256];
        for i in 0..nr {
            let (g, lane) = (i / LANES, i % LANES);
            let row = w.row_data(r0 + i);
            for sb in 0..nsb {
                let blk = &row[sb * bb..(sb + 1) * bb];
                quants(format, blk, &mut q);
                let at = g * nsb + sb;
                let dst = &mut p.q[at * SB_BYTES..(at + 1) * SB_BYTES];
                for (k, quad) in q.chunks_exact(4).enumerate() {
                    dst[64 * k + 4 * lane..64 * k + 4 * lane + 4].copy_from_slice(quad);
                }
                let ws = &mut p.ws[at * nsub * LANES..(at + 1) * nsub * LANES];
                if q6 {
                    for (j, s) in q6k_scales(blk).into_iter().enumerate() {
                        ws[j * LANES + lane] = s;
                    }
                } else {
                    let (dl, ml) = q4k_scales(blk);
                    let wm = &mut p.wm[at * 8 * LANES..(at + 1) * 8 * LANES];
                    for j in 0..8 {
                        ws[j * LANES + lane] = dl[j];
                        wm[j * LANES + lane] = ml[j];
                    }
                }
            }
        }
        p
    }
}

/// One token's activations as the kernel reads them.
#[derive(Clone, Copy)]
struct Tok<'a> {
    /// Quants in element order.
    x: &'a [i8],
    /// Scale per 32-block (one per super-block, repeated).
    d: &'a [f32],
    /// `d * sum(q)` per 32-block (Q4_K/Q5_K's min term).
    s: &'a [f32],
    /// `sum(q)` per 16 elements (Q6_K's offset is `-32` times it; empty for the others).
    sum16: &'a [i32],
}

/// Groups `g0 .. g0 + G` against tokens `toks` over super-blocks `sbs`: per group and token, each
/// lane's (row's) dot added to `acc`.
///
/// # Safety
/// AVX-512F/BW/VNNI and AVX2/FMA present; `g0 + G` groups in `p`; `sbs` within the row; each
/// token's slices cover the row's columns (`p.nsb * 256` quants, `p.nsb * 8` scales and sums,
/// `p.nsb * 16` sums per 16 for Q6_K).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn block<const G: usize, const T: usize, const Q6: bool>(
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
        let mut tsb = [[_mm512_setzero_ps(); T]; G];
        // Sub-blocks of `quads` quads: Q6_K's 16 of 16 elements, the others' 8 of 32.
        let quads = if Q6 { 4 } else { 8 };
        for sub in 0..p.nsub {
            let mut isum = [[_mm512_setzero_si512(); T]; G];
            if Q6 {
                for t in 0..T {
                    // SAFETY: `sb * 16 + sub < nsb * 16` sums per the contract.
                    let o = _mm512_set1_epi32(
                        -32 * unsafe { *toks[t].sum16.get_unchecked(sb * 16 + sub) },
                    );
                    for row in isum.iter_mut() {
                        row[t] = o;
                    }
                }
            }
            for k in 0..quads {
                let quad = quads * sub + k;
                let mut w = [std::ptr::null(); G];
                for g in 0..G {
                    // In bounds: group `g0 + g`'s super-block `sb` lies in `p.q` (`at[g] <
                    // groups * nsb`), quad `quad < 64`: 64 bytes at `at * SB_BYTES + 64 * quad`.
                    w[g] = p.q.as_ptr().wrapping_add(at[g] * SB_BYTES + 64 * quad);
                }
                let mut x = [std::ptr::null(); T];
                for t in 0..T {
                    // In bounds: element `sb * 256 + 4 * quad + 3 < nsb * 256` per the contract.
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
                let i = (at[g] * p.nsub + sub) * LANES;
                // SAFETY: `ws` holds `groups * nsb * nsub * LANES` floats; `i + LANES` is within.
                let sc = unsafe { _mm512_loadu_ps(p.ws.as_ptr().add(i)) };
                for t in 0..T {
                    tsb[g][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[g][t]), sc, tsb[g][t]);
                }
                if !Q6 {
                    // SAFETY: `wm` has the layout of `ws` for these formats (8 sub-blocks).
                    let m = unsafe { _mm512_loadu_ps(p.wm.as_ptr().add(i)) };
                    for t in 0..T {
                        // SAFETY: block `sb * 8 + sub < nsb * 8` per the contract.
                        let s = unsafe { *toks[t].s.get_unchecked(sb * 8 + sub) };
                        acc[g][t] = _mm512_fnmadd_ps(m, _mm512_set1_ps(s), acc[g][t]);
                    }
                }
            }
        }
        for t in 0..T {
            // SAFETY: scale `sb * 8 < nsb * 8` per the contract.
            let d = _mm512_set1_ps(unsafe { *toks[t].d.get_unchecked(sb * 8) });
            for g in 0..G {
                acc[g][t] = _mm512_fmadd_ps(tsb[g][t], d, acc[g][t]);
            }
        }
    }
    acc
}

/// The tile of one work item: its repacked rows and the prompt's tokens.
struct K8<'a> {
    p: Packed,
    q6: bool,
    toks: Vec<Tok<'a>>,
}

impl Lanes for K8<'_> {
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
        // within the row), and every token covers the row's columns (asserted in `tile512_k8`).
        unsafe {
            if self.q6 {
                block::<G, T, true>(&self.p, g0, tk, units, acc)
            } else {
                block::<G, T, false>(&self.p, g0, tk, units, acc)
            }
        }
    }
}

/// `out[t * nr + i]` = row `r0 + i` of `w` · token `t` (activations `acts[t]`, quantized by
/// `QActs::quantize_super`).
///
/// # Safety
/// AVX-512F/BW/VNNI and AVX2/FMA/F16C present; `w` is Q4_K, Q5_K or Q6_K.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn tile512_k8(
    w: &QMatrix,
    r0: usize,
    nr: usize,
    acts: &[QActs],
    out: &mut [f32],
) {
    let (n, cols) = (acts.len(), w.cols());
    let q6 = w.format() == WeightFormat::Q6_K;
    assert!(out.len() >= n * nr && r0 + nr <= w.rows() && cols % 256 == 0);
    assert!(acts.iter().all(|a| a.per_super
        && a.qs.len() >= cols
        && a.d.len() >= cols / 32
        && a.s.len() >= cols / 32));
    if n == 0 || nr == 0 {
        return;
    }
    let p = Packed::new(w, r0, nr);
    let toks: Vec<Tok> = acts
        .iter()
        .map(|a| Tok {
            x: &a.qs,
            d: &a.d,
            s: &a.s,
            sum16: &a.sum16,
        })
        .collect();
    let k = K8 { p, q6, toks };
    // SAFETY: features present per this function's contract; `k.p` holds `nr` rows.
    unsafe { drive(&k, nr, n, out) };
}
