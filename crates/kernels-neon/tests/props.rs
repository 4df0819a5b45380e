//! Property tests: every available kernel path against a float64 reference.
//!
//! Tolerances (stated once, used everywhere below):
//! * Exact:  |y - ref| <= 1e-5 * Σ|w·x| + 1e-6
//! * Fast (8-bit activations, round to nearest, d = amax/127): each
//!   activation is off by at most d/2 = amax_block/254, so
//!   |y - ref| <= Σ_j |w_j| · amax_block(j) / 254 · 1.001 + 1e-5 * Σ|w·x| + 1e-6.
//!   Float weight formats use the exact path in Fast mode and get the Exact bound.

mod common;

use common::*;
use kernels_neon::*;
use proptest::prelude::*;

fn cols_for(format: WeightFormat, units: usize, odd: usize) -> usize {
    if format.is_quantized() {
        units * 32
    } else {
        units * 32 + odd
    }
}

fn check(y: f32, (dot, abs, qerr): (f64, f64, f64), fast_int: bool) -> Result<(), String> {
    let mut tol = 1e-5 * abs + 1e-6;
    if fast_int {
        tol += qerr * 1.001;
    }
    let err = (f64::from(y) - dot).abs();
    if err <= tol {
        Ok(())
    } else {
        Err(format!("y={y} ref={dot} err={err} tol={tol}"))
    }
}

/// 256 cases unless `PROPTEST_CASES` says otherwise (reduce it under qemu).
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

fn format_strategy() -> impl Strategy<Value = WeightFormat> {
    prop::sample::select(FORMATS.to_vec())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn matvec_all_paths_match_f64(
        format in format_strategy(),
        rows in 1usize..70,
        units in 1usize..12,
        odd in 0usize..8,
        chunk in prop::sample::select(vec![0usize, 1, 3, 16]),
        seed in any::<u64>(),
    ) {
        let cols = cols_for(format, units, odd);
        let mut rng = Rng(seed);
        let data = random_matrix(format, rows, cols, &mut rng);
        let w = QMatrix::new(format, rows, cols, &data).unwrap();
        let x = random_vec(cols, &mut rng);
        let wf = dequant_f64(&w);
        set_chunk_rows(chunk);
        for path in available_paths() {
            for precision in [Precision::Exact, Precision::Fast] {
                let mut y = vec![f32::NAN; rows];
                matvec_with(path, &w, &x, &mut y, precision).unwrap();
                let fast_int = precision == Precision::Fast && format.is_quantized();
                for r in 0..rows {
                    if let Err(e) = check(y[r], reference(&wf[r], &x), fast_int) {
                        prop_assert!(false, "{path:?} {format:?} {precision:?} {rows}x{cols} row {r}: {e}");
                    }
                }
            }
        }
        set_chunk_rows(0);
    }

    #[test]
    fn fast_paths_match_scalar_fast(
        format in prop::sample::select(vec![WeightFormat::Q8_0, WeightFormat::Q4_0, WeightFormat::Q4_1]),
        rows in 1usize..40,
        units in 1usize..20,
        seed in any::<u64>(),
    ) {
        // Same quantized activations on every path, so results agree up to
        // f32 summation order: 1e-5 relative to Σ|w·x|.
        let cols = units * 32;
        let mut rng = Rng(seed);
        let data = random_matrix(format, rows, cols, &mut rng);
        let w = QMatrix::new(format, rows, cols, &data).unwrap();
        let x = random_vec(cols, &mut rng);
        let wf = dequant_f64(&w);
        let mut ys = vec![0f32; rows];
        matvec_with(KernelPath::Scalar, &w, &x, &mut ys, Precision::Fast).unwrap();
        for path in available_paths() {
            let mut y = vec![f32::NAN; rows];
            matvec_with(path, &w, &x, &mut y, Precision::Fast).unwrap();
            for r in 0..rows {
                let (_, abs, _) = reference(&wf[r], &x);
                prop_assert!((y[r] - ys[r]).abs() as f64 <= 1e-5 * abs + 1e-6,
                    "{path:?} {format:?} row {r}: {} vs scalar {}", y[r], ys[r]);
            }
        }
    }

    #[test]
    fn matmul_all_paths_match_f64(
        format in format_strategy(),
        rows in 1usize..80,
        units in 1usize..6,
        odd in 0usize..8,
        n in 1usize..10,
        chunk in prop::sample::select(vec![0usize, 1, 5, 16]),
        seed in any::<u64>(),
    ) {
        let cols = cols_for(format, units, odd);
        let mut rng = Rng(seed);
        let data = random_matrix(format, rows, cols, &mut rng);
        let w = QMatrix::new(format, rows, cols, &data).unwrap();
        let x = random_vec(cols * n, &mut rng);
        let wf = dequant_f64(&w);
        set_chunk_rows(chunk);
        for path in available_paths() {
            for precision in [Precision::Exact, Precision::Fast] {
                let mut y = vec![f32::NAN; rows * n];
                matmul_with(path, &w, &x, n, &mut y, precision).unwrap();
                // n == 1 goes through matvec (integer path in Fast mode).
                let fast_int = n == 1 && precision == Precision::Fast && format.is_quantized();
                for t in 0..n {
                    for r in 0..rows {
                        let refv = reference(&wf[r], &x[t * cols..(t + 1) * cols]);
                        if let Err(e) = check(y[t * rows + r], refv, fast_int) {
                            prop_assert!(false, "{path:?} {format:?} {precision:?} n={n} t={t} r={r}: {e}");
                        }
                    }
                }
            }
        }
        set_chunk_rows(0);
    }

    #[test]
    fn dequantize_paths_agree(
        format in format_strategy(),
        units in 1usize..10,
        odd in 0usize..8,
        seed in any::<u64>(),
    ) {
        let cols = cols_for(format, units, odd);
        let mut rng = Rng(seed);
        let data = random_matrix(format, 1, cols, &mut rng);
        let mut ys = vec![0f32; cols];
        dequantize_row_with(KernelPath::Scalar, format, &data, &mut ys).unwrap();
        for path in available_paths() {
            let mut y = vec![f32::NAN; cols];
            dequantize_row_with(path, format, &data, &mut y).unwrap();
            // Same math (d*q or fma(q, d, m)): allow 1 ulp-ish for fma vs mul+add.
            for j in 0..cols {
                prop_assert!((y[j] - ys[j]).abs() <= 1e-6 * ys[j].abs().max(1e-3), "{path:?} {format:?} j={j}: {} vs {}", y[j], ys[j]);
            }
        }
    }

    #[test]
    fn dot_and_axpy_match(n in 0usize..300, alpha in -2f32..2.0, seed in any::<u64>()) {
        let mut rng = Rng(seed);
        let a = random_vec(n, &mut rng);
        let b = random_vec(n, &mut rng);
        let exact: f64 = a.iter().zip(&b).map(|(&p, &q)| f64::from(p) * f64::from(q)).sum();
        let abs: f64 = a.iter().zip(&b).map(|(&p, &q)| (f64::from(p) * f64::from(q)).abs()).sum();
        prop_assert!((f64::from(dot_f32(&a, &b)) - exact).abs() <= 1e-5 * abs + 1e-6);
        let mut y = b.clone();
        axpy_f32(alpha, &a, &mut y);
        for j in 0..n {
            let e = f64::from(b[j]) + f64::from(alpha) * f64::from(a[j]);
            prop_assert!((f64::from(y[j]) - e).abs() <= 1e-6 * e.abs().max(1.0));
        }
    }
}
