//! The PowerInfer-2 hybrid format (`I4Hybrid`): byte layout, quantizer
//! (outlier choice, error bounds), validation of outlier columns, and a
//! hand-made row through every kernel path.

use crate::common;

use common::Rng;
use kernels_neon::*;
use proptest::prelude::*;

fn hy(k: u16) -> WeightFormat {
    WeightFormat::I4Hybrid {
        outliers_per_row: k,
    }
}

fn quantize(format: WeightFormat, x: &[f32]) -> Vec<u8> {
    let mut q = vec![0u8; format.row_bytes(x.len()).unwrap()];
    quantize_row(format, x, &mut q).unwrap();
    q
}

fn f32_at(b: &[u8], i: usize) -> f32 {
    f32::from_le_bytes(b[i..i + 4].try_into().unwrap())
}

#[test]
fn row_bytes_follow_the_layout() {
    // 8 header bytes + cols/2 nibbles + 3 bytes per outlier, padded to 4.
    assert_eq!(hy(0).row_bytes(576), Some(8 + 288));
    assert_eq!(hy(6).row_bytes(576), Some(316)); // 314 -> 316
    assert_eq!(hy(16).row_bytes(1536), Some(8 + 768 + 48));
    assert_eq!(hy(1).row_bytes(33), None); // not a multiple of 32
    assert_eq!(hy(40).row_bytes(32), None); // k > cols
    assert_eq!(hy(0).row_bytes(65536 + 32), None); // u16 columns
    assert_eq!(WeightFormat::hybrid_for(0.01, 576), Some(hy(6)));
    assert_eq!(WeightFormat::hybrid_for(0.005, 1536), Some(hy(8)));
    assert_eq!(WeightFormat::hybrid_for(0.0, 1536), Some(hy(0)));
    assert_eq!(WeightFormat::hybrid_for(0.07, 100), Some(hy(7)));
    assert_eq!(WeightFormat::hybrid_for(0.02, 1536), Some(hy(31)));
    assert_eq!(WeightFormat::hybrid_for(1.0, 64), Some(hy(64)));
    assert!(hy(3).is_quantized() && hy(3).is_hybrid() && !WeightFormat::Q4_0.is_hybrid());
}

#[test]
fn hand_made_row_on_every_path() {
    // 32 columns: s = 0.5, s_o = 0.25, q = (j % 16) - 8, outliers at
    // columns 31 (o = 100) and 2 (o = -4); the nibble at column 2 is also
    // used (non-zero), which the format adds to the outlier.
    let (s, so) = (0.5f32, 0.25f32);
    let mut row = Vec::new();
    row.extend_from_slice(&s.to_le_bytes());
    row.extend_from_slice(&so.to_le_bytes());
    for j in 0..16 {
        let lo = (j % 16) as u8;
        let hi = ((j + 16) % 16) as u8;
        row.push(lo | (hi << 4));
    }
    row.extend_from_slice(&31u16.to_le_bytes());
    row.extend_from_slice(&2u16.to_le_bytes());
    row.push(100u8);
    row.push((-4i8) as u8);
    row.resize(hy(2).row_bytes(32).unwrap(), 0);
    assert_eq!(row.len(), 32);
    let mut want = [0f32; 32];
    for (j, w) in want.iter_mut().enumerate() {
        *w = s * ((j % 16) as f32 - 8.0);
    }
    want[31] += so * 100.0;
    want[2] += so * -4.0;
    let x: Vec<f32> = (0..32).map(|j| (j as f32 - 10.0) * 0.125).collect();
    let dot: f32 = want.iter().zip(&x).map(|(a, b)| a * b).sum();
    let w = QMatrix::new(hy(2), 1, 32, &row).unwrap();
    for path in available_paths() {
        let mut d = [0f32; 32];
        dequantize_row_with(path, hy(2), &row, &mut d).unwrap();
        assert_eq!(d, want, "{path:?}");
        for p in [Precision::Exact, Precision::Fast, Precision::Int8] {
            let mut y = [0f32];
            matvec_with(path, &w, &x, &mut y, p).unwrap();
            assert!(
                (y[0] - dot).abs() < 1e-4,
                "{path:?} {p:?}: {} vs {dot}",
                y[0]
            );
        }
        let mut y = vec![1f32; 32];
        axpy_rows_with(path, &w, &[0], &[2.0], &mut y).unwrap();
        for j in 0..32 {
            assert!(
                (y[j] - (1.0 + 2.0 * want[j])).abs() < 1e-5,
                "{path:?} axpy {j}"
            );
        }
    }
}

