//! Small random devices and models for the planner's tests.

#![allow(dead_code)]

use planner::{AccelRate, DeviceProfile, FfnLayer, IoRate, KernelRate, ModelSummary, TensorInfo};
use proptest::prelude::*;

/// A device with `cores` cores, rates scaled by `speed` (so tests can vary them).
pub fn device(cores: u32, speed: f64) -> DeviceProfile {
    let mut kernels = Vec::new();
    for t in 1..=cores {
        for f in ["q4_0", "q8_0"] {
            let base = if f == "q4_0" { 4e9 } else { 6e9 };
            kernels.push(KernelRate {
                format: f.into(),
                threads: t,
                dense_bps: base * speed * (t as f64).powf(0.8),
                sparse_bps: base * 0.6 * speed * (t as f64).powf(0.8),
                axpy_bps: 0.0,
                batch_cost: 0.0,
                dram_dense_bps: 0.0,
                unit_rows_bps: 0.0,
                unit_axpy_bps: 0.0,
            });
        }
    }
    DeviceProfile {
        name: "test".into(),
        fingerprint: 7,
        cores,
        dram_bps: 12e9,
        batch_cost: 0.3,
        kernels,
        flash_random: vec![
            IoRate {
                read_bytes: 4096,
                queue_depth: 1,
                bps: 0.05e9,
            },
            IoRate {
                read_bytes: 4096,
                queue_depth: 32,
                bps: 0.6e9 * speed,
            },
            IoRate {
                read_bytes: 16384,
                queue_depth: 32,
                bps: 1.2e9 * speed,
            },
        ],
        flash_seq_bps: 2e9,
        flash_path: "/tmp".into(),
        ..Default::default()
    }
}

/// A power law of firing frequencies, hottest first.
pub fn power_law(n: usize, alpha: f64, scale: f64) -> Vec<f32> {
    (0..n)
        .map(|i| (scale * (i as f64 + 1.0).powf(-alpha)).min(1.0) as f32)
        .collect()
}

/// A model of `layers` layers of `neurons` neurons on a grid of `grid` steps.
pub fn model(
    layers: usize,
    neurons: usize,
    grid: u32,
    alpha: f64,
    offloaded: bool,
) -> ModelSummary {
    let ls = (0..layers)
        .map(|l| {
            let f1 = power_law(neurons, alpha + 0.1 * l as f64, 0.9);
            let f2: Vec<f32> = f1.iter().map(|&p| 1.0 - (1.0 - p) * (1.0 - p)).collect();
            FfnLayer::from_frequencies(12288, "q4_0", 16384, 1, &[f1, f2], grid).unwrap()
        })
        .collect();
    ModelSummary {
        name: "test-model".into(),
        fingerprint: 99,
        tensors: vec![
            TensorInfo {
                name: "attention".into(),
                format: "q4_0".into(),
                bytes: 8 << 20,
                touched_bytes: 8 << 20,
                offloadable: false,
                computed: true,
            },
            TensorInfo {
                name: "token_embd.weight".into(),
                format: "q4_0".into(),
                bytes: 16 << 20,
                touched_bytes: 2304,
                offloadable: true,
                computed: false,
            },
        ],
        layers: ls,
        predictor_bytes: 1 << 20,
        predicted: true,
        kv_bytes_per_position: 4096,
        process_bytes: 4 << 20,
        batch_sizes: vec![1, 2],
        grid,
        offloaded,
        ..Default::default()
    }
}

/// Strategy: (layers, neurons, grid, alpha, budget fraction in [0, 1.2]).
pub fn small_case() -> impl Strategy<Value = (usize, usize, u32, f64, f64)> {
    (1usize..=3, 8usize..64, 1u32..=4, 0.3f64..2.0, 0.0f64..1.2)
}

/// An accelerator beside the cores (an NPU's entry) at `bps` bytes per second.
pub fn npu(bps: f64) -> AccelRate {
    AccelRate {
        name: "qnn".into(),
        parallel: true,
        bps,
        macs_per_s: 0.0,
        batch_cost: 0.1,
        call_ns: 20_000.0,
    }
}

/// `d` with the accelerator entry `a`.
pub fn with(mut d: DeviceProfile, a: AccelRate) -> DeviceProfile {
    d.accelerators.push(a);
    d
}
