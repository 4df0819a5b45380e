//! Small-batch `matvec` with 16-bit activations ([`crate::matvec_batch`] in
//! [`Precision::Fast`](crate::Precision::Fast)): each weight block is widened
//! to i16 once and dotted (`smull`/`smlal`) with every token's activations,
//! so the unpacking is paid once per batch. Per token the operations are
//! those of [`super::matvec_i16`](fn@super::matvec_i16)'s kernel, in the same order: the results
//! are bit-identical. (Not on `dotprod` CPUs, whose `matvec_i16` differs: one call per token.)

use std::arch::aarch64::*;

use super::dequant::weights_i8;
use super::matvec_i16::matvec_i16;
use super::matvec_split::has_split;
use super::simd::{f16_at, load_i16x8};
use crate::arch::tags::{block_bytes, has_min, IQ4_NL, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};
use crate::arch::Rows;
use crate::quant::QActs16;
use crate::WeightFormat;
use crate::{KernelPath, QMatrix};

/// Dots of one row with the activations of `T` tokens.
#[target_feature(enable = "neon")]
fn dot_i16_tokens<const F: u8, const T: usize>(row: &[u8], xq: [&QActs16; T]) -> [f32; T] {
    let bb = block_bytes(F);
    let mut sumv = [vdupq_n_f32(0.0); T];
    let mut extra = [0f32; T];
    for (b, blk) in row.chunks_exact(bb).enumerate() {
        let (w0, w1) = weights_i8::<F>(blk);
        let w = [
            vmovl_s8(vget_low_s8(w0)),
            vmovl_high_s8(w0),
            vmovl_s8(vget_low_s8(w1)),
            vmovl_high_s8(w1),
        ];
        let (dw, mw) = (
            f16_at(blk, 0),
            if has_min(F) { f16_at(blk, 2) } else { 0.0 },
        );
        for (t, q) in xq.iter().enumerate() {
            let qx = &q.qs[b * 32..b * 32 + 32];
            let x = [
                load_i16x8(&qx[0..]),
                load_i16x8(&qx[8..]),
                load_i16x8(&qx[16..]),
                load_i16x8(&qx[24..]),
            ];
            let (dx, sx) = (q.d[b], q.s[b]);
            let mut s = vmull_s16(vget_low_s16(w[0]), vget_low_s16(x[0]));
            let mut u = vmull_s16(vget_low_s16(w[1]), vget_low_s16(x[1]));
            s = vmlal_high_s16(s, w[0], x[0]);
            u = vmlal_high_s16(u, w[1], x[1]);
            s = vmlal_s16(s, vget_low_s16(w[2]), vget_low_s16(x[2]));
            u = vmlal_s16(u, vget_low_s16(w[3]), vget_low_s16(x[3]));
            s = vmlal_high_s16(s, w[2], x[2]);
            u = vmlal_high_s16(u, w[3], x[3]);
            let isum = vaddq_s32(s, u);
            sumv[t] = vfmaq_n_f32(sumv[t], vcvtq_f32_s32(isum), dw * dx);
            if has_min(F) {
                extra[t] += mw * sx;
            }
        }
    }
    std::array::from_fn(|t| vaddvq_f32(sumv[t]) + extra[t])
}

/// Rows `r0..r0 + ys[t].len()` for every token `t`, one row at a time: its tokens 4 at a time, then
/// 2, then 1.
#[target_feature(enable = "neon")]
fn batch_q<const F: u8>(w: &QMatrix<'_>, r0: usize, xq: &[&QActs16], ys: &mut [&mut [f32]]) {
    for r in 0..ys[0].len() {
        let row = w.row_data(r0 + r);
        let mut t = 0;
        while t < xq.len() {
            let left = xq.len() - t;
            let done = if left >= 4 {
                let d = dot_i16_tokens::<F, 4>(row, [xq[t], xq[t + 1], xq[t + 2], xq[t + 3]]);
                ys[t..t + 4].iter_mut().zip(d).for_each(|(y, v)| y[r] = v);
                4
            } else if left >= 2 {
                let d = dot_i16_tokens::<F, 2>(row, [xq[t], xq[t + 1]]);
                ys[t..t + 2].iter_mut().zip(d).for_each(|(y, v)| y[r] = v);
                2
            } else {
                let [v] = dot_i16_tokens::<F, 1>(row, [xq[t]]);
                ys[t][r] = v;
                1
            };
            t += done;
        }
    }
}

/// `ys[t][i] = dot(W[r0 + i], x_t)` for every token `t` (all `ys[t]` of one length): the
/// 32-element block formats share each block's unpacking across 4 (or 2) tokens at a time; the
/// others run [`matvec_i16`] once per token.
#[target_feature(enable = "neon")]
pub(crate) fn matvec_i16_batch(
    w: &QMatrix<'_>,
    r0: usize,
    xq: &[&QActs16],
    ys: &mut [&mut [f32]],
    path: KernelPath,
) {
    let dotprod = path != KernelPath::Neon;
    assert_eq!(xq.len(), ys.len());
    let nb = w.cols() / 32;
    let fits = !ys.is_empty()
        && ys.iter().all(|y| y.len() == ys[0].len())
        && r0 + ys[0].len() <= w.rows()
        && xq
            .iter()
            .all(|q| q.d.len() == nb && q.qs.len() >= nb * 32 && q.s.len() >= nb);
    let per_token = |ys: &mut [&mut [f32]]| {
        for (q, y) in xq.iter().zip(ys.iter_mut()) {
            matvec_i16(w, Rows::From(r0), q, y, path, None)
        }
    };
    // With `dotprod` the 32-element formats' `matvec_i16` is `sdot`/`udot` (`matvec_split.rs`),
    // which this batch kernel's `smull` lanes would not match bit for bit: one call per token.
    if !fits || (dotprod && has_split(w.format())) {
        return per_token(ys);
    }
    match w.format() {
        WeightFormat::Q8_0 => batch_q::<Q8_0>(w, r0, xq, ys),
        WeightFormat::Q4_0 => batch_q::<Q4_0>(w, r0, xq, ys),
        WeightFormat::Q4_1 => batch_q::<Q4_1>(w, r0, xq, ys),
        WeightFormat::Q5_0 => batch_q::<Q5_0>(w, r0, xq, ys),
        WeightFormat::Q5_1 => batch_q::<Q5_1>(w, r0, xq, ys),
        WeightFormat::IQ4_NL => batch_q::<IQ4_NL>(w, r0, xq, ys),
        _ => per_token(ys),
    }
}
