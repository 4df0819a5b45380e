//! `add_fixed` on every available path gives the reference's integers: f32 values scaled by 2^32
//! and rounded to nearest, ties to even, including ties, values past the fast paths' ranges and
//! tails shorter than a SIMD step.

use kernels_neon::{add_fixed_with, available_paths, KernelPath};
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
