//! [`experts_ffn`]: the routed experts of one Mixture-of-Experts layer over a step's tokens in two
//! parallel regions, work split by (expert, row chunk): the gate and up products of every expert
//! with their activation, then the down products of every expert, then each token's weighted sum
//! in the experts' order. Each expert's products are those of [`crate::matvec_gated`] /
//! [`crate::matmul()`] / [`crate::matvec`] run one expert at a time, bit for bit (the scheduling
//! differs: no fork and join per expert and matrix), but that a prompt's group of fewer than
//! [`crate::INT_TILE_MIN_TOKENS`] tokens in [`Precision::Fast`] takes the decode kernels, as a
//! batched decode step does ([`crate::matvec_batch`]: `Fast` decode's activations, each block's
//! weights unpacked once for the group) rather than `matmul`'s f32 tile, unless
//! `SPARROW_MOE_GROUPS=tile` or `matmul` takes its 16-bit tile for the group (on aarch64 with
//! `dotprod`, from [`crate::short_prompt_tokens`] tokens). A job that brings its matrices'
//! [`Q40x8`] copies ([`ExpertJob::copies`]) runs those decode kernels' products over the copies
//! on the AVX2 and AVX-512 paths, with the same bits (each copy's rows are the original's `matvec`
//! bits).

use rayon::prelude::*;

use crate::out_rows::OutPtr;
use crate::product::Product;
use crate::q40x8::Acts8;
use crate::{
    act_mul_inplace, active_path, check_len, check_path, matvec_chunk, matvec_precision,
    Activation, KernelError, KernelPath, Precision, Q40x8, QMatrix,
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
    /// The three matrices repacked eight rows at a time, where the caller made copies: the
    /// products that would run the decode kernels (one token, a decode step, a `Fast` prompt's
    /// small group) read them instead, with the same bits.
    pub copies: Option<ExpertCopies<'a>>,
}

/// An expert's gate, up and down repacked ([`Q40x8`]), each of its original's shape.
#[derive(Clone, Copy)]
pub struct ExpertCopies<'a> {
    /// Gate rows.
    pub gate: &'a Q40x8,
    /// Up rows.
    pub up: &'a Q40x8,
    /// Down rows.
    pub down: &'a Q40x8,
}

impl std::fmt::Debug for ExpertCopies<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shape = |m: &Q40x8| (m.rows(), m.cols());
        f.debug_struct("ExpertCopies")
            .field("gate", &shape(self.gate))
            .field("up", &shape(self.up))
            .field("down", &shape(self.down))
            .finish()
    }
}

/// A job's activations, prepared once: products over its matrices, or each token's for its
/// copies (held beside them).
enum Prepared<'a> {
    /// Gate's product, and up's where its format differs.
    Products(Product, Option<Product>),
    /// Each token's 16-bit activations, and the copies they are for.
    Copies(Vec<Acts8>, ExpertCopies<'a>),
}

/// Rows of a [`Q40x8`] group: a copy's work items start and end on multiples of it.
const GROUP: usize = 8;

