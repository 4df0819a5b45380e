//! [`experts_ffn`]: the routed experts of one Mixture-of-Experts layer over a step's tokens in two
//! parallel regions, work split by (expert, row chunk): the gate and up products of every expert
//! with their activation, then the down products of every expert, then each token's weighted sum
//! in the experts' order. Each expert's products are those of [`crate::matvec_gated`] /
//! [`crate::matmul`] / [`crate::matvec`] run one expert at a time, bit for bit (the scheduling
//! differs: no fork and join per expert and matrix), but that a prompt's group of fewer than
//! [`crate::INT_TILE_MIN_TOKENS`] tokens in [`Precision::Fast`] takes the decode kernels, as a
//! batched decode step does ([`crate::matvec_batch`]: `Fast` decode's activations, each block's
//! weights unpacked once for the group) rather than `matmul`'s f32 tile, unless
//! `SPARROW_MOE_GROUPS=tile`.

use rayon::prelude::*;

use crate::out_rows::OutPtr;
use crate::product::Product;
use crate::{
    act_mul_inplace, active_path, check_len, check_path, Activation, KernelError, KernelPath,
    Precision, QMatrix,
};

/// One expert's share of an MoE step: its gated FFN (`gate` and `up` are `ff × d`, `down` is
/// `d × ff`) and the tokens routed to it, each with its weight.
#[derive(Debug, Clone, Copy)]
pub struct ExpertJob<'a> {
    /// Gate rows.
    pub gate: &'a QMatrix<'a>,
    /// Up rows.
    pub up: &'a QMatrix<'a>,
    /// Down rows.
    pub down: &'a QMatrix<'a>,
    /// Indices of the step's tokens this expert computes, in order.
    pub tokens: &'a [u32],
    /// The weight of each of those tokens' outputs.
    pub weights: &'a [f32],
}

/// Buffers of [`experts_ffn`], kept by the caller between steps.
#[derive(Debug, Default)]
pub struct ExpertsScratch {
    xs: Vec<f32>,
    g: Vec<f32>,
    ys: Vec<f32>,
}

/// At most this many (token, expert) pairs are prepared (gathered, quantized) on the calling
/// thread rather than in a parallel region of their own.
const SERIAL_PAIRS: usize = 16;

fn grow(v: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if v.len() < len {
        v.resize(len, 0.0);
    }
    &mut v[..len]
}

