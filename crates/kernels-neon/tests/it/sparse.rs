//! Property tests of the sparse kernels (`matvec_rows`, `axpy_rows`,
//! `gate_up_sparse`): every available path against the scalar reference,
//! a float64 reference and the dense kernels.
//!
//! Tolerances are those of `tests/it/props.rs` (per precision, see there):
//! * Exact:  |y - ref| <= 1e-5 * Σ|w·x| + 1e-6
//! * Fast:   + A / 65278 · 1.02   (A = Σ_j |w_j| · amax_block(j))
//! * Int8:   + A / 254 · 1.001
//!
//! and, between a SIMD path and the scalar path on the same quantized
//! activations, 1e-5 * Σ|w·x| + 1e-6 (f32 summation order only).
//! `axpy_rows` (f32 multiply-adds of dequantized weights) is checked against
//! `y0 + Σ c·w` in f64 within 1e-5 · (|y0| + Σ|c·w|) + 1e-6.

use crate::common;

use common::Rng;
use common::*;
use kernels_neon::*;
use proptest::prelude::*;

/// Row selection: 0 = empty, 1 = all in order, 2 = all shuffled,
/// otherwise a random duplicate-free subset in random order.
fn select_rows(kind: u8, n: usize, rng: &mut Rng) -> Vec<u32> {
    let mut all: Vec<u32> = (0..n as u32).collect();
    match kind {
        0 => Vec::new(),
        1 => all,
        _ => {
            // Fisher-Yates shuffle, then keep a random prefix.
            for i in (1..n).rev() {
                let j = (rng.next_u64() % (i as u64 + 1)) as usize;
                all.swap(i, j);
            }
            if kind == 2 {
                all
            } else {
                let k = (rng.next_u64() % (n as u64 + 1)) as usize;
                all.truncate(k);
                all
            }
        }
    }
}

