//! Weights left on flash under a memory budget (issue "bigger than memory", item 3): the token
//! embedding, of which a step reads one row per token, and the output projection, which a step reads
//! whole but in order. Both stay in the model file's mapping; what changes is how the kernel pages
//! them:
//!
//! - the embedding without read-ahead (`MADV_RANDOM`, set by `Model::set_streamed`): a token faults in
//!   the one page of its row, not a 128 KiB window of its neighbours';
//! - the output projection (or, where the resident file carries one, its proxy for steps of a few
//!   tokens: [`crate::output_proxy`]) [`OUTPUT_CHUNK`] bytes at a time (`output_logits`), the next chunk read
//!   while this one is multiplied, so at most two chunks of it are resident at a time, read in large
//!   sequential requests. Where the file opens for direct I/O (`StreamSource`) a reader thread
//!   reads each chunk into one of two buffers of the step's own: no page cache (which a memory cap
//!   counts) and no page faults. Otherwise the chunk is asked for in the mapping (`MADV_WILLNEED`,
//!   read-ahead the kernel starts at once) and handed back once used (`MADV_PAGEOUT`, or
//!   `MADV_DONTNEED` on kernels without it).
//!
//! What a budget gives these two is what the FFN's neuron cache gets instead: a byte of the output
//! costs a sequential read per step, a byte of the FFN a 4 KiB random read, several times slower per
//! byte on flash (BENCHMARKS, "Flash reads"), so the FFN goes first (OATO's benefit per byte).

use std::sync::mpsc;

use kernels_neon::{Precision, QMatrix};
use model_format::{advise, Paging};
use ufs_io::{AlignedBuf, ALIGN};

use crate::error::{kernel, ModelError, Result};
use crate::ffn::StepKind;
use crate::ops::mm_step;
use crate::stream_source::StreamSource;

/// Bytes of the output projection multiplied per chunk when it streams.
pub const OUTPUT_CHUNK: usize = 4 << 20;

/// What streaming keeps resident of the output projection at most: the chunk being multiplied and
/// the next one (read directly: two buffers of a chunk and its alignment margins, kept).
pub const STREAM_RESIDENT_BYTES: u64 = 2 * (OUTPUT_CHUNK as u64 + 2 * ufs_io::ALIGN as u64);

/// Asks for the first chunk of `output` (called at the start of a step, so that its read overlaps
/// the layers).
pub(crate) fn prefetch_output(output: &QMatrix<'_>) {
    let rows = chunk_rows(output);
    advise(
        &output.data()[..rows.min(output.rows()) * output.row_bytes()],
        Paging::WillNeed,
    );
}

fn chunk_rows(w: &QMatrix<'_>) -> usize {
    (OUTPUT_CHUNK / w.row_bytes().max(1)).max(1)
}

/// `m` rows of logits (`m × vocab`, row-major) of `normed` (`m × d_model`) through `output`, chunk by
/// chunk as the module docs say: read directly from `source` when given (the file, and the offset of
/// `output`'s data in it), else paged in the mapping.
/// The same kernels as the resident path, on row ranges of the matrix: each logit is the same dot
/// product, so results are bit for bit those of one call over the whole matrix.
pub(crate) fn output_logits(
    kind: StepKind,
    output: &QMatrix<'_>,
    source: Option<(&StreamSource, u64)>,
    normed: &[f32],
    m: usize,
    logits: &mut [f32],
    precision: Precision,
) -> Result<()> {
    let proj = Projection {
        kind,
        output,
        normed,
        m,
        precision,
    };
    if let Some((src, base)) = source {
        return direct_logits(&proj, src, base, logits);
    }
    let (vocab, rb) = (output.rows(), output.row_bytes());
    let step = chunk_rows(output);
    let data = output.data();
    let mut part = vec![0.0f32; m * step];
    let mut r0 = 0;
    while r0 < vocab {
        let r1 = (r0 + step).min(vocab);
        let next = r1..(r1 + step).min(vocab);
        if !next.is_empty() {
            advise(&data[next.start * rb..next.end * rb], Paging::WillNeed);
        }
        let bytes = &data[r0 * rb..r1 * rb];
        proj.multiply(r0..r1, bytes, &mut part, logits)?;
        advise(bytes, Paging::Release);
        r0 = r1;
    }
    Ok(())
}

