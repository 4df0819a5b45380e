//! `Q4_K`, `Q5_K` and `Q6_K` rows × 16-bit activations ([`Precision::Fast`](crate::Precision::Fast))
//! with `sdot`/`udot` on `dotprod` CPUs: the integer products of `kquant::matvec_k_int`'s widening
//! path, from the split activations of [`Split16`] (`x = 256 * hi + lo`); the same super-block
//! kernels take 8-bit activations ([`Precision::Int8`](crate::Precision::Int8)) with one `sdot`
//! per 16 products ([`SbDot`]: `kquant_acts.rs`).
//!
//! The weight quants are taken unsigned (`Q4_K` 0..=15, `Q5_K` 0..=31, `Q6_K` 0..=63), so each
//! 16-product sum is `256 * sdot(q, hi) + udot(q, lo)` with no correction (the `hi` sum shifted
//! left by 8 starts the `lo` one); `Q6_K`'s `- 32` is taken back once per super-block by vector,
//! `32 * sum(d * sc * d_x * sum16)` ([`offset_term`], [`Split16::sum16`]). Each super-block and
//! its activations are sliced once (fixed-size arrays: no bounds check per vector) and its loops
//! have fixed trip counts, so they unroll: about 23 instructions per 32 weights of `Q4_K` (the
//! widening path about 80). `Q2_K`, `Q3_K` and `IQ4_XS` super-blocks the same way:
//! `kquant_low_split.rs`.

use std::arch::aarch64::*;

use super::kquant_acts::{I8Slices, SbDot, SplitSlices};
use super::kquant_low_split as low;
use super::matvec_split::Split16;
use super::simd::{dx16, f16_at, fma_sums4, ld, load_f32x4, offset_term, s8_to_f32};
use crate::arch::drivers::{rows_blocked, RowDots};
use crate::arch::Rows;
use crate::quant::{QActs, QActs16};
use crate::{QMatrix, WeightFormat};

/// Sub-block `J` (elements `32 J .. + 32`) of a `Q4_K` (`Q5 = false`, 144 bytes) or `Q5_K` (176
/// bytes) super-block `blk` with its activations `a`: its integer dot (four lanes; its scale is
/// lane `J % 4` of [`q45k_block`]'s `scale[J / 4]`). `J` is a constant, so that the nibble half
/// and the fifth bit are fixed at compile time.
///
/// # Safety
/// The CPU must support the `dotprod` extension.
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn q45k_sub<const Q5: bool, const N: usize, const J: usize, A: SbDot>(
    blk: &[u8; N],
    a: &A,
) -> int32x4_t {
    let qoff = if Q5 { 48 } else { 16 };
    let raw = [
        ld(blk, qoff + 32 * (J / 2)),
        ld(blk, qoff + 32 * (J / 2) + 16),
    ];
    let mut q = if J % 2 == 0 {
        raw.map(|r| vandq_u8(r, vdupq_n_u8(0x0F)))
    } else {
        raw.map(|r| vshrq_n_u8::<4>(r))
    };
    if Q5 {
        for (p, qp) in q.iter_mut().enumerate() {
            // 0x10 where bit J of qh is set.
            let set = vtstq_u8(ld(blk, 16 + 16 * p), vdupq_n_u8(1 << J));
            *qp = vorrq_u8(*qp, vandq_u8(set, vdupq_n_u8(0x10)));
        }
    }
    // SAFETY: dotprod present per this function's contract.
    unsafe { a.dot32(q[0], q[1], 32 * J) }
}

/// The 8 scales and 8 mins (6 bits each) of a `Q4_K`/`Q5_K` super-block (bytes 4..16), as
/// `scale_min_k4` unpacks them, in two u8x8 (ggml's `utmp` arrangement, in four 32-bit words).
#[inline]
#[target_feature(enable = "neon")]
fn q4k_scale_bytes(sc: &[u8]) -> (uint8x8_t, uint8x8_t) {
    let sc: &[u8; 12] = sc[..12].try_into().expect("12 bytes");
    let u0 = u32::from_le_bytes([sc[0], sc[1], sc[2], sc[3]]);
    let u1 = u32::from_le_bytes([sc[4], sc[5], sc[6], sc[7]]);
    let u2 = u32::from_le_bytes([sc[8], sc[9], sc[10], sc[11]]);
    let (k1, k2, k3) = (0x3f3f_3f3f_u32, 0x0f0f_0f0f_u32, 0x0303_0303_u32);
    let scales = u64::from(u0 & k1) | (u64::from((u2 & k2) | (((u0 >> 6) & k3) << 4)) << 32);
    let mins = u64::from(u1 & k1) | (u64::from(((u2 >> 4) & k2) | (((u1 >> 6) & k3) << 4)) << 32);
    (vcreate_u8(scales), vcreate_u8(mins))
}

