//! Small-batch products for decode steps of several sequences ([`matvec_batch`],
//! [`matvec_batch_many`]): each token's row of the result is what [`crate::matvec`] gives for it,
//! bit for bit, while the weights are read from memory once for the batch.

use std::sync::atomic::{AtomicBool, Ordering};

use rayon::prelude::*;

use crate::out_rows::OutPtr;
use crate::quant::QActs16;
use crate::{
    active_path, arch, check_len, check_path, check_tokens, chunk_rows_setting, matvec_chunk,
    matvec_many_with, Acts, KernelError, KernelPath, Precision, QMatrix, WeightFormat,
};

/// A small-batch product for decode steps of `n` independent sequences: `x` is `n` rows of `cols`
/// (token-major), `y` is `n` rows of `rows`, `y[t*rows + r] = dot(W[r], x[t])`, each token's row
/// the same as [`crate::matvec`] gives for it, bit for bit (same activation quantization, same kernels).
/// Each parallel work item takes a chunk of weight rows small enough to stay in cache and runs
/// every token over it, so the weights are read from memory once for the whole batch: decode of
/// `n` sequences costs about one token's weight traffic. [`crate::matmul()`], by contrast, runs a
/// prompt's tokens through a tile (f32, or integer where the path has one) whose sums are not
/// always `matvec`'s bit for bit.
pub fn matvec_batch(
    w: &QMatrix,
    x: &[f32],
    n: usize,
    y: &mut [f32],
    precision: Precision,
) -> Result<(), KernelError> {
    matvec_batch_with(active_path(), w, x, n, y, precision)
}

/// [`matvec_batch`] on an explicit path (for tests and benchmarks).
#[doc(hidden)]
pub fn matvec_batch_with(
    path: KernelPath,
    w: &QMatrix,
    x: &[f32],
    n: usize,
    y: &mut [f32],
    precision: Precision,
) -> Result<(), KernelError> {
    matvec_batch_many_with(path, &[w], x, n, &mut [y], precision)
}

/// Several small-batch products of the same tokens: `ys[i]` is [`matvec_batch`] of `ws[i]`, bit for
/// bit, with each token's activations quantized once per form and one parallel region over the
/// row chunks of every matrix (a batched decode step's q/k/v, and gate/up, read the same vectors).
/// Every matrix must have `x.len() / n` columns and `ys[i].len() == n * ws[i].rows()`.
pub fn matvec_batch_many(
    ws: &[&QMatrix],
    x: &[f32],
    n: usize,
    ys: &mut [&mut [f32]],
    precision: Precision,
) -> Result<(), KernelError> {
    matvec_batch_many_with(active_path(), ws, x, n, ys, precision)
}

/// [`matvec_batch_many`] on an explicit path (for tests and benchmarks).
#[doc(hidden)]
pub fn matvec_batch_many_with(
    path: KernelPath,
    ws: &[&QMatrix],
    x: &[f32],
    n: usize,
    ys: &mut [&mut [f32]],
    precision: Precision,
) -> Result<(), KernelError> {
    check_path(path)?;
    check_len("matvec_batch outputs", ws.len(), ys.len())?;
    for (w, y) in ws.iter().zip(ys.iter()) {
        check_tokens(["matvec_batch x", "matvec_batch y"], w, x, n, y)?;
    }
    if n == 0 || ws.is_empty() {
        return Ok(());
    }
    if n == 1 {
        return matvec_many_with(path, ws, x, ys, precision);
    }
    let cols = ws[0].cols();
    let prepared = Prepared::new(path, ws, x, n, precision);
    let ready = prepared.ready(path);
    // Work items: (matrix, first row, rows), each writing that row chunk of every token's output.
    let mut items: Vec<(usize, usize, usize)> = Vec::new();
    let mut outs: Vec<OutPtr> = Vec::with_capacity(ys.len());
    for (i, y) in ys.iter_mut().enumerate() {
        let rows = ws[i].rows();
        outs.push(OutPtr(y.as_mut_ptr()));
        if rows == 0 {
            continue;
        }
        if cols == 0 {
            y.fill(0.0);
            continue;
        }
        let chunk = batch_chunk(ws[i]);
        items
            .extend((0..rows.div_ceil(chunk)).map(|c| (i, c * chunk, chunk.min(rows - c * chunk))));
    }
    let run = |&(i, r0, nr): &(usize, usize, usize)| {
        // SAFETY: `ys[i]` holds `n * rows` elements (checked) and stays mutably borrowed (`ys`)
        // until the items are done; this item alone covers rows `r0 .. r0 + nr` of matrix `i`.
        let mut ts = unsafe { outs[i].token_rows(n, ws[i].rows(), r0, nr) };
        ready.run(i, r0, x, &mut ts);
    };
    if items.len() <= 1 {
        items.iter().for_each(run);
    } else {
        items.par_iter().for_each(run);
    }
    Ok(())
}

/// The activations of one product of several matrices with the same `n` tokens: each token
/// quantized once per distinct form the matrices need.
pub(crate) struct Prepared<'w> {
    ws: &'w [&'w QMatrix<'w>],
    cols: usize,
    /// Per distinct form, each token's activations.
    forms: Vec<Vec<Acts>>,
    /// The form of each matrix.
    which: Vec<usize>,
}

