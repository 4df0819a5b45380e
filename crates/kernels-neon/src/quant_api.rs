//! The activation quantizers on an explicit path, for tests: every path must give the same quants
//! as the scalar reference.

use crate::quant::{QActs, QActs16, QBlocks};
use crate::{check_path, KernelError, KernelPath, WeightFormat};

/// Quantizes `x` to the 16-bit activations of [`Precision::Fast`] on an
/// explicit path (for tests: every path must produce identical quants).
/// `x.len()` must be a multiple of 32.
#[doc(hidden)]
pub fn quantize_acts_i16_with(path: KernelPath, x: &[f32]) -> Result<QActs16, KernelError> {
    check_blocks(path, "quantize_acts_i16 x (multiple of 32)", x)?;
    Ok(QActs16::quantize(path, x))
}

/// Quantizes `x` to the 8-bit activations with one scale per 32-block that `Int8` gives the
/// 32-block formats, on an explicit path (for tests: every path must produce identical quants).
/// `x.len()` must be a multiple of 32.
#[doc(hidden)]
pub fn quantize_acts_i8_with(path: KernelPath, x: &[f32]) -> Result<QBlocks<i8>, KernelError> {
    check_blocks(path, "quantize_acts_i8 x (multiple of 32)", x)?;
    Ok(QActs::quantize(path, x))
}

/// Quantizes `x` to the 8-bit activations with one scale per 256 elements that `Int8` gives
/// Q4_K/Q5_K/Q6_K weights, on an explicit path (for tests: every path must produce identical
/// quants). `x.len()` must be a multiple of 32.
#[doc(hidden)]
pub fn quantize_acts_i8_super_with(
    path: KernelPath,
    x: &[f32],
) -> Result<QBlocks<i8>, KernelError> {
    check_blocks(path, "quantize_acts_i8_super x (multiple of 32)", x)?;
    Ok(QActs::quantize_super(path, x))
}

/// Quantizes `x` to the 8-bit activations with one scale per 16 elements that `Fast` prompts of
/// [`fast_prompts_halves`]' formats take, on an explicit path (for tests: every path must produce
/// identical quants). `x.len()` must be a multiple of 32.
#[doc(hidden)]
pub fn quantize_acts_i8_halves_with(
    path: KernelPath,
    x: &[f32],
) -> Result<QBlocks<i8>, KernelError> {
    check_blocks(path, "quantize_acts_i8_halves x (multiple of 32)", x)?;
    Ok(QActs::quantize_halves(path, x))
}

/// `path` available and `x` whole blocks of 32 (`what` names it in the error).
fn check_blocks(path: KernelPath, what: &'static str, x: &[f32]) -> Result<(), KernelError> {
    check_path(path)?;
    if x.len() % 32 != 0 {
        return Err(KernelError::LengthMismatch {
            what,
            expected: x.len().next_multiple_of(32),
            actual: x.len(),
        });
    }
    Ok(())
}

/// Quantizes `x` to the 8-bit activations [`Precision::Ggml`] gives weights of `format` (ggml's
/// `vec_dot_type`), on an explicit path (for tests: every path must produce identical
/// activations). `x.len()` must be a multiple of 32.
#[doc(hidden)]
pub fn quantize_acts_ggml_with(
    path: KernelPath,
    format: WeightFormat,
    x: &[f32],
) -> Result<QBlocks<i8>, KernelError> {
    check_blocks(path, "quantize_acts_ggml x (multiple of 32)", x)?;
    Ok(QActs::quantize_ggml(path, format, x))
}
