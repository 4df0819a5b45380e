//! Accelerator backends (PowerInfer-2's XPU side): a device that runs the dense, predictable part of
//! the FFN — whole layers in prefill, each layer's hot neurons in decode — as one block per layer and
//! batch size, while sparse work stays on the CPU cores.
//!
//! * [`Accelerator`] is the backend trait: one call runs a layer's block over `n` tokens.
//! * [`FfnBlock`] is what a backend is built from: a layer's block (all its neurons, or a chosen
//!   set) as plain f32 matrices, taken from the model's weights in any format.
//! * [`CpuAccelerator`] (`cpu.rs`) runs the blocks with the batched dense kernels (gate and up rows
//!   as the file stores them, down columns re-quantized to `Q8_0`, also as one row per neuron
//!   so that a one-token step of a prefix of the block reads only its own), so that scheduling is
//!   measurable on a machine without an NPU.
//! * [`QnnAccelerator`] (`qnn.rs`) builds one Qualcomm QNN graph per layer and batch size (1, 2, 4,
//!   8; larger batches are cut into those) through the `npu-qnn` wrapper, weights in the INT8
//!   per-output-channel form HTP takes (or f32, for QNN's CPU backend and for exact checks).
//! * [`crate::AccelFfn`] (`ffn/accel.rs`) hands whole layers to a backend; [`crate::HybridFfn`]
//!   (`hybrid.rs`) hands it each layer's hot neurons and keeps the rest sparse on the CPU.
//!
//! [`open`] picks a backend from an [`AccelKind`]; a QNN library that is missing, of another API
//! version, or failing at any step is an [`EngineError::Accelerator`] naming the library and the step,
//! and the caller stays on the CPU.

mod cpu;
mod qnn;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use crate::config::Activation;
use crate::error::{kernel, EngineError, Result};
use crate::model::{Layer, Model};