fn format_strategy() -> impl Strategy<Value = WeightFormat> {
    prop::sample::select(FORMATS.to_vec())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn matvec_rows_matches_f64_scalar_and_dense(
        format in format_strategy(),
        nrows in 1usize..70,
        units in 1usize..12,
        odd in 0usize..8,
        kind in 0u8..5,
        chunk in prop::sample::select(vec![0usize, 1, 3, 16]),
        seed in any::<u64>(),
    ) {
        let cols = cols_for(format, units, odd);
        let mut rng = Rng(seed);
        let data = random_matrix(format, nrows, cols, &mut rng);
        let w = QMatrix::new(format, nrows, cols, &data).unwrap();
        let x = random_vec(cols, &mut rng);
        let rows = select_rows(kind, nrows, &mut rng);
        let wf = dequant_f64(&w);
        set_chunk_rows(chunk);
        for precision in PRECISIONS {
            let eff = |path| if format.is_quantized() { matvec_precision(path, format, precision) } else { Precision::Exact };
            // The scalar path's products in the precision `path` takes for them.
            let scalar = |path| {
                let mut ys = vec![f32::NAN; rows.len()];
                // (F16 weights: `precision` itself, whose activations are rounded to f16 outside
                // Exact on every path.)
                let p = if format == WeightFormat::F16 { precision } else { eff(path) };
                matvec_rows_with(KernelPath::Scalar, &w, &rows, &x, &mut ys, p).unwrap();
                ys
            };
            // Prepared once, on the active path: bit-identical to matvec_rows.
            let (mut yp, mut ya) = (vec![f32::NAN; rows.len()], vec![f32::NAN; rows.len()]);
            matvec_rows_prepared(&prepare_acts(format, &x, precision), &w, &rows, &mut yp).unwrap();
            matvec_rows(&w, &rows, &x, &mut ya, precision).unwrap();
            prop_assert_eq!(yp.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), ya.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "prepared {:?} {:?}", format, precision);
            for path in available_paths() {
                let ys = scalar(path);
                let mut y = vec![f32::NAN; rows.len()];
                matvec_rows_with(path, &w, &rows, &x, &mut y, precision).unwrap();
                let xe = matvec_acts(format, precision, &x);
                for (i, &r) in rows.iter().enumerate() {
                    let refv = reference(&wf[r as usize], &xe);
                    if let Err(e) = check(y[i], refv, eff(path)) {
                        prop_assert!(false, "{path:?} {format:?} {precision:?} {nrows}x{cols} i={i} row {r}: {e}");
                    }
                    prop_assert!((y[i] - ys[i]).abs() as f64 <= 1e-5 * refv.1 + 1e-6,
                        "{path:?} {format:?} {precision:?} row {r}: {} vs scalar {}", y[i], ys[i]);
                }
                if kind == 1 {
                    // All rows in order: bit-identical to the dense matvec.
                    let mut yd = vec![f32::NAN; nrows];
                    matvec_with(path, &w, &x, &mut yd, precision).unwrap();
                    for r in 0..nrows {
                        prop_assert_eq!(y[r].to_bits(), yd[r].to_bits(),
                            "{:?} {:?} {:?} row {}", path, format, precision, r);
                    }
                }
            }
        }
        set_chunk_rows(0);
    }

    #[test]
    fn axpy_rows_matches_dense_f64(
        format in format_strategy(),
        nrows in 1usize..70,
        units in 1usize..48,
        odd in 0usize..8,
        kind in 0u8..5,
        seed in any::<u64>(),
    ) {
        let cols = cols_for(format, units, odd);
        let mut rng = Rng(seed);
        let data = random_matrix(format, nrows, cols, &mut rng);
        let w = QMatrix::new(format, nrows, cols, &data).unwrap();
        let rows = select_rows(kind, nrows, &mut rng);
        let coeffs: Vec<f32> = rows
            .iter()
            .map(|_| if rng.next_u64() % 5 == 0 { 0.0 } else { rng.f() * 3.0 })
            .collect();
        let y0 = random_vec(cols, &mut rng);
        let wf = dequant_f64(&w);
        let mut exact: Vec<f64> = y0.iter().map(|&v| f64::from(v)).collect();
        let mut abs: Vec<f64> = y0.iter().map(|&v| f64::from(v).abs()).collect();
        for (&r, &c) in rows.iter().zip(&coeffs) {
            for j in 0..cols {
                let t = f64::from(c) * wf[r as usize][j];
                exact[j] += t;
                abs[j] += t.abs();
            }
        }
        let mut ys = y0.clone();
        axpy_rows_with(KernelPath::Scalar, &w, &rows, &coeffs, &mut ys).unwrap();
        for path in available_paths() {
            let mut y = y0.clone();
            axpy_rows_with(path, &w, &rows, &coeffs, &mut y).unwrap();
            for j in 0..cols {
                let tol = 1e-5 * abs[j] + 1e-6;
                prop_assert!((f64::from(y[j]) - exact[j]).abs() <= tol,
                    "{path:?} {format:?} {nrows}x{cols} col {j}: {} vs f64 {}", y[j], exact[j]);
                prop_assert!((f64::from(y[j]) - f64::from(ys[j])).abs() <= tol,
                    "{path:?} {format:?} col {j}: {} vs scalar {}", y[j], ys[j]);
            }
        }
    }

    #[test]
    fn gate_up_sparse_equals_dense(
        gformat in format_strategy(),
        uformat in format_strategy(),
        nrows in 1usize..60,
        units in 1usize..8,
        kind in 0u8..5,
        silu in any::<bool>(),
        threshold in prop::sample::select(vec![0.0f32, 0.05, 0.3, -1.0]),
        seed in any::<u64>(),
    ) {
        // Quantized formats need cols % 32 == 0 (K-quants cols % 256 == 0);
        // use that for both.
        let cols = if gformat.is_k_quant() || uformat.is_k_quant() { 256 * (1 + units % 2) } else { units * 32 };
        let mut rng = Rng(seed);
        let gdata = random_matrix(gformat, nrows, cols, &mut rng);
        let udata = random_matrix(uformat, nrows, cols, &mut rng);
        let gate = QMatrix::new(gformat, nrows, cols, &gdata).unwrap();
        let up = QMatrix::new(uformat, nrows, cols, &udata).unwrap();
        let x = random_vec(cols, &mut rng);
        let rows = select_rows(kind, nrows, &mut rng);
        let act = if silu { Activation::Silu } else { Activation::Relu };
        for path in available_paths() {
            for precision in PRECISIONS {
                let mut g = vec![0f32; nrows];
                let mut u = vec![0f32; nrows];
                matvec_with(path, &gate, &x, &mut g, precision).unwrap();
                matvec_with(path, &up, &x, &mut u, precision).unwrap();
                let mut dense = g.clone();
                if silu { silu_mul_inplace(&mut dense, &u) } else { relu_mul_inplace(&mut dense, &u) }
                let mut out = vec![f32::NAN; rows.len()];
                let n = gate_up_sparse_with(path, &gate, &up, &rows, &x, threshold, act, &mut out, precision).unwrap();
                let mut expect_n = 0;
                for (i, &r) in rows.iter().enumerate() {
                    let r = r as usize;
                    let a = act.apply(g[r]);
                    if a.abs() <= threshold {
                        prop_assert_eq!(out[i], 0.0);
                    } else {
                        expect_n += 1;
                        prop_assert_eq!(out[i].to_bits(), (a * u[r]).to_bits());
                    }
                    if !silu && threshold == 0.0 {
                        // ReLU at threshold 0: exactly the dense relu(gate) * up.
                        prop_assert!(out[i] == dense[r], "{:?} {:?} row {}: {} vs dense {}", path, precision, r, out[i], dense[r]);
                    }
                }
                prop_assert_eq!(n, expect_n);
            }
        }
    }
}

