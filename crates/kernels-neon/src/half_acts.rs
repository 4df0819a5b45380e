//! The activations of F16 weights in every [`crate::Precision`] but `Exact` ([`HalfActs`]):
//! rounded to f16 once per call, as llama.cpp's CPU backend takes them for F16 weights (its
//! `vec_dot_type`), the products then exact and summed in f32. Where the CPU multiplies f16
//! directly (aarch64 with FEAT_FHM: `fmlal`) that halves a row's arithmetic; elsewhere the float
//! kernel runs on the rounded values, with the same bits.

use half::{f16, slice::HalfFloatSliceExt, vec::HalfFloatVecExt};

/// `x` rounded to f16 (to nearest, ties to even): as f32 for the float kernels and, where the
/// CPU has `fmlal`, as f16 bits.
pub(crate) struct HalfActs {
    rounded: Vec<f32>,
    bits: Option<Vec<u16>>,
}

impl HalfActs {
    /// `x` rounded, the bits kept where `with_bits` (the path has an f16 kernel); `None` where
    /// some value is not finite in f16 (past ±65504, or NaN): the caller then takes the f32
    /// activations as given.
    pub(crate) fn new(x: &[f32], with_bits: bool) -> Option<Self> {
        // `half`'s slice conversions: the CPU's own instructions where it has them.
        let mut h = vec![f16::ZERO; x.len()];
        h.convert_from_f32_slice(x);
        if !h.iter().all(|v| v.is_finite()) {
            return None;
        }
        let mut rounded = vec![0f32; x.len()];
        h.convert_to_f32_slice(&mut rounded);
        Some(HalfActs {
            rounded,
            bits: with_bits.then(|| h.reinterpret_into()),
        })
    }

    /// The rounded activations as f32.
    pub(crate) fn rounded(&self) -> &[f32] {
        &self.rounded
    }

    /// The rounded activations as f16 bits, where made.
    #[cfg_attr(not(target_arch = "aarch64"), allow(dead_code))]
    pub(crate) fn bits(&self) -> Option<&[u16]> {
        self.bits.as_deref()
    }
}
