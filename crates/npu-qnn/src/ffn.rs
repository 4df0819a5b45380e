//! One gated FFN block as one QNN graph: `out = down · (act(gate · x) ⊙ (up · x))`, for one batch
//! size (QNN graphs have static shapes: the engine builds one per batch size, e.g. 1, 2, 4, 8).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::backend::Context;
use crate::error::QnnError;
use crate::graph::{Graph, Tensor};

static FFN_SERIAL: AtomicU64 = AtomicU64::new(1);

/// The activation of the gate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FfnActivation {
    /// `x · sigmoid(x)`, two nodes (`Sigmoid`, `ElementWiseMultiply`).
    Silu,
    /// `max(x, 0)` (`Relu`).
    Relu,
}

/// A weight matrix, row-major `[rows, cols]`.
#[derive(Clone, Copy, Debug)]
pub enum FfnWeights<'a> {
    /// f32 values given to each execution ([`FfnGraph::execute_with`]): a graph input, so that
    /// one graph serves every chunk of weights of its shape streamed from flash.
    Input,
    /// f32 values.
    F32(&'a [f32]),
    /// INT8 values with one scale per row (symmetric, per output channel):
    /// `w[r][c] = values[r*cols + c] * scales[r]`.
    Int8 {
        /// `rows * cols` quantized values.
        values: &'a [i8],
        /// `rows` scales, finite and > 0.
        scales: &'a [f32],
    },
}

/// A finalized gated-FFN graph for one batch size.
pub struct FfnGraph {
    graph: Graph,
    batch: usize,
    d_model: usize,
    /// Element counts of the weights given to each execution (gate, up, down order), 0 for static.
    inputs: [usize; 3],
}

fn weight(
    g: &mut Graph,
    name: &str,
    rows: usize,
    cols: usize,
    w: FfnWeights<'_>,
) -> Result<Tensor, QnnError> {
    match w {
        FfnWeights::Input => g.input(name, &[rows, cols]),
        FfnWeights::F32(v) => g.static_f32(name, &[rows, cols], v),
        FfnWeights::Int8 { values, scales } => {
            g.static_i8_per_row(name, [rows, cols], values, scales)
        }
    }
}

impl FfnGraph {
    /// Builds and finalizes the graph: `gate` and `up` are `[d_ff, d_model]`, `down` is
    /// `[d_model, d_ff]` (each row one output), inputs and outputs `[batch, d_model]` row-major f32.
    /// Weights given as [`FfnWeights::Input`] are inputs of every execution
    /// ([`FfnGraph::execute_with`]).
    #[allow(clippy::too_many_arguments)]
    pub fn build(
        ctx: &Context,
        batch: usize,
        d_model: usize,
        d_ff: usize,
        gate: FfnWeights<'_>,
        up: FfnWeights<'_>,
        down: FfnWeights<'_>,
        activation: FfnActivation,
    ) -> Result<FfnGraph, QnnError> {
        let name = format!(
            "ffn_b{batch}_{}",
            FFN_SERIAL.fetch_add(1, Ordering::Relaxed)
        );
        let mut g = Graph::new(ctx, &name)?;
        let x = g.input("x", &[batch, d_model])?;
        let given = |w: &FfnWeights<'_>| match w {
            FfnWeights::Input => d_ff * d_model,
            _ => 0,
        };
        let inputs = [given(&gate), given(&up), given(&down)];
        let wg = weight(&mut g, "w_gate", d_ff, d_model, gate)?;
        let wu = weight(&mut g, "w_up", d_ff, d_model, up)?;
        let wd = weight(&mut g, "w_down", d_model, d_ff, down)?;
        let h = [batch, d_ff];
        let gx = g.native("gate_x", &h)?;
        g.fully_connected("gate", x, wg, None, gx)?;
        let ux = g.native("up_x", &h)?;
        g.fully_connected("up", x, wu, None, ux)?;
        let act = g.native("act", &h)?;
        match activation {
            FfnActivation::Silu => {
                let s = g.native("gate_sigmoid", &h)?;
                g.sigmoid("sigmoid", gx, s)?;
                g.multiply("silu", gx, s, act)?;
            }
            FfnActivation::Relu => g.relu("relu", gx, act)?,
        }
        let hidden = g.native("hidden", &h)?;
        g.multiply("gate_times_up", act, ux, hidden)?;
        let y = g.output("y", &[batch, d_model])?;
        g.fully_connected("down", hidden, wd, None, y)?;
        g.finalize()?;
        Ok(FfnGraph {
            graph: g,
            batch,
            d_model,
            inputs,
        })
    }

    /// The batch size this graph was built for.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// `out = ffn(x)` for `batch` rows of `d_model` values each (a graph whose weights are all
    /// static).
    pub fn execute(&mut self, x: &[f32], out: &mut [f32]) -> Result<(), QnnError> {
        self.execute_with(x, &[], out)
    }

    /// `out = ffn(x)` with `weights` the [`FfnWeights::Input`] matrices of the build, in gate, up,
    /// down order (the static ones left out), each of its full size.
    pub fn execute_with(
        &mut self,
        x: &[f32],
        weights: &[&[f32]],
        out: &mut [f32],
    ) -> Result<(), QnnError> {
        let n = self.batch * self.d_model;
        let wanted: Vec<usize> = self.inputs.iter().copied().filter(|&c| c > 0).collect();
        if weights.len() != wanted.len() {
            return Err(QnnError::Length {
                what: "FFN weight inputs".into(),
                expected: wanted.len(),
                got: weights.len(),
            });
        }
        let lens = [("FFN input", x.len(), n), ("FFN output", out.len(), n)];
        let weight_lens = weights
            .iter()
            .zip(&wanted)
            .map(|(w, &c)| ("FFN weights", w.len(), c));
        for (what, len, expected) in lens.into_iter().chain(weight_lens) {
            if len != expected {
                return Err(QnnError::Length {
                    what: what.into(),
                    expected,
                    got: len,
                });
            }
        }
        let mut inputs = Vec::with_capacity(1 + weights.len());
        inputs.push(x);
        inputs.extend_from_slice(weights);
        self.graph.execute(&inputs, &mut [out])
    }
}
