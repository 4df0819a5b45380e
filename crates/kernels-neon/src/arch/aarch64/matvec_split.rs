//! `matvec` with 16-bit activations ([`Precision::Fast`](crate::Precision::Fast)) on `dotprod`
//! CPUs: the same integer products as [`super::matvec_i16`](fn@super::matvec_i16), by `sdot`/`udot`.
//!
//! Each 16-bit activation quant is split exactly, once per call ([`Split16`]), two ways:
//! `x = 256 * hi + lo` with `hi = x >> 8` (signed) and `lo = x & 255` (unsigned), and
//! `x = 256 * hr + ls` with `hr = (x + 128) >> 8` (the rounded high byte) and `ls` the same low
//! byte read as an i8 (-128..=127): both halves signed, and `hr` an i8 because the quantizer keeps
//! `|x| <= 32639` (`<i16 as Quant>::MAX`). A weight quant `w` times `x` is then
//! `256 * (w * hi) + w * lo`: `sdot` takes `w * hi` and `udot` `w * lo`, for the unsigned quants
//! (the 4- and 5-bit ones without their offset: `Q4_0`'s 8, `Q5_0`'s 16 with the nibble copies,
//! taken back once per block as `-off * sum(x)`, the correction folded into the accumulator's
//! first lane). The signed ones (`Q8_0`, `IQ4_NL`, `Q5_0`'s `q - 16`: [`signed`]) take
//! `256 * (w * hr) + w * ls`, both by `sdot`, with nothing to take back (where `lo` needed
//! `i8mm`'s `usdot`, or the values `+ 128` and a correction). Per 32 weights and row: four dot
//! instructions, where the widening path spends four widenings and eight multiplies;
//! `Q5_0`/`Q5_1`'s fifth bits by a table lookup per 16 (`quants`). Four rows a pass share the
//! activation loads, corrections and scale conversions. Each lane's i32 sum is exact (below
//! 2^26), so a block's integer dot equals the widening path's; only the f32 rounding differs
//! (here each block's exact sum is converted once, there its four lanes apart).

use std::arch::aarch64::*;
use std::arch::asm;

use super::dequant::weights_i8;
use super::rows_acc::RowsAcc;
use super::simd::load_u8x16;
use crate::arch::drivers::{rows_blocked, RowDots};
use crate::arch::tags::{block_bytes, quants_offset, IQ4_NL, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};
use crate::arch::Rows;
use crate::quant::QActs16;
use crate::QMatrix;
use crate::WeightFormat;

/// A block's integer correction as the first lane of a vector whose other lanes are 0: what
/// starts its dot, loaded whole (one load, where a scalar put into a zeroed vector took three
/// instructions).
pub(crate) type Corr = [i32; 4];

/// The 16-bit activations split into their high (signed) and low (unsigned) bytes,
/// `x = 256 * hi + lo`, and into their rounded high bytes `hr` and the low ones as i8,
/// `x = 256 * hr + (lo as i8)` (module docs).
pub(crate) struct Split16 {
    pub(super) hi: Vec<i8>,
    pub(super) lo: Vec<u8>,
    /// `(x + 128) >> 8`: -127..=127 for the quantizer's `|x| <= 32639`.
    pub(super) hr: Vec<i8>,
    /// Each block's `-8 * sum(x)` and `-16 * sum(x)` (`Q4_0`'s and `Q5_0`'s offsets taken back).
    off8: Vec<Corr>,
    off16: Vec<Corr>,
    /// The sum of each 16 quants `x` (for `Q6_K`'s offset, `kquant_split.rs`).
    pub(super) sum16: Vec<i32>,
    /// Each block's scale and sum `[d_x, s_x, d_x, s_x]` (one multiply for two rows' `d` and
    /// `m` of `Q4_1`/`Q5_1`).
    ds2: Vec<[f32; 4]>,
}

