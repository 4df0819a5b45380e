//! F16 weights outside `Exact` take their activations rounded to f16 (`HalfActs`), on every path:
//! the result is the exact float kernel's on the rounded activations, bit for bit, whether the
//! path multiplies f16 directly (aarch64 with FEAT_FHM: `fmlal`, tested under `qemu -cpu max`) or
//! the float kernel runs on the rounded values (elsewhere).

use crate::common::*;
use half::f16;
use kernels_neon::*;

const NON_EXACT: [Precision; 3] = [Precision::Fast, Precision::Int8, Precision::Ggml];

fn rounded(x: &[f32]) -> Vec<f32> {
    x.iter().map(|&v| f16::from_f32(v).to_f32()).collect()
}

fn bits(y: &[f32]) -> Vec<u32> {
    y.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn f16_rows_equal_the_exact_kernel_on_rounded_activations_bit_for_bit() {
    let mut rng = Rng(0x05ee_df16);
    // Row counts around the four-row step (and its pairs and single rows), column counts with
    // and without a tail past the last group of 32.
    for (rows, cols) in [
        (1, 32),
        (4, 64),
        (7, 96),
        (9, 33),
        (13, 100),
        (16, 576),
        (5, 7),
    ] {
        let data = random_matrix(WeightFormat::F16, rows, cols, &mut rng);
        let w = QMatrix::new(WeightFormat::F16, rows, cols, &data).unwrap();
        // Values from about 1e-6 to 30: some f16 subnormals, most rounded away from their f32.
        let x: Vec<f32> = (0..cols)
            .map(|i| rng.f() * [30.0, 1.0, 1e-5][i % 3])
            .collect();
        let xr = rounded(&x);
        assert_ne!(x, xr, "the activations must change when rounded");
        let list: Vec<u32> = (0..rows as u32).rev().chain([0, 0]).collect();
        for path in available_paths() {
            let mut want = vec![f32::NAN; rows];
            matvec_with(path, &w, &xr, &mut want, Precision::Exact).unwrap();
            let mut want_list = vec![f32::NAN; list.len()];
            matvec_rows_with(path, &w, &list, &xr, &mut want_list, Precision::Exact).unwrap();
            for precision in NON_EXACT {
                let mut y = vec![f32::NAN; rows];
                matvec_with(path, &w, &x, &mut y, precision).unwrap();
                assert_eq!(
                    bits(&y),
                    bits(&want),
                    "{path:?} {precision:?} {rows}x{cols}"
                );
                let mut yl = vec![f32::NAN; list.len()];
                matvec_rows_with(path, &w, &list, &x, &mut yl, precision).unwrap();
                assert_eq!(
                    bits(&yl),
                    bits(&want_list),
                    "{path:?} {precision:?} rows {list:?}"
                );
            }
        }
    }
}

#[test]
fn f16_activations_past_f16s_range_stay_f32() {
    let mut rng = Rng(7);
    let (rows, cols) = (6, 70);
    let data = random_matrix(WeightFormat::F16, rows, cols, &mut rng);
    let w = QMatrix::new(WeightFormat::F16, rows, cols, &data).unwrap();
    let mut x = random_vec(cols, &mut rng);
    x[3] = 70000.0;
    for path in available_paths() {
        let mut want = vec![f32::NAN; rows];
        matvec_with(path, &w, &x, &mut want, Precision::Exact).unwrap();
        assert!(want.iter().all(|v| v.is_finite()));
        for precision in NON_EXACT {
            let mut y = vec![f32::NAN; rows];
            matvec_with(path, &w, &x, &mut y, precision).unwrap();
            assert_eq!(bits(&y), bits(&want), "{path:?} {precision:?}");
        }
    }
}

#[test]
fn other_float_formats_keep_f32_activations() {
    let mut rng = Rng(11);
    let (rows, cols) = (5, 64);
    let x = random_vec(cols, &mut rng);
    for format in [WeightFormat::F32, WeightFormat::BF16] {
        let data = random_matrix(format, rows, cols, &mut rng);
        let w = QMatrix::new(format, rows, cols, &data).unwrap();
        for path in available_paths() {
            let mut want = vec![f32::NAN; rows];
            matvec_with(path, &w, &x, &mut want, Precision::Exact).unwrap();
            for precision in NON_EXACT {
                let mut y = vec![f32::NAN; rows];
                matvec_with(path, &w, &x, &mut y, precision).unwrap();
                assert_eq!(bits(&y), bits(&want), "{path:?} {format:?} {precision:?}");
            }
        }
    }
}
