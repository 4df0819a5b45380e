//! A one-token step's logits through the output projection's proxy ([`crate::output_proxy`] says
//! what the proxy is and why): the proxy streamed, its best rows read from the real output
//! projection and computed exactly.

use kernels_neon::{Precision, QMatrix};

use crate::error::{kernel, ModelError, Result};
use crate::ops::{mm_step, StepKind};
use crate::output_proxy::PROXY_CANDIDATES;
use crate::stream::output_logits;
use crate::stream_source::StreamSource;

/// Reads of candidate rows in flight at once.
const PROXY_READERS: usize = 8;

/// Where a streamed step reads the output projection and its proxy directly: the file (whose own
/// offset is the output's data) and the proxy's data offset in it.
pub(crate) struct ProxySource<'a> {
    pub(crate) file: &'a StreamSource,
    pub(crate) proxy_offset: u64,
}

/// Most rows of logits a step computes through the proxy (a batch of sequences, each its next
/// token): larger batches, and prompts scored whole, read the whole output projection.
pub const PROXY_MAX_ROWS: usize = 8;

/// The rows of logits (`m × vocab`) of `normed` (`m × d_model`) through `proxy`, as
/// [`crate::output_proxy`] says: the proxy streamed once for all rows, then the union of each row's
/// best [`PROXY_CANDIDATES`] rows of `output` read and computed exactly, each row's logits made exact
/// at its own best rows only (so each row is what a one-token step of it gives). Read with
/// direct I/O from `source` when given, else through the mapping.
pub(crate) fn proxy_logits(
    kind: StepKind,
    output: &QMatrix<'_>,
    proxy: &QMatrix<'_>,
    source: Option<&ProxySource<'_>>,
    normed: &[f32],
    logits: &mut [f32],
    precision: Precision,
) -> Result<()> {
    let (vocab, d, pc) = (output.rows(), output.cols(), proxy.cols());
    let m = normed.len() / d.max(1);
    let mut padded = vec![0.0f32; m * pc];
    for (p, x) in padded.chunks_exact_mut(pc).zip(normed.chunks_exact(d)) {
        p[..d].copy_from_slice(x);
    }
    output_logits(
        kind,
        proxy,
        source.map(|s| (s.file, s.proxy_offset)),
        &padded,
        m,
        logits,
        precision,
    )?;
    let k = PROXY_CANDIDATES.min(vocab);
    let mut cand: Vec<u32> = Vec::with_capacity(m * k);
    let mut order: Vec<u32> = Vec::with_capacity(vocab);
    for row in logits.chunks_exact(vocab) {
        order.clear();
        order.extend(0..vocab as u32);
        order.select_nth_unstable_by(k - 1, |&a, &b| {
            row[b as usize].total_cmp(&row[a as usize]).then(a.cmp(&b))
        });
        cand.extend_from_slice(&order[..k]);
    }
    // Each row's own candidates (`k` each): the only rows of its logits made exact, so that a row
    // of a batch is what its one-token step gives.
    let own = cand.clone();
    cand.sort_unstable();
    cand.dedup();
    let (n, rb) = (cand.len(), output.row_bytes());
    let mut rows = vec![0u8; n * rb];
    match source {
        Some(s) => read_rows(s, rb, &cand, &mut rows)?,
        None => {
            for (&r, dst) in cand.iter().zip(rows.chunks_exact_mut(rb)) {
                dst.copy_from_slice(&output.data()[r as usize * rb..][..rb]);
            }
        }
    }
    let w = QMatrix::new(output.format(), n, d, &rows)
        .map_err(kernel("output projection candidate rows"))?;
    let mut exact = vec![0.0f32; m * n];
    mm_step(
        kind,
        &w,
        normed,
        m,
        &mut exact,
        precision,
        "output projection",
    )?;
    for ((row, ex), mine) in logits
        .chunks_exact_mut(vocab)
        .zip(exact.chunks_exact(n))
        .zip(own.chunks_exact(k))
    {
        for &r in mine {
            if let Ok(p) = cand.binary_search(&r) {
                row[r as usize] = ex[p];
            }
        }
    }
    Ok(())
}

/// An aligned read of the output projection holding `count` candidate rows from `first` on.
struct Window {
    start: u64,
    len: usize,
    first: usize,
    count: usize,
}

/// Reads rows `cand` (sorted) of the output projection (`rb` bytes each) into `rows`: each row's
/// 4 KiB-aligned window, neighbouring windows merged, [`PROXY_READERS`] reads in flight.
fn read_rows(s: &ProxySource<'_>, rb: usize, cand: &[u32], rows: &mut [u8]) -> Result<()> {
    let align = ufs_io::ALIGN as u64;
    let at = |r: u32| s.file.offset + u64::from(r) * rb as u64;
    let mut windows: Vec<Window> = Vec::new();
    for (i, &r) in cand.iter().enumerate() {
        let (a0, a1) = (
            at(r) / align * align,
            (at(r) + rb as u64).next_multiple_of(align),
        );
        match windows.last_mut() {
            Some(w) if a0 <= w.start + w.len as u64 => {
                w.len = (a1.max(w.start + w.len as u64) - w.start) as usize;
                w.count += 1;
            }
            _ => windows.push(Window {
                start: a0,
                len: (a1 - a0) as usize,
                first: i,
                count: 1,
            }),
        }
    }
    let total = windows.iter().map(|w| w.len).sum::<usize>();
    let [mut buf, spare] = s.file.take_buffers(total)?;
    // Each window's part of the buffer (aligned: every window is a multiple of 4 KiB).
    let mut parts: Vec<(&Window, &mut [u8])> = Vec::with_capacity(windows.len());
    let mut rest = &mut buf[..total];
    for w in &windows {
        let (part, tail) = std::mem::take(&mut rest).split_at_mut(w.len);
        parts.push((w, part));
        rest = tail;
    }
    let per = parts.len().div_ceil(PROXY_READERS).max(1);
    let results: Vec<Result<()>> = std::thread::scope(|scope| {
        let handles: Vec<_> = parts
            .chunks_mut(per)
            .map(|group| {
                scope.spawn(move || -> Result<()> {
                    for (w, part) in group.iter_mut() {
                        let got = s.file.file.read_into(w.start, part)?;
                        if got < part.len() {
                            return Err(ModelError::Flash(ufs_io::IoError::ShortRead {
                                path: s.file.file.path().to_path_buf(),
                                offset: w.start,
                                wanted: part.len(),
                                got,
                            }));
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(ModelError::Request(
                        "a reader of output rows panicked".into(),
                    ))
                })
            })
            .collect()
    });
    results.into_iter().collect::<Result<()>>()?;
    for (w, part) in &parts {
        for (j, &r) in cand[w.first..w.first + w.count].iter().enumerate() {
            let off = (at(r) - w.start) as usize;
            rows[(w.first + j) * rb..][..rb].copy_from_slice(&part[off..off + rb]);
        }
    }
    drop(parts);
    s.file.keep_buffers(vec![buf, spare]);
    Ok(())
}
