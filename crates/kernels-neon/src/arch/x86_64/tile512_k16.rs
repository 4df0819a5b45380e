//! The 16-bit prompt tile on AVX-512 VNNI ([`Precision::Fast`](crate::Precision) prompts on
//! [`KernelPath::Avx512`](crate::KernelPath)) for the formats of 32-element blocks of integer
//! quants whose `Fast` prompts keep 16 bits ([`has_tile512_k16`]: Q4_0, Q4_1, Q5_1, IQ4_NL, and
//! IQ4_XS's sub-blocks of 32 as IQ4_NL blocks; the others' prompts take the 8-bit tiles,
//! `tile512_i8.rs`, `tile512_k8.rs` and `tile512_k23.rs`).
//!
//! A work item's rows are repacked once into groups of [`LANES`] rows (`tile512_lanes.rs`), each
//! quant widened to i16, so that each 32-bit lane holds one row's two quants of the same two
//! columns. One `vpdpwssd` against two 16-bit activations broadcast to every lane adds 32
//! products of 16 rows; each lane's i32 sum over a block is one row's, converted and weighted by the
//! row's scale and the token's in f32, and a block's min term (Q4_1, Q5_1) is added as `m * s`
//! with the token's `s = d * sum(q)`.
//!
//! The activations are `matvec`'s in this precision (`QActs16`: one scale per 32-block), so the
//! integer products are those of `matvec_i16`; only the f32 summation order differs.

use std::arch::x86_64::*;
use std::ops::Range;

use super::tile512_lanes::{drive, step, Lanes, LANES};
use crate::quant::QActs16;
use crate::scalar::{f16_at, iq4xs_scales, q5_quants};
use crate::{QMatrix, WeightFormat};
use tensor_types::IQ4NL_VALUES;

/// i16 quants of one group's 32-element block: 16 column pairs × 16 lanes × 2.
const BLOCK_I16: usize = 32 * LANES;
/// Blocks of a column panel: two groups' quants of a panel (32 KiB) stay in L1 while every token
/// passes over them.
const PANEL_BLOCKS: usize = 16;

/// Whether [`tile512_k16`] takes weights of `format`: the 32-block formats not in
/// [`crate::fast_prompts_int8`], and IQ4_NL and IQ4_XS (their values from the table, IQ4_XS's
/// sub-blocks of 32 as blocks with the scale `d * (ls - 32)`), which took AVX2's `tile_k16` on
/// this path before (pp512 of the 16-layer SYNTHETIC files 513-526 and 502-521 tok/s, this tile
/// 778-816 and 782-792; 2 threads, 2026-12-06).
pub(crate) fn has_tile512_k16(format: WeightFormat) -> bool {
    use WeightFormat::*;
    matches!(format, Q4_0 | Q4_1 | Q5_1 | IQ4_NL | IQ4_XS)
}

/// One row's quants, scales and mins, in element order.
struct Unpacked {
    /// Signed quants, one per column.
    q: Vec<i16>,
    /// Scale per 32-block.
    sc: Vec<f32>,
    /// Min per 32-block (Q4_1, Q5_1): the row's dot adds `mn * sum(x)`.
    mn: Vec<f32>,
}

impl Unpacked {
    fn new(cols: usize) -> Self {
        Unpacked {
            q: vec![0; cols],
            sc: vec![0.0; cols / 32],
            mn: vec![0.0; cols / 32],
        }
    }