/// u8x8 as two f32x4 (lanes 0..4, 4..8).
#[inline]
#[target_feature(enable = "neon")]
fn u8x8_f32(v: uint8x8_t) -> [float32x4_t; 2] {
    let w = vmovl_u8(v);
    [
        vcvtq_f32_u32(vmovl_u16(vget_low_u16(w))),
        vcvtq_f32_u32(vmovl_high_u16(w)),
    ]
}

/// A `Q4_K`/`Q5_K` super-block: its scales `d * sc * d_x` and mins `dmin * m * s_x` as vectors,
/// then its 8 sub-blocks ([`q45k_sub`]); returns the min term (to subtract).
///
/// # Safety
/// The CPU must support the `dotprod` extension.
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn q45k_block<const Q5: bool, const N: usize, A: SbDot>(
    blk: &[u8; N],
    a: &A,
    acc: &mut float32x4_t,
) -> f32 {
    let (d, dmin) = (f16_at(blk, 0), f16_at(blk, 2));
    let (scb, mb) = q4k_scale_bytes(&blk[4..16]);
    let (dx, sx) = (a.d(), a.s());
    let (sc, m) = (u8x8_f32(scb), u8x8_f32(mb));
    let scale: [float32x4_t; 2] =
        std::array::from_fn(|i| vmulq_f32(vmulq_n_f32(sc[i], d), load_f32x4(&dx[4 * i..])));
    let min = vfmaq_f32(
        vmulq_f32(vmulq_n_f32(m[0], dmin), load_f32x4(&sx[0..])),
        vmulq_n_f32(m[1], dmin),
        load_f32x4(&sx[4..]),
    );
    // Four sub-blocks at a time: their exact sums in one vector, one conversion and one FMA.
    // SAFETY: dotprod present per this function's contract.
    unsafe {
        let s = [
            q45k_sub::<Q5, N, 0, A>(blk, a),
            q45k_sub::<Q5, N, 1, A>(blk, a),
            q45k_sub::<Q5, N, 2, A>(blk, a),
            q45k_sub::<Q5, N, 3, A>(blk, a),
        ];
        *acc = fma_sums4(*acc, s, scale[0]);
        let s = [
            q45k_sub::<Q5, N, 4, A>(blk, a),
            q45k_sub::<Q5, N, 5, A>(blk, a),
            q45k_sub::<Q5, N, 6, A>(blk, a),
            q45k_sub::<Q5, N, 7, A>(blk, a),
        ];
        *acc = fma_sums4(*acc, s, scale[1]);
    }
    vaddvq_f32(min)
}

/// The integer dot (four lanes) of group `G = 8 n + 2 k + p` (elements `128 n + 32 k + 16 p ..
/// + 16`, its own scale: lane `G % 4` of [`q6k_block`]'s `scale[G / 4]`) of a `Q6_K` super-block
/// (210 bytes) with its activations `a`; `G` is a constant (fixed shifts).
///
/// # Safety
/// The CPU must support the `dotprod` extension.
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn q6k_group<const G: usize, A: SbDot>(blk: &[u8; 210], a: &A) -> int32x4_t {
    let (n, k, p) = (G / 8, (G / 2) % 4, G % 2);
    let src = ld(blk, 64 * n + 32 * (k & 1) + 16 * p);
    let qh = ld(blk, 128 + 32 * n + 16 * p);
    let lo = if k < 2 {
        vandq_u8(src, vdupq_n_u8(0x0F))
    } else {
        vshrq_n_u8::<4>(src)
    };
    // Bits 2k..2k + 2 of qh as bits 4..6.
    let hb = match k {
        0 => vshlq_n_u8::<4>(qh),
        1 => vshlq_n_u8::<2>(qh),
        2 => qh,
        _ => vshrq_n_u8::<2>(qh),
    };
    let q = vorrq_u8(lo, vandq_u8(hb, vdupq_n_u8(0x30)));
    // SAFETY: dotprod present per this function's contract.
    unsafe { a.dot16(q, 16 * G) }
}