#[test]
fn out_of_range_outlier_columns_are_errors() {
    let mut rng = Rng(3);
    let x: Vec<f32> = (0..64).map(|_| rng.f()).collect();
    let mut q = quantize(hy(2), &x);
    assert!(QMatrix::new(hy(2), 1, 64, &q).is_ok());
    let n = 8 + 32; // first index
    q[n..n + 2].copy_from_slice(&64u16.to_le_bytes());
    let mut two = quantize(hy(2), &x);
    two.extend_from_slice(&q); // bad row is row 1
    assert!(matches!(
        QMatrix::new(hy(2), 2, 64, &two).map_err(KernelError::from),
        Err(KernelError::Layout(LayoutError::OutlierOutOfRange {
            row: 1,
            col: 64,
            cols: 64
        }))
    ));
    let mut d = vec![0f32; 64];
    assert!(matches!(
        dequantize_row(hy(2), &q, &mut d),
        Err(KernelError::Layout(LayoutError::OutlierOutOfRange {
            col: 64,
            ..
        }))
    ));
}

#[test]
fn outliers_reduce_the_error_of_heavy_tailed_rows() {
    // Gaussian-ish weights with 1% planted outliers 20x larger: per-channel
    // INT4 alone must spend its range on them; the hybrid format does not.
    let mut rng = Rng(11);
    let cols = 1536;
    let mut x: Vec<f32> = (0..cols)
        .map(|_| (rng.f() + rng.f() + rng.f()) * 0.02)
        .collect();
    for _ in 0..15 {
        let c = (rng.next_u64() % cols as u64) as usize;
        x[c] = if rng.f() > 0.0 { 1.0 } else { -1.0 } * (0.6 + rng.f().abs() * 0.4);
    }
    let mse = |format: WeightFormat| {
        let mut y = vec![0f32; cols];
        dequantize_row(format, &quantize(format, &x), &mut y).unwrap();
        x.iter()
            .zip(&y)
            .map(|(a, b)| f64::from(a - b).powi(2))
            .sum::<f64>()
            / cols as f64
    };
    let (plain, hybrid) = (
        mse(hy(0)),
        mse(WeightFormat::hybrid_for(0.01, cols).unwrap()),
    );
    assert!(
        hybrid * 20.0 < plain,
        "hybrid {hybrid} vs per-channel {plain}"
    );
    // And better than Q4_0 groups of 32 here.
    assert!(
        hybrid < mse(WeightFormat::Q4_0),
        "hybrid {hybrid} vs q4_0 {}",
        mse(WeightFormat::Q4_0)
    );
}

proptest! {
    #[test]
    fn quantizer_layout_and_error_bounds(
        units in 1usize..8,
        k in 0u16..40,
        scale in 1e-3f32..10.0,
        seed in any::<u64>(),
    ) {
        let cols = units * 32;
        let k = k.min(cols as u16);
        let format = hy(k);
        let mut rng = Rng(seed);
        let x: Vec<f32> = (0..cols).map(|_| rng.f() * rng.f() * scale).collect();
        let q = quantize(format, &x);
        let (s, so) = (f32_at(&q, 0), f32_at(&q, 4));
        let n = 8 + cols / 2;
        let k = usize::from(k);
        let idx: Vec<usize> = (0..k).map(|j| usize::from(u16::from_le_bytes([q[n + 2 * j], q[n + 2 * j + 1]]))).collect();
        // Sorted, distinct, in range, and the k largest magnitudes.
        prop_assert!(idx.windows(2).all(|p| p[0] < p[1]) && idx.iter().all(|&c| c < cols));
        let min_out = idx.iter().map(|&c| x[c].abs()).fold(f32::INFINITY, f32::min);
        let max_rest = (0..cols).filter(|c| !idx.contains(c)).map(|c| x[c].abs()).fold(0f32, f32::max);
        prop_assert!(k == 0 || k == cols || min_out >= max_rest);
        // Padding is zero, the INT4 quant at outlier columns is 0 (nibble 8).
        prop_assert!(q[n + 3 * k..].iter().all(|&b| b == 0));
        for &c in &idx {
            let b = q[8 + c / 32 * 16 + c % 16];
            prop_assert_eq!(if c % 32 < 16 { b & 0xF } else { b >> 4 }, 8);
        }
        let mut y = vec![0f32; cols];
        dequantize_row(format, &q, &mut y).unwrap();
        let tiny = 1e-6 * scale;
        for c in 0..cols {
            let err = (x[c] - y[c]).abs();
            if idx.contains(&c) {
                prop_assert!(err <= so * 0.5 + tiny, "outlier {c}: {} -> {} (so {so})", x[c], y[c]);
            } else {
                // Within half a step, unless clipped by the chosen ratio.
                let clip = if x[c] >= 0.0 { x[c] - 7.0 * s } else { -x[c] - 8.0 * s };
                prop_assert!(err <= (s * 0.5).max(clip) + tiny, "col {c}: {} -> {} (s {s})", x[c], y[c]);
                prop_assert!(s <= max_rest / 7.0 * 1.0001 + tiny);
            }
        }
    }
}
