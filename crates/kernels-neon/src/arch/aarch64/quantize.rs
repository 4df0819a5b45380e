//! Activation quantizers (8- and 16-bit): NEON has none yet, so the scalar
//! reference (`QBlocks::quantize_scalar`) runs; it computes the same f32
//! operations as the SIMD quantizers of other paths, so the quants are the
//! same on every path.

use crate::quant::{QActs, QActs16};

/// Always `false` (writes nothing): no NEON 8-bit quantizer.
pub(crate) fn quantize(x: &[f32], out: &mut QActs) -> bool {
    let _ = (x, out);
    false
}

/// Always `false` (writes nothing): no NEON 16-bit quantizer.
pub(crate) fn quantize16(x: &[f32], out: &mut QActs16) -> bool {
    let _ = (x, out);
    false
}