impl<'w> Prepared<'w> {
    /// Quantizes the `n` tokens of `x` (token-major rows of the matrices' common width) for `ws`.
    pub(crate) fn new(
        path: KernelPath,
        ws: &'w [&'w QMatrix<'w>],
        x: &[f32],
        n: usize,
        precision: Precision,
    ) -> Self {
        let cols = ws.first().map_or(0, |w| w.cols());
        let mut forms: Vec<Vec<Acts>> = Vec::new();
        let mut which = Vec::with_capacity(ws.len());
        for w in ws {
            match forms.iter().position(|f| {
                f.first()
                    .is_some_and(|a| a.fits(path, w.format(), precision))
            }) {
                Some(i) => which.push(i),
                None => {
                    which.push(forms.len());
                    forms.push(
                        x.chunks_exact(cols.max(1))
                            .take(n)
                            .map(|xt| Acts::new(path, w.format(), xt, precision))
                            .collect(),
                    );
                }
            }
        }
        Prepared {
            ws,
            cols,
            forms,
            which,
        }
    }

    /// The activations as the kernels of `path` take them: for 16-bit activations of several
    /// tokens, the batch kernel's layout, whose interleaved (or reordered) tokens are built only
    /// when one of the form's matrices takes them.
    pub(crate) fn ready(&self, path: KernelPath) -> Ready<'_> {
        let i16s = self
            .forms
            .iter()
            .enumerate()
            .map(|(f, acts)| {
                if acts.len() < 2 {
                    return None;
                }
                let qs: Option<Vec<&QActs16>> = acts
                    .iter()
                    .map(|a| match a {
                        Acts::I16(q, _) => Some(q),
                        _ => None,
                    })
                    .collect();
                let formats: Vec<WeightFormat> = self
                    .ws
                    .iter()
                    .zip(&self.which)
                    .filter(|&(_, &wf)| wf == f)
                    .map(|(w, _)| w.format())
                    .collect();
                qs.map(|qs| arch::Batch16::new(path, qs, &formats))
            })
            .collect();
        Ready {
            path,
            p: self,
            i16s,
        }
    }
}

/// [`Prepared`] activations with the batch kernel's layout, ready to run row chunks.
pub(crate) struct Ready<'p> {
    path: KernelPath,
    p: &'p Prepared<'p>,
    /// Per form, the batch kernel's view of its 16-bit activations (several tokens only).
    i16s: Vec<Option<arch::Batch16<'p>>>,
}

impl Ready<'_> {
    /// Rows `r0..r0 + outs[t].len()` of matrix `i` for every token `t` (`x` the tokens' f32
    /// activations, which the exact path reads).
    pub(crate) fn run(&self, i: usize, r0: usize, x: &[f32], outs: &mut [&mut [f32]]) {
        let (w, f, cols) = (self.p.ws[i], self.p.which[i], self.p.cols);
        match &self.i16s[f] {
            Some(qs) => arch::matvec_i16_batch(self.path, w, r0, qs, outs),
            None => Acts::run_tokens(
                &self.p.forms[f],
                self.path,
                w,
                r0,
                &x[..outs.len() * cols],
                outs,
            ),
        }
    }
}

static BATCH_KQUANTS: AtomicBool = AtomicBool::new(true);

/// Whether [`matvec_batch`] (and [`matvec_batch_many`], [`crate::matvec_gated`]) run the batch
/// kernels of `Q4_K`, `Q5_K` and `Q6_K` where the path has them (the default), or each token's
/// `matvec` kernel over a row chunk in turn, as before they existed: for benchmarks comparing the
/// two. Both give the same results, bit for bit.
#[doc(hidden)]
pub fn set_batch_kquants(on: bool) {
    BATCH_KQUANTS.store(on, Ordering::Relaxed);
}

/// The [`set_batch_kquants`] setting (read by the x86_64 batch kernels only).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) fn batch_kquants() -> bool {
    BATCH_KQUANTS.load(Ordering::Relaxed)
}

/// Bytes of weight rows per [`matvec_batch`] work item: the batch's tokens re-read them from cache.
const BATCH_CHUNK_BYTES: usize = 48 << 10;

/// Rows per [`matvec_batch`] work item: [`crate::set_chunk_rows`] if set, else as [`crate::matvec`] but capped
/// so that a work item's rows stay in a core's cache while every token runs over them.
pub(crate) fn batch_chunk(w: &QMatrix) -> usize {
    let set = chunk_rows_setting();
    if set > 0 {
        return set;
    }
    let row_bytes = w.row_bytes().max(1);
    let fit = (BATCH_CHUNK_BYTES / row_bytes).max(4) / 4 * 4;
    let chunk = matvec_chunk(w.rows()).min(fit);
    // A whole number of work items per thread: a small matrix (q, o) cut into 5 items would
    // leave one of 2 threads idle for a fifth of the product.
    let threads = rayon::current_num_threads().max(1);
    let items = w.rows().div_ceil(chunk).next_multiple_of(threads);
    w.rows().div_ceil(items).next_multiple_of(4)
}
