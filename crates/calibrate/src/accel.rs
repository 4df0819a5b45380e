//! `sparrow calibrate --accel KIND`: an accelerator's rate for the planner's hybrid split
//! ([`planner::AccelRate`]), measured on one synthetic layer block of [`NEURONS`] neurons of width
//! [`D_MODEL`] (about a mid-sized model's layer): the whole block and its first half at one token,
//! whose difference gives the cost per neuron (so the multiply-add rate, in the accelerator's own
//! form of the weights) and what is left the fixed cost of a call; and the whole block at
//! [`BATCH`] tokens for the cost of a batch. A backend that fails to open or to run is the error of
//! [`offload::accel::open`] or of the call, naming the library and the step.

use std::time::Duration;

use kernels_neon::WeightFormat;
use planner::AccelRate;

use crate::error::{CalibrateError, Result};
use crate::kernels::{kernel_err, per_call, XorShift};
use offload::accel::{open, AccelKind, FfnBlock, FileRows};
use transformer::config::Activation;

/// Width of the measured block.
pub const D_MODEL: usize = 1024;
/// Neurons of the measured block.
pub const NEURONS: usize = 2048;
/// Tokens of the batched measurement (the largest graph size).
const BATCH: usize = 8;

/// A block of `neurons` neurons of width `d` with small deterministic weights; its file rows in
/// `Q8_0` (what the CPU backend would multiply).
fn synthetic_block(neurons: usize, d: usize) -> Result<FfnBlock> {
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    let mut values = |n: usize| -> Vec<f32> {
        (0..n)
            .map(|_| (rng.next() % 2001) as f32 / 1000.0 - 1.0)
            .map(|v| v * 0.05)
            .collect()
    };
    let (gate, up, down) = (
        values(neurons * d),
        values(neurons * d),
        values(d * neurons),
    );
    let q = |m: &[f32]| kernels_neon::quantize_matrix(WeightFormat::Q8_0, m, neurons, d);
    let file_rows = FileRows {
        format: WeightFormat::Q8_0,
        gate: q(&gate).map_err(kernel_err)?,
        up: q(&up).map_err(kernel_err)?,
    };
    Ok(FfnBlock {
        neurons,
        d_model: d,
        gate,
        up,
        down,
        activation: Activation::Silu,
        file_rows,
        // Calibration times the block's first half too.
        prefixes: true,
    })
}

/// The rate from three timings (seconds per call) of a block of `neurons` neurons of width `d`:
/// `full` (every neuron, one token), `half` (the first half, one token), `batch` (every neuron,
/// `batch` tokens). Noise that makes the half block as slow as the whole puts the whole time on
/// the neurons (no call cost).
fn fit(
    name: &str,
    neurons: usize,
    d: usize,
    full: f64,
    half: f64,
    batch: (f64, usize),
) -> AccelRate {
    let per_neuron = if full > half && half > 0.0 {
        (full - half) / (neurons - neurons / 2) as f64
    } else {
        full / neurons as f64
    };
    let call = (full - per_neuron * neurons as f64).max(0.0);
    let compute = (full - call).max(f64::MIN_POSITIVE);
    let (t_batch, b) = batch;
    let batch_cost = ((t_batch - call) / compute - 1.0) / (b as f64 - 1.0);
    AccelRate {
        name: name.into(),
        // Measured backends run beside the CPU cores (the CPU stand-in is costed from the kernels).
        parallel: true,
        bps: 0.0,
        macs_per_s: 3.0 * d as f64 / per_neuron,
        batch_cost: batch_cost.max(0.0),
        call_ns: call * 1e9,
    }
}

/// Measures accelerator `kind`, each point for about `point_time` (see the module docs).
/// The CPU stand-in is not measured: it runs the file's rows through the kernels already measured,
/// which the planner costs it from (an error says so).
pub fn measure_accel(kind: &AccelKind, point_time: Duration) -> Result<AccelRate> {
    if kind.is_cpu() {
        return Err(CalibrateError::Measure(
            "calibrate: the cpu accelerator runs the measured CPU kernels, which the planner costs it from; measure an accelerator beside the cores (qnn, qnn:LIBRARY)".into(),
        ));
    }
    let block = synthetic_block(NEURONS, D_MODEL)?;
    let accel = open(kind, [Ok(block)])?;
    let x: Vec<f32> = (0..BATCH * D_MODEL)
        .map(|i| ((i * 37) % 101) as f32 / 101.0 - 0.5)
        .collect();
    let mut out = vec![0f32; BATCH * D_MODEL];
    let mut time = |neurons: usize, n: usize| {
        per_call(point_time, || {
            Ok(accel.ffn(0, neurons, &x[..n * D_MODEL], n, &mut out[..n * D_MODEL])?)
        })
    };
    let full = time(NEURONS, 1)?;
    let half = time(NEURONS / 2, 1)?;
    let batch = time(NEURONS, BATCH)?;
    let rate = fit(kind.name(), NEURONS, D_MODEL, full, half, (batch, BATCH));
    if !(rate.macs_per_s.is_finite() && rate.macs_per_s > 0.0) {
        return Err(CalibrateError::Measure(format!(
            "calibrate: the {} accelerator's timings give no rate ({full} s per block)",
            kind.name()
        )));
    }
    Ok(rate)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fit_recovers_a_linear_cost() {
        // 2 µs per call, 1 ns per neuron-row, a batch of 8 costing 3x one token's compute.
        let (n, d) = (2048usize, 1024usize);
        let (call, per) = (2e-6, 1e-9 * 3.0 * d as f64);
        let t = |k: usize| call + per * k as f64;
        let r = fit(
            "qnn",
            n,
            d,
            t(n),
            t(n / 2),
            (call + 3.0 * per * n as f64, 8),
        );
        assert!((r.macs_per_s - 1e9).abs() < 1e3, "{r:?}");
        assert!((r.call_ns - 2000.0).abs() < 1e-3, "{r:?}");
        assert!((r.batch_cost - 2.0 / 7.0).abs() < 1e-9, "{r:?}");
        assert!(r.parallel && r.bps == 0.0);
        // Noise: the half block no faster than the whole one.
        let r = fit("qnn", n, d, 1e-3, 1.1e-3, (2e-3, 8));
        assert_eq!(r.call_ns, 0.0);
        assert!((r.macs_per_s - 3.0 * d as f64 * n as f64 / 1e-3).abs() < 1.0);
        assert!((r.batch_cost - 1.0 / 7.0).abs() < 1e-9, "{r:?}");
    }
}
