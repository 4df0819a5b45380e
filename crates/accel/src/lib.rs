//! Sparrow's accelerator seam (PowerInfer-2's XPU side): a device that runs the dense, predictable
//! part of the FFN — whole layers in prefill, each layer's hot neurons in decode — as one block per
//! layer and batch size, while sparse work stays on the CPU cores. Usable alone: it knows kernels and
//! weight formats, not models.
//!
//! * [`Accelerator`] is the backend trait: one call runs a layer's block over `n` tokens, another
//!   runs neurons whose weights come with the call ([`StreamedRows`], a chunk read from flash).
//! * [`FfnBlock`] is what a backend is built from: a layer's block (all its neurons, or a chosen
//!   set) as plain f32 matrices plus the gate and up rows in the file's format. Making one from a
//!   model's layer is the engine's business.
//! * [`CpuAccelerator`] (`cpu.rs`) runs the blocks with the batched dense kernels (gate and up rows
//!   as the file stores them, down columns re-quantized to `Q8_0`, also as one row per neuron so
//!   that a one-token step of a prefix of the block reads only its own), so that scheduling is
//!   measurable on a machine without an NPU.
//! * Backend selection is open: an [`AccelKind`] is a name (`cpu`, `qnn`, ...) with an optional
//!   variant and path (`NAME[-VARIANT][:PATH]`), parsed without knowing the backends; a
//!   [`Registry`] maps names to [`Backend`]s (a name, a usage line, an opening function). A
//!   registry starts with `cpu`; a front end registers the others it was built with (the QNN
//!   backend lives in `accel-qnn`) and opens kinds through it.
//!
//! Invariants: a backend computes `down · (act(gate · x) ⊙ (up · x))` of the block it was given and
//! overwrites its output; a failing backend returns an [`AccelError`] naming the backend (or its
//! library) and the step, never panics; the registry never opens a kind it has no backend for.

mod cpu;
mod error;
mod matrix;
mod registry;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

pub use cpu::CpuAccelerator;
pub use error::{kernel, AccelError, Result};
pub use matrix::{dequantize_matrix, transpose_f32};
pub use registry::{AccelKind, Backend, OpenFn, Registry};
pub use tensor_types::Activation;

/// Batch sizes a backend has a block (graph) for; a larger batch is cut into these, largest first.
pub const BATCH_SIZES: [usize; 4] = [8, 4, 2, 1];

/// Cuts `n` tokens into runs of [`BATCH_SIZES`], largest first (13 = 8 + 4 + 1).
pub fn batch_runs(mut n: usize) -> Vec<usize> {
    let mut runs = Vec::new();
    for &b in &BATCH_SIZES {
        while n >= b {
            runs.push(b);
            n -= b;
        }
    }
    runs
}

/// A device that runs dense FFN blocks.
pub trait Accelerator: Send + Sync {
    /// The backend's name in reports (`cpu`, `qnn`).
    fn name(&self) -> &str;

    /// `out = block_l(x)` for `n` tokens (`x`, `out`: `n × d_model`; `out` is overwritten): layer
    /// `layer`'s block, `down · (act(gate · x) ⊙ (up · x))` over the block's first `neurons`
    /// neurons (at most [`Accelerator::block_neurons`], which is the whole block; more is an
    /// error).
    fn ffn(&self, layer: usize, neurons: usize, x: &[f32], n: usize, out: &mut [f32])
        -> Result<()>;

    /// Neurons of each layer's block (the FFN width for whole layers).
    fn block_neurons(&self, layer: usize) -> usize;

    /// Whether the backend computes on a device of its own (an NPU), the calling thread only
    /// waiting for it: hybrid decode then calls it from a thread outside the compute pool, so that
    /// every pool thread takes the CPU's part beside it (the planner's `AccelRate::parallel`).
    /// False: it computes on the pool's threads (the CPU stand-in), and shares them.
    fn beside_cores(&self) -> bool {
        false
    }

    /// Bytes this backend keeps in the process's memory for a block of `neurons` neurons of width
    /// `d_model` whose gate and up rows come in `format`, run whole (a neuron store's block,
    /// [`FfnBlock::prefixes`] false: what the store's memory budget must leave for it; a backend's
    /// own copy in device memory is not counted).
    fn block_bytes(
        &self,
        neurons: usize,
        d_model: usize,
        format: kernels_neon::WeightFormat,
    ) -> u64;

    /// `out = down · (act(gate · x) ⊙ (up · x))` for `n` tokens over `rows`, neurons whose weights
    /// come with the call (`x`, `out`: `n × d_model`; `out` is overwritten): PowerInfer-2's
    /// NPU-centric prefill over a neuron store hands each chunk of a layer read from flash to the
    /// accelerator while the next one is read. Dense: every neuron of the chunk.
    fn ffn_rows(&self, rows: &StreamedRows<'_>, x: &[f32], n: usize, out: &mut [f32])
        -> Result<()>;

    /// Bytes [`Accelerator::ffn_rows`] holds while it runs over `neurons` rows of width `d_model`,
    /// besides what the CPU's own streamed prompt step holds for that chunk (a prompt step over a
    /// neuron store borrows its working memory from the neuron cache: this is counted in).
    fn streamed_bytes(&self, neurons: usize, d_model: usize) -> u64;
}

/// Neurons of one layer whose weights come with the call ([`Accelerator::ffn_rows`]), in the
/// formats a neuron store keeps them: `gate` and `up` rows (`neurons × d_model`) and `down`
/// columns as rows (`neurons × d_model`: row `j` is neuron `j`'s column of the down projection).
pub struct StreamedRows<'a> {
    /// Gate rows.
    pub gate: kernels_neon::QMatrix<'a>,
    /// Up rows.
    pub up: kernels_neon::QMatrix<'a>,
    /// Down columns, one row per neuron.
    pub down: kernels_neon::QMatrix<'a>,
    /// The gate's activation.
    pub activation: Activation,
}