/// A `Q6_K` super-block: its 16 scales `d * sc * d_x` as vectors (each activation scale serves
/// two groups), then its 16 groups ([`q6k_group`]); returns the offset term `32 * sum(scale *
/// sum16)` (to subtract, [`offset_term`]).
///
/// # Safety
/// The CPU must support the `dotprod` extension.
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn q6k_block<A: SbDot>(blk: &[u8; 210], a: &A, acc: &mut float32x4_t) -> f32 {
    let d = f16_at(blk, 208);
    let sc = vreinterpretq_s8_u8(ld(blk, 192));
    let scf = s8_to_f32(sc).map(|v| vmulq_n_f32(v, d));
    let dxs = dx16(a.d());
    let scale: [float32x4_t; 4] = std::array::from_fn(|i| vmulq_f32(scf[i], dxs[i]));
    // Four groups at a time: their exact sums in one vector, one conversion and one FMA.
    macro_rules! groups {
        ($($i:literal: $g0:literal $g1:literal $g2:literal $g3:literal);*) => {
            // SAFETY: dotprod present per this function's contract.
            unsafe {$(
                let s = [
                    q6k_group::<$g0, A>(blk, a),
                    q6k_group::<$g1, A>(blk, a),
                    q6k_group::<$g2, A>(blk, a),
                    q6k_group::<$g3, A>(blk, a),
                ];
                *acc = fma_sums4(*acc, s, scale[$i]);
            )*}
        };
    }
    groups!(0: 0 1 2 3; 1: 4 5 6 7; 2: 8 9 10 11; 3: 12 13 14 15);
    32.0 * offset_term(&scale, a.sum16())
}

/// [`dot_row`]'s format tag of `IQ4_XS` (the others: the K-quant's digit).
const IQ4XS: u8 = 7;

/// The dot of one K-quant or `IQ4_XS` row (`F`: 2..=6 or [`IQ4XS`]) with `nsb` super-blocks of
/// activations (`acts(sb)`: super-block `sb`'s).
///
/// # Safety
/// The CPU must support the `dotprod` extension.
#[target_feature(enable = "neon,dotprod")]
unsafe fn dot_row<const F: u8, A: SbDot>(row: &[u8], nsb: usize, acts: impl Fn(usize) -> A) -> f32 {
    let mut acc = vdupq_n_f32(0.0);
    let mut min = 0f32;
    match F {
        4 => {
            for (sb, blk) in row.chunks_exact(144).take(nsb).enumerate() {
                let blk: &[u8; 144] = blk.try_into().expect("144 bytes");
                // SAFETY: dotprod present per this function's contract.
                min += unsafe { q45k_block::<false, 144, A>(blk, &acts(sb), &mut acc) };
            }
        }
        5 => {
            for (sb, blk) in row.chunks_exact(176).take(nsb).enumerate() {
                let blk: &[u8; 176] = blk.try_into().expect("176 bytes");
                // SAFETY: as above.
                min += unsafe { q45k_block::<true, 176, A>(blk, &acts(sb), &mut acc) };
            }
        }
        2 | 3 => {
            // SAFETY: as above.
            return unsafe { dot_rows_k23::<F, 1, A>([row], nsb, &acts) }[0];
        }
        IQ4XS => {
            for (sb, blk) in row.chunks_exact(136).take(nsb).enumerate() {
                let blk: &[u8; 136] = blk.try_into().expect("136 bytes");
                // SAFETY: as above.
                unsafe { low::iq4xs_block(blk, &acts(sb), &mut acc) };
            }
        }
        _ => {
            for (sb, blk) in row.chunks_exact(210).take(nsb).enumerate() {
                let blk: &[u8; 210] = blk.try_into().expect("210 bytes");
                // SAFETY: as above.
                min += unsafe { q6k_block(blk, &acts(sb), &mut acc) };
            }
        }
    }
    vaddvq_f32(acc) - min
}

/// The dots of `R` `Q2_K` (`F` = 2) or `Q3_K` (3) rows with `nsb` super-blocks of activations
/// (`acts(sb)`), each super-block's activations taken once for the `R` rows
/// ([`low::q2k_block`], [`low::q3k_block`]); each row's result that of the row alone.
///
/// # Safety
/// The CPU must support the `dotprod` extension.
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn dot_rows_k23<const F: u8, const R: usize, A: SbDot>(
    rows: [&[u8]; R],
    nsb: usize,
    acts: &impl Fn(usize) -> A,
) -> [f32; R] {
    let bb = if F == 3 { 110 } else { 84 };
    let nsb = rows.iter().map(|r| r.len() / bb).fold(nsb, usize::min);
    let mut acc = [vdupq_n_f32(0.0); R];
    let mut min = [0f32; R];
    for sb in 0..nsb {
        let a = acts(sb);
        // SAFETY: dotprod present per this function's contract.
        let m = unsafe {
            if F == 3 {
                let blks = rows.map(|r| r[110 * sb..110 * sb + 110].try_into().expect("110 bytes"));
                low::q3k_block(blks, &a, &mut acc)
            } else {
                let blks = rows.map(|r| r[84 * sb..84 * sb + 84].try_into().expect("84 bytes"));
                low::q2k_block(blks, &a, &mut acc)
            }
        };
        for (t, m) in min.iter_mut().zip(m) {
            *t += m;
        }
    }
    std::array::from_fn(|r| vaddvq_f32(acc[r]) - min[r])
}

/// [`dot_rows_k23`] as the kernel of the shared row drivers: `acts` and the super-block count.
struct K23Dots<'c, const F: u8, C>(&'c C, usize);