/// `out[t] += Σ_j weights_j[i] · down_j(act(gate_j · x_t) * (up_j · x_t))` for every job `j` in
/// order and every token `t = tokens_j[i]`: an MoE layer's routed (and shared) experts over the `n`
/// tokens of `x` (`n × d`, token-major). `decode` says the tokens are independent decode steps
/// (each computed as [`crate::matvec`] computes one token); otherwise a group of several tokens
/// takes [`crate::matmul`]'s kernels (a group smaller than [`crate::INT_TILE_MIN_TOKENS`] in
/// [`Precision::Fast`], the decode kernels). `on_gated(j, g)` sees each job's activations (`m × ff`,
/// token-major) before the down products.
#[allow(clippy::too_many_arguments)]
pub fn experts_ffn(
    jobs: &[ExpertJob<'_>],
    act: Activation,
    x: &[f32],
    n: usize,
    out: &mut [f32],
    precision: Precision,
    decode: bool,
    scratch: &mut ExpertsScratch,
    on_gated: &mut dyn FnMut(usize, &[f32]),
) -> Result<(), KernelError> {
    experts_ffn_with(
        active_path(),
        jobs,
        act,
        x,
        n,
        out,
        precision,
        decode,
        scratch,
        on_gated,
    )
}

/// [`experts_ffn`] on an explicit path (for tests and benchmarks).
#[doc(hidden)]
#[allow(clippy::too_many_arguments)]
pub fn experts_ffn_with(
    path: KernelPath,
    jobs: &[ExpertJob<'_>],
    act: Activation,
    x: &[f32],
    n: usize,
    out: &mut [f32],
    precision: Precision,
    decode: bool,
    scratch: &mut ExpertsScratch,
    on_gated: &mut dyn FnMut(usize, &[f32]),
) -> Result<(), KernelError> {
    check_path(path)?;
    let Some(d) = check_jobs(jobs, x, n, out)? else {
        return Ok(());
    };
    let ms: Vec<usize> = jobs.iter().map(|j| j.tokens.len()).collect();
    let ffs: Vec<usize> = jobs.iter().map(|j| j.gate.rows()).collect();
    let xs = split(
        grow(&mut scratch.xs, ms.iter().sum::<usize>() * d),
        &ms,
        |_| d,
    );
    let g_len: usize = ms.iter().zip(&ffs).map(|(m, f)| m * f).sum();
    let mut gs = split(grow(&mut scratch.g, g_len), &ms, |j| ffs[j]);
    // The tokens of each job gathered and prepared for its gate (and up, if of another form).
    let prepare = |(job, xs): (&ExpertJob<'_>, &mut [f32])| {
        for (dst, &t) in xs.chunks_exact_mut(d).zip(job.tokens) {
            let t = t as usize;
            dst.copy_from_slice(&x[t * d..(t + 1) * d]);
        }
        let m = job.tokens.len();
        let pg = Product::new(path, job.gate, xs, m, precision, decode);
        let pu = (job.up.format() != job.gate.format())
            .then(|| Product::new(path, job.up, xs, m, precision, decode));
        (pg, pu)
    };
    let pairs: usize = ms.iter().sum();
    // A decode step's few tokens are quantized on this thread: a parallel region costs more.
    let prepared: Vec<(Product, Option<Product>)> = if pairs <= SERIAL_PAIRS {
        jobs.iter().zip(xs).map(prepare).collect()
    } else {
        jobs.par_iter()
            .zip(xs.into_par_iter())
            .map(prepare)
            .collect()
    };
    let batches: Vec<_> = jobs
        .iter()
        .zip(&prepared)
        .map(|(job, (pg, pu))| {
            let formats = [job.gate.format(), job.up.format()];
            (
                pg.batch(path, &formats),
                pu.as_ref().and_then(|p| p.batch(path, &formats)),
            )
        })
        .collect();
    let xs = &scratch.xs;
    let x_off = offsets(&ms, |_| d);
    // Gate and up of every job, by (job, row chunk), the activation applied per work item.
    let mut items = Vec::new();
    for (j, job) in jobs.iter().enumerate().filter(|&(j, _)| ms[j] > 0) {
        let chunk = prepared[j].0.chunk(path, job.gate).max(1);
        items.extend(
            (0..ffs[j].div_ceil(chunk)).map(|c| (j, c * chunk, chunk.min(ffs[j] - c * chunk))),
        );
    }
    let g_ptrs: Vec<OutPtr> = gs.iter_mut().map(|g| OutPtr(g.as_mut_ptr())).collect();
    let gated = |&(j, r0, nr): &(usize, usize, usize)| {
        let (job, m) = (&jobs[j], ms[j]);
        let xj = &xs[x_off[j]..x_off[j] + m * d];
        let mut g = vec![0f32; m * nr];
        let mut u = vec![0f32; m * nr];
        let (pg, pu) = &prepared[j];
        let (bg, bu) = &batches[j];
        pg.run(path, job.gate, xj, m, r0, &mut g, bg.as_ref());
        match pu {
            Some(pu) => pu.run(path, job.up, xj, m, r0, &mut u, bu.as_ref()),
            None => pg.run(path, job.up, xj, m, r0, &mut u, bg.as_ref()),
        }
        act_mul_inplace(act, &mut g, &u);
        // SAFETY: job `j`'s buffer holds `m * ff` elements and stays mutably borrowed (`gs`) until
        // this region ends; this work item alone writes its rows `r0 .. r0 + nr`.
        unsafe { g_ptrs[j].write_rows(&g, m, ffs[j], r0, nr) };
    };
    run_items(&items, gated);
    drop(batches);
    drop(prepared);
    for (j, g) in gs.iter().enumerate() {
        on_gated(j, g);
    }
    let gs: Vec<&[f32]> = gs.into_iter().map(|g| &*g).collect();
    let ys_len = ms.iter().sum::<usize>() * d;
    let mut ys = split(grow(&mut scratch.ys, ys_len), &ms, |_| d);
    down_products(path, jobs, &ms, &gs, &mut ys, d, precision, decode);
    accumulate(jobs, &ys, n, d, out);
    Ok(())
}

/// Checks the shapes; the hidden size `d`, or `None` when there is nothing to do.
fn check_jobs(
    jobs: &[ExpertJob<'_>],
    x: &[f32],
    n: usize,
    out: &[f32],
) -> Result<Option<usize>, KernelError> {
    let Some(first) = jobs.first() else {
        return Ok(None);
    };
    let d = first.gate.cols();
    check_len("experts_ffn x", n * d, x.len())?;
    check_len("experts_ffn out", n * d, out.len())?;
    for j in jobs {
        check_len("experts_ffn gate columns", d, j.gate.cols())?;
        check_len(
            "experts_ffn up rows (as gate's)",
            j.gate.rows(),
            j.up.rows(),
        )?;
        check_len("experts_ffn up columns", d, j.up.cols())?;
        check_len("experts_ffn down rows", d, j.down.rows())?;
        check_len("experts_ffn down columns", j.gate.rows(), j.down.cols())?;
        check_len("experts_ffn weights", j.tokens.len(), j.weights.len())?;
        if let Some(&t) = j.tokens.iter().find(|&&t| t as usize >= n) {
            return Err(KernelError::RowOutOfRange {
                what: "experts_ffn tokens",
                row: t as usize,
                rows: n,
            });
        }
    }
    Ok((d > 0 && n > 0).then_some(d))
}

/// The down products of every job, by (job, row chunk): `ys[j]` (`m × d`) from `gs[j]` (`m × ff`).
#[allow(clippy::too_many_arguments)]
fn down_products(
    path: KernelPath,
    jobs: &[ExpertJob<'_>],
    ms: &[usize],
    gs: &[&[f32]],
    ys: &mut [&mut [f32]],
    d: usize,
    precision: Precision,
    decode: bool,
) {
    let prepare = |((job, g), &m): ((&ExpertJob<'_>, &&[f32]), &usize)| {
        (job.down.cols() > 0 && m > 0)
            .then(|| Product::new(path, job.down, g, m, precision, decode))
    };
    let prepared: Vec<Option<Product>> = if ms.iter().sum::<usize>() <= SERIAL_PAIRS {
        jobs.iter().zip(gs).zip(ms).map(prepare).collect()
    } else {
        jobs.par_iter()
            .zip(gs.par_iter())
            .zip(ms.par_iter())
            .map(prepare)
            .collect()
    };
    let batches: Vec<_> = jobs
        .iter()
        .zip(&prepared)
        .map(|(job, p)| p.as_ref().and_then(|p| p.batch(path, &[job.down.format()])))
        .collect();
    let mut items = Vec::new();
    for (j, job) in jobs.iter().enumerate() {
        match &prepared[j] {
            // No columns: the products are zero.
            None => ys[j].fill(0.0),
            Some(p) => {
                let chunk = p.chunk(path, job.down).max(1);
                items.extend(
                    (0..d.div_ceil(chunk)).map(|c| (j, c * chunk, chunk.min(d - c * chunk))),
                );
            }
        }
    }
    let y_ptrs: Vec<OutPtr> = ys.iter_mut().map(|y| OutPtr(y.as_mut_ptr())).collect();
    let down = |&(j, r0, nr): &(usize, usize, usize)| {
        let m = ms[j];
        let mut y = vec![0f32; m * nr];
        if let Some(p) = &prepared[j] {
            p.run(
                path,
                jobs[j].down,
                gs[j],
                m,
                r0,
                &mut y,
                batches[j].as_ref(),
            );
        }
        // SAFETY: job `j`'s output holds `m * d` elements and stays mutably borrowed (`ys`) until
        // this region ends; this work item alone writes its rows `r0 .. r0 + nr`.
        unsafe { y_ptrs[j].write_rows(&y, m, d, r0, nr) };
    };
    run_items(&items, down);
}

/// `out[t] += w · ys[j][i]` for every job `j` in order and each of its tokens `t = tokens[i]`.
fn accumulate(jobs: &[ExpertJob<'_>], ys: &[&mut [f32]], n: usize, d: usize, out: &mut [f32]) {
    let add = |j: usize, i: usize, w: f32, o: &mut [f32]| {
        crate::axpy_f32(w, &ys[j][i * d..(i + 1) * d], o);
    };
    if n == 1 {
        for (j, job) in jobs.iter().enumerate() {
            for (i, &w) in job.weights.iter().enumerate() {
                add(j, i, w, &mut out[..d]);
            }
        }
        return;
    }
    // Each token's (job, index, weight), jobs in order (a counting sort by token).
    let mut start = vec![0usize; n + 1];
    for job in jobs {
        for &t in job.tokens {
            start[t as usize + 1] += 1;
        }
    }
    for t in 0..n {
        start[t + 1] += start[t];
    }
    let mut fill = start.clone();
    let mut list = vec![(0usize, 0usize, 0f32); start[n]];
    for (j, job) in jobs.iter().enumerate() {
        for (i, (&t, &w)) in job.tokens.iter().zip(job.weights).enumerate() {
            list[fill[t as usize]] = (j, i, w);
            fill[t as usize] += 1;
        }
    }
    out.par_chunks_mut(d).enumerate().for_each(|(t, o)| {
        for &(j, i, w) in &list[start[t]..start[t + 1]] {
            add(j, i, w, o);
        }
    });
}

/// Runs `f` on every item, in one parallel region when there are several.
fn run_items<T: Sync>(items: &[T], f: impl Fn(&T) + Sync + Send) {
    if items.len() <= 1 {
        items.iter().for_each(f);
    } else {
        items.par_iter().for_each(f);
    }
}

/// Start of each job's part of a buffer of `ms[j] * width(j)` elements per job.
fn offsets(ms: &[usize], width: impl Fn(usize) -> usize) -> Vec<usize> {
    let mut acc = 0;
    ms.iter()
        .enumerate()
        .map(|(j, &m)| {
            let o = acc;
            acc += m * width(j);
            o
        })
        .collect()
}

/// `buf` cut into one part of `ms[j] * width(j)` elements per job.
fn split<'b>(
    mut buf: &'b mut [f32],
    ms: &[usize],
    width: impl Fn(usize) -> usize,
) -> Vec<&'b mut [f32]> {
    let mut parts = Vec::with_capacity(ms.len());
    for (j, &m) in ms.iter().enumerate() {
        let (part, rest) = std::mem::take(&mut buf).split_at_mut(m * width(j));
        parts.push(part);
        buf = rest;
    }
    parts
}
