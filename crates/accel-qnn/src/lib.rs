//! [`QnnAccelerator`]: Sparrow's accelerator backend on Qualcomm QNN, through the safe `npu-qnn`
//! wrapper; [`backend`] is its entry for an `accel::Registry` (`qnn`, `qnn:LIBRARY`, `qnn-f32`,
//! `qnn-f32:LIBRARY`). No `unsafe` and no FFI here: those stay in `npu-qnn-sys` and `npu-qnn`.
//!
//! One graph per layer, batch size ([`accel::BATCH_SIZES`]) and number of the block's neurons
//! (hybrid decode runs a prefix of the block that depends on the batch size), built when first
//! used (QNN graphs have static shapes); a batch is cut into runs of those sizes. Weights streamed
//! from flash ([`Accelerator::ffn_rows`]) go in as f32 graph inputs, one graph per batch size and
//! chunk shape (INT8 inputs would need their quantization fixed when the graph is built: not done).
//! The library is loaded at run time; nothing links against QNN.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use npu_qnn::{Backend, Context, FfnActivation, FfnGraph, FfnWeights, Qnn, QnnError};

use accel::{
    batch_runs, AccelError, AccelKind, Accelerator, Activation, FfnBlock, Result, StreamedRows,
};

/// The form of the weights handed to QNN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QnnWeights {
    /// INT8, one symmetric scale per output row (`AXIS_SCALE_OFFSET` on axis 0): what HTP takes.
    Int8,
    /// f32 as dequantized (QNN's CPU backend; exact checks).
    F32,
}

/// A matrix in the chosen form.
enum Weights {
    F32(Vec<f32>),
    Int8 { values: Vec<i8>, scales: Vec<f32> },
}

impl Weights {
    /// `rows × cols` row-major `v` in `form`: INT8 rows scaled by `max |w| / 127` (1 for a zero row).
    fn new(v: &[f32], cols: usize, form: QnnWeights) -> Weights {
        match form {
            QnnWeights::F32 => Weights::F32(v.to_vec()),
            QnnWeights::Int8 => {
                let mut values = Vec::with_capacity(v.len());
                let mut scales = Vec::with_capacity(v.len() / cols.max(1));
                for row in v.chunks_exact(cols.max(1)) {
                    let amax = row.iter().fold(0f32, |m, x| m.max(x.abs()));
                    let s = if amax > 0.0 { amax / 127.0 } else { 1.0 };
                    values.extend(
                        row.iter()
                            .map(|x| (x / s).round().clamp(-127.0, 127.0) as i8),
                    );
                    scales.push(s);
                }
                Weights::Int8 { values, scales }
            }
        }
    }

    fn view(&self) -> FfnWeights<'_> {
        match self {
            Weights::F32(v) => FfnWeights::F32(v),
            Weights::Int8 { values, scales } => FfnWeights::Int8 { values, scales },
        }
    }

    /// The first `rows` rows (of `cols`), as a view.
    fn rows(&self, rows: usize, cols: usize) -> FfnWeights<'_> {
        match self {
            Weights::F32(v) => FfnWeights::F32(&v[..rows * cols]),
            Weights::Int8 { values, scales } => FfnWeights::Int8 {
                values: &values[..rows * cols],
                scales: &scales[..rows],
            },
        }
    }

    /// The first `keep` columns of every row (of `cols`), copied (the scales are per row).
    fn columns(&self, cols: usize, keep: usize) -> Weights {
        fn take<T: Copy>(v: &[T], cols: usize, keep: usize) -> Vec<T> {
            v.chunks_exact(cols.max(1))
                .flat_map(|r| r[..keep].iter().copied())
                .collect()
        }
        match self {
            Weights::F32(v) => Weights::F32(take(v, cols, keep)),
            Weights::Int8 { values, scales } => Weights::Int8 {
                values: take(values, cols, keep),
                scales: scales.clone(),
            },
        }
    }
}

struct QnnBlock {
    neurons: usize,
    d_model: usize,
    gate: Weights,
    up: Weights,
    down: Weights,
    activation: FfnActivation,
}

/// Everything that calls QNN: one thread at a time (the wrapper's objects are `Send`, not `Sync`).
struct State {
    ctx: Context,
    /// By (layer, batch size, neurons of the block).
    graphs: HashMap<(usize, usize, usize), FfnGraph>,
    /// Graphs whose weights are inputs ([`Accelerator::ffn_rows`]), by (batch size, neurons,
    /// width, activation).
    streamed: HashMap<(usize, usize, usize, Activation), FfnGraph>,
    // Dropped after the context (fields drop in order): the wrapper keeps parents alive anyway.
    _backend: Backend,
    _qnn: Qnn,
}