impl Split16 {
    /// Splits `xq`'s quants (whole 32-element blocks).
    #[target_feature(enable = "neon")]
    pub(crate) fn new(xq: &QActs16) -> Self {
        let n = xq.qs.len() / 32 * 32;
        let mut s = Split16 {
            hi: vec![0; n],
            lo: vec![0; n],
            hr: vec![0; n],
            sum16: vec![0; n / 16],
            off8: vec![[0; 4]; n / 32],
            off16: vec![[0; 4]; n / 32],
            ds2: xq
                .d
                .iter()
                .zip(&xq.s)
                .take(n / 32)
                .map(|(&d, &s)| [d, s, d, s])
                .collect(),
        };
        for (b, q) in xq.qs[..n].chunks_exact(32).enumerate() {
            for k in 0..4 {
                let v = &q[8 * k..8 * k + 8];
                // SAFETY: `v` has exactly 8 readable i16, and `hi`/`lo`/`hr` exactly 8 writable
                // bytes at `32 b + 8 k` (all are `n` long, `b < n / 32`).
                unsafe {
                    let x = vld1q_s16(v.as_ptr());
                    debug_assert!(vmaxvq_s16(x) <= 32639, "16-bit quants past 32639");
                    // `shrn #8` keeps bits 15..8: as an i8, `x >> 8` (arithmetic); `rshrn #8`
                    // the same of `x + 128` (its sum kept wide: no overflow).
                    let h = vshrn_n_s16::<8>(x);
                    let hr = vrshrn_n_s16::<8>(x);
                    let l = vmovn_u16(vreinterpretq_u16_s16(x));
                    let o = 32 * b + 8 * k;
                    vst1_s8(s.hi[o..o + 8].as_mut_ptr(), h);
                    vst1_s8(s.hr[o..o + 8].as_mut_ptr(), hr);
                    vst1_u8(s.lo[o..o + 8].as_mut_ptr(), l);
                    s.sum16[2 * b + k / 2] += vaddlvq_s16(x);
                }
            }
            let sumx = s.sum16[2 * b] + s.sum16[2 * b + 1];
            (s.off8[b][0], s.off16[b][0]) = (-8 * sumx, -16 * sumx);
        }
        s
    }
}

super::simd::acc_insn!(
    /// `acc += sdot(a, b)` (signed bytes).
    pub(super) sdot, "sdot", int8x16_t, int8x16_t, "neon,dotprod"
);

super::simd::acc_insn!(
    /// `acc += udot(a, b)` (unsigned bytes; the sums are below 2^31 here, so the lanes read as i32).
    pub(super) udot, "udot", uint8x16_t, uint8x16_t, "neon,dotprod"
);

/// Whether format `F`'s rows take signed quants, by `sdot` on `hr` and `lo` as i8 (module docs):
/// `Q8_0` and `IQ4_NL` (signed values) and `Q5_0` (its quants made signed in fewer instructions
/// than unsigned ones, [`signed5`], and no correction); the unsigned formats take `hi` and `lo`.
pub(super) const fn signed<const F: u8>() -> bool {
    matches!(F, Q8_0 | IQ4_NL | Q5_0)
}

/// The signed `Q5_0` quants (`q - 16`, -16..=15) of the 16 nibble bytes `raw`: elements `j`
/// (low nibbles) and `16 + j` (high ones), from `nv` and `nv16`, the inverted fifth bits spread
/// one `qh` byte per lane (as [`quants`] spreads them) and `bit`, each lane's bit. A lane whose
/// fifth bit is clear is its nibble minus 16, that is, the nibble with the high four bits set:
/// `cmtst` of the inverted bits gives that lane's mask, into whose low four bits `bit` inserts the
/// low nibble (`sri #4` shifts in the high one). Two instructions a half, where the unsigned
/// quants take three (a mask or shift, `cmtst`, `bit`).
#[inline(always)]
fn signed5(raw: uint8x16_t, nv: uint8x16_t, nv16: uint8x16_t, bit: uint8x16_t) -> [int8x16_t; 2] {
    let (lo, hi): (uint8x16_t, uint8x16_t);
    // SAFETY: `cmtst`, `bit` and `sri` only read and write the named vector registers; NEON (the
    // reinterprets') is baseline on aarch64.
    unsafe {
        asm!(
            "cmtst {l:v}.16b, {nv:v}.16b, {b:v}.16b",
            "cmtst {h:v}.16b, {nv16:v}.16b, {b:v}.16b",
            "bit {l:v}.16b, {r:v}.16b, {m:v}.16b",
            "sri {h:v}.16b, {r:v}.16b, #4",
            l = out(vreg) lo,
            h = out(vreg) hi,
            nv = in(vreg) nv,
            nv16 = in(vreg) nv16,
            b = in(vreg) bit,
            r = in(vreg) raw,
            m = in(vreg) vdupq_n_u8(0x0F),
            options(pure, nomem, nostack, preserves_flags)
        );
        [vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi)]
    }
}

