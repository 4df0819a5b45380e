//! Weight quantizers: round trips through `dequantize_row` stay within each format's step, re-quantizing a
//! dequantized row reproduces it, and bad input is an error.

use crate::common;

use common::Rng;
use kernels_neon::{
    dequantize_row, quantize_matrix, quantize_row, KernelError, LayoutError, WeightFormat,
};
use proptest::prelude::*;

const FORMATS: [WeightFormat; 8] = [
    WeightFormat::F32,
    WeightFormat::F16,
    WeightFormat::BF16,
    WeightFormat::Q8_0,
    WeightFormat::Q4_0,
    WeightFormat::Q4_1,
    WeightFormat::Q5_0,
    WeightFormat::Q5_1,
];

fn round_trip(format: WeightFormat, x: &[f32]) -> Vec<f32> {
    let mut q = vec![0u8; format.row_bytes(x.len()).unwrap()];
    quantize_row(format, x, &mut q).unwrap();
    let mut y = vec![0.0f32; x.len()];
    dequantize_row(format, &q, &mut y).unwrap();
    y
}

/// What storing a block's `d` (and `m`) as f16 can add when it is subnormal in f16 (below 2^-14,
/// spaced 2^-24 apart: rounded by up to 2^-25 absolute, not relative): up to 2^-25 times the largest
/// quant (127) plus one for `m`. Blocks of values near 1e-3 have `d` near 8e-6, subnormal; there
/// the relative slack of the bounds below (1e-3 of `amax`) is too small.
const F16_SUBNORMAL: f32 = 128.0 / (1u32 << 25) as f32;

/// Largest error allowed per element of a 32-block whose largest magnitude is `amax` (range `span`).
fn step(format: WeightFormat, amax: f32, span: f32) -> f32 {
    match format {
        WeightFormat::F32 => 0.0,
        WeightFormat::F16 => amax * 1e-3,
        WeightFormat::BF16 => amax * 8e-3,
        WeightFormat::Q8_0 => amax / 127.0 * 0.5 + amax * 1e-3 + F16_SUBNORMAL,
        WeightFormat::Q4_0 => amax / 8.0 + amax * 1e-2 + F16_SUBNORMAL,
        WeightFormat::Q4_1 => span / 15.0 * 0.5 + span * 1e-2 + amax * 1e-3 + F16_SUBNORMAL,
        WeightFormat::Q5_0 => amax / 16.0 + amax * 1e-2 + F16_SUBNORMAL,
        WeightFormat::Q5_1 => span / 31.0 * 0.5 + span * 1e-2 + amax * 1e-3 + F16_SUBNORMAL,
        _ => unreachable!(),
    }
}

proptest! {
    #[test]
    fn round_trip_error_is_within_one_step(blocks in 1usize..6, seed in any::<u64>(), scale in 1e-3f32..10.0) {
        let mut rng = Rng(seed);
        let x: Vec<f32> = (0..blocks * 32).map(|_| rng.f() * scale).collect();
        for format in FORMATS {
            let y = round_trip(format, &x);
            for (b, (xs, ys)) in x.chunks(32).zip(y.chunks(32)).enumerate() {
                let amax = xs.iter().fold(0.0f32, |a, v| a.max(v.abs()));
                let span = xs.iter().copied().fold(f32::MIN, f32::max) - xs.iter().copied().fold(f32::MAX, f32::min);
                let tol = step(format, amax, span);
                for (i, (a, b2)) in xs.iter().zip(ys).enumerate() {
                    prop_assert!((a - b2).abs() <= tol, "{format:?} block {b} elem {i}: {a} -> {b2} (tol {tol})");
                }
            }
        }
    }
}

/// [`k_step`] of an affine K-quant (Q2_K, Q4_K) of `len`-element sub-blocks, `levels` quant
/// steps and sub-block scales of `scale_max` steps: one step of the element's sub-block, `slack`
/// steps of `d` for the rounded scale, one `dmin` step for the rounded min.
fn affine_step(x: &[f32], i: usize, len: usize, levels: f32, scale_max: f32, slack: f32) -> f32 {
    let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
    let range =
        |s: &[f32]| s.iter().copied().fold(0f32, f32::max) - s.iter().copied().fold(0f32, f32::min);
    let d = x.chunks(len).map(range).fold(0f32, f32::max) / levels / scale_max;
    let dmin = x.iter().copied().fold(0f32, f32::min).abs() / scale_max;
    range(&x[i / len * len..][..len]) / levels + slack * d + dmin + amax * 1e-3
}