    /// Unpacks `row` of `format` (one of [`has_tile512_k16`]'s).
    fn fill(&mut self, format: WeightFormat, row: &[u8]) {
        use WeightFormat::*;
        if format == IQ4_XS {
            // Super-blocks of 256: `d`, the scales' high and low bits, then 8 sub-blocks of 16
            // bytes of nibbles as IQ4_NL's.
            for (sb, blk) in row.chunks_exact(136).enumerate() {
                let sc = iq4xs_scales(blk);
                for j in 0..8 {
                    let b = 8 * sb + j;
                    self.sc[b] = sc[j];
                    iq4nl_quants(
                        &blk[8 + 16 * j..24 + 16 * j],
                        &mut self.q[32 * b..32 * b + 32],
                    );
                }
            }
            return;
        }
        let bb = format.block_bytes();
        for (b, blk) in row.chunks_exact(bb).enumerate() {
            let q = &mut self.q[32 * b..32 * b + 32];
            self.sc[b] = f16_at(blk, 0);
            match format {
                Q4_0 | Q4_1 => {
                    let (qoff, off) = if format == Q4_0 { (2, 8) } else { (4, 0) };
                    for j in 0..16 {
                        let v = blk[qoff + j];
                        q[j] = i16::from(v & 0xF) - off;
                        q[j + 16] = i16::from(v >> 4) - off;
                    }
                }
                IQ4_NL => iq4nl_quants(&blk[2..18], q),
                _ => {
                    // Q5_1.
                    for (d, v) in q.iter_mut().zip(q5_quants(blk, 4)) {
                        *d = i16::from(v);
                    }
                }
            }
            if matches!(format, Q4_1 | Q5_1) {
                self.mn[b] = f16_at(blk, 2);
            }
        }
    }
}

/// The 32 values of an IQ4_NL block's 16 bytes of nibbles `qs` (low nibbles the first 16, high the
/// last) into `q`.
fn iq4nl_quants(qs: &[u8], q: &mut [i16]) {
    for (j, &v) in qs.iter().enumerate().take(16) {
        q[j] = i16::from(IQ4NL_VALUES[usize::from(v & 0xF)]);
        q[j + 16] = i16::from(IQ4NL_VALUES[usize::from(v >> 4)]);
    }
}

/// A work item's rows repacked for the tile.
struct Packed {
    /// Per group and block ([`BLOCK_I16`]): pair `k` (columns `2k, 2k + 1` of the block) at
    /// `32k ..`, lane `j` (row `16g + j`) at `32k + 2j`; rows past the item's end are zero.
    q: Vec<i16>,
    /// Per group and block, each lane's scale.
    sc: Vec<f32>,
    /// Per group and block, each lane's min factor (empty for formats without one).
    mn: Vec<f32>,
    /// Blocks of 32 in a row.
    nb: usize,
}

impl Packed {
    /// Rows `r0 .. r0 + nr` of `w` (a [`has_tile512_k16`] format).
    fn new(w: &QMatrix, r0: usize, nr: usize) -> Self {
        let (format, cols) = (w.format(), w.cols());
        let nb = cols / 32;
        let groups = nr.div_ceil(LANES);
        let min = has_min(format);
        let mut p = Packed {
            q: vec![0; groups * nb * BLOCK_I16],
            sc: vec![0.0; groups * nb * LANES],
            mn: vec![0.0; if min { groups * nb * LANES } else { 0 }],
            nb,
        };
        let mut u = Unpacked::new(cols);
        for i in 0..nr {
            let (g, lane) = (i / LANES, i % LANES);
            u.fill(format, w.row_data(r0 + i));
            for b in 0..nb {
                let at = g * nb + b;
                let dst = &mut p.q[at * BLOCK_I16..(at + 1) * BLOCK_I16];
                for (k, pair) in u.q[32 * b..32 * b + 32].chunks_exact(2).enumerate() {
                    dst[32 * k + 2 * lane..32 * k + 2 * lane + 2].copy_from_slice(pair);
                }
                p.sc[at * LANES + lane] = u.sc[b];
                if min {
                    p.mn[at * LANES + lane] = u.mn[b];
                }
            }
        }
        p
    }
}

