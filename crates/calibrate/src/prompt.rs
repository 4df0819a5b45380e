//! The prompt's batched products for `sparrow calibrate` ([`measure_prompt`]): the one rate older
//! plans read (a Q4_0 matrix over 64 tokens), the product with a matrix stored transposed, each
//! weight format's rate over a long prompt (whichever tile the format takes there) and a short
//! prompt's (on x86 the decode kernels, `matvec_batch`; elsewhere the f32 tile). Matrices of
//! 1024 × 4096 (like a layer's chunk of a prompt step), quantized from smooth values (no subnormals
//! to slow the arithmetic), at the most threads.

use std::time::Duration;

use kernels_neon::{Precision, QMatrix, WeightFormat};
use planner::PromptRate;

use crate::error::{CalibrateError, Result};
use crate::kernels::{kernel_err, per_call, pool};

/// Tokens of the one-rate measurement ([`PromptRates::flops`]).
pub(crate) const PROMPT_TOKENS: usize = 64;

/// Tokens of the per-format and transposed measurements: a prompt step's few hundred (the integer
/// tiles repack a work item's rows once for all of them, so over 64 tokens they measured up to 3x
/// below what a 512-token prompt ran at).
const LONG_TOKENS: usize = 256;

/// Tokens of the short-prompt measurement: fewer than `kernels_neon::INT_TILE_MIN_TOKENS`.
const SHORT_TOKENS: usize = 16;

/// The formats whose long-prompt rates are measured: those of the real models this project runs
/// (SmolLM2's Q4_1 and Q8_0, Qwen2.5's Q5_0, Q8_0, Q4_K and Q6_K) and the other common ones this
/// crate can quantize a matrix to (not Q5_K: its prompts take `prompt_flops`).
const FORMATS: [WeightFormat; 7] = [
    WeightFormat::Q4_0,
    WeightFormat::Q4_1,
    WeightFormat::Q5_0,
    WeightFormat::Q5_1,
    WeightFormat::Q8_0,
    WeightFormat::Q4_K,
    WeightFormat::Q6_K,
];

/// What [`measure_prompt`] measured, in floating-point operations per second (2 per multiply-add).
pub(crate) struct PromptRates {
    /// `matmul` of Q4_0 in `Fast` over [`PROMPT_TOKENS`] tokens (`DeviceProfile::prompt_flops`).
    pub(crate) flops: f64,
    /// `matmul_t` of Q5_0 (a store's down rows) over [`LONG_TOKENS`] tokens.
    pub(crate) t_flops: f64,
    /// `matmul` of each of [`FORMATS`] over [`LONG_TOKENS`] tokens.
    pub(crate) by_format: Vec<PromptRate>,
    /// `matmul` of Q8_0 over [`SHORT_TOKENS`] tokens.
    pub(crate) short_flops: f64,
}

/// Rows and columns of the measured matrices.
const ROWS: usize = 1024;
const COLS: usize = 4096;

/// How long and on how many threads a product is timed.
#[derive(Clone, Copy)]
pub(crate) struct Timing {
    /// The most threads (the pool's).
    pub(crate) threads: usize,
    /// How long each point is repeated.
    pub(crate) point_time: Duration,
}

/// Seconds of one `matmul` (or `matmul_t`, `transposed`) of a [`ROWS`] × [`COLS`] matrix of
/// `format` over `n` tokens in `Fast`, at the most threads.
fn time_product(o: Timing, format: WeightFormat, n: usize, transposed: bool) -> Result<f64> {
    let src: Vec<f32> = (0..ROWS * COLS)
        .map(|i| ((i * 7919) % 1013) as f32 / 1013.0 - 0.5)
        .collect();
    let data = kernels_neon::quantize_matrix(format, &src, ROWS, COLS).map_err(kernel_err)?;
    let w = QMatrix::new(format, ROWS, COLS, &data)
        .map_err(|e| CalibrateError::Measure(format!("calibration matrix: {e}")))?;
    let (k, m) = if transposed {
        (ROWS, COLS)
    } else {
        (COLS, ROWS)
    };
    let x: Vec<f32> = (0..n * k)
        .map(|i| ((i * 31) % 61) as f32 / 61.0 - 0.5)
        .collect();
    let mut y = vec![0f32; n * m];
    pool(o.threads)?.install(|| {
        per_call(o.point_time, || {
            match transposed {
                true => kernels_neon::matmul_t(&w, &x, n, &mut y, Precision::Fast),
                false => kernels_neon::matmul(&w, &x, n, &mut y, Precision::Fast),
            }
            .map_err(kernel_err)
        })
    })
}

/// Measures the prompt's products (see the module's documentation).
pub(crate) fn measure_prompt(o: Timing) -> Result<PromptRates> {
    let flop = |n: usize| 2.0 * (ROWS * COLS * n) as f64;
    let flops = flop(PROMPT_TOKENS) / time_product(o, WeightFormat::Q4_0, PROMPT_TOKENS, false)?;
    let t_flops = flop(LONG_TOKENS) / time_product(o, WeightFormat::Q5_0, LONG_TOKENS, true)?;
    let by_format = FORMATS
        .iter()
        .map(|&f| {
            Ok(PromptRate {
                format: f.name().into(),
                flops: flop(LONG_TOKENS) / time_product(o, f, LONG_TOKENS, false)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let short_flops =
        flop(SHORT_TOKENS) / time_product(o, WeightFormat::Q8_0, SHORT_TOKENS, false)?;
    Ok(PromptRates {
        flops,
        t_flops,
        by_format,
        short_flops,
    })
}
