//! The output projection's proxy: a step that streams the output projection from flash (an
//! offloaded model's [`crate::stream`]) reads the whole matrix for one token's logits, 145 MB of
//! Q8_0 on Qwen2.5-0.5B, while all a token needs from it is which few rows score highest. The issue
//! "bigger than memory" asks to "predict the few rows that matter"; this does it with a 2-bit copy:
//!
//! - `sparrow convert` writes [`OUTPUT_PROXY_TENSOR`] into the resident file where it pays
//!   ([`proxy_pays`]): every output row
//!   dequantized, padded with zeros to a multiple of 256 columns ([`proxy_cols`]) and quantized to
//!   Q2_K (2.625 bits a weight: 336 bytes a row on Qwen instead of 952);
//! - a step of at most 8 rows of logits (one token, or the last tokens of a batch of sequences;
//!   `proxy_step::proxy_logits`) streams the proxy instead of the output (the same reader, chunks
//!   and buffers), takes for each row the [`PROXY_CANDIDATES`] rows it scores highest, reads those
//!   rows of the real output projection (a few hundred KiB of 4 KiB-aligned reads, several in
//!   flight) and computes their logits with the same kernels as the whole matrix.
//!
//! What the step returns: the exact logits of the candidates (bit for bit the full projection's),
//! the proxy's estimates for every other row. Greedy decoding therefore picks the true argmax
//! whenever it is among the candidates. Measured on Qwen2.5-Coder-0.5B (docs/BENCHMARKS.md): the
//! true argmax was within the proxy's top 60 at all of 1,024 test-split positions (a simulation of
//! this quantizer over the engine's final hidden states), and equal through the engine at every
//! position of the test `the_output_proxy_keeps_the_candidates_exact_on_qwen`. Sampling sees the
//! candidates exactly and the tail approximately. Prompts scored whole (perplexity), `--exact` and
//! `--full-output` read the whole output projection.

use kernels_neon::{QMatrix, WeightFormat};

use crate::error::{kernel, Result};

/// The proxy's tensor name in a resident file.
pub const OUTPUT_PROXY_TENSOR: &str = "output_proxy.weight";

/// The proxy's weight format.
pub const PROXY_FORMAT: WeightFormat = WeightFormat::Q2_K;

/// Rows of the real output projection a step reads and computes exactly.
pub const PROXY_CANDIDATES: usize = 128;

/// Columns of the proxy of a `d_model`-wide output projection: `d_model` rounded up to Q2_K's
/// 256-element blocks (the extra columns are zero, as is the activation there).
pub fn proxy_cols(d_model: usize) -> usize {
    d_model.next_multiple_of(256)
}

/// Bytes a one-token step reads from flash through a proxy of `output`: the proxy and, for each
/// candidate, the 4 KiB-aligned window of its row (what the planner counts for a streamed output).
pub fn proxy_step_bytes(output: &QMatrix<'_>) -> u64 {
    let rows = output.rows();
    let proxy_row = PROXY_FORMAT
        .row_bytes(proxy_cols(output.cols()))
        .unwrap_or(0);
    let window = output.row_bytes().next_multiple_of(ufs_io::ALIGN) + ufs_io::ALIGN;
    (rows * proxy_row + PROXY_CANDIDATES.min(rows) * window) as u64
}

/// Whether a proxy of `output` saves reads: a step through it reads at most half the output's
/// bytes (`sparrow convert` writes one only then; a small vocabulary's output is read whole).
pub fn proxy_pays(output: &QMatrix<'_>) -> bool {
    2 * proxy_step_bytes(output) <= output.data().len() as u64
}

/// The proxy rows of `output` ([`PROXY_FORMAT`], [`proxy_cols`] wide), row-major.
pub fn build_proxy(output: &QMatrix<'_>) -> Result<Vec<u8>> {
    let d = output.cols();
    kernels_neon::requantize_rows(
        output.format(),
        output.data(),
        d,
        PROXY_FORMAT,
        proxy_cols(d),
    )
    .map_err(kernel("output proxy: re-quantize"))
}