/// Largest error allowed in a K-quant super-block `x` (256 elements) for the element at `i`: one
/// quantization step of its sub-block, plus what rounding the sub-block scales (and Q4_K's mins) to
/// 6 or 8 bits can shift or clip.
fn k_step(format: WeightFormat, x: &[f32], i: usize) -> f32 {
    let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
    match format {
        WeightFormat::Q4_K => affine_step(x, i, 32, 15.0, 63.0, 8.0),
        // 4-bit scales and mins: rounding a sub-block's scale moves its top level by up to 1.5 `d`,
        // its min by half a `dmin` step.
        WeightFormat::Q2_K => affine_step(x, i, 16, 3.0, 15.0, 2.0),
        WeightFormat::Q6_K => {
            let sub = x[i / 16 * 16..][..16]
                .iter()
                .fold(0f32, |a, v| a.max(v.abs()));
            sub / 32.0 + 16.0 * (amax / 32.0 / 127.0) + amax * 1e-3
        }
        _ => unreachable!(),
    }
}

proptest! {
    #[test]
    fn k_quant_round_trip_error_is_within_one_step(blocks in 1usize..4, seed in any::<u64>(), scale in 1e-3f32..10.0, skew in 0f32..1.0) {
        let mut rng = Rng(seed);
        // Sub-blocks of different magnitudes, and a skew off zero (Q4_K's mins).
        let x: Vec<f32> = (0..blocks * 256)
            .map(|i| (rng.f() + skew) * scale * (1.0 + (i / 32 % 5) as f32))
            .collect();
        for format in [WeightFormat::Q2_K, WeightFormat::Q4_K, WeightFormat::Q6_K] {
            let y = round_trip(format, &x);
            for (b, (xs, ys)) in x.chunks(256).zip(y.chunks(256)).enumerate() {
                for (i, (a, b2)) in xs.iter().zip(ys).enumerate() {
                    let tol = k_step(format, xs, i);
                    prop_assert!((a - b2).abs() <= tol, "{format:?} block {b} elem {i}: {a} -> {b2} (tol {tol})");
                }
            }
            prop_assert!(round_trip(format, &[0.0; 256]).iter().all(|&v| v == 0.0), "{format:?}");
        }
    }
}

#[test]
fn requantizing_a_dequantized_row_is_stable() {
    let mut rng = Rng(7);
    let x: Vec<f32> = (0..256).map(|_| rng.f()).collect();
    for format in FORMATS {
        let once = round_trip(format, &x);
        let twice = round_trip(format, &once);
        for (a, b) in once.iter().zip(&twice) {
            assert!(
                (a - b).abs() <= 1e-3 * a.abs().max(1e-2),
                "{format:?}: {a} vs {b}"
            );
        }
    }
}

#[test]
fn zero_blocks_stay_zero() {
    for format in FORMATS {
        assert!(
            round_trip(format, &[0.0; 64]).iter().all(|&v| v == 0.0),
            "{format:?}"
        );
    }
}

#[test]
fn bad_input_is_an_error() {
    let mut q = vec![0u8; 34];
    assert!(matches!(
        quantize_row(WeightFormat::Q8_0, &[0.0; 31], &mut q),
        Err(KernelError::Layout(LayoutError::RaggedCols { .. }))
    ));
    assert!(matches!(
        quantize_row(WeightFormat::Q8_0, &[0.0; 64], &mut q),
        Err(KernelError::Layout(LayoutError::DataLength { .. }))
    ));
    let mut x = [0.0f32; 32];
    x[5] = f32::NAN;
    assert!(matches!(
        quantize_row(WeightFormat::Q8_0, &x, &mut q),
        Err(KernelError::NonFinite { index: 5, .. })
    ));
    let mut k = vec![0u8; 176];
    assert!(matches!(
        quantize_row(WeightFormat::Q5_K, &[0.0; 256], &mut k[..110]),
        Err(KernelError::Layout(LayoutError::DataLength { .. }))
    ));
    assert!(matches!(
        quantize_row(WeightFormat::Q5_K, &[0.0; 256], &mut k),
        Err(KernelError::Unsupported { .. })
    ));
    assert!(matches!(
        quantize_row(WeightFormat::Q4_K, &[0.0; 255], &mut k[..144]),
        Err(KernelError::Layout(LayoutError::RaggedCols { .. }))
    ));
    assert!(matches!(
        quantize_matrix(WeightFormat::Q8_0, &[0.0; 10], 2, 32),
        Err(KernelError::LengthMismatch { .. })
    ));
}

#[test]
fn quantize_matrix_matches_rows() {
    let mut rng = Rng(3);
    let x: Vec<f32> = (0..3 * 64).map(|_| rng.f()).collect();
    let m = quantize_matrix(WeightFormat::Q4_1, &x, 3, 64).unwrap();
    let rb = WeightFormat::Q4_1.row_bytes(64).unwrap();
    for r in 0..3 {
        let mut q = vec![0u8; rb];
        quantize_row(WeightFormat::Q4_1, &x[r * 64..(r + 1) * 64], &mut q).unwrap();
        assert_eq!(&m[r * rb..(r + 1) * rb], &q[..]);
    }
}