pub use cpu::CpuAccelerator;
pub use qnn::{QnnAccelerator, QnnWeights};

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
    pub(crate) fn dequantized(&self, what: &str) -> Result<(Vec<f32>, Vec<f32>, Vec<f32>)> {
        let (k, d) = (self.gate.rows(), self.gate.cols());
        let f32s = |m: &kernels_neon::QMatrix<'_>, part: &str| {
            crate::transpose::dequantize_matrix(m).map_err(kernel(format!("{what} {part}")))
        };
        let down = crate::transpose::transpose_f32(&f32s(&self.down, "down")?, k, d);
        Ok((f32s(&self.gate, "gate")?, f32s(&self.up, "up")?, down))
    }

    /// Checks that the three matrices have one row per neuron of the same width and that `x` and
    /// `out` hold `n` rows of it; returns `(neurons, d_model)`.
    pub(crate) fn shape(
        &self,
        backend: &str,
        x: &[f32],
        n: usize,
        out: &[f32],
    ) -> Result<(usize, usize)> {
        let (k, d) = (self.gate.rows(), self.gate.cols());
        let same = |m: &kernels_neon::QMatrix<'_>| m.rows() == k && m.cols() == d;
        if !same(&self.up) || !same(&self.down) || x.len() != n * d || out.len() != n * d {
            return Err(EngineError::Request(format!(
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
pub(crate) fn check_prefix(
    backend: &str,
    layer: usize,
    neurons: usize,
    block: usize,
) -> Result<()> {
    if neurons > block {
        return Err(EngineError::Request(format!(
            "{backend} accelerator: {neurons} neurons asked of layer {layer}'s block of {block}"
        )));
    }
    Ok(())
}

/// An accelerator's first failure: the executors that use a backend ([`crate::AccelFfn`],
/// [`crate::HybridFfn`]) record it, report it, and compute on the CPU from then on.
#[derive(Debug, Default)]
pub(crate) struct Failure {
    failed: AtomicBool,
    first: Mutex<Option<String>>,
}

impl Failure {
    /// Whether the accelerator has failed.
    pub(crate) fn happened(&self) -> bool {
        self.failed.load(Ordering::Relaxed)
    }

    /// Records `e` (the first one recorded is kept).
    pub(crate) fn record(&self, e: &EngineError) {
        self.failed.store(true, Ordering::Relaxed);
        if let Ok(mut f) = self.first.lock() {
            f.get_or_insert_with(|| e.to_string());
        }
    }

    /// The first failure, if any.
    pub(crate) fn first(&self) -> Option<String> {
        self.first.lock().ok().and_then(|f| f.clone())
    }
}

/// Which backend to open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccelKind {
    /// [`CpuAccelerator`].
    Cpu,
    /// [`QnnAccelerator`] over the library at this path, or the usual names (`libQnnHtp.so`, then
    /// `libQnnCpu.so`) when `None`.
    Qnn {
        /// The QNN backend library.
        library: Option<PathBuf>,
        /// The form of the weights handed to QNN.
        weights: QnnWeights,
    },
}

impl AccelKind {
    /// The backend's name, as device profiles and plans name it: `cpu` or `qnn`.
    pub fn name(&self) -> &'static str {
        match self {
            AccelKind::Cpu => "cpu",
            AccelKind::Qnn { .. } => "qnn",
        }
    }
}

impl std::str::FromStr for AccelKind {
    type Err = String;

    /// `cpu`, `qnn`, `qnn:PATH`, `qnn-f32` or `qnn-f32:PATH`.
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let (head, path) = match s.split_once(':') {
            Some((h, p)) if !p.is_empty() => (h, Some(PathBuf::from(p))),
            Some(_) => return Err(format!("`{s}`: give the library after the colon")),
            None => (s, None),
        };
        match (head, path) {
            ("cpu", None) => Ok(AccelKind::Cpu),
            ("qnn", library) => Ok(AccelKind::Qnn {
                library,
                weights: QnnWeights::Int8,
            }),
            ("qnn-f32", library) => Ok(AccelKind::Qnn {
                library,
                weights: QnnWeights::F32,
            }),
            _ => Err(format!(
                "`{s}`: expected cpu, qnn, qnn:LIBRARY, qnn-f32 or qnn-f32:LIBRARY"
            )),
        }
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

impl FfnBlock {
    /// The block of `layer` over `neurons` (neuron indices, in the order the block keeps them), or
    /// over every neuron when `None`, dequantized from the model's weights.
    pub fn from_layer(
        layer: &Layer<'_>,
        neurons: Option<&[u32]>,
        activation: Activation,
    ) -> Result<FfnBlock> {
        let Some(layer) = layer.ffn.gated() else {
            return Err(EngineError::Request(
                "an accelerator block needs a gated FFN: accelerators do not support \
                 Mixture-of-Experts layers yet"
                    .into(),
            ));
        };
        let (ff, d) = (layer.gate.rows(), layer.gate.cols());
        if ff == 0 {
            return Err(EngineError::Request(
                "an accelerator block needs the FFN weights in memory (this is a resident file)"
                    .into(),
            ));
        }
        let all: Vec<u32>;
        let ids = match neurons {
            Some(ids) => ids,
            None => {
                all = (0..ff as u32).collect();
                &all
            }
        };
        if let Some(&bad) = ids.iter().find(|&&j| j as usize >= ff) {
            return Err(EngineError::Request(format!(
                "accelerator block: neuron {bad} is past the layer's {ff}"
            )));
        }
        let rows = |m: &kernels_neon::QMatrix<'_>, what: &str| -> Result<Vec<f32>> {
            let mut out = vec![0f32; ids.len() * d];
            for (dst, &j) in out.chunks_exact_mut(d).zip(ids) {
                kernels_neon::dequantize_row(m.format(), m.row_data(j as usize), dst)
                    .map_err(kernel(what))?;
            }
            Ok(out)
        };
        let raw = |m: &kernels_neon::QMatrix<'_>| -> Vec<u8> {
            ids.iter()
                .flat_map(|&j| m.row_data(j as usize).iter().copied())
                .collect()
        };
        let file_rows = FileRows {
            format: layer.gate.format(),
            gate: raw(&layer.gate),
            up: raw(&layer.up),
        };
        let gate = rows(&layer.gate, "accelerator block gate")?;
        let up = rows(&layer.up, "accelerator block up")?;
        let mut down = vec![0f32; d * ids.len()];
        let mut row = vec![0f32; ff];
        for (r, dst) in down.chunks_exact_mut(ids.len().max(1)).enumerate().take(d) {
            kernels_neon::dequantize_row(layer.down.format(), layer.down.row_data(r), &mut row)
                .map_err(kernel("accelerator block down"))?;
            for (o, &j) in dst.iter_mut().zip(ids) {
                *o = row[j as usize];
            }
        }
        Ok(FfnBlock {
            neurons: ids.len(),
            d_model: d,
            gate,
            up,
            down,
            activation,
            file_rows,
            prefixes: true,
        })
    }

    /// The block of every layer of `model`, each over `neurons[l]` (or every neuron), made as the
    /// iterator is advanced.
    pub fn for_model<'m>(
        model: &'m Model<'_>,
        neurons: Option<&'m [Vec<u32>]>,
    ) -> impl Iterator<Item = Result<FfnBlock>> + 'm {
        model.layers.iter().enumerate().map(move |(l, layer)| {
            model.refuse_moe("an accelerator (--accel, hybrid)")?;
            FfnBlock::from_layer(
                layer,
                neurons.map(|n| n[l].as_slice()),
                model.config.activation,
            )
        })
    }
}

/// Opens the backend `kind` over `blocks` (one per layer, taken one at a time so that only one
/// layer's f32 block exists at once).
pub fn open(
    kind: &AccelKind,
    blocks: impl IntoIterator<Item = Result<FfnBlock>>,
) -> Result<Box<dyn Accelerator>> {
    Ok(match kind {
        AccelKind::Cpu => Box::new(CpuAccelerator::new(blocks)?),
        AccelKind::Qnn { library, weights } => {
            Box::new(QnnAccelerator::new(library.as_deref(), blocks, *weights)?)
        }
    })
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

    #[test]
    fn kinds_parse() {
        assert_eq!("cpu".parse::<AccelKind>(), Ok(AccelKind::Cpu));
        assert_eq!(
            "qnn:/x/libQnnHtp.so".parse::<AccelKind>(),
            Ok(AccelKind::Qnn {
                library: Some("/x/libQnnHtp.so".into()),
                weights: QnnWeights::Int8
            })
        );
        assert!("qnn-f32".parse::<AccelKind>().is_ok());
        assert!("gpu".parse::<AccelKind>().is_err());
        assert!("qnn:".parse::<AccelKind>().is_err());
        assert!("cpu:/x".parse::<AccelKind>().is_err());
    }
}
