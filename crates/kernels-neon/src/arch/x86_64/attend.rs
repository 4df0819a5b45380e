//! The block attention of `arch/attend_block.rs` instantiated under AVX2/FMA (16 lanes = two ymm)
//! and AVX-512F (one zmm).

use crate::arch::attend_block::attend_block;

/// # Safety
/// AVX2, FMA and F16C present.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn attend_block_avx2(
    q: &[f32],
    lens: &[usize],
    starts: &[usize],
    hd: usize,
    kt: &[f32],
    nkp: usize,
    v: &[f32],
    scale: f32,
    s: &mut Vec<f32>,
    out: &mut [f32],
) {
    attend_block(q, lens, starts, hd, kt, nkp, v, scale, s, out)
}

/// # Safety
/// AVX-512F, AVX2, FMA and F16C present.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn attend_block_avx512(
    q: &[f32],
    lens: &[usize],
    starts: &[usize],
    hd: usize,
    kt: &[f32],
    nkp: usize,
    v: &[f32],
    scale: f32,
    s: &mut Vec<f32>,
    out: &mut [f32],
) {
    attend_block(q, lens, starts, hd, kt, nkp, v, scale, s, out)
}