#[test]
fn out_of_range_rows_are_errors() {
    let mut rng = Rng(7);
    for format in FORMATS {
        let cols = if format.is_k_quant() { 256 } else { 64 };
        let data = random_matrix(format, 4, cols, &mut rng);
        let w = QMatrix::new(format, 4, cols, &data).unwrap();
        let x = random_vec(cols, &mut rng);
        for path in available_paths() {
            for bad in [vec![4u32], vec![0, 1, 99], vec![u32::MAX]] {
                let mut y = vec![0f32; bad.len()];
                let e = matvec_rows_with(path, &w, &bad, &x, &mut y, Precision::Fast);
                assert!(
                    matches!(e, Err(KernelError::RowOutOfRange { rows: 4, .. })),
                    "{e:?}"
                );
                let mut y = vec![0f32; cols];
                let c = vec![1f32; bad.len()];
                let e = axpy_rows_with(path, &w, &bad, &c, &mut y);
                assert!(matches!(e, Err(KernelError::RowOutOfRange { .. })), "{e:?}");
                assert!(y.iter().all(|&v| v == 0.0), "y untouched on error");
                let mut out = vec![0f32; bad.len()];
                let e = gate_up_sparse_with(
                    path,
                    &w,
                    &w,
                    &bad,
                    &x,
                    0.0,
                    Activation::Relu,
                    &mut out,
                    Precision::Exact,
                );
                assert!(matches!(e, Err(KernelError::RowOutOfRange { .. })), "{e:?}");
            }
        }
        // Length mismatches.
        let mut y = vec![0f32; 2];
        assert!(matches!(
            matvec_rows(&w, &[0], &x, &mut y, Precision::Exact),
            Err(KernelError::LengthMismatch { .. })
        ));
        assert!(matches!(
            matvec_rows(&w, &[0], &x[..32], &mut y[..1], Precision::Exact),
            Err(KernelError::LengthMismatch { .. })
        ));
        let mut y = vec![0f32; cols - 1];
        assert!(matches!(
            axpy_rows(&w, &[0], &[1.0], &mut y),
            Err(KernelError::LengthMismatch { .. })
        ));
        let mut y = vec![0f32; cols];
        assert!(matches!(
            axpy_rows(&w, &[0, 1], &[1.0], &mut y),
            Err(KernelError::LengthMismatch { .. })
        ));
        // Empty lists are fine.
        matvec_rows(&w, &[], &x, &mut [], Precision::Fast).unwrap();
        axpy_rows(&w, &[], &[], &mut y).unwrap();
        assert_eq!(
            gate_up_sparse(
                &w,
                &w,
                &[],
                &x,
                0.0,
                Activation::Silu,
                &mut [],
                Precision::Fast
            ),
            Ok(0)
        );
    }
}

