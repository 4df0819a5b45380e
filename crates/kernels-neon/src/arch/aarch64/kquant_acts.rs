//! A super-block's activations as the `dotprod` K-quant kernels (`kquant_split.rs`,
//! `kquant_low_split.rs`) read them: the exact integer dots of weight quants with its quantized
//! activations ([`SbDot`]), for 16-bit activations split into two bytes ([`SbActs`]: `sdot` of
//! the high bytes, shifted left by 8, starts the `udot` of the low ones) and for 8-bit ones
//! ([`SbI8`], `Precision::Int8`: one `sdot`). Both cut one super-block's activations, scales and
//! sums into fixed-size arrays, so that the kernels' constant offsets into them need no bounds
//! check (with slices of the whole vector, each 16-element load paid two compares and branches:
//! a quarter of `Q6_K`'s instructions).

use std::arch::aarch64::*;

use super::matvec_split::{sdot, udot, Split16};
use crate::quant::{QActs, QActs16};

/// One 256-element super-block's activations, exact integer dots with them, and its scales.
pub(super) trait SbDot {
    /// `sum(q * x)` over the super-block's elements `e..e + 16`, in 4 i32 lanes (`q` unsigned,
    /// at most 127).
    ///
    /// # Safety
    /// The CPU must support the `dotprod` extension.
    unsafe fn dot16(&self, q: uint8x16_t, e: usize) -> int32x4_t;
    /// The same over elements `e..e + 32` (`q0` the first 16).
    ///
    /// # Safety
    /// As [`SbDot::dot16`].
    unsafe fn dot32(&self, q0: uint8x16_t, q1: uint8x16_t, e: usize) -> int32x4_t;
    /// `sum(v * x)` of signed values `v` over block `j`'s 32 elements (`IQ4_XS`).
    ///
    /// # Safety
    /// As [`SbDot::dot16`].
    unsafe fn dot32s(&self, v0: int8x16_t, v1: int8x16_t, j: usize) -> int32x4_t;
    /// The super-block's scales and sums.
    fn sums(&self) -> &SbSums<'_>;
    /// Each block's scale `d_x`.
    #[inline(always)]
    fn d(&self) -> &[f32; 8] {
        self.sums().d
    }
    /// Each block's `d_x * sum(x)`.
    #[inline(always)]
    fn s(&self) -> &[f32; 8] {
        self.sums().s
    }
    /// Each 16 quants' sum.
    #[inline(always)]
    fn sum16(&self) -> &[i32; 16] {
        self.sums().sum16
    }
}

/// A super-block's activation scales and sums, which both kinds of activations carry.
pub(super) struct SbSums<'a> {
    d: &'a [f32; 8],
    s: &'a [f32; 8],
    sum16: &'a [i32; 16],
}

/// The slices [`SbSums`] cuts (for [`SplitSlices`] and [`I8Slices`]).
#[derive(Clone, Copy)]
struct SumSlices<'a> {
    d: &'a [f32],
    s: &'a [f32],
    sum16: &'a [i32],
}

impl<'a> SumSlices<'a> {
    /// Super-block `sb`; panics where the slices hold less.
    #[inline(always)]
    fn sb(self, sb: usize) -> SbSums<'a> {
        SbSums {
            d: at(self.d, sb),
            s: at(self.s, sb),
            sum16: at(self.sum16, sb),
        }
    }
}

/// Elements `N i .. N i + N` of `v`; panics where it holds less.
#[inline(always)]
fn at<T, const N: usize>(v: &[T], i: usize) -> &[T; N] {
    v[N * i..N * i + N].try_into().expect("N elements")
}

/// A pointer to the 16 elements of `v` from `e`, bounds-checked (`e` is a constant offset at
/// every call, so the check folds away).
#[inline(always)]
fn ld16<T>(v: &[T; 256], e: usize) -> *const T {
    v[e..e + 16].as_ptr()
}

/// One super-block's share of the split 16-bit activations ([`Split16`], `x = 256 hi + lo` and
/// `x = 256 hr + (lo as i8)`) and of their scales ([`QActs16`]).
pub(super) struct SbActs<'a> {
    hi: &'a [i8; 256],
    lo: &'a [u8; 256],
    hr: &'a [i8; 256],
    sums: SbSums<'a>,
}

/// The slices of [`Split16`] and its [`QActs16`] that [`SbActs`] cuts, copied out once per
/// product, so that a row's super-blocks take them from registers (read through the two
/// structures for each super-block, they cost 3-6% more instructions on K-quant rows).
#[derive(Clone, Copy)]
pub(super) struct SplitSlices<'a> {
    hi: &'a [i8],
    lo: &'a [u8],
    hr: &'a [i8],
    sums: SumSlices<'a>,
}

impl<'a> SplitSlices<'a> {
    pub(super) fn new(s: &'a Split16, xq: &'a QActs16) -> Self {
        SplitSlices {
            hi: &s.hi,
            lo: &s.lo,
            hr: &s.hr,
            sums: SumSlices {
                d: &xq.d,
                s: &xq.s,
                sum16: &s.sum16,
            },
        }
    }

    /// Super-block `sb`; panics where the slices hold less.
    #[inline(always)]
    pub(super) fn sb(self, sb: usize) -> SbActs<'a> {
        SbActs {
            hi: at(self.hi, sb),
            lo: at(self.lo, sb),
            hr: at(self.hr, sb),
            sums: self.sums.sb(sb),
        }
    }
}