impl StreamedRows<'_> {
    /// The rows dequantized to f32: gate and up as `neurons × d_model`, down transposed to
    /// `d_model × neurons` ([`FfnBlock`]'s layout). `what` names the caller in errors.
    pub fn dequantized(&self, what: &str) -> Result<(Vec<f32>, Vec<f32>, Vec<f32>)> {
        let (k, d) = (self.gate.rows(), self.gate.cols());
        let f32s = |m: &kernels_neon::QMatrix<'_>, part: &str| {
            dequantize_matrix(m).map_err(kernel(format!("{what} {part}")))
        };
        let down = transpose_f32(&f32s(&self.down, "down")?, k, d);
        Ok((f32s(&self.gate, "gate")?, f32s(&self.up, "up")?, down))
    }

    /// Checks that the three matrices have one row per neuron of the same width and that `x` and
    /// `out` hold `n` rows of it; returns `(neurons, d_model)`.
    pub fn shape(&self, backend: &str, x: &[f32], n: usize, out: &[f32]) -> Result<(usize, usize)> {
        let (k, d) = (self.gate.rows(), self.gate.cols());
        let same = |m: &kernels_neon::QMatrix<'_>| m.rows() == k && m.cols() == d;
        if !same(&self.up) || !same(&self.down) || x.len() != n * d || out.len() != n * d {
            return Err(AccelError::Request(format!(
                "{backend} accelerator: streamed rows of {k} × {d} (up {} × {}, down {} × {}) with {} inputs and {} outputs for {n} tokens",
                self.up.rows(),
                self.up.cols(),
                self.down.rows(),
                self.down.cols(),
                x.len(),
                out.len()
            )));
        }
        Ok((k, d))
    }
}

/// An error unless `neurons` fit in layer `layer`'s block of `block` neurons on `backend`.
pub fn check_prefix(backend: &str, layer: usize, neurons: usize, block: usize) -> Result<()> {
    if neurons > block {
        return Err(AccelError::Request(format!(
            "{backend} accelerator: {neurons} neurons asked of layer {layer}'s block of {block}"
        )));
    }
    Ok(())
}

/// An accelerator's first failure: the executors that use a backend (the engine's `AccelFfn` and
/// `HybridFfn`) record it, report it, and compute on the CPU from then on.
#[derive(Debug, Default)]
pub struct Failure {
    failed: AtomicBool,
    first: Mutex<Option<String>>,
}

impl Failure {
    /// Whether the accelerator has failed.
    pub fn happened(&self) -> bool {
        self.failed.load(Ordering::Relaxed)
    }

    /// Records `e` (the first one recorded is kept).
    pub fn record(&self, e: &dyn std::fmt::Display) {
        self.failed.store(true, Ordering::Relaxed);
        if let Ok(mut f) = self.first.lock() {
            f.get_or_insert_with(|| e.to_string());
        }
    }

    /// The first failure, if any.
    pub fn first(&self) -> Option<String> {
        self.first.lock().ok().and_then(|f| f.clone())
    }
}

/// One layer's FFN block as row-major f32 matrices: `gate` and `up` are `neurons × d_model`, `down`
/// is `d_model × neurons`.
#[derive(Debug, Clone)]
pub struct FfnBlock {
    /// Neurons in the block.
    pub neurons: usize,
    /// Model width.
    pub d_model: usize,
    /// Gate rows of the block's neurons.
    pub gate: Vec<f32>,
    /// Up rows of the block's neurons.
    pub up: Vec<f32>,
    /// Down columns of the block's neurons (each row one output).
    pub down: Vec<f32>,
    /// The gate's activation.
    pub activation: Activation,
    /// The block's gate and up rows as the model file stores them (a backend that takes the file's
    /// format, like the CPU one, uses them as they are).
    pub file_rows: FileRows,
    /// Whether a step may run a prefix of the block (hybrid decode in memory, whose hot count grows
    /// with the batch); over a neuron store every step runs the whole block, and a backend may
    /// keep less for it.
    pub prefixes: bool,
}

/// Gate and up rows of a block in the model's own format.
#[derive(Debug, Clone)]
pub struct FileRows {
    /// The weights' format.
    pub format: kernels_neon::WeightFormat,
    /// Gate rows, `neurons × row_bytes`.
    pub gate: Vec<u8>,
    /// Up rows.
    pub up: Vec<u8>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_are_cut_into_graph_sizes() {
        assert_eq!(batch_runs(1), vec![1]);
        assert_eq!(batch_runs(8), vec![8]);
        assert_eq!(batch_runs(13), vec![8, 4, 1]);
        assert_eq!(batch_runs(23), vec![8, 8, 4, 2, 1]);
        assert!(batch_runs(0).is_empty());
    }
}
