//! A gated FFN's first half in one parallel region ([`matvec_gated`]): the gate and up products of
//! a row chunk and the activation of their product, per work item, so no thread waits on another
//! while one applies the activation to the whole vector.

use rayon::prelude::*;

use crate::batch::{batch_chunk, Prepared};
use crate::out_rows::OutPtr;
use crate::{
    active_path, check_len, check_path, check_tokens, chunk_rows_setting, matvec_chunk, Activation,
    KernelError, KernelPath, Precision, QMatrix,
};

/// `out[t*rows + r] = act(dot(gate[r], x[t])) * dot(up[r], x[t])` for the `n` tokens of `x`
/// (token-major rows of `gate.cols()`): each token's row bit for bit what [`crate::matvec`] (or
/// [`crate::matvec_batch`] for several tokens) of both matrices followed by
/// [`crate::act_mul_inplace`] gives. `gate` and `up` must have the same
/// shape.
pub fn matvec_gated(
    gate: &QMatrix,
    up: &QMatrix,
    act: Activation,
    x: &[f32],
    n: usize,
    out: &mut [f32],
    precision: Precision,
) -> Result<(), KernelError> {
    matvec_gated_with(active_path(), gate, up, act, x, n, out, precision)
}

/// [`matvec_gated`] on an explicit path (for tests and benchmarks).
#[doc(hidden)]
#[allow(clippy::too_many_arguments)]
pub fn matvec_gated_with(
    path: KernelPath,
    gate: &QMatrix,
    up: &QMatrix,
    act: Activation,
    x: &[f32],
    n: usize,
    out: &mut [f32],
    precision: Precision,
) -> Result<(), KernelError> {
    check_path(path)?;
    check_len("matvec_gated up rows (as gate's)", gate.rows(), up.rows())?;
    check_len(
        "matvec_gated up columns (as gate's)",
        gate.cols(),
        up.cols(),
    )?;
    check_tokens(["matvec_gated x", "matvec_gated out"], gate, x, n, out)?;
    let rows = gate.rows();
    if n == 0 || rows == 0 {
        return Ok(());
    }
    if gate.cols() == 0 {
        // Both products are zero, and so is the activation's product.
        out.fill(0.0);
        return Ok(());
    }
    let ws = [gate, up];
    let prepared = Prepared::new(path, &ws, x, n, precision);
    let ready = prepared.ready(path);
    let chunk = gated_chunk(gate, n);
    let out_ptr = OutPtr(out.as_mut_ptr());
    // Work items: the first row and the rows of a chunk, of every token's output; each item's up
    // products in a buffer of its own (made and freed on the thread that runs it).
    let items: Vec<(usize, usize)> = (0..rows.div_ceil(chunk))
        .map(|c| (c * chunk, chunk.min(rows - c * chunk)))
        .collect();
    let run = |&(r0, nr): &(usize, usize)| {
        // SAFETY: `out` holds `n * rows` elements (checked) and stays mutably borrowed until the
        // items are done; this item alone covers rows `r0 .. r0 + nr`.
        let mut gs = unsafe { out_ptr.token_rows(n, rows, r0, nr) };
        let mut ups = vec![0f32; n * nr];
        let mut us: Vec<&mut [f32]> = ups.chunks_mut(nr).collect();
        ready.run(0, r0, x, &mut gs);
        ready.run(1, r0, x, &mut us);
        for (g, u) in gs.iter_mut().zip(&us) {
            crate::act_mul_inplace(act, g, u);
        }
    };
    if items.len() <= 1 {
        items.iter().for_each(run);
    } else {
        items.par_iter().for_each(run);
    }
    Ok(())
}

/// Rows of both matrices per work item: as many items as the two products would take apart
/// ([`crate::matvec_many`] for one token, [`crate::matvec_batch_many`] for several), each
/// covering the same rows of both.
fn gated_chunk(gate: &QMatrix, n: usize) -> usize {
    let set = chunk_rows_setting();
    if set > 0 {
        return set;
    }
    let per_matrix = if n == 1 {
        matvec_chunk(2 * gate.rows())
    } else {
        batch_chunk(gate)
    };
    (per_matrix / 2).next_multiple_of(4).max(4)
}
