//! `IQ4_XS` rows × 16-bit activations ([`Precision::Fast`](crate::Precision::Fast)) on `dotprod`
//! CPUs, up to four rows a pass: the products of `kquant_low_split.rs`'s one-row kernel (the
//! split `x = 256 * hr + ls` of [`Split16`], both signed: `sdot` of the table values with `hr`,
//! shifted left by 8, starts the `sdot` with `ls`), each row's sums and scales in the same f32
//! order, so every row's result is that kernel's bit for bit. What a pass of `R` rows shares: each
//! sub-block's four activation loads, the table and the super-block's activation scales.

use std::arch::aarch64::*;

use super::matvec_split::{sdot, Split16};
use super::simd::{iq4xs_scales, load_f32x4};
use crate::arch::drivers::{rows_blocked, RowDots};
use crate::arch::Rows;
use crate::quant::QActs16;
use crate::QMatrix;

/// The bytes of an `IQ4_XS` super-block (`d`, `scales_h`, `scales_l` 4, nibbles 128).
const BB: usize = 136;

/// The dots of `R` `IQ4_XS` rows with the split activations `s` of `xq`: per super-block each
/// row's 8 scales `d * (ls - 32) * d_x`, then four sub-blocks at a time, each row's four exact
/// sums converted once and FMA'd with their scales (`fma_sums4`'s operations).
///
/// # Safety
/// The CPU must support the `dotprod` extension.
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn iq4xs_rows<const R: usize>(rows: [&[u8]; R], s: &Split16, xq: &QActs16) -> [f32; R] {
    const { assert!(R == 1 || R == 2 || R == 4) };
    // The super-blocks every row and the activations hold.
    let nsb = rows
        .iter()
        .map(|r| r.len() / BB)
        .fold(xq.d.len() / 8, usize::min);
    let rows = rows.map(|r| &r[..nsb * BB]);
    // SAFETY: the table is exactly 16 readable i8.
    let kv = unsafe { vld1q_s8(tensor_types::IQ4NL_VALUES.as_ptr()) };
    let mut acc = [vdupq_n_f32(0.0); R];
    for sb in 0..nsb {
        // Each super-block's slices checked once; the loads below at offsets within them.
        let blks: [&[u8; BB]; R] = std::array::from_fn(|k| {
            rows[k][sb * BB..sb * BB + BB]
                .try_into()
                .expect("136 bytes")
        });
        let h: &[i8; 256] = s.hr[256 * sb..256 * sb + 256]
            .try_into()
            .expect("256 bytes");
        let l: &[u8; 256] = s.lo[256 * sb..256 * sb + 256]
            .try_into()
            .expect("256 bytes");
        let dx = [load_f32x4(&xq.d[8 * sb..]), load_f32x4(&xq.d[8 * sb + 4..])];
        // A plain loop: `blks.map` with a closure was an out-of-line call per row.
        let mut dl = [[vdupq_n_f32(0.0); 2]; R];
        for (d, b) in dl.iter_mut().zip(blks) {
            *d = iq4xs_scales(b);
        }
        for (g, dxg) in dx.into_iter().enumerate() {
            // Each row's four sums reduced in pairs as they come, in `fma_sums4`'s order
            // (`(s0 + s1) + (s2 + s3)` by `addp`).
            let mut pairs = [[vdupq_n_s32(0); R]; 2];
            for (half, pair) in pairs.iter_mut().enumerate() {
                let j = 4 * g + 2 * half;
                // SAFETY: j + 1 < 8; dotprod present per this function's contract.
                let (s0, s1) = unsafe {
                    (
                        sub_dots::<R>(&blks, h, l, j, kv),
                        sub_dots::<R>(&blks, h, l, j + 1, kv),
                    )
                };
                for (p, (a, b)) in pair.iter_mut().zip(s0.into_iter().zip(s1)) {
                    *p = vpaddq_s32(a, b);
                }
            }
            for (k, a) in acc.iter_mut().enumerate() {
                let t = vpaddq_s32(pairs[0][k], pairs[1][k]);
                *a = vfmaq_f32(*a, vcvtq_f32_s32(t), vmulq_f32(dl[k][g], dxg));
            }
        }
    }
    acc.map(|a| vaddvq_f32(a))
}

/// Sub-block `j`'s exact dots (four i32 lanes each) of `R` rows' super-blocks `blks` with the
/// split activations `h` (`hr`) and `l` (`lo`, taken as i8) of their super-block; `kv` the table.
/// A function with no branch (a loop over `j` with a `match` on it was left rolled, its branches
/// about 4 instructions a row and sub-block).
///
/// # Safety
/// `j < 8`; the CPU must support the `dotprod` extension.
#[inline(always)]
unsafe fn sub_dots<const R: usize>(
    blks: &[&[u8; BB]; R],
    h: &[i8; 256],
    l: &[u8; 256],
    j: usize,
    kv: int8x16_t,
) -> [int32x4_t; R] {
    debug_assert!(j < 8);
    // SAFETY: NEON is baseline on aarch64; j < 8 per this function's contract: bytes 32 j ..
    // 32 j + 32 of `h` and `l` (256 each), and each row's nibble bytes 8 + 16 j .. 24 + 16 j <=
    // 136; dotprod present per the contract.
    unsafe {
        let m4 = vdupq_n_u8(0x0F);
        let (h0, h1) = (
            vld1q_s8(h.as_ptr().add(32 * j)),
            vld1q_s8(h.as_ptr().add(32 * j + 16)),
        );
        let (l0, l1) = (
            vld1q_s8(l.as_ptr().add(32 * j) as *const i8),
            vld1q_s8(l.as_ptr().add(32 * j + 16) as *const i8),
        );
        let mut out = [vdupq_n_s32(0); R];
        for (o, blk) in out.iter_mut().zip(blks) {
            let raw = vld1q_u8(blk.as_ptr().add(8 + 16 * j));
            let v0 = vqtbl1q_s8(kv, vandq_u8(raw, m4));
            let v1 = vqtbl1q_s8(kv, vshrq_n_u8::<4>(raw));
            let hi = vshlq_n_s32::<8>(sdot(sdot(vdupq_n_s32(0), v0, h0), v1, h1));
            *o = sdot(sdot(hi, v0, l0), v1, l1);
        }
        out
    }
}

/// [`iq4xs_rows`] as the kernel of the shared row drivers.
struct Iq4xsDots<'a>(&'a Split16, &'a QActs16);

impl RowDots for Iq4xsDots<'_> {
    #[inline(always)]
    unsafe fn dots<const N: usize>(&self, rows: [&[u8]; N]) -> [f32; N] {
        // SAFETY: dotprod is present per this method's contract (`matvec_iq4xs_split`'s).
        unsafe { iq4xs_rows::<N>(rows, self.0, self.1) }
    }
}

/// `IQ4_XS` weights `w` (rows `sel`) × 16-bit activations `xq` split as `s`, four rows a step.
///
/// # Safety
/// The CPU must support the `dotprod` extension.
#[target_feature(enable = "neon,dotprod")]
pub(super) unsafe fn matvec_iq4xs_split(
    w: &QMatrix<'_>,
    sel: Rows<'_>,
    xq: &QActs16,
    s: &Split16,
    y: &mut [f32],
) {
    // SAFETY: dotprod present per this function's contract.
    unsafe { rows_blocked::<4, _>(&Iq4xsDots(s, xq), w, sel, y) }
}
