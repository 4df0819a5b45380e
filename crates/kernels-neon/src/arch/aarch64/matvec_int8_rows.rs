//! `matvec` with 8-bit activations ([`Precision::Int8`](crate::Precision::Int8)) on `dotprod`
//! CPUs for the 32-element block formats: rows four at a time sharing the activation loads and
//! the block's correction, one `sdot` per 16 products (the 16-bit rows of `matvec_split.rs` take
//! two, for the high and the low byte).
//!
//! The quants are those the split rows take (`quants::<F>`): `Q8_0`/`IQ4_NL`
//! values and `Q5_0`'s `q - 16` signed, `Q4_0` nibbles unsigned (its offset of 8 taken back per
//! block: `-8 * sum(x)`, from the per-16 sums of the activations, starts each row's dot),
//! `Q4_1`/`Q5_1` unsigned with their mins beside; `sdot` takes each against the signed
//! activations. Per block, the rows' exact sums, scales and mins are summed by
//! [`RowsAcc`], the same operations for any number of rows a pass.

use std::arch::aarch64::*;

use super::matvec_split::{quants, sdot};
use super::rows_acc::RowsAcc;
use crate::arch::drivers::{rows_blocked, RowDots};
use crate::arch::tags::{block_bytes, IQ4_NL, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};
use crate::arch::Rows;
use crate::quant::QActs;
use crate::{QMatrix, WeightFormat};

/// The dots of `R` rows (1, 2 or 4) of format `F` with the 8-bit activations `xq`, `sum16` the
/// sum of each 16 of its quants (read for `Q4_0`).
///
/// # Safety
/// The CPU must support the `dotprod` extension.
#[target_feature(enable = "neon,dotprod")]
unsafe fn dot_i8_rows<const F: u8, const R: usize>(
    rows: [&[u8]; R],
    xq: &QActs,
    sum16: &[i32],
) -> [f32; R] {
    let bb = block_bytes(F);
    let mut sums = RowsAcc::<F, R>::new();
    // Every slice cut to `nb` blocks up front, so that the loop's indexing needs no checks.
    let nb = rows
        .iter()
        .map(|r| r.len() / bb)
        .fold(xq.d.len().min(xq.qs.len() / 32), usize::min);
    let nb = if F == Q4_0 {
        nb.min(sum16.len() / 2)
    } else {
        nb
    };
    let rows = rows.map(|r| &r[..nb * bb]);
    let (qs, d, s) = (&xq.qs[..nb * 32], &xq.d[..nb], &xq.s[..nb]);
    let s16 = if F == Q4_0 { &sum16[..2 * nb] } else { &[] };
    for b in 0..nb {
        let bs: [&[u8]; R] = std::array::from_fn(|i| &rows[i][b * bb..b * bb + bb]);
        let x = &qs[b * 32..b * 32 + 32];
        // SAFETY: `x` is exactly 32 readable i8 (cut above).
        let (x0, x1) = unsafe { (vld1q_s8(x.as_ptr()), vld1q_s8(x.as_ptr().add(16))) };
        let init = if F == Q4_0 {
            vsetq_lane_s32::<0>(-8 * (s16[2 * b] + s16[2 * b + 1]), vdupq_n_s32(0))
        } else {
            vdupq_n_s32(0)
        };
        // A plain loop: a closure here was not inlined (see `matvec_split.rs`).
        let mut isum = [vdupq_n_s32(0); R];
        for (k, blk) in bs.iter().enumerate() {
            let ([q0, q1], _) = quants::<F>(blk);
            // SAFETY: dotprod present per this function's contract.
            isum[k] = unsafe { sdot(sdot(init, q0, x0), q1, x1) };
        }
        sums.add(&isum, &bs, d[b], &[d[b], s[b], d[b], s[b]]);
    }
    sums.finish()
}

/// [`dot_i8_rows`] as the kernel of the shared row drivers.
struct I8Rows<'a, const F: u8> {
    xq: &'a QActs,
    sum16: &'a [i32],
}

impl<const F: u8> RowDots for I8Rows<'_, F> {
    #[inline(always)]
    unsafe fn dots<const N: usize>(&self, rows: [&[u8]; N]) -> [f32; N] {
        // SAFETY: dotprod is present per this method's contract (`matvec_int8_rows`'s).
        unsafe { dot_i8_rows::<F, N>(rows, self.xq, self.sum16) }
    }
}

#[target_feature(enable = "neon,dotprod")]
unsafe fn rows_i8<const F: u8>(
    w: &QMatrix<'_>,
    sel: Rows<'_>,
    xq: &QActs,
    sum16: &[i32],
    y: &mut [f32],
) {
    // Four rows a step, dense or listed, as the 16-bit split rows.
    // SAFETY: dotprod present per this function's contract.
    unsafe { rows_blocked::<4, _>(&I8Rows::<F> { xq, sum16 }, w, sel, y) }
}

/// Quantized weights × 8-bit activations by `sdot`, four rows a step, for the 32-element block
/// formats (`matvec_split::has_split`'s; others: nothing written); `sum16` the sum of each 16 quants of `xq` (read
/// for `Q4_0`).
///
/// # Safety
/// The CPU must support the `dotprod` extension.
#[target_feature(enable = "neon,dotprod")]
pub(super) unsafe fn matvec_int8_rows(
    w: &QMatrix<'_>,
    sel: Rows<'_>,
    xq: &QActs,
    sum16: &[i32],
    y: &mut [f32],
) {
    // SAFETY: dotprod is present per this function's contract (all arms).
    unsafe {
        match w.format() {
            WeightFormat::Q8_0 => rows_i8::<Q8_0>(w, sel, xq, sum16, y),
            WeightFormat::Q4_0 => rows_i8::<Q4_0>(w, sel, xq, sum16, y),
            WeightFormat::Q4_1 => rows_i8::<Q4_1>(w, sel, xq, sum16, y),
            WeightFormat::Q5_0 => rows_i8::<Q5_0>(w, sel, xq, sum16, y),
            WeightFormat::Q5_1 => rows_i8::<Q5_1>(w, sel, xq, sum16, y),
            WeightFormat::IQ4_NL => rows_i8::<IQ4_NL>(w, sel, xq, sum16, y),
            _ => {}
        }
    }
}
