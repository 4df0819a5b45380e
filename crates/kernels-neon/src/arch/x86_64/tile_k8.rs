//! The AVX2 8-bit prompt tile of Q4_K/Q5_K/Q6_K weights that `matmul` no longer takes (it takes
//! `tile_k8_lanes.rs`: 1.9x this one's rate for Q4_K, 1.6x for Q6_K), kept as the bit-identical
//! form (each result equal to `matvec_int8`'s): `panel_k8.rs`'s kernels over blocks of [`ROWS`] rows × [`TOKENS`] tokens, so a
//! super-block's activations of the tokens (4 KiB) stay in L1 while every row of the block passes
//! over them, and the work item's rows stay in L2 while every token block passes over them.

use super::kquant_super::SuperActs;
use super::panel_k8::{k_super_panel, PanelScratch};
use crate::quant::QActs;
use crate::QMatrix;

/// Rows of a panel.
const ROWS: usize = 16;
/// Tokens of a panel.
const TOKENS: usize = 16;

/// `out[t * nr + i]` = row `r0 + i` of `w` · token `t` (activations `acts[t]`, quantized by
/// `QActs::quantize_super`), bit-identical to `matvec_int8` of that token.
///
/// # Safety
/// AVX2/FMA/F16C present; `w` is Q4_K, Q5_K or Q6_K.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn tile_k8(w: &QMatrix, r0: usize, nr: usize, acts: &[QActs], out: &mut [f32]) {
    let n = acts.len();
    assert!(out.len() >= n * nr && r0 + nr <= w.rows());
    let xs: Vec<SuperActs> = acts
        .iter()
        .map(|a| SuperActs {
            x: &a.qs,
            d: &a.d,
            s: &a.s,
        })
        .collect();
    let mut scratch = PanelScratch::new(ROWS * TOKENS);
    let mut res = [0f32; ROWS * TOKENS];
    for t0 in (0..n).step_by(TOKENS) {
        let xg = &xs[t0..(t0 + TOKENS).min(n)];
        let mut slots: [&[u8]; ROWS] = [&[]; ROWS];
        for i0 in (0..nr).step_by(ROWS) {
            let m = ROWS.min(nr - i0);
            for (i, slot) in slots.iter_mut().take(m).enumerate() {
                *slot = w.row_data(r0 + i0 + i);
            }
            let rows = &slots[..m];
            // SAFETY: AVX2/FMA/F16C present and the format checked per this function's
            // contract; the kernel asserts the lengths it reads.
            unsafe { k_super_panel(w.format(), rows, xg, &mut scratch, &mut res) };
            for (r, vals) in res.chunks(xg.len()).take(rows.len()).enumerate() {
                for (c, &v) in vals.iter().enumerate() {
                    out[(t0 + c) * nr + i0 + r] = v;
                }
            }
        }
    }
}