/// [`output_logits`] over chunks read with direct I/O: a scoped reader thread fills one buffer with
/// the next chunk's aligned window while this thread multiplies the chunk in the other.
fn direct_logits(
    proj: &Projection<'_, '_>,
    src: &StreamSource,
    base: u64,
    logits: &mut [f32],
) -> Result<()> {
    let (output, m) = (proj.output, proj.m);
    let (vocab, rb) = (output.rows(), output.row_bytes());
    let step = chunk_rows(output);
    let chunks = vocab.div_ceil(step);
    // Chunk `c`'s rows, its bytes in the file, and the aligned window that holds them.
    let rows = |c: usize| c * step..((c + 1) * step).min(vocab);
    let bytes = |c: usize| {
        let r = rows(c);
        let start = base + (r.start * rb) as u64;
        (start, start + (r.len() * rb) as u64)
    };
    let window = |c: usize| {
        let (start, end) = bytes(c);
        let a0 = start / ALIGN as u64 * ALIGN as u64;
        (a0, (end - a0).next_multiple_of(ALIGN as u64) as usize)
    };
    let cap = (step * rb + 2 * ALIGN).next_multiple_of(ALIGN);
    let (to_reader, requests) = mpsc::sync_channel::<(usize, AlignedBuf)>(2);
    let (to_main, filled) = mpsc::sync_channel::<(usize, AlignedBuf, ufs_io::Result<usize>)>(2);
    let mut part = vec![0.0f32; m * step];
    // `move`: the request sender is dropped when this closure returns, early on an error too, so
    // the reader's loop ends and the scope can join it.
    std::thread::scope(move |scope| -> Result<()> {
        scope.spawn(move || {
            for (c, mut buf) in requests {
                let (a0, len) = window(c);
                let got = src.file.read_into(a0, &mut buf[..len]);
                if to_main.send((c, buf, got)).is_err() {
                    break;
                }
            }
        });
        let [a, b] = src.take_buffers(cap)?;
        // Buffers no chunk needs any more, kept for the next step.
        let mut done = Vec::with_capacity(2);
        to_reader.send((0, a)).map_err(|_| reader_stopped(src))?;
        if chunks > 1 {
            to_reader.send((1, b)).map_err(|_| reader_stopped(src))?;
        } else {
            done.push(b);
        }
        for c in 0..chunks {
            let (got_c, buf, got) = filled.recv().map_err(|_| reader_stopped(src))?;
            debug_assert_eq!(got_c, c);
            let got = got?;
            let (start, end) = bytes(c);
            let (a0, _) = window(c);
            let (lo, hi) = ((start - a0) as usize, (end - a0) as usize);
            if got < hi {
                return Err(ModelError::Flash(ufs_io::IoError::ShortRead {
                    path: src.file.path().to_path_buf(),
                    offset: a0,
                    wanted: hi,
                    got,
                }));
            }
            proj.multiply(rows(c), &buf[lo..hi], &mut part, logits)?;
            if c + 2 < chunks {
                to_reader
                    .send((c + 2, buf))
                    .map_err(|_| reader_stopped(src))?;
            } else {
                done.push(buf);
            }
        }
        src.keep_buffers(done);
        Ok(())
    })
}

/// One [`output_logits`] call's product, which each chunk of rows takes its part of.
struct Projection<'a, 'w> {
    kind: StepKind,
    output: &'a QMatrix<'w>,
    normed: &'a [f32],
    m: usize,
    precision: Precision,
}

impl Projection<'_, '_> {
    /// The logits of output rows `rows`, whose weights are `bytes`, into each token's row of
    /// `logits` (`part`: scratch of at least `m × rows.len()`).
    fn multiply(
        &self,
        rows: std::ops::Range<usize>,
        bytes: &[u8],
        part: &mut [f32],
        logits: &mut [f32],
    ) -> Result<()> {
        let (out, n, vocab) = (self.output, rows.len(), self.output.rows());
        let w = QMatrix::new(out.format(), n, out.cols(), bytes)
            .map_err(kernel("output projection chunk"))?;
        let part = &mut part[..self.m * n];
        mm_step(
            self.kind,
            &w,
            self.normed,
            self.m,
            part,
            self.precision,
            "output projection",
        )?;
        for (t, p) in part.chunks_exact(n).enumerate() {
            logits[t * vocab + rows.start..t * vocab + rows.end].copy_from_slice(p);
        }
        Ok(())
    }
}

fn reader_stopped(src: &StreamSource) -> ModelError {
    ModelError::Request(format!(
        "{}: the output projection's reader stopped",
        src.file.path().display()
    ))
}
