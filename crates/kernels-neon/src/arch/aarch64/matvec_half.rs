//! F16 rows times activations rounded to f16 (`crate::HalfActs`: every precision but `Exact`)
//! with FEAT_FHM's `fmlal`/`fmlal2`: each f16 × f16 product exact and added to an f32 lane with
//! one rounding, as `vfmaq_f32` adds the product of the two converted to f32. Each row keeps
//! [`super::matvec_exact`](fn@super::matvec_exact)'s four accumulators in its order, so the result is the float kernel's
//! on the rounded activations, bit for bit, at two instructions per eight weights instead of
//! four (no `fcvtl`/`fcvtl2`). Stable Rust has no f16 vector type, so the instruction is written
//! as inline assembly.

use std::arch::aarch64::*;
use std::arch::asm;

use super::matvec_exact::{dot_exact_float, float_tail};
use crate::arch::drivers::{rows_blocked, RowDots};
use crate::arch::tags::F16;
use crate::arch::Rows;
use crate::QMatrix;

/// `acc + w[0..4] · x[0..4]` (`fmlal`: lanes 0-3 of the two f16x8) and `acc2 + w[4..8] ·
/// x[4..8]` (`fmlal2`), each lane one fused f16 product added in f32.
#[inline(always)]
fn fmlal_pair(
    acc: float32x4_t,
    acc2: float32x4_t,
    w: uint16x8_t,
    x: uint16x8_t,
) -> (float32x4_t, float32x4_t) {
    let (mut a, mut b) = (acc, acc2);
    // SAFETY: register-only arithmetic; every caller is compiled with `fhm` enabled and runs
    // only where `has_fhm` detected it.
    unsafe {
        asm!(
            "fmlal {a:v}.4s, {w:v}.4h, {x:v}.4h",
            "fmlal2 {b:v}.4s, {w:v}.4h, {x:v}.4h",
            a = inout(vreg) a,
            b = inout(vreg) b,
            w = in(vreg) w,
            x = in(vreg) x,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    (a, b)
}

/// The 32 f16 of a group (64 bytes at the start of `b`), as four f16x8, by one `ld1`.
#[inline(always)]
fn load32(b: &[u8]) -> [uint16x8_t; 4] {
    let b = &b[..64];
    // SAFETY: `b` holds the 64 bytes read (checked by the slice above).
    let v = unsafe { vld1q_u16_x4(b.as_ptr().cast()) };
    [v.0, v.1, v.2, v.3]
}

/// One row's group of 32 (`w`) into its accumulators with the group's activations `x`: eight
/// elements `8i..8i + 8` into accumulators `2i & 3` and `(2i + 1) & 3`.
#[inline(always)]
fn group(acc: &mut [float32x4_t; 4], w: [uint16x8_t; 4], x: &[uint16x8_t; 4]) {
    for i in 0..4 {
        let (a, b) = ((2 * i) & 3, (2 * i + 1) & 3);
        (acc[a], acc[b]) = fmlal_pair(acc[a], acc[b], w[i], x[i]);
    }
}

/// Four F16 rows' dots with the rounded activations (`bits` as f16, `xr` as f32), each row's
/// four accumulators those of `dot_exact_float::<F16>` on `xr`, its tail through `float_tail`.
#[target_feature(enable = "neon,fhm")]
fn dot4_half(rows: [&[u8]; 4], bits: &[u16], xr: &[f32]) -> [f32; 4] {
    let n32 = xr.len() / 32 * 32;
    let (mut a0, mut a1, mut a2, mut a3) = (
        [vdupq_n_f32(0.0); 4],
        [vdupq_n_f32(0.0); 4],
        [vdupq_n_f32(0.0); 4],
        [vdupq_n_f32(0.0); 4],
    );
    let g = |r: usize| rows[r][..n32 * 2].chunks_exact(64);
    for ((((g0, g1), g2), g3), xs) in g(0)
        .zip(g(1))
        .zip(g(2))
        .zip(g(3))
        .zip(bits[..n32].chunks_exact(32))
    {
        // SAFETY: `xs` holds 32 u16 (checked by `chunks_exact`), the four loads' 64 bytes.
        let xv = unsafe { vld1q_u16_x4(xs.as_ptr()) };
        let xv = [xv.0, xv.1, xv.2, xv.3];
        group(&mut a0, load32(g0), &xv);
        group(&mut a1, load32(g1), &xv);
        group(&mut a2, load32(g2), &xv);
        group(&mut a3, load32(g3), &xv);
    }
    [
        float_tail::<F16>(a0, rows[0], xr),
        float_tail::<F16>(a1, rows[1], xr),
        float_tail::<F16>(a2, rows[2], xr),
        float_tail::<F16>(a3, rows[3], xr),
    ]
}

/// [`dot4_half`] four rows at a time, `dot_exact_float::<F16>` on the rounded f32 the rest.
struct HalfDots<'a> {
    bits: &'a [u16],
    xr: &'a [f32],
}

impl RowDots for HalfDots<'_> {
    #[inline]
    #[target_feature(enable = "neon,fhm")]
    unsafe fn dots<const N: usize>(&self, rows: [&[u8]; N]) -> [f32; N] {
        if N == 4 {
            let s = dot4_half(std::array::from_fn(|r| rows[r]), self.bits, self.xr);
            return std::array::from_fn(|r| s[r]);
        }
        rows.map(|r| dot_exact_float::<F16>(r, self.xr))
    }
}

/// The rows `sel` of F16 `w` times the activations rounded to f16 (`bits`; `xr` the same values
/// as f32), four at a time: `matvec_exact` on `xr`, bit for bit.
///
/// # Safety
/// The CPU has FEAT_FHM (`crate::arch::has_fhm`).
#[target_feature(enable = "neon,fhm")]
pub(crate) unsafe fn matvec_half(
    w: &QMatrix<'_>,
    sel: Rows<'_>,
    bits: &[u16],
    xr: &[f32],
    y: &mut [f32],
) {
    // SAFETY: the caller checked FEAT_FHM; NEON is baseline.
    unsafe { rows_blocked::<4, _>(&HalfDots { bits, xr }, w, sel, y) }
}
