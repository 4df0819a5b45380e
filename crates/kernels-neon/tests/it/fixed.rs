//! `add_fixed` on every available path gives the reference's integers: f32 values scaled by 2^32
//! and rounded to nearest, ties to even, including ties, values past the fast paths' ranges and
//! tails shorter than a SIMD step; `axpy_rows_fixed` gives the integers of `axpy_rows` then
//! `add_fixed`.

use crate::common;

use common::{random_matrix, Rng};
use kernels_neon::{
    add_fixed_with, available_paths, axpy_rows_fixed_with, axpy_rows_with, KernelPath, QMatrix,
    WeightFormat,
};
use proptest::prelude::*;

fn reference(acc: &[i64], x: &[f32]) -> Vec<i64> {
    acc.iter()
        .zip(x)
        .map(|(&a, &v)| a.wrapping_add((f64::from(v) * 4_294_967_296.0).round_ties_even() as i64))
        .collect()
}

fn check(acc: &[i64], x: &[f32]) {
    let want = reference(acc, x);
    for path in available_paths() {
        let (mut a, mut v) = (acc.to_vec(), x.to_vec());
        add_fixed_with(path, &mut a, &mut v).unwrap();
        assert_eq!(a, want, "{path:?}");
        assert!(v.iter().all(|&e| e == 0.0), "{path:?}: x not cleared");
    }
}

#[test]
fn ties_and_large_values() {
    // 2^-33 is half a step: ties round to even (0, 2, ...); 2^19 and 2^30 pass the fast paths'
    // ranges in one lane of a step; the last lanes are a tail.
    let half = 2f32.powi(-33);
    let mut x = vec![
        half,
        3.0 * half,
        -half,
        -3.0 * half,
        5.0 * half,
        1.0,
        -1.0,
        0.0,
    ];
    x.extend([
        2f32.powi(19),
        1e-3,
        -2f32.powi(30),
        0.5,
        7.25,
        -1e-6,
        3.0,
        1.5,
    ]);
    x.extend([123.456, -0.001, 2f32.powi(-40)]);
    let acc: Vec<i64> = (0..x.len() as i64).map(|i| i * 1_000_003 - 7).collect();
    check(&acc, &x);
    assert!(available_paths().contains(&KernelPath::Scalar));
}

proptest! {
    #[test]
    fn every_path_equals_the_reference(
        x in prop::collection::vec(-300f32..300.0, 0..70),
        acc0 in -1_000_000_000_000i64..1_000_000_000_000,
    ) {
        let acc: Vec<i64> = (0..x.len() as i64).map(|i| acc0 + i).collect();
        check(&acc, &x);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// `axpy_rows_fixed` gives the integers of `axpy_rows` into a zeroed vector followed by
    /// `add_fixed`, on every path, for the fused kernel's formats and others, row counts past
    /// one group, zero coefficients, and sums past the fast conversion's 2^19.
    #[test]
    fn axpy_rows_fixed_equals_axpy_then_add_fixed(
        f in 0usize..8,
        blocks in 1usize..5,
        picks in prop::collection::vec((0usize..120, -2f32..2.0), 0..90),
        big in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let formats = [
            WeightFormat::Q8_0,
            WeightFormat::Q4_0,
            WeightFormat::Q4_1,
            WeightFormat::Q5_0,
            WeightFormat::Q5_1,
            WeightFormat::IQ4_NL,
            WeightFormat::Q4_K,
            WeightFormat::F32,
        ];
        let format = formats[f];
        let cols = blocks * format.block_len().max(32);
        let n = 120;
        let data = random_matrix(format, n, cols, &mut Rng(seed));
        let w = QMatrix::new(format, n, cols, &data).unwrap();
        let rows: Vec<u32> = picks.iter().map(|p| p.0 as u32).collect();
        let scale = if big { 1e6 } else { 1.0 };
        let coeffs: Vec<f32> = picks
            .iter()
            .enumerate()
            .map(|(i, p)| if i % 7 == 3 { 0.0 } else { p.1 * scale })
            .collect();
        let acc0: Vec<i64> = (0..cols as i64).map(|i| i * 977 - 5_000).collect();
        for path in available_paths() {
            let mut y = vec![0f32; cols];
            axpy_rows_with(path, &w, &rows, &coeffs, &mut y).unwrap();
            let mut want = acc0.clone();
            add_fixed_with(path, &mut want, &mut y).unwrap();
            let (mut got, mut scratch) = (acc0.clone(), vec![0f32; cols]);
            axpy_rows_fixed_with(path, &w, &rows, &coeffs, &mut scratch, &mut got).unwrap();
            prop_assert_eq!(&got, &want, "{:?} {:?} {} rows", path, format, rows.len());
            prop_assert!(scratch.iter().all(|&v| v == 0.0), "{:?}: scratch not zeroed", path);
        }
    }
}
