//! Const-generic format tags shared by the SIMD kernels of every
//! architecture: a kernel generic over `const F: u8` is monomorphized once
//! per format, so the inner loops carry no format branch.
//!
//! Invariant: [`block_bytes`] agrees with `WeightFormat::block_bytes` for
//! every tag (block of 32 elements for the quantized tags, one element for
//! the float tags).

/// `WeightFormat::Q8_0`.
pub(crate) const Q8_0: u8 = 0;
/// `WeightFormat::Q4_0`.
pub(crate) const Q4_0: u8 = 1;
/// `WeightFormat::Q4_1`.
pub(crate) const Q4_1: u8 = 2;
/// `WeightFormat::Q5_0`.
pub(crate) const Q5_0: u8 = 6;
/// `WeightFormat::Q5_1`.
pub(crate) const Q5_1: u8 = 7;
/// `WeightFormat::IQ4_NL`.
pub(crate) const IQ4_NL: u8 = 8;
/// `WeightFormat::F32`.
pub(crate) const F32: u8 = 3;
/// `WeightFormat::F16`.
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
pub(crate) const F16: u8 = 4;
/// `WeightFormat::BF16`.
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
pub(crate) const BF16: u8 = 5;

/// Whether blocks of format `f` carry a min `m` (f16 after `d`) whose term
/// `m * s_x` the integer dots add per block (`Q4_1`, `Q5_1`).
pub(crate) const fn has_min(f: u8) -> bool {
    matches!(f, Q4_1 | Q5_1)
}

/// Offset of the quants in a block of a 32-element format `f` (after `d`,
/// and `m` for the formats with a min); for `Q5_0`/`Q5_1` the 4 `qh` bytes,
/// then the 16 nibble bytes.
pub(crate) const fn quants_offset(f: u8) -> usize {
    if has_min(f) {
        4
    } else {
        2
    }
}

/// Bytes of one block of format `f`: 32 elements for the quantized formats,
/// one element for the float formats.
pub(crate) const fn block_bytes(f: u8) -> usize {
    match f {
        Q8_0 => 34,
        Q4_0 => 18,
        Q4_1 => 20,
        Q5_0 => 22,
        Q5_1 => 24,
        IQ4_NL => 18,
        F32 => 4,
        _ => 2,
    }
}
