//! Several products of one vector over [`Q40x8`] matrices in one parallel region, with the vector
//! quantized once: what a decode step runs for the q/k/v projections ([`Q40x8::matvec_many`]) and
//! for a gated FFN's gate and up with the activation ([`Q40x8::matvec_gated`]). Each matrix's
//! result is bit for bit its own [`Q40x8::matvec_with`] (a group's 8 dots do not depend on how
//! rows are cut into work items).

use rayon::prelude::*;

use crate::q40x8::Acts8;
use crate::{check_len, check_path, matvec_chunk, Activation, KernelError, KernelPath, Q40x8};

/// Rows of a group.
const GROUP: usize = 8;

impl Q40x8 {
    /// `ys[i] = ws[i] x` for every matrix, on the active path.
    pub fn matvec_many(ws: &[&Q40x8], x: &[f32], ys: &mut [&mut [f32]]) -> Result<(), KernelError> {
        Self::matvec_many_with(crate::active_path(), ws, x, ys)
    }

    /// [`Q40x8::matvec_many`] on an explicit path.
    pub fn matvec_many_with(
        path: KernelPath,
        ws: &[&Q40x8],
        x: &[f32],
        ys: &mut [&mut [f32]],
    ) -> Result<(), KernelError> {
        check_path(path)?;
        check_len("q40x8 matvec_many outputs", ws.len(), ys.len())?;
        for (w, y) in ws.iter().zip(ys.iter()) {
            check_len("q40x8 matvec_many x", w.cols(), x.len())?;
            check_len("q40x8 matvec_many y", w.rows(), y.len())?;
        }
        let acts = Acts8::new(path, x);
        let total: usize = ws.iter().map(|w| w.rows()).sum();
        let chunk = matvec_chunk(total).next_multiple_of(GROUP);
        // Work items: (matrix, first row, that row chunk of its output).
        let mut items: Vec<(usize, usize, &mut [f32])> = Vec::new();
        for (i, y) in ys.iter_mut().enumerate() {
            for (c, yc) in y.chunks_mut(chunk).enumerate() {
                items.push((i, c * chunk, yc));
            }
        }
        let run = |(i, r0, yc): (usize, usize, &mut [f32])| ws[i].run_rows(path, &acts, r0, yc);
        if items.len() <= 1 {
            items.into_iter().for_each(run);
        } else {
            items.into_par_iter().for_each(run);
        }
        Ok(())
    }

    /// `out = act(gate x) * (up x)` (element-wise), on the active path: bit for bit both
    /// [`Q40x8::matvec`]s followed by [`crate::act_mul_inplace`]. `gate` and `up` must have the
    /// same shape.
    pub fn matvec_gated(
        gate: &Q40x8,
        up: &Q40x8,
        act: Activation,
        x: &[f32],
        out: &mut [f32],
    ) -> Result<(), KernelError> {
        Self::matvec_gated_with(crate::active_path(), gate, up, act, x, out)
    }

    /// [`Q40x8::matvec_gated`] on an explicit path.
    pub fn matvec_gated_with(
        path: KernelPath,
        gate: &Q40x8,
        up: &Q40x8,
        act: Activation,
        x: &[f32],
        out: &mut [f32],
    ) -> Result<(), KernelError> {
        check_path(path)?;
        check_len("q40x8 matvec_gated up rows", gate.rows(), up.rows())?;
        check_len("q40x8 matvec_gated up columns", gate.cols(), up.cols())?;
        check_len("q40x8 matvec_gated x", gate.cols(), x.len())?;
        check_len("q40x8 matvec_gated out", gate.rows(), out.len())?;
        let acts = Acts8::new(path, x);
        let chunk = (matvec_chunk(2 * gate.rows()) / 2)
            .max(1)
            .next_multiple_of(GROUP);
        let run = |r0: usize, g: &mut [f32]| {
            let mut u = vec![0f32; g.len()];
            gate.run_rows(path, &acts, r0, g);
            up.run_rows(path, &acts, r0, &mut u);
            crate::act_mul_inplace(act, g, &u);
        };
        if gate.rows() <= chunk {
            run(0, out);
        } else {
            out.par_chunks_mut(chunk)
                .enumerate()
                .for_each(|(c, g)| run(c * chunk, g));
        }
        Ok(())
    }
}