/// Job `job`'s copies where its `m` tokens take them: it has them, its products would run the
/// decode kernels of `Fast`, the copies give those kernels' bits on `path`
/// ([`Q40x8::exact_on`]), and one token where the copies do not serve steps of several
/// ([`Q40x8::serves_steps_on`]: Q4_K's, Q5_K's and Q8_0's on x86, as a dense decode step's),
/// where the originals' batch kernels unpack each block once for all.
fn takes_copies<'a>(
    path: KernelPath,
    job: &ExpertJob<'a>,
    m: usize,
    precision: Precision,
    decode: bool,
) -> Option<ExpertCopies<'a>> {
    job.copies.filter(|c| {
        m > 0
            && precision == Precision::Fast
            && [c.gate, c.up, c.down].iter().all(|w| {
                Q40x8::exact_on(path, w.format())
                    && matvec_precision(path, w.format(), precision) == Precision::Fast
                    && (m == 1 || w.serves_steps_on(path))
            })
            && [c.gate, c.up, c.down]
                .iter()
                .all(|w| Product::per_token(path, w.format(), m, precision, decode))
    })
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
/// takes [`crate::matmul()`]'s kernels (a group smaller than [`crate::INT_TILE_MIN_TOKENS`] in
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
    let copies: Vec<Option<ExpertCopies>> = jobs
        .iter()
        .zip(&ms)
        .map(|(job, &m)| takes_copies(path, job, m, precision, decode))
        .collect();
    // The tokens of each job gathered and prepared for its gate (and up, if of another form), or
    // for its copies.
    let prepare = |(j, (job, xs)): (usize, (&ExpertJob<'_>, &mut [f32]))| {
        for (dst, &t) in xs.chunks_exact_mut(d).zip(job.tokens) {
            let t = t as usize;
            dst.copy_from_slice(&x[t * d..(t + 1) * d]);
        }
        if let Some(c) = copies[j] {
            let acts = xs.chunks_exact(d).map(|xt| Acts8::new(path, xt)).collect();
            return Prepared::Copies(acts, c);
        }
        let m = job.tokens.len();
        let pg = Product::new(path, job.gate, xs, m, precision, decode);
        let pu = (job.up.format() != job.gate.format())
            .then(|| Product::new(path, job.up, xs, m, precision, decode));
        Prepared::Products(pg, pu)
    };
    let pairs: usize = ms.iter().sum();
    // A decode step's few tokens are quantized on this thread: a parallel region costs more.
    let prepared: Vec<Prepared> = if pairs <= SERIAL_PAIRS {
        jobs.iter().zip(xs).enumerate().map(prepare).collect()
    } else {
        jobs.par_iter()
            .zip(xs.into_par_iter())
            .enumerate()
            .map(prepare)
            .collect()
    };
    let batches = gate_up_batches(path, jobs, &prepared);
    let xs = &scratch.xs;
    let x_off = offsets(&ms, |_| d);
    // Gate and up of every job, by (job, row chunk), the activation applied per work item.
    let mut items = Vec::new();
    for (j, job) in jobs.iter().enumerate().filter(|&(j, _)| ms[j] > 0) {
        let chunk = match &prepared[j] {
            Prepared::Products(pg, _) => pg.chunk(path, job.gate).max(1),
            Prepared::Copies(..) => matvec_chunk(ffs[j]).next_multiple_of(GROUP),
        };
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
        match (&prepared[j], &batches[j]) {
            (Prepared::Copies(acts, c), _) => {
                c.gate.run_rows_tokens(path, acts, r0, &mut g);
                c.up.run_rows_tokens(path, acts, r0, &mut u);
            }
            (Prepared::Products(pg, pu), (bg, bu)) => {
                pg.run(path, job.gate, xj, m, r0, &mut g, bg.as_ref());
                match pu {
                    Some(pu) => pu.run(path, job.up, xj, m, r0, &mut u, bu.as_ref()),
                    None => pg.run(path, job.up, xj, m, r0, &mut u, bg.as_ref()),
                }
            }
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
    down_products(path, jobs, &ms, &copies, &gs, &mut ys, d, precision, decode);
    accumulate(jobs, &ys, n, d, out);
    Ok(())
}

/// Per job, the batch kernels' views of its gate and up products.
type GateUpBatches<'p> = Vec<(
    Option<crate::arch::Batch16<'p>>,
    Option<crate::arch::Batch16<'p>>,
)>;

/// The batch kernels' views of each job's gate and up products ([`Product::batch`]; none for
/// copies).
fn gate_up_batches<'p>(
    path: KernelPath,
    jobs: &[ExpertJob<'_>],
    prepared: &'p [Prepared<'_>],
) -> GateUpBatches<'p> {
    jobs.iter()
        .zip(prepared)
        .map(|(job, p)| match p {
            Prepared::Products(pg, pu) => {
                let formats = [job.gate.format(), job.up.format()];
                (
                    pg.batch(path, &formats),
                    pu.as_ref().and_then(|p| p.batch(path, &formats)),
                )
            }
            Prepared::Copies(..) => (None, None),
        })
        .collect()
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
        if let Some(c) = &j.copies {
            for (rows, cols, copy, m) in [
                (
                    "experts_ffn gate copy rows",
                    "experts_ffn gate copy columns",
                    c.gate,
                    j.gate,
                ),
                (
                    "experts_ffn up copy rows",
                    "experts_ffn up copy columns",
                    c.up,
                    j.up,
                ),
                (
                    "experts_ffn down copy rows",
                    "experts_ffn down copy columns",
                    c.down,
                    j.down,
                ),
            ] {
                check_len(rows, m.rows(), copy.rows())?;
                check_len(cols, m.cols(), copy.cols())?;
            }
        }
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