/// `nib` with bit 4 set in the lanes where `v & bit` is not zero (`cmtst`, then `bit` inserts
/// that lane's bit 4; written out because LLVM turns the intrinsics' test into `and`, `cmeq` and
/// `bic`, and the insert into `and` and `orr`: five instructions for these two).
#[inline(always)]
fn insert_bit4(nib: uint8x16_t, v: uint8x16_t, bit: uint8x16_t) -> uint8x16_t {
    let out: uint8x16_t;
    // SAFETY: `cmtst` and `bit` only read and write the named vector registers (NEON is
    // baseline on aarch64).
    unsafe {
        asm!(
            "cmtst {t:v}.16b, {v:v}.16b, {b:v}.16b",
            "bit {n:v}.16b, {t:v}.16b, {m:v}.16b",
            n = inout(vreg) nib => out,
            t = out(vreg) _,
            v = in(vreg) v,
            b = in(vreg) bit,
            m = in(vreg) vdupq_n_u8(0x10),
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    out
}

/// The 32 quants of a 32-element block, two halves of 16: signed for the formats of [`signed`]
/// (`Q8_0` and `IQ4_NL` values as they are, `Q5_0`'s `q - 16` by [`signed5`]), the `hr` and `lo`
/// dots' weights both; else (`Q4_0` and `Q4_1` nibbles, 0..=15, `Q5_1` 5-bit quants, 0..=31,
/// without their offset) as the signed bytes the `hi` dot takes and the unsigned ones the `lo`
/// dot takes, the same bytes. The fifth bits of `Q5_0`/`Q5_1` are spread from the four `qh` bytes
/// by one table lookup per 16 lanes (`tbl`), then tested against each lane's bit.
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn quants<const F: u8>(blk: &[u8]) -> ([int8x16_t; 2], [uint8x16_t; 2]) {
    match F {
        Q4_0 | Q4_1 | Q5_0 | Q5_1 => {
            let o = quants_offset(F) + if F == Q5_0 || F == Q5_1 { 4 } else { 0 };
            let raw = load_u8x16(&blk[o..]);
            if F == Q5_0 || F == Q5_1 {
                let h = &blk[quants_offset(F)..quants_offset(F) + 4];
                let qh =
                    vreinterpretq_u8_u32(vdupq_n_u32(u32::from_le_bytes([h[0], h[1], h[2], h[3]])));
                let bit = vreinterpretq_u8_u64(vdupq_n_u64(0x8040_2010_0804_0201));
                let idx0 = vcombine_u8(vdup_n_u8(0), vdup_n_u8(1));
                let idx1 = vcombine_u8(vdup_n_u8(2), vdup_n_u8(3));
                if signed::<F>() {
                    let nq: uint8x16_t;
                    // SAFETY: `mvn` only reads and writes the named vector registers. Written out:
                    // LLVM moved the intrinsic's `mvn` before the broadcast, where the load could
                    // no longer broadcast (`ldr`, `mvn`, `dup` against `ld1r`, `mvn`).
                    unsafe {
                        asm!(
                            "mvn {n:v}.16b, {q:v}.16b",
                            n = lateout(vreg) nq,
                            q = in(vreg) qh,
                            options(pure, nomem, nostack, preserves_flags)
                        )
                    };
                    let q = signed5(raw, vqtbl1q_u8(nq, idx0), vqtbl1q_u8(nq, idx1), bit);
                    // Signed both ways (the unsigned operands unused).
                    return (q, q.map(|v| vreinterpretq_u8_s8(v)));
                }
                let (lo, hi) = (vandq_u8(raw, vdupq_n_u8(0x0F)), vshrq_n_u8::<4>(raw));
                let u = [
                    insert_bit4(lo, vqtbl1q_u8(qh, idx0), bit),
                    insert_bit4(hi, vqtbl1q_u8(qh, idx1), bit),
                ];
                (u.map(|v| vreinterpretq_s8_u8(v)), u)
            } else {
                let (lo, hi) = (vandq_u8(raw, vdupq_n_u8(0x0F)), vshrq_n_u8::<4>(raw));
                ([vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi)], [lo, hi])
            }
        }
        _ => {
            // `Q8_0` and `IQ4_NL`: signed as they are (the unsigned operands unused).
            let (w0, w1) = weights_i8::<F>(blk);
            ([w0, w1], [vreinterpretq_u8_s8(w0), vreinterpretq_u8_s8(w1)])
        }
    }
}

/// The integer corrections of each block in [`Split16`] for format `F`'s unsigned quants:
/// `-off * sum(x)` (`Q4_0`: 8, `Q5_0`: 16, their offsets, where a kernel takes them unsigned);
/// `None` for the formats without an offset.
#[inline(always)]
pub(super) fn offsets<const F: u8>(s: &Split16) -> Option<&[Corr]> {
    match F {
        Q4_0 => Some(&s.off8),
        Q5_0 => Some(&s.off16),
        _ => None,
    }
}

/// The dots of `R` rows (1, 2 or 4) with the split activations: per block and row, of the quants
/// ([`quants`]) `sdot(q, hi)` and `udot(u, lo)`, or for the signed ones ([`signed`]) `sdot(q, hr)`
/// and `sdot(q, lo as i8)`: the high sum shifted left by 8 (plus the block's correction in the
/// first lane: [`offsets`]) starts the low sum. The activation loads serve every row; the rows'
/// exact block sums, scales and mins are summed by [`RowsAcc`] (for up to four rows one
/// conversion and one FMA a block).
///
/// # Safety
/// The CPU must support the `dotprod` extension.
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn dot_split_rows<const F: u8, const R: usize>(
    rows: [&[u8]; R],
    s: &Split16,
    xq: &QActs16,
) -> [f32; R] {
    const { assert!(R == 1 || R == 2 || R == 4) };
    let bb = block_bytes(F);
    let mut sums = RowsAcc::<F, R>::new();
    // Every slice cut to `nb` blocks up front, so that the loop's indexing needs no checks.
    let nb = rows
        .iter()
        .map(|r| r.len() / bb)
        .fold(xq.d.len(), usize::min);
    let rows = rows.map(|r| &r[..nb * bb]);
    let his = if signed::<F>() { &s.hr } else { &s.hi };
    let (his, los) = (&his[..nb * 32], &s.lo[..nb * 32]);
    let (ds, ds2) = (&xq.d[..nb], &s.ds2[..nb]);
    let corr = if signed::<F>() { None } else { offsets::<F>(s) };
    let corr = corr.map(|c| &c[..nb]);
    for b in 0..nb {
        let bs: [&[u8]; R] = std::array::from_fn(|i| &rows[i][b * bb..b * bb + bb]);
        let (hs, ls) = (&his[b * 32..b * 32 + 32], &los[b * 32..b * 32 + 32]);
        // SAFETY: `hs` and `ls` are exactly 32 bytes (cut above).
        let (h0, h1, l0, l1) = unsafe {
            (
                vld1q_s8(hs.as_ptr()),
                vld1q_s8(hs.as_ptr().add(16)),
                vld1q_u8(ls.as_ptr()),
                vld1q_u8(ls.as_ptr().add(16)),
            )
        };
        // SAFETY: `c[b]` is 4 readable i32.
        let init = corr.map(|c| unsafe { vld1q_s32(c[b].as_ptr()) });
        // A plain loop: a closure here was not inlined for Q5_0/Q5_1 (2.3x the instructions).
        let mut isum = [vdupq_n_s32(0); R];
        for (k, blk) in bs.into_iter().enumerate() {
            let ([q0, q1], [u0, u1]) = quants::<F>(blk);
            // SAFETY: dotprod present per this function's contract.
            isum[k] = unsafe {
                let hi = vshlq_n_s32::<8>(sdot(sdot(vdupq_n_s32(0), q0, h0), q1, h1));
                let start = match init {
                    Some(c) => vaddq_s32(hi, c),
                    None => hi,
                };
                if signed::<F>() {
                    let (s0, s1) = (vreinterpretq_s8_u8(l0), vreinterpretq_s8_u8(l1));
                    sdot(sdot(start, q0, s0), q1, s1)
                } else {
                    udot(udot(start, u0, l0), u1, l1)
                }
            };
        }
        sums.add(&isum, &bs, ds[b], &ds2[b]);
    }
    sums.finish()
}

/// [`dot_split_rows`] as the kernel of the shared row drivers.
struct SplitDots<'a, const F: u8>(&'a Split16, &'a QActs16);

impl<const F: u8> RowDots for SplitDots<'_, F> {
    #[inline(always)]
    unsafe fn dots<const N: usize>(&self, rows: [&[u8]; N]) -> [f32; N] {
        // SAFETY: dotprod is present per this method's contract (`matvec_split`'s).
        unsafe { dot_split_rows::<F, N>(rows, self.0, self.1) }
    }
}