/// The QNN backend: the library, one context, the layers' weights and their graphs.
pub struct QnnAccelerator {
    library: PathBuf,
    form: QnnWeights,
    blocks: Vec<QnnBlock>,
    state: Mutex<State>,
}

fn qnn_error(library: &Path, e: QnnError) -> AccelError {
    AccelError::Library {
        library: library.to_path_buf(),
        detail: e.to_string(),
    }
}

impl QnnAccelerator {
    /// Loads the QNN library (`library`, or `libQnnHtp.so` then `libQnnCpu.so`), creates a backend
    /// and a context, and keeps `blocks` (one per layer, in order) in the form `weights` for the
    /// graphs.
    pub fn new(
        library: Option<&Path>,
        blocks: impl IntoIterator<Item = Result<FfnBlock>>,
        weights: QnnWeights,
    ) -> Result<QnnAccelerator> {
        let name = library
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("libQnnHtp.so"));
        let qnn = Qnn::load(library).map_err(|e| qnn_error(&name, e))?;
        let backend = Backend::new(&qnn).map_err(|e| qnn_error(&name, e))?;
        let ctx = Context::new(&backend, None).map_err(|e| qnn_error(&name, e))?;
        let blocks = blocks
            .into_iter()
            .map(|b| {
                let b = b?;
                Ok(QnnBlock {
                    neurons: b.neurons,
                    d_model: b.d_model,
                    gate: Weights::new(&b.gate, b.d_model, weights),
                    up: Weights::new(&b.up, b.d_model, weights),
                    down: Weights::new(&b.down, b.neurons, weights),
                    activation: ffn_activation(b.activation)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(QnnAccelerator {
            library: name,
            form: weights,
            blocks,
            state: Mutex::new(State {
                ctx,
                graphs: HashMap::new(),
                streamed: HashMap::new(),
                _backend: backend,
                _qnn: qnn,
            }),
        })
    }

    /// Graphs built so far (layer, batch size, neurons).
    pub fn graphs(&self) -> usize {
        self.state.lock().map_or(0, |s| s.graphs.len())
    }

    /// Graphs with streamed weights built so far (batch size, neurons, width, activation).
    pub fn streamed_graphs(&self) -> usize {
        self.state.lock().map_or(0, |s| s.streamed.len())
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, State>> {
        self.state
            .lock()
            .map_err(|_| AccelError::Request("qnn accelerator: a QNN call panicked".into()))
    }
}

/// QNN's activation op for `a` (its FFN graphs have SiLU and ReLU; a GELU model is refused).
fn ffn_activation(a: Activation) -> Result<FfnActivation> {
    match a {
        Activation::Silu => Ok(FfnActivation::Silu),
        Activation::Relu => Ok(FfnActivation::Relu),
        Activation::GeluTanh => Err(AccelError::Request(
            "qnn accelerator: the FFN graphs have SiLU and ReLU, not GELU (run this model without --accel qnn)".into(),
        )),
    }
}

impl Accelerator for QnnAccelerator {
    fn name(&self) -> &str {
        "qnn"
    }

    /// QNN's graphs run on the backend's device (HTP); the caller waits in `graphExecute`.
    fn beside_cores(&self) -> bool {
        true
    }

    fn ffn(
        &self,
        layer: usize,
        neurons: usize,
        x: &[f32],
        n: usize,
        out: &mut [f32],
    ) -> Result<()> {
        let b = self.blocks.get(layer).ok_or_else(|| {
            AccelError::Request(format!("qnn accelerator: no block for layer {layer}"))
        })?;
        let d = b.d_model;
        if x.len() != n * d || out.len() != n * d {
            return Err(AccelError::Request(format!(
                "qnn accelerator: {n} tokens need {} inputs and outputs, got {} and {}",
                n * d,
                x.len(),
                out.len()
            )));
        }
        accel::check_prefix("qnn", layer, neurons, b.neurons)?;
        if neurons == 0 {
            out.fill(0.0);
            return Ok(());
        }
        let mut state = self.lock()?;
        let State { ctx, graphs, .. } = &mut *state;
        let mut at = 0;
        for run in batch_runs(n) {
            let graph = match graphs.entry((layer, run, neurons)) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(e) => {
                    // A graph over the block's first `neurons`: their gate and up rows, and the
                    // first `neurons` columns of every down row.
                    let part = (neurons < b.neurons).then(|| b.down.columns(b.neurons, neurons));
                    e.insert(
                        FfnGraph::build(
                            ctx,
                            run,
                            d,
                            neurons,
                            b.gate.rows(neurons, d),
                            b.up.rows(neurons, d),
                            part.as_ref().unwrap_or(&b.down).view(),
                            b.activation,
                        )
                        .map_err(|e| qnn_error(&self.library, e))?,
                    )
                }
            };
            let rows = at * d..(at + run) * d;
            graph
                .execute(&x[rows.clone()], &mut out[rows])
                .map_err(|e| qnn_error(&self.library, e))?;
            at += run;
        }
        Ok(())
    }

    fn block_neurons(&self, layer: usize) -> usize {
        self.blocks.get(layer).map_or(0, |b| b.neurons)
    }

    /// Gate, up and down in the form the graphs take (INT8 values and a scale per row, or f32);
    /// the graphs' own copies belong to the backend.
    fn block_bytes(
        &self,
        neurons: usize,
        d_model: usize,
        _format: kernels_neon::WeightFormat,
    ) -> u64 {
        let values = 3 * (neurons * d_model) as u64;
        match self.form {
            QnnWeights::F32 => 4 * values,
            QnnWeights::Int8 => values + 4 * (2 * neurons + d_model) as u64,
        }
    }

    /// The chunk dequantized to f32: gate, up, the down rows and their transpose (the graph's own
    /// intermediates are per token, as the CPU path's).
    fn streamed_bytes(&self, neurons: usize, d_model: usize) -> u64 {
        16 * (neurons * d_model) as u64
    }

    /// The rows dequantized to f32 (gate and up as `[neurons, d_model]`, down transposed to
    /// `[d_model, neurons]`) and given as inputs to a graph per batch size and shape, built when
    /// first used.
    fn ffn_rows(
        &self,
        rows: &StreamedRows<'_>,
        x: &[f32],
        n: usize,
        out: &mut [f32],
    ) -> Result<()> {
        let (k, d) = rows.shape("qnn", x, n, out)?;
        if k == 0 {
            out.fill(0.0);
            return Ok(());
        }
        let (gate, up, down) = rows.dequantized("qnn streamed")?;
        let mut state = self.lock()?;
        let State { ctx, streamed, .. } = &mut *state;
        let mut at = 0;
        for run in batch_runs(n) {
            let graph = match streamed.entry((run, k, d, rows.activation)) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(e) => e.insert(
                    FfnGraph::build(
                        ctx,
                        run,
                        d,
                        k,
                        FfnWeights::Input,
                        FfnWeights::Input,
                        FfnWeights::Input,
                        ffn_activation(rows.activation)?,
                    )
                    .map_err(|e| qnn_error(&self.library, e))?,
                ),
            };
            let r = at * d..(at + run) * d;
            graph
                .execute_with(&x[r.clone()], &[&gate, &up, &down], &mut out[r])
                .map_err(|e| qnn_error(&self.library, e))?;
            at += run;
        }
        Ok(())
    }
}

/// The QNN backend's registry entry: `qnn` (INT8 weights), `qnn-f32` (f32 weights), either with
/// `:LIBRARY` (else `libQnnHtp.so`, then `libQnnCpu.so`).
pub fn backend() -> accel::Backend {
    accel::Backend {
        name: "qnn",
        usage: "qnn, qnn:LIBRARY, qnn-f32, qnn-f32:LIBRARY",
        open: open_qnn,
    }
}

fn open_qnn(
    kind: &AccelKind,
    blocks: &mut dyn Iterator<Item = Result<FfnBlock>>,
) -> Result<Box<dyn Accelerator>> {
    let weights = match kind.variant() {
        None => QnnWeights::Int8,
        Some("f32") => QnnWeights::F32,
        Some(v) => {
            return Err(AccelError::Request(format!(
                "accelerator `{kind}`: qnn has no variant `{v}` (qnn, qnn-f32)"
            )))
        }
    };
    Ok(Box::new(QnnAccelerator::new(kind.path(), blocks, weights)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_variants_are_refused_before_loading() {
        let mut r = accel::Registry::new();
        r.register(backend());
        let e = r
            .open(&"qnn-f16".parse().unwrap(), std::iter::empty())
            .err()
            .unwrap();
        assert!(e.to_string().contains("no variant `f16`"), "{e}");
    }
}
