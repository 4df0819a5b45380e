//! Weights left on flash under a memory budget (issue "bigger than memory", item 3): the token
//! embedding, of which a step reads one row per token, and the output projection, which a step reads
//! whole but in order. Both stay in the model file's mapping; what changes is how the kernel pages
//! them:
//!
//! - the embedding without read-ahead (`MADV_RANDOM`, set by `Model::set_streamed`): a token faults in
//!   the one page of its row, not a 128 KiB window of its neighbours';
//! - the output projection [`OUTPUT_CHUNK`] bytes at a time ([`output_logits`]): the next chunk is
//!   asked for (`MADV_WILLNEED`, read-ahead the kernel starts at once) while this one is multiplied,
//!   and a chunk once used is handed back (`MADV_PAGEOUT`, or `MADV_DONTNEED` on kernels without it),
//!   so at most about two chunks of it are resident at a time, read in large sequential requests.
//!
//! What a budget gives these two is what the FFN's neuron cache gets instead: a byte of the output
//! costs a sequential read per step, a byte of the FFN a 4 KiB random read, several times slower per
//! byte on flash (BENCHMARKS, "Flash reads"), so the FFN goes first (OATO's benefit per byte).

use kernels_neon::{Precision, QMatrix};
use model_format::{advise, Paging};

use crate::error::{kernel, Result};
use crate::ffn::StepKind;
use crate::ops::mm_step;

/// Bytes of the output projection multiplied per chunk when it streams.
pub const OUTPUT_CHUNK: usize = 4 << 20;

/// What streaming keeps resident of the output projection at most: the chunk being multiplied and
/// the next one.
pub const STREAM_RESIDENT_BYTES: u64 = 2 * OUTPUT_CHUNK as u64;

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
/// chunk as the module docs say. The same kernels as the resident path, on row ranges of the matrix:
/// each logit is the same dot product, so results are bit for bit those of one call over the whole
/// matrix.
pub(crate) fn output_logits(
    kind: StepKind,
    output: &QMatrix<'_>,
    normed: &[f32],
    m: usize,
    logits: &mut [f32],
    precision: Precision,
) -> Result<()> {
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
        let w = QMatrix::new(output.format(), r1 - r0, output.cols(), bytes)
            .map_err(kernel("output projection chunk"))?;
        let n = r1 - r0;
        mm_step(
            kind,
            &w,
            normed,
            m,
            &mut part[..m * n],
            precision,
            "output projection",
        )?;
        for t in 0..m {
            logits[t * vocab + r0..t * vocab + r1].copy_from_slice(&part[t * n..(t + 1) * n]);
        }
        advise(bytes, Paging::Release);
        r0 = r1;
    }
    Ok(())
}