/// Whether `format`'s rows add a min term.
fn has_min(format: WeightFormat) -> bool {
    use WeightFormat::*;
    matches!(format, Q4_1 | Q5_1)
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
/// AVX-512F/BW/VNNI and AVX2/FMA present; `g0 + G` groups in `p`; `blocks` within the row; each
/// token's slices cover the row's columns (`p.nb * 32` quants, `p.nb` scales and sums).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn block<const G: usize, const T: usize, const MIN: bool>(
    p: &Packed,
    g0: usize,
    toks: [Tok; T],
    blocks: Range<usize>,
    mut acc: [[__m512; T]; G],
) -> [[__m512; T]; G] {
    let nb = p.nb;
    for b in blocks {
        let mut at = [0usize; G];
        for (g, a) in at.iter_mut().enumerate() {
            *a = (g0 + g) * nb + b;
        }
        let mut dx = [_mm512_setzero_ps(); T];
        for t in 0..T {
            // SAFETY: block `b < nb` per the contract.
            dx[t] = _mm512_set1_ps(unsafe { *toks[t].d.get_unchecked(b) });
        }
        let mut isum = [[_mm512_setzero_si512(); T]; G];
        for pair in 0..16 {
            let mut w = [std::ptr::null(); G];
            for g in 0..G {
                // In bounds: group `g0 + g`'s block `b` lies in `p.q` (`at[g] < groups * nb`),
                // pair `pair < 16`: 32 i16 at `at * BLOCK_I16 + 32 * pair`.
                w[g] =
                    p.q.as_ptr()
                        .wrapping_add(at[g] * BLOCK_I16 + 32 * pair)
                        .cast::<u8>();
            }
            let mut x = [std::ptr::null(); T];
            for t in 0..T {
                // In bounds: elements `b * 32 + 2 * pair + 1 < nb * 32` per the contract.
                x[t] = toks[t]
                    .x
                    .as_ptr()
                    .wrapping_add(32 * b + 2 * pair)
                    .cast::<u8>();
            }
            // SAFETY: 64 bytes at each `w[g]` and 4 at each `x[t]` (above).
            unsafe { step(&mut isum, w, x, |a, w, x| _mm512_dpwssd_epi32(a, w, x)) };
        }
        for g in 0..G {
            // SAFETY: `sc` holds `groups * nb * LANES` floats; `at[g] < groups * nb`.
            let sc = unsafe { _mm512_loadu_ps(p.sc.as_ptr().add(at[g] * LANES)) };
            for t in 0..T {
                let v = _mm512_mul_ps(_mm512_cvtepi32_ps(isum[g][t]), sc);
                acc[g][t] = _mm512_fmadd_ps(v, dx[t], acc[g][t]);
            }
        }
        if MIN {
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
    }
    acc
}

/// The tile of one work item: its repacked rows and the prompt's tokens.
struct K16<'a> {
    p: Packed,
    min: bool,
    toks: Vec<Tok<'a>>,
}

impl Lanes for K16<'_> {
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
        // the row), and every token covers the row's columns (asserted in `tile512_k16`).
        unsafe {
            if self.min {
                block::<G, T, true>(p, g0, tk, units, acc)
            } else {
                block::<G, T, false>(p, g0, tk, units, acc)
            }
        }
    }
}

/// `out[t * nr + i]` = row `r0 + i` of `w` · token `t` (activations `acts[t]`, quantized as
/// `matvec` quantizes them in [`Precision::Fast`](crate::Precision)).
///
/// # Safety
/// AVX-512F/BW/VNNI and AVX2/FMA/F16C present; `w`'s format is one of [`has_tile512_k16`]'s.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn tile512_k16(
    w: &QMatrix,
    r0: usize,
    nr: usize,
    acts: &[QActs16],
    out: &mut [f32],
) {
    let (n, cols, format) = (acts.len(), w.cols(), w.format());
    assert!(has_tile512_k16(format) && out.len() >= n * nr && r0 + nr <= w.rows());
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
    let toks = acts
        .iter()
        .map(|a| Tok {
            x: &a.qs,
            d: &a.d,
            s: &a.s,
        })
        .collect();
    let k = K16 {
        p: Packed::new(w, r0, nr),
        min: has_min(format),
        toks,
    };
    // SAFETY: features present per this function's contract; `k.p` holds `nr` rows.
    unsafe { drive(&k, nr, n, out) };
}
