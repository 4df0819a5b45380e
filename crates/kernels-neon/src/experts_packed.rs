//! [`experts_ffn_packed`]: the routed experts of one Mixture-of-Experts layer for **one token**,
//! every matrix a [`Q40x8`] copy (eight rows interleaved): what a one-token decode step runs when
//! the model's Q4_0 experts were repacked at load. Bit for bit [`crate::experts_ffn`] over the
//! original matrices in [`crate::Precision::Fast`] on the AVX2 and AVX-512 paths (each copy's rows
//! are the original's `matvec` bits, the activation and the weighted sum are the same functions in
//! the same order), in the same two parallel regions: gate and up with the activation by
//! (expert, row chunk), then down by (expert, row chunk).

use rayon::prelude::*;

use crate::q40x8::Acts8;
use crate::{
    act_mul_inplace, active_path, check_len, check_path, matvec_chunk, Activation, KernelError,
    KernelPath, Q40x8,
};

/// Rows of a [`Q40x8`] group: every work item's first row is a multiple of it.
const GROUP: usize = 8;

/// One expert's repacked matrices (`gate` and `up` are `ff × d`, `down` is `d × ff`) and the weight
/// of its output for the step's token.
#[derive(Clone, Copy)]
pub struct PackedExpertJob<'a> {
    /// Gate rows.
    pub gate: &'a Q40x8,
    /// Up rows.
    pub up: &'a Q40x8,
    /// Down rows.
    pub down: &'a Q40x8,
    /// The weight of this expert's output.
    pub weight: f32,
}

/// `out += Σ_j weight_j · down_j(act(gate_j · x) * (up_j · x))` for the one token `x` (`d`), jobs
/// in order, on the active path. `on_gated(j, g)` sees each job's activations (`ff`) before the
/// down products.
pub fn experts_ffn_packed(
    jobs: &[PackedExpertJob<'_>],
    act: Activation,
    x: &[f32],
    out: &mut [f32],
    on_gated: &mut dyn FnMut(usize, &[f32]),
) -> Result<(), KernelError> {
    experts_ffn_packed_with(active_path(), jobs, act, x, out, on_gated)
}

/// [`experts_ffn_packed`] on an explicit path (for tests and benchmarks).
#[doc(hidden)]
pub fn experts_ffn_packed_with(
    path: KernelPath,
    jobs: &[PackedExpertJob<'_>],
    act: Activation,
    x: &[f32],
    out: &mut [f32],
    on_gated: &mut dyn FnMut(usize, &[f32]),
) -> Result<(), KernelError> {
    check_path(path)?;
    let d = x.len();
    check_len("experts_ffn_packed out", d, out.len())?;
    for j in jobs {
        check_len("experts_ffn_packed gate columns", d, j.gate.cols())?;
        check_len("experts_ffn_packed up rows", j.gate.rows(), j.up.rows())?;
        check_len("experts_ffn_packed up columns", d, j.up.cols())?;
        check_len("experts_ffn_packed down rows", d, j.down.rows())?;
        check_len(
            "experts_ffn_packed down columns",
            j.gate.rows(),
            j.down.cols(),
        )?;
    }
    if jobs.is_empty() || d == 0 {
        return Ok(());
    }
    let acts = Acts8::new(path, x);
    let mut gs: Vec<Vec<f32>> = jobs.iter().map(|j| vec![0f32; j.gate.rows()]).collect();
    let gated = |(j, r0, g): (usize, usize, &mut [f32])| {
        let mut u = vec![0f32; g.len()];
        jobs[j].gate.run_rows(path, &acts, r0, g);
        jobs[j].up.run_rows(path, &acts, r0, &mut u);
        act_mul_inplace(act, g, &u);
    };
    run_items(items(&mut gs), gated);
    for (j, g) in gs.iter().enumerate() {
        on_gated(j, g);
    }
    let down_acts: Vec<Acts8> = gs.iter().map(|g| Acts8::new(path, g)).collect();
    let mut ys: Vec<Vec<f32>> = jobs.iter().map(|_| vec![0f32; d]).collect();
    let down = |(j, r0, y): (usize, usize, &mut [f32])| {
        jobs[j].down.run_rows(path, &down_acts[j], r0, y);
    };
    run_items(items(&mut ys), down);
    for (job, y) in jobs.iter().zip(&ys) {
        crate::axpy_f32(job.weight, y, out);
    }
    Ok(())
}

/// The work items over every job's output `outs[j]`: (job, first row, that row chunk), chunks cut
/// as a one-token product cuts them, rounded up to whole groups.
fn items(outs: &mut [Vec<f32>]) -> Vec<(usize, usize, &mut [f32])> {
    let mut items = Vec::new();
    for (j, o) in outs.iter_mut().enumerate() {
        let chunk = matvec_chunk(o.len()).next_multiple_of(GROUP);
        for (c, oc) in o.chunks_mut(chunk).enumerate() {
            items.push((j, c * chunk, oc));
        }
    }
    items
}

/// Runs `f` on every item, in one parallel region when there are several.
fn run_items<'o>(
    items: Vec<(usize, usize, &'o mut [f32])>,
    f: impl Fn((usize, usize, &'o mut [f32])) + Sync + Send,
) {
    if items.len() <= 1 {
        items.into_iter().for_each(f);
    } else {
        items.into_par_iter().for_each(f);
    }
}