#[test]
fn axpy_rows_large_parallel() {
    // Large enough for the column-range split (cols > 256, rows*cols >= 2^16).
    let mut rng = Rng(11);
    let (n, cols) = (300usize, 4096usize);
    // I4Hybrid with 1% outliers: the column ranges of the split must pick
    // up exactly the outliers that fall inside them.
    let hybrid = WeightFormat::hybrid_for(0.01, cols).unwrap();
    for format in [
        WeightFormat::Q4_0,
        WeightFormat::Q8_0,
        WeightFormat::Q5_0,
        WeightFormat::Q5_1,
        WeightFormat::F16,
        WeightFormat::Q2_K,
        WeightFormat::Q3_K,
        WeightFormat::Q4_K,
        WeightFormat::Q5_K,
        WeightFormat::Q6_K,
        WeightFormat::IQ4_NL,
        WeightFormat::IQ4_XS,
        hybrid,
    ] {
        let data = random_matrix(format, n, cols, &mut rng);
        let w = QMatrix::new(format, n, cols, &data).unwrap();
        let rows = select_rows(3, n, &mut rng);
        let coeffs: Vec<f32> = rows.iter().map(|_| rng.f()).collect();
        let mut ys = vec![0f32; cols];
        axpy_rows_with(KernelPath::Scalar, &w, &rows, &coeffs, &mut ys).unwrap();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        for path in available_paths() {
            let mut y = vec![0f32; cols];
            pool.install(|| axpy_rows_with(path, &w, &rows, &coeffs, &mut y))
                .unwrap();
            for j in 0..cols {
                assert!(
                    (y[j] - ys[j]).abs() <= 1e-4 * ys[j].abs().max(1.0),
                    "{path:?} {format:?} {j}"
                );
            }
        }
    }
}

#[test]
fn axpy_rows_in_many_row_groups() {
    // 1200 wide rows (2304 bytes in Q4_0) on one thread: the AVX2 kernel
    // goes through them in L2-sized groups of rows (dozens of groups here),
    // in any order, with duplicates of nothing and zero coefficients mixed in.
    let mut rng = Rng(5);
    let (n, cols) = (1200usize, 4096usize);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    for format in [WeightFormat::Q4_0, WeightFormat::Q4_1, WeightFormat::Q8_0] {
        let data = random_matrix(format, n, cols, &mut rng);
        let w = QMatrix::new(format, n, cols, &data).unwrap();
        let mut rows: Vec<u32> = (0..n as u32).rev().collect();
        rows.retain(|r| r % 7 != 3);
        let coeffs: Vec<f32> = rows
            .iter()
            .map(|&r| if r % 11 == 0 { 0.0 } else { rng.f() })
            .collect();
        let mut ys = vec![0f32; cols];
        axpy_rows_with(KernelPath::Scalar, &w, &rows, &coeffs, &mut ys).unwrap();
        for path in available_paths() {
            let mut y = vec![0.5f32; cols];
            pool.install(|| axpy_rows_with(path, &w, &rows, &coeffs, &mut y))
                .unwrap();
            for j in 0..cols {
                let want = ys[j] + 0.5;
                assert!(
                    (y[j] - want).abs() <= 1e-4 * want.abs().max(1.0),
                    "{path:?} {format:?} {j}: {} vs {want}",
                    y[j]
                );
            }
        }
    }
}
