//! `matmul` through the integer tiles: the 8-bit ones, Q4_K/Q5_K/Q6_K on AVX2 and AVX-512
//! (activations with one scale per 256, in `Int8`, and in `Fast` from `INT_TILE_MIN_TOKENS` tokens)
//! and Q2_K/Q3_K on AVX2 and AVX-512 (one scale per 32, the same token counts) and
//! Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/IQ4_NL/IQ4_XS on AVX-512, Q4_0/Q4_1/Q5_0/Q5_1 on AVX2 (one scale per
//! 32, in both from `INT_TILE_MIN_TOKENS` tokens); the 16-bit ones of `Fast` prompts from that many
//! tokens (AVX-512: Q4_0/Q4_1/Q5_1/IQ4_NL/IQ4_XS; AVX2: those and Q8_0; NEON with i8mm: as
//! AVX-512's, and from 8 tokens below that many every 32-block format). Every token's row of the
//! result is what `matvec` gives for that token in the precision whose activations the
//! tile takes (`common::tile_products`), whatever the token count (register blocks and the remainders),
//! the rows per work item and the row count: each sums the same integer products in another f32
//! order, so within f32 rounding of `Σ|w·x|`. Their accuracy
//! against float64 is `props.rs`'s (the Int8 and Fast bounds).

use crate::common;

use common::*;
use kernels_neon::*;
use proptest::prelude::*;

/// Checks `matmul` of `n` tokens in `precision` against `matvec` of each token on `path` in the
/// precision of the tile's products (`common::tile_products`): bit for bit where `exact`, else
/// within `1e-5 * Σ|w·x| + 1e-6`.
#[allow(clippy::too_many_arguments)]
fn equals_matvec(
    path: KernelPath,
    w: &QMatrix,
    wf: &[Vec<f64>],
    x: &[f32],
    n: usize,
    precision: Precision,
    exact: bool,
) -> Result<(), TestCaseError> {
    let (rows, cols) = (w.rows(), w.cols());
    if halves_tile(path, w.format(), precision, n) {
        return equals_halves(path, w, wf, x, n);
    }
    let products = tile_products(path, w.format(), precision, n).unwrap_or_else(|| {
        panic!(
            "{path:?} {:?} {precision:?} n={n}: no integer tile",
            w.format()
        )
    });
    let mut y = vec![f32::NAN; rows * n];
    matmul_with(path, w, x, n, &mut y, precision).unwrap();
    // `matvec` of `path` where it takes the tile's products; the scalar path's where `path`'s
    // decode takes others (`Fast` decode of Q2_K on AVX2 takes `Int8`'s: `matvec_precision`).
    let mpath = if matvec_precision(path, w.format(), products) == products {
        path
    } else {
        KernelPath::Scalar
    };
    for t in 0..n {
        let xt = &x[t * cols..(t + 1) * cols];
        let mut yt = vec![f32::NAN; rows];
        matvec_with(mpath, w, xt, &mut yt, products).unwrap();
        for r in 0..rows {
            let (got, want) = (y[t * rows + r], yt[r]);
            let what = format!(
                "{path:?} {:?} {precision:?} n={n} t={t} r={r}: {got} vs matvec {products:?} {want}",
                w.format()
            );
            if exact {
                prop_assert_eq!(got.to_bits(), want.to_bits(), "{}", what);
            } else {
                let abs: f64 = wf[r]
                    .iter()
                    .zip(xt)
                    .map(|(w, x)| (w * f64::from(*x)).abs())
                    .sum();
                let tol = 1e-5 * abs + 1e-6;
                prop_assert!(
                    (f64::from(got) - f64::from(want)).abs() <= tol,
                    "{} (tolerance {})",
                    what,
                    tol
                );
            }
        }
    }
    Ok(())
}