/// The down products of every job, by (job, row chunk): `ys[j]` (`m × d`) from `gs[j]` (`m × ff`),
/// over the job's copies where `copies[j]` holds them.
#[allow(clippy::too_many_arguments)]
fn down_products(
    path: KernelPath,
    jobs: &[ExpertJob<'_>],
    ms: &[usize],
    copies: &[Option<ExpertCopies<'_>>],
    gs: &[&[f32]],
    ys: &mut [&mut [f32]],
    d: usize,
    precision: Precision,
    decode: bool,
) {
    let prepare = |(j, ((job, g), &m)): (usize, ((&ExpertJob<'_>, &&[f32]), &usize))| {
        let ff = job.down.cols();
        (ff > 0 && m > 0).then(|| match copies[j] {
            Some(c) => Prepared::Copies(
                g.chunks_exact(ff).map(|gt| Acts8::new(path, gt)).collect(),
                c,
            ),
            None => Prepared::Products(Product::new(path, job.down, g, m, precision, decode), None),
        })
    };
    let prepared: Vec<Option<Prepared>> = if ms.iter().sum::<usize>() <= SERIAL_PAIRS {
        jobs.iter()
            .zip(gs)
            .zip(ms)
            .enumerate()
            .map(prepare)
            .collect()
    } else {
        jobs.par_iter()
            .zip(gs.par_iter())
            .zip(ms.par_iter())
            .enumerate()
            .map(prepare)
            .collect()
    };
    let batches: Vec<_> = jobs
        .iter()
        .zip(&prepared)
        .map(|(job, p)| match p {
            Some(Prepared::Products(p, _)) => p.batch(path, &[job.down.format()]),
            _ => None,
        })
        .collect();
    let mut items = Vec::new();
    for (j, job) in jobs.iter().enumerate() {
        let chunk = match &prepared[j] {
            // No columns: the products are zero.
            None => {
                ys[j].fill(0.0);
                continue;
            }
            Some(Prepared::Products(p, _)) => p.chunk(path, job.down).max(1),
            Some(Prepared::Copies(..)) => matvec_chunk(d).next_multiple_of(GROUP),
        };
        items.extend((0..d.div_ceil(chunk)).map(|c| (j, c * chunk, chunk.min(d - c * chunk))));
    }
    let y_ptrs: Vec<OutPtr> = ys.iter_mut().map(|y| OutPtr(y.as_mut_ptr())).collect();
    let down = |&(j, r0, nr): &(usize, usize, usize)| {
        let m = ms[j];
        let mut y = vec![0f32; m * nr];
        match &prepared[j] {
            Some(Prepared::Copies(acts, c)) => c.down.run_rows_tokens(path, acts, r0, &mut y),
            Some(Prepared::Products(p, _)) => p.run(
                path,
                jobs[j].down,
                gs[j],
                m,
                r0,
                &mut y,
                batches[j].as_ref(),
            ),
            None => {}
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
