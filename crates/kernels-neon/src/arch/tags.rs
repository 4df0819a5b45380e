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
/// `WeightFormat::F32`.
pub(crate) const F32: u8 = 3;
/// `WeightFormat::F16` (the NEON kernels convert float rows without tags).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) const F16: u8 = 4;
/// `WeightFormat::BF16` (the NEON kernels convert float rows without tags).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) const BF16: u8 = 5;

/// Bytes of one block of format `f`: 32 elements for the quantized formats,
/// one element for the float formats.
pub(crate) const fn block_bytes(f: u8) -> usize {
    match f {
        Q8_0 => 34,
        Q4_0 => 18,
        Q4_1 => 20,
        F32 => 4,
        _ => 2,
    }
}