impl SbActs<'_> {
    /// The split activations of elements `e..e + 16` (`hi`, `lo`).
    #[inline(always)]
    fn acts(&self, e: usize) -> (int8x16_t, uint8x16_t) {
        // SAFETY: `ld16` points at 16 readable bytes of each array.
        unsafe { (vld1q_s8(ld16(self.hi, e)), vld1q_u8(ld16(self.lo, e))) }
    }
}

impl SbDot for SbActs<'_> {
    #[inline(always)]
    unsafe fn dot16(&self, q: uint8x16_t, e: usize) -> int32x4_t {
        let (h, l) = self.acts(e);
        // SAFETY: NEON is baseline on aarch64; dotprod present per this method's contract.
        unsafe {
            let hi = sdot(vdupq_n_s32(0), vreinterpretq_s8_u8(q), h);
            udot(vshlq_n_s32::<8>(hi), q, l)
        }
    }

    #[inline(always)]
    unsafe fn dot32(&self, q0: uint8x16_t, q1: uint8x16_t, e: usize) -> int32x4_t {
        let ((h0, l0), (h1, l1)) = (self.acts(e), self.acts(e + 16));
        // SAFETY: NEON is baseline on aarch64; dotprod present per this method's contract.
        unsafe {
            let (s0, s1) = (vreinterpretq_s8_u8(q0), vreinterpretq_s8_u8(q1));
            let hi = sdot(sdot(vdupq_n_s32(0), s0, h0), s1, h1);
            udot(udot(vshlq_n_s32::<8>(hi), q0, l0), q1, l1)
        }
    }

    #[inline(always)]
    unsafe fn dot32s(&self, v0: int8x16_t, v1: int8x16_t, j: usize) -> int32x4_t {
        // The signed values by `sdot` both ways: with the rounded high bytes `hr` and the low
        // ones as i8.
        let e = 32 * j;
        // SAFETY: `ld16` points at 16 readable bytes of each array; NEON is baseline on aarch64;
        // dotprod present per this method's contract.
        unsafe {
            let (h0, h1) = (vld1q_s8(ld16(self.hr, e)), vld1q_s8(ld16(self.hr, e + 16)));
            let l0 = vld1q_s8(ld16(self.lo, e) as *const i8);
            let l1 = vld1q_s8(ld16(self.lo, e + 16) as *const i8);
            let hi = sdot(sdot(vdupq_n_s32(0), v0, h0), v1, h1);
            sdot(sdot(vshlq_n_s32::<8>(hi), v0, l0), v1, l1)
        }
    }

    #[inline(always)]
    fn sums(&self) -> &SbSums<'_> {
        &self.sums
    }
}

/// One super-block's share of 8-bit activations ([`QActs`]) and their per-16 sums.
pub(super) struct SbI8<'a> {
    x: &'a [i8; 256],
    sums: SbSums<'a>,
}

/// The slices of [`QActs`] (and the per-16 sums) that [`SbI8`] cuts, as [`SplitSlices`].
#[derive(Clone, Copy)]
pub(super) struct I8Slices<'a> {
    x: &'a [i8],
    sums: SumSlices<'a>,
}

impl<'a> I8Slices<'a> {
    pub(super) fn new(xq: &'a QActs, sum16: &'a [i32]) -> Self {
        I8Slices {
            x: &xq.qs,
            sums: SumSlices {
                d: &xq.d,
                s: &xq.s,
                sum16,
            },
        }
    }

    /// Super-block `sb`; panics where the slices hold less.
    #[inline(always)]
    pub(super) fn sb(self, sb: usize) -> SbI8<'a> {
        SbI8 {
            x: at(self.x, sb),
            sums: self.sums.sb(sb),
        }
    }
}

impl SbI8<'_> {
    #[inline(always)]
    fn x(&self, e: usize) -> int8x16_t {
        // SAFETY: `ld16` points at 16 readable bytes.
        unsafe { vld1q_s8(ld16(self.x, e)) }
    }
}

impl SbDot for SbI8<'_> {
    #[inline(always)]
    unsafe fn dot16(&self, q: uint8x16_t, e: usize) -> int32x4_t {
        // SAFETY: NEON is baseline on aarch64; dotprod present per this method's contract.
        unsafe { sdot(vdupq_n_s32(0), vreinterpretq_s8_u8(q), self.x(e)) }
    }

    #[inline(always)]
    unsafe fn dot32(&self, q0: uint8x16_t, q1: uint8x16_t, e: usize) -> int32x4_t {
        // SAFETY: NEON is baseline on aarch64; dotprod present per this method's contract.
        unsafe {
            let (s0, s1) = (vreinterpretq_s8_u8(q0), vreinterpretq_s8_u8(q1));
            sdot(sdot(vdupq_n_s32(0), s0, self.x(e)), s1, self.x(e + 16))
        }
    }

    #[inline(always)]
    unsafe fn dot32s(&self, v0: int8x16_t, v1: int8x16_t, j: usize) -> int32x4_t {
        // SAFETY: NEON is baseline on aarch64; dotprod present per this method's contract.
        unsafe {
            sdot(
                sdot(vdupq_n_s32(0), v0, self.x(32 * j)),
                v1,
                self.x(32 * j + 16),
            )
        }
    }

    #[inline(always)]
    fn sums(&self) -> &SbSums<'_> {
        &self.sums
    }
}