/// Checks `matmul` of `n` tokens in `Fast` where it takes activations of one scale per 16
/// (`halves_tile`) against the f64 dot of each row with each token's activations as quantized
/// (`quantize_acts_i8_halves_with`), within `1e-5 * Σ|w·x| + 1e-6`: the tile's integer products,
/// weighted by the half blocks' scales, summed in f32.
fn equals_halves(
    path: KernelPath,
    w: &QMatrix,
    wf: &[Vec<f64>],
    x: &[f32],
    n: usize,
) -> Result<(), TestCaseError> {
    let (rows, cols) = (w.rows(), w.cols());
    let mut y = vec![f32::NAN; rows * n];
    matmul_with(path, w, x, n, &mut y, Precision::Fast).unwrap();
    for t in 0..n {
        let q = quantize_acts_i8_halves_with(path, &x[t * cols..(t + 1) * cols]).unwrap();
        let xq: Vec<f64> =
            q.qs.iter()
                .enumerate()
                .map(|(e, &v)| f64::from(v) * f64::from(q.d16[e / 16]))
                .collect();
        for r in 0..rows {
            let dot: f64 = wf[r].iter().zip(&xq).map(|(a, b)| a * b).sum();
            let abs: f64 = wf[r].iter().zip(&xq).map(|(a, b)| (a * b).abs()).sum();
            let (got, tol) = (f64::from(y[t * rows + r]), 1e-5 * abs + 1e-6);
            prop_assert!(
                (got - dot).abs() <= tol,
                "{path:?} {:?} Fast n={n} t={t} r={r}: {got} vs {dot} with scales of 16 (tolerance {tol})",
                w.format()
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn int8_tile_equals_matvec_per_token(
        format in prop::sample::select(vec![
            WeightFormat::Q2_K, WeightFormat::Q3_K, WeightFormat::Q4_K, WeightFormat::Q5_K,
            WeightFormat::Q6_K,
        ]),
        rows in 1usize..80,
        supers in 1usize..4,
        n in 2usize..12,
        chunk in prop::sample::select(vec![0usize, 1, 3, 16, 48]),
        seed in any::<u64>(),
    ) {
        let cols = 256 * supers;
        let mut rng = Rng(seed);
        let data = random_matrix(format, rows, cols, &mut rng);
        let w = QMatrix::new(format, rows, cols, &data).unwrap();
        let x = random_vec(cols * n, &mut rng);
        let wf = dequant_f64(&w);
        set_chunk_rows(chunk);
        for path in available_paths().into_iter().filter(|&p| int8_tile(p, format)) {
            // No tile is bit-identical to `matvec` now (the AVX2 K-quant tile has the rows in
            // the lanes): within f32 rounding.
            equals_matvec(path, &w, &wf, &x, n, Precision::Int8, false)?;
        }
        set_chunk_rows(0);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn prompts_equal_matvec_per_token(
        format in prop::sample::select(vec![
            WeightFormat::Q4_0, WeightFormat::Q4_1, WeightFormat::Q5_0, WeightFormat::Q5_1,
            WeightFormat::Q8_0, WeightFormat::IQ4_NL, WeightFormat::IQ4_XS, WeightFormat::Q2_K,
            WeightFormat::Q3_K,
            WeightFormat::Q4_K, WeightFormat::Q5_K, WeightFormat::Q6_K,
        ]),
        rows in 1usize..80,
        units in 1usize..12,
        n in 8..INT_TILE_MIN_TOKENS + 9,
        chunk in prop::sample::select(vec![0usize, 1, 3, 16, 48]),
        seed in any::<u64>(),
    ) {
        let cols = if format.is_k_quant() { 256 * (1 + units % 3) } else { 32 * units };
        let mut rng = Rng(seed);
        let data = random_matrix(format, rows, cols, &mut rng);
        let w = QMatrix::new(format, rows, cols, &data).unwrap();
        let x = random_vec(cols * n, &mut rng);
        let wf = dequant_f64(&w);
        set_chunk_rows(chunk);
        for path in available_paths() {
            for precision in [Precision::Fast, Precision::Int8] {
                if int_tile(path, format, precision, n) {
                    equals_matvec(path, &w, &wf, &x, n, precision, false)?;
                }
            }
        }
        set_chunk_rows(0);
    }
}

/// Which tile an Int8 prompt of a Q4_K matrix takes, on every path here: the integer tile where
/// the tests above assume it (its result differs from the f32 tile's, `Exact`), the f32 tile
/// elsewhere (the same).
#[test]
fn int8_prompts_of_k_quants_take_the_integer_tile_on_x86_and_dotprod() {
    let (rows, cols, n) = (8, 512, 5);
    let mut rng = Rng(7);
    let data = random_matrix(WeightFormat::Q4_K, rows, cols, &mut rng);
    let w = QMatrix::new(WeightFormat::Q4_K, rows, cols, &data).unwrap();
    let x = random_vec(cols * n, &mut rng);
    for path in available_paths() {
        let (mut yi, mut ye) = (vec![0f32; rows * n], vec![0f32; rows * n]);
        matmul_with(path, &w, &x, n, &mut yi, Precision::Int8).unwrap();
        matmul_with(path, &w, &x, n, &mut ye, Precision::Exact).unwrap();
        let other_tile = int8_tile(path, WeightFormat::Q4_K);
        assert_eq!(yi != ye, other_tile, "{path:?}");
    }
}

/// `Fast` prompts of `fast_prompts_halves`' formats (Q4_0, Q4_1 on AVX2, AVX-512 and with
/// dotprod or i8mm; IQ4_NL and IQ4_XS on AVX-512) take the 8-bit tile with a scale per 16 on the
/// paths that have it, from `halves_min_tokens` (8 on aarch64, else `INT_TILE_MIN_TOKENS`), over
/// whole panels and a partial one, a short last group of rows, an odd row and token count and
/// every register block's remainder of tokens; the AVX2 (Q4_0, Q4_1) and AVX-512 paths on x86_64
/// and the dotprod and i8mm ones on aarch64 (Q4_0, Q4_1; wherever the CPU has them) must be among
/// them.
#[test]
fn fast_q4_prompts_take_scales_of_16() {
    use WeightFormat::*;
    let mut rng = Rng(0x0416);
    for format in [Q4_0, Q4_1, IQ4_NL, IQ4_XS] {
        let mut taken = Vec::new();
        let shapes = match format {
            IQ4_XS => [(19, 256), (40, 256 * 5)],
            _ => [(19, 96), (40, 32 * 37)],
        };
        for (rows, cols) in shapes {
            let data = random_matrix(format, rows, cols, &mut rng);
            let w = QMatrix::new(format, rows, cols, &data).unwrap();
            let wf = dequant_f64(&w);
            // 8 and 13: from `halves_min_tokens` on aarch64, a 16-bit tile's before.
            for n in [
                8,
                13,
                INT_TILE_MIN_TOKENS,
                INT_TILE_MIN_TOKENS + 1,
                INT_TILE_MIN_TOKENS + 2,
            ] {
                let x = random_vec(cols * n, &mut rng);
                for path in available_paths() {
                    if halves_tile(path, format, Precision::Fast, n) {
                        equals_halves(path, &w, &wf, &x, n).unwrap();
                        taken.push(path);
                    }
                }
            }
        }
        let q4 = matches!(format, Q4_0 | Q4_1);
        #[cfg(target_arch = "x86_64")]
        for path in [KernelPath::Avx2Fma, KernelPath::Avx512] {
            if available_paths().contains(&path) && (q4 || path == KernelPath::Avx512) {
                assert!(taken.contains(&path), "{format:?}: {taken:?}");
            }
        }
        #[cfg(target_arch = "aarch64")]
        for path in [KernelPath::NeonDotprod, KernelPath::NeonI8mm] {
            if available_paths().contains(&path) && q4 {
                assert!(taken.contains(&path), "{format:?}: {taken:?}");
            }
        }
    }
}