#[target_feature(enable = "neon,dotprod")]
unsafe fn rows_split<const F: u8>(
    w: &QMatrix<'_>,
    sel: Rows<'_>,
    xq: &QActs16,
    s: &Split16,
    y: &mut [f32],
) {
    // Four rows a step: the activation loads, the block's correction and scale serve all four
    // (two rows a step executed 6-10% more instructions on Q5_0, Q4_0 and Q8_0).
    // SAFETY: dotprod present per this function's contract.
    unsafe { rows_blocked::<4, _>(&SplitDots::<F>(s, xq), w, sel, y) }
}

/// Whether [`matvec_split`] takes weights of `format` (the 32-element block formats).
pub(crate) fn has_split(format: WeightFormat) -> bool {
    matches!(
        format,
        WeightFormat::Q8_0
            | WeightFormat::Q4_0
            | WeightFormat::Q4_1
            | WeightFormat::Q5_0
            | WeightFormat::Q5_1
            | WeightFormat::IQ4_NL
    )
}

/// Quantized weights × 16-bit activations by `sdot`/`udot`, for the formats of [`has_split`]
/// (others: nothing written); `s` is `xq` split ([`Split16::new`]).
///
/// # Safety
/// The CPU must support the `dotprod` extension.
#[target_feature(enable = "neon,dotprod")]
pub(crate) unsafe fn matvec_split(
    w: &QMatrix<'_>,
    sel: Rows<'_>,
    xq: &QActs16,
    s: &Split16,
    y: &mut [f32],
) {
    // SAFETY: dotprod is present per this function's contract (all arms).
    unsafe {
        match w.format() {
            WeightFormat::Q8_0 => rows_split::<Q8_0>(w, sel, xq, s, y),
            WeightFormat::IQ4_NL => rows_split::<IQ4_NL>(w, sel, xq, s, y),
            WeightFormat::Q4_0 => rows_split::<Q4_0>(w, sel, xq, s, y),
            WeightFormat::Q4_1 => rows_split::<Q4_1>(w, sel, xq, s, y),
            WeightFormat::Q5_0 => rows_split::<Q5_0>(w, sel, xq, s, y),
            WeightFormat::Q5_1 => rows_split::<Q5_1>(w, sel, xq, s, y),
            _ => {}
        }
    }
}
