//! `matmul` of 8-bit activations through the integer tile (Q4_K/Q5_K/Q6_K on AVX2): every token's
//! row of the result is what `matvec` gives for that token, bit for bit, whatever the token count
//! (groups of four and the remainders), the rows per work item and the row count. Its accuracy
//! against float64 is `props.rs`'s (the Int8 bound).

mod common;

use common::*;
use kernels_neon::*;
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn int8_tile_equals_matvec_per_token(
        format in prop::sample::select(vec![WeightFormat::Q4_K, WeightFormat::Q5_K, WeightFormat::Q6_K]),
        rows in 1usize..40,
        supers in 1usize..4,
        n in 2usize..12,
        chunk in prop::sample::select(vec![0usize, 1, 3, 16]),
        seed in any::<u64>(),
    ) {
        let cols = 256 * supers;
        let mut rng = Rng(seed);
        let data = random_matrix(format, rows, cols, &mut rng);
        let w = QMatrix::new(format, rows, cols, &data).unwrap();
        let x = random_vec(cols * n, &mut rng);
        set_chunk_rows(chunk);
        for path in available_paths().into_iter().filter(|&p| int8_tile(p, format)) {
            let mut y = vec![f32::NAN; rows * n];
            matmul_with(path, &w, &x, n, &mut y, Precision::Int8).unwrap();
            for t in 0..n {
                let mut yt = vec![f32::NAN; rows];
                matvec_with(path, &w, &x[t * cols..(t + 1) * cols], &mut yt, Precision::Int8).unwrap();
                for r in 0..rows {
                    prop_assert_eq!(
                        y[t * rows + r].to_bits(), yt[r].to_bits(),
                        "{:?} {:?} n={} t={} r={}: {} vs matvec {}", path, format, n, t, r,
                        y[t * rows + r], yt[r]
                    );
                }
            }
        }
        set_chunk_rows(0);
    }
}

/// Which tile an Int8 prompt of a Q4_K matrix takes, on every path here: the integer tile where
/// the tests above assume it (its result differs from the f32 tile's, `Exact`), the bf16 tile on
/// AVX-512 (also different), the f32 tile elsewhere (the same).
#[test]
fn int8_prompts_of_k_quants_take_the_integer_tile_on_avx2() {
    let (rows, cols, n) = (8, 512, 5);
    let mut rng = Rng(7);
    let data = random_matrix(WeightFormat::Q4_K, rows, cols, &mut rng);
    let w = QMatrix::new(WeightFormat::Q4_K, rows, cols, &data).unwrap();
    let x = random_vec(cols * n, &mut rng);
    for path in available_paths() {
        let (mut yi, mut ye) = (vec![0f32; rows * n], vec![0f32; rows * n]);
        matmul_with(path, &w, &x, n, &mut yi, Precision::Int8).unwrap();
        matmul_with(path, &w, &x, n, &mut ye, Precision::Exact).unwrap();
        let other_tile = int8_tile(path, WeightFormat::Q4_K) || path == KernelPath::Avx512;
        assert_eq!(yi != ye, other_tile, "{path:?}");
    }
}