impl<const F: u8, A: SbDot, C: Fn(usize) -> A> RowDots for K23Dots<'_, F, C> {
    #[inline(always)]
    unsafe fn dots<const N: usize>(&self, rows: [&[u8]; N]) -> [f32; N] {
        // SAFETY: dotprod is present per this method's contract (`rows`'s).
        unsafe { dot_rows_k23::<F, N, A>(rows, self.1, self.0) }
    }
}

/// Whether [`matvec_k_split`] takes weights of `format`.
pub(crate) fn has_k_split(format: WeightFormat) -> bool {
    matches!(
        format,
        WeightFormat::Q2_K
            | WeightFormat::Q3_K
            | WeightFormat::Q4_K
            | WeightFormat::Q5_K
            | WeightFormat::Q6_K
            | WeightFormat::IQ4_XS
    )
}

/// `y[i]` = the dot of row `sel.get(i)` with `nsb` super-blocks of activations (`acts(sb)`).
#[target_feature(enable = "neon,dotprod")]
unsafe fn rows<const F: u8, A: SbDot>(
    w: &QMatrix<'_>,
    sel: Rows<'_>,
    nsb: usize,
    acts: impl Fn(usize) -> A,
    y: &mut [f32],
) {
    if F == 2 {
        // Rows in pairs: each super-block's activation loads serve both.
        // SAFETY: dotprod present per this function's contract.
        return unsafe { rows_blocked::<2, _>(&K23Dots::<F, _>(&acts, nsb), w, sel, y) };
    }
    // `Q3_K` one row at a time (by `dot_row`): in pairs it executed 5% more instructions a token
    // on the Q3_K_M file, and through `rows_blocked` one at a time 3% more.
    for (i, yv) in y.iter_mut().enumerate() {
        sel.prefetch(w, i + 2, 1);
        // SAFETY: dotprod present per this function's contract.
        *yv = unsafe { dot_row::<F, A>(w.row_data(sel.get(i)), nsb, &acts) };
    }
}

/// [`rows`] for the format of `w` (K-quants and `IQ4_XS`; others: nothing written).
///
/// # Safety
/// The CPU must support the `dotprod` extension.
#[target_feature(enable = "neon,dotprod")]
unsafe fn rows_of<A: SbDot>(
    w: &QMatrix<'_>,
    sel: Rows<'_>,
    nsb: usize,
    acts: impl Fn(usize) -> A,
    y: &mut [f32],
) {
    // SAFETY: dotprod is present per this function's contract (all arms).
    unsafe {
        match w.format() {
            WeightFormat::Q2_K => rows::<2, A>(w, sel, nsb, acts, y),
            WeightFormat::Q3_K => rows::<3, A>(w, sel, nsb, acts, y),
            WeightFormat::Q4_K => rows::<4, A>(w, sel, nsb, acts, y),
            WeightFormat::Q5_K => rows::<5, A>(w, sel, nsb, acts, y),
            WeightFormat::Q6_K => rows::<6, A>(w, sel, nsb, acts, y),
            WeightFormat::IQ4_XS => rows::<IQ4XS, A>(w, sel, nsb, acts, y),
            _ => {}
        }
    }
}

/// K-quant and `IQ4_XS` weights × 16-bit activations by `sdot`/`udot` (others: nothing written);
/// `s` is `xq` split ([`Split16::new`]).
///
/// # Safety
/// The CPU must support the `dotprod` extension.
#[target_feature(enable = "neon,dotprod")]
pub(crate) unsafe fn matvec_k_split(
    w: &QMatrix<'_>,
    sel: Rows<'_>,
    xq: &QActs16,
    s: &Split16,
    y: &mut [f32],
) {
    let a = SplitSlices::new(s, xq);
    // SAFETY: dotprod is present per this function's contract.
    unsafe { rows_of(w, sel, xq.d.len() / 8, move |sb| a.sb(sb), y) }
}

/// K-quant and `IQ4_XS` weights × 8-bit activations (`Precision::Int8`) by `sdot`, with the
/// super-block kernels of the split path (others: nothing written); `sum16` is the sum of each 16
/// quants of `xq` (the offsets of `Q6_K`/`Q3_K`, `Q2_K`'s mins).
///
/// # Safety
/// The CPU must support the `dotprod` extension.
#[target_feature(enable = "neon,dotprod")]
pub(crate) unsafe fn matvec_k_int8_split(
    w: &QMatrix<'_>,
    sel: Rows<'_>,
    xq: &QActs,
    sum16: &[i32],
    y: &mut [f32],
) {
    let a = I8Slices::new(xq, sum16);
    // SAFETY: dotprod is present per this function's contract.
    unsafe { rows_of(w, sel, xq.d.len() / 8, move |sb| a.sb(sb), y) }
}
