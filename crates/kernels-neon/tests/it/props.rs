//! Property tests: every available kernel path against a float64 reference.
//!
//! Tolerances (stated once, used everywhere below; `A = Σ_j |w_j| ·
//! amax_block(j)` over the row, amax of the 32-block activation j is in):
//! * Exact:  |y - ref| <= 1e-5 * Σ|w·x| + 1e-6
//! * Fast (16-bit activations, round to nearest, d = amax/32639): each
//!   activation is off by at most d/2 = amax_block/65278, so
//!   |y - ref| <= A / 65278 · 1.02 + 1e-5 * Σ|w·x| + 1e-6.
//!   The 2% slack covers the f32 rounding of `32639/amax`, `x * id` and
//!   `d` (each 2^-24 relative, i.e. up to 0.002 quantization steps at
//!   |q| = 32639, three of them: 0.006 of the 0.5-step bound, 1.2%).
//! * Int8 (8-bit activations, d = amax/127): off by at most amax_block/254:
//!   |y - ref| <= A / 254 · 1.001 + 1e-5 * Σ|w·x| + 1e-6
//!   (at |q| <= 127 the f32 rounding is 0.00002 steps). For Q4_K, Q5_K and
//!   Q6_K weights the scale is one per 256 (llama.cpp's `Q8_K`), so the
//!   guaranteed bound takes amax over the super-block; the checks keep the
//!   per-32 `A`, a tighter bound that these random activations (no outliers:
//!   a super-block's amax is within a few percent of its blocks') meet with
//!   a wide margin, so a kernel error still fails them. The super-block
//!   quantizer itself is checked exactly in `quant.rs`'s unit test.
//!
//! * bf16 (the Int8 `matmul` tile with n > 1 on the AVX-512 path for weights
//!   without an integer tile there: the float formats, Q2_K, Q3_K, the IQ4 ones): weights and
//!   activations rounded to 8 significant bits, each off by at most 2^-8 of
//!   itself (round to nearest), so each product by at most 2^-7 + 2^-16 of
//!   |w·x|: |y - ref| <= Σ|w·x| · (2^-7 · 1.001 + 1e-5) + 1e-6.
//!
//! Float weight formats use the exact path in every precision and get the
//! Exact bound (F16 outside `Exact` against its activations rounded to f16,
//! `common::matvec_acts`; `half_acts.rs` checks those bit for bit); so does `matmul` with n > 1 otherwise, but for the integer tiles
//! (`common::tile_products`): prompts of Q4_K/Q5_K/Q6_K on the AVX2 and AVX-512 paths get the
//! Int8 bound (in `Int8`, and in `Fast` from `INT_TILE_MIN_TOKENS` tokens), and prompts of
//! Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 on AVX-512 from `INT_TILE_MIN_TOKENS` tokens their precision's
//! bound, as `Fast` prompts of Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/IQ4_NL on AVX2 from that many tokens (the
//! 16-bit tile) get the Fast bound (and all equal `matvec` in that precision: `matmul_int.rs`).

use crate::common;

use common::*;
use kernels_neon::*;
use proptest::prelude::*;

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
            for precision in PRECISIONS {
                let mut y = vec![f32::NAN; rows];
                matvec_with(path, &w, &x, &mut y, precision).unwrap();
                let eff = if format.is_quantized() { matvec_precision(path, format, precision) } else { Precision::Exact };
                let xe = matvec_acts(format, precision, &x);
                for r in 0..rows {
                    if let Err(e) = check(y[r], reference(&wf[r], &xe), eff) {
                        prop_assert!(false, "{path:?} {format:?} {precision:?} {rows}x{cols} row {r}: {e}");
                    }
                }
            }
        }
        set_chunk_rows(0);
    }

    #[test]
    fn matvec_many_equals_one_matvec_per_matrix(
        formats in prop::collection::vec(format_strategy(), 0..4),
        rows in prop::collection::vec(0usize..50, 4),
        units in 1usize..6,
        chunk in prop::sample::select(vec![0usize, 1, 5, 16]),
        seed in any::<u64>(),
    ) {
        // One column count every format accepts (K-quants need 256).
        let cols = if formats.iter().any(|f| f.is_k_quant()) { 256 } else { units * 32 };
        let mut rng = Rng(seed);
        let data: Vec<Vec<u8>> = formats
            .iter()
            .zip(&rows)
            .map(|(&f, &r)| random_matrix(f, r, cols, &mut rng))
            .collect();
        let ws: Vec<QMatrix> = formats
            .iter()
            .zip(&rows)
            .zip(&data)
            .map(|((&f, &r), d)| QMatrix::new(f, r, cols, d).unwrap())
            .collect();
        let wr: Vec<&QMatrix> = ws.iter().collect();
        let x = random_vec(cols, &mut rng);
        set_chunk_rows(chunk);
        for path in available_paths() {
            for precision in PRECISIONS {
                let mut got: Vec<Vec<f32>> = ws.iter().map(|w| vec![f32::NAN; w.rows()]).collect();
                let mut outs: Vec<&mut [f32]> = got.iter_mut().map(|v| v.as_mut_slice()).collect();
                matvec_many_with(path, &wr, &x, &mut outs, precision).unwrap();
                for (i, w) in ws.iter().enumerate() {
                    let mut want = vec![f32::NAN; w.rows()];
                    matvec_with(path, w, &x, &mut want, precision).unwrap();
                    let same = want.iter().zip(&got[i]).all(|(a, b)| a.to_bits() == b.to_bits());
                    prop_assert!(same, "{path:?} {precision:?} matrix {i} ({:?} {}x{cols}): {:?} vs {:?}", w.format(), w.rows(), got[i], want);
                }
            }
        }
        set_chunk_rows(0);
    }

    #[test]
    fn matvec_batch_equals_one_matvec_per_token(
        format in format_strategy(),
        rows in 1usize..70,
        units in 1usize..8,
        n in 1usize..=9,
        chunk in prop::sample::select(vec![0usize, 1, 5, 16]),
        seed in any::<u64>(),
    ) {
        let cols = cols_for(format, units, 0);
        let mut rng = Rng(seed);
        let data = random_matrix(format, rows, cols, &mut rng);
        let w = QMatrix::new(format, rows, cols, &data).unwrap();
        let x = random_vec(n * cols, &mut rng);
        set_chunk_rows(chunk);
        for path in available_paths() {
            for precision in PRECISIONS {
                let mut got = vec![f32::NAN; n * rows];
                matvec_batch_with(path, &w, &x, n, &mut got, precision).unwrap();
                for t in 0..n {
                    let mut want = vec![f32::NAN; rows];
                    matvec_with(path, &w, &x[t * cols..(t + 1) * cols], &mut want, precision).unwrap();
                    let row = &got[t * rows..(t + 1) * rows];
                    let same = want.iter().zip(row).all(|(a, b)| a.to_bits() == b.to_bits());
                    prop_assert!(same, "{path:?} {format:?} {precision:?} {rows}x{cols} n={n} token {t}: {row:?} vs {want:?}");
                }
            }
        }
        set_chunk_rows(0);
    }

    #[test]
    fn kquant_matvec_batch_equals_one_matvec_per_token(
        format in prop::sample::select(vec![WeightFormat::Q4_K, WeightFormat::Q5_K, WeightFormat::Q6_K]),
        other in prop::sample::select(vec![WeightFormat::Q4_K, WeightFormat::Q6_K, WeightFormat::Q5_0]),
        rows in 1usize..40,
        super_blocks in 1usize..5,
        n in 1usize..=9,
        chunk in prop::sample::select(vec![0usize, 1, 3, 16]),
        seed in any::<u64>(),
    ) {
        // The K-quant batch kernels (4 tokens per unpacked super-block, then 3, 2 or 1), alone
        // and with a second matrix of another format on the same tokens (`matvec_batch_many`:
        // both activation orders built, or the 32-element interleaving too), against one
        // `matvec` per token, bit for bit; odd and even rows and token counts.
        let cols = 256 * super_blocks;
        let mut rng = Rng(seed);
        let data = random_matrix(format, rows, cols, &mut rng);
        let w = QMatrix::new(format, rows, cols, &data).unwrap();
        let data2 = random_matrix(other, rows + 1, cols, &mut rng);
        let w2 = QMatrix::new(other, rows + 1, cols, &data2).unwrap();
        let x = random_vec(n * cols, &mut rng);
        set_chunk_rows(chunk);
        for path in available_paths() {
            for precision in [Precision::Fast, Precision::Int8] {
                let mut got = vec![f32::NAN; n * rows];
                matvec_batch_with(path, &w, &x, n, &mut got, precision).unwrap();
                let mut got2 = vec![f32::NAN; n * (rows + 1)];
                let mut many = [vec![f32::NAN; n * rows], vec![f32::NAN; n * (rows + 1)]];
                {
                    let mut outs: Vec<&mut [f32]> = many.iter_mut().map(|v| v.as_mut_slice()).collect();
                    matvec_batch_many_with(path, &[&w, &w2], &x, n, &mut outs, precision).unwrap();
                }
                matvec_batch_with(path, &w2, &x, n, &mut got2, precision).unwrap();
                for t in 0..n {
                    let xt = &x[t * cols..(t + 1) * cols];
                    for (m, out, batch) in [(&w, &got, &many[0]), (&w2, &got2, &many[1])] {
                        let r = m.rows();
                        let mut want = vec![f32::NAN; r];
                        matvec_with(path, m, xt, &mut want, precision).unwrap();
                        for (what, y) in [("batch", out), ("batch_many", batch)] {
                            let row = &y[t * r..(t + 1) * r];
                            let same = want.iter().zip(row).all(|(a, b)| a.to_bits() == b.to_bits());
                            prop_assert!(same, "{path:?} {:?} {precision:?} {what} {r}x{cols} n={n} token {t}: {row:?} vs {want:?}", m.format());
                        }
                    }
                }
            }
        }
        set_chunk_rows(0);
    }

    #[test]
    fn matvec_gated_equals_both_products_then_the_activation(
        format in format_strategy(),
        up_q8 in any::<bool>(),
        rows in 0usize..70,
        units in 1usize..6,
        n in 1usize..9,
        act in prop::sample::select(vec![Activation::Silu, Activation::Relu, Activation::GeluTanh]),
        chunk in prop::sample::select(vec![0usize, 1, 5, 16]),
        seed in any::<u64>(),
    ) {
        // The up matrix in the gate's format, or in Q8_0 (a second activation form).
        let up_format = if up_q8 { WeightFormat::Q8_0 } else { format };
        let cols = cols_for(format, units, 0);
        let mut rng = Rng(seed);
        let gd = random_matrix(format, rows, cols, &mut rng);
        let ud = random_matrix(up_format, rows, cols, &mut rng);
        let gate = QMatrix::new(format, rows, cols, &gd).unwrap();
        let up = QMatrix::new(up_format, rows, cols, &ud).unwrap();
        let x = random_vec(n * cols, &mut rng);
        set_chunk_rows(chunk);
        for path in available_paths() {
            for precision in PRECISIONS {
                let mut got = vec![f32::NAN; n * rows];
                matvec_gated_with(path, &gate, &up, act, &x, n, &mut got, precision).unwrap();
                let mut want = vec![f32::NAN; n * rows];
                let mut u = vec![f32::NAN; n * rows];
                matvec_batch_with(path, &gate, &x, n, &mut want, precision).unwrap();
                matvec_batch_with(path, &up, &x, n, &mut u, precision).unwrap();
                match act {
                    Activation::Silu => silu_mul_inplace(&mut want, &u),
                    Activation::Relu => relu_mul_inplace(&mut want, &u),
                    Activation::GeluTanh => gelu_mul_inplace(&mut want, &u),
                }
                let same = want.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits());
                prop_assert!(same, "{path:?} {format:?}/{up_format:?} {precision:?} {act:?} {rows}x{cols} n={n}: {got:?} vs {want:?}");
            }
        }
        set_chunk_rows(0);
    }

    #[test]
    fn matvec_batch_many_equals_one_matvec_batch_per_matrix(
        formats in prop::collection::vec(format_strategy(), 1..4),
        rows in prop::collection::vec(0usize..50, 4),
        units in 1usize..6,
        n in 1usize..7,
        seed in any::<u64>(),
    ) {
        let cols = if formats.iter().any(|f| f.is_k_quant()) { 256 } else { units * 32 };
        let mut rng = Rng(seed);
        let data: Vec<Vec<u8>> = formats
            .iter()
            .zip(&rows)
            .map(|(&f, &r)| random_matrix(f, r, cols, &mut rng))
            .collect();
        let ws: Vec<QMatrix> = formats
            .iter()
            .zip(&rows)
            .zip(&data)
            .map(|((&f, &r), d)| QMatrix::new(f, r, cols, d).unwrap())
            .collect();
        let wr: Vec<&QMatrix> = ws.iter().collect();
        let x = random_vec(n * cols, &mut rng);
        for path in available_paths() {
            for precision in PRECISIONS {
                let mut got: Vec<Vec<f32>> = ws.iter().map(|w| vec![f32::NAN; n * w.rows()]).collect();
                let mut outs: Vec<&mut [f32]> = got.iter_mut().map(|v| v.as_mut_slice()).collect();
                matvec_batch_many_with(path, &wr, &x, n, &mut outs, precision).unwrap();
                for (i, w) in ws.iter().enumerate() {
                    let mut want = vec![f32::NAN; n * w.rows()];
                    matvec_batch_with(path, w, &x, n, &mut want, precision).unwrap();
                    let same = want.iter().zip(&got[i]).all(|(a, b)| a.to_bits() == b.to_bits());
                    prop_assert!(same, "{path:?} {precision:?} matrix {i} ({:?} {}x{cols}) n={n}", w.format(), w.rows());
                }
            }
        }
    }

    #[test]
    fn integer_paths_match_scalar(
        format in prop::sample::select(vec![
            WeightFormat::Q8_0, WeightFormat::Q4_0, WeightFormat::Q4_1,
            WeightFormat::Q5_0, WeightFormat::Q5_1, WeightFormat::Q2_K, WeightFormat::Q3_K,
            WeightFormat::Q4_K, WeightFormat::Q5_K, WeightFormat::Q6_K,
            WeightFormat::IQ4_NL, WeightFormat::IQ4_XS, WeightFormat::I4Hybrid { outliers_per_row: 5 },
        ]),
        precision in prop::sample::select(vec![Precision::Fast, Precision::Int8]),
        rows in 1usize..40,
        units in 1usize..20,
        seed in any::<u64>(),
    ) {
        // Same quantized activations on every path, so results agree up to
        // f32 summation order: 1e-5 relative to Σ|w·x|.
        let cols = cols_for(format, units, 0);
        let mut rng = Rng(seed);
        let data = random_matrix(format, rows, cols, &mut rng);
        let w = QMatrix::new(format, rows, cols, &data).unwrap();
        let x = random_vec(cols, &mut rng);
        let wf = dequant_f64(&w);
        for path in available_paths() {
            // The scalar path's products in the precision `path` takes for them.
            let mut ys = vec![0f32; rows];
            let p = matvec_precision(path, format, precision);
            matvec_with(KernelPath::Scalar, &w, &x, &mut ys, p).unwrap();
            let mut y = vec![f32::NAN; rows];
            matvec_with(path, &w, &x, &mut y, precision).unwrap();
            for r in 0..rows {
                let (_, abs, _) = reference(&wf[r], &x);
                prop_assert!((y[r] - ys[r]).abs() as f64 <= 1e-5 * abs + 1e-6,
                    "{path:?} {format:?} {precision:?} row {r}: {} vs scalar {}", y[r], ys[r]);
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
            for precision in PRECISIONS {
                let mut y = vec![f32::NAN; rows * n];
                matmul_with(path, &w, &x, n, &mut y, precision).unwrap();
                // n == 1 goes through matvec (integer path in Fast/Int8 mode), and so do short
                // Fast prompts of quantized weights (`matvec_batch`); n > 1 is otherwise the f32
                // tile, or in Int8 mode on a path with a bf16 tile, the bf16 one, or an integer
                // tile (`int_tile`).
                let products = if n > 1 { tile_products(path, format, precision, n) } else { None };
                let int_tile = products.is_some();
                let short = precision == Precision::Fast && n < short_prompt_tokens(path);
                let eff = if (n == 1 || short) && format.is_quantized() {
                    matvec_precision(path, format, precision)
                } else {
                    products.unwrap_or(Precision::Exact)
                };
                let bf16 = n > 1 && precision == Precision::Int8 && path == KernelPath::Avx512 && !int_tile;
                // F16 outside Exact: one token runs `matvec` (f16 activations), short prompts too
                // where the path multiplies f16 (aarch64 with FEAT_FHM), longer ones the f32 tile
                // (as given): checked against the rounded activations, the tile's results within
                // their rounding (2^-11 of each product) of it.
                let half = format == WeightFormat::F16 && precision != Precision::Exact;
                for t in 0..n {
                    let xt = &x[t * cols..(t + 1) * cols];
                    let xe = matvec_acts(format, precision, xt);
                    for r in 0..rows {
                        let refv = reference(&wf[r], &xe);
                        let ok = if bf16 {
                            check_bf16(y[t * rows + r], refv)
                        } else if half && n > 1 {
                            let tol = refv.1 * (2f64.powi(-11) + 1e-5) + 1e-6;
                            let err = (f64::from(y[t * rows + r]) - refv.0).abs();
                            if err <= tol { Ok(()) } else { Err(format!("err={err} tol={tol} (f16 prompt)")) }
                        } else {
                            check(y[t * rows + r], refv, eff)
                        };
                        if let Err(e) = ok {
                            prop_assert!(false, "{path:?} {format:?} {precision:?} n={n} t={t} r={r}: {e}");
                        }
                    }
                }
            }
        }
        set_chunk_rows(0);
    }

    #[test]
    fn matmul_t_long_prompts_within_8_bit_bounds(
        format in format_strategy(),
        rows in 1usize..70,
        units in 1usize..4,
        odd in 0usize..8,
        n in INT_TILE_MIN_TOKENS..INT_TILE_MIN_TOKENS + 5,
        precision in prop::sample::select(vec![Precision::Fast, Precision::Int8]),
        seed in any::<u64>(),
    ) {
        // `Fast` and `Int8` products of long prompts may quantize both operands to 8 bits per 32
        // along the sum (`W`'s rows per column, each token's values): each term off by at most
        // half a step of each, `|x| · wamax / 254 + |w| · xamax / 254`, on top of f32 rounding.
        let cols = cols_for(format, units, odd);
        let mut rng = Rng(seed);
        let data = random_matrix(format, rows, cols, &mut rng);
        let w = QMatrix::new(format, rows, cols, &data).unwrap();
        let x = random_vec(rows * n, &mut rng);
        let wf = dequant_f64(&w);
        for path in available_paths() {
            let mut y = vec![f32::NAN; cols * n];
            matmul_t_with(path, &w, &x, n, &mut y, precision).unwrap();
            for t in 0..n {
                let xt = &x[t * rows..(t + 1) * rows];
                let xamax = xt.iter().fold(0f64, |m, v| m.max(f64::from(v.abs())));
                for c in 0..cols {
                    let wamax = (0..rows).fold(0f64, |m, j| m.max(wf[j][c].abs()));
                    let (mut dot, mut abs, mut q) = (0f64, 0f64, 0f64);
                    for (j, &xj) in xt.iter().enumerate() {
                        let (wj, xj) = (wf[j][c], f64::from(xj));
                        dot += wj * xj;
                        abs += (wj * xj).abs();
                        q += xj.abs() * wamax / 254.0 + wj.abs() * xamax / 254.0;
                    }
                    let got = f64::from(y[t * cols + c]);
                    let tol = 1e-5 * abs + 1e-6 + 1.01 * q;
                    prop_assert!((got - dot).abs() <= tol,
                        "{path:?} {format:?} {precision:?} n={n} t={t} c={c}: {got} vs {dot} (tolerance {tol})");
                }
            }
        }
    }

    #[test]
    fn matmul_t_all_paths_match_f64(
        format in format_strategy(),
        rows in 0usize..70,
        units in 1usize..6,
        odd in 0usize..8,
        n in 1usize..10,
        chunk in prop::sample::select(vec![0usize, 1, 5, 16]),
        seed in any::<u64>(),
    ) {
        // y[t] = Σ_j x[t][j] · W[j]: f32 sums of the exactly dequantized weights.
        let cols = cols_for(format, units, odd);
        let mut rng = Rng(seed);
        let data = random_matrix(format, rows, cols, &mut rng);
        let w = QMatrix::new(format, rows, cols, &data).unwrap();
        let x = random_vec(rows * n, &mut rng);
        let wf = dequant_f64(&w);
        set_chunk_rows(chunk);
        for path in available_paths() {
            let mut y = vec![f32::NAN; cols * n];
            matmul_t_with(path, &w, &x, n, &mut y, Precision::Exact).unwrap();
            for t in 0..n {
                for c in 0..cols {
                    let (mut dot, mut abs) = (0f64, 0f64);
                    for j in 0..rows {
                        let p = wf[j][c] * f64::from(x[t * rows + j]);
                        dot += p;
                        abs += p.abs();
                    }
                    let got = f64::from(y[t * cols + c]);
                    prop_assert!((got - dot).abs() <= 1e-5 * abs + 1e-6,
                        "{path:?} {format:?} n={n} t={t} c={c}: {got} vs {dot}");
                }
            }
        }
        set_chunk_rows(0);
        let mut short = vec![0f32; cols * n];
        prop_assert!(matmul_t(&w, &x[..x.len().saturating_sub(1)], n, &mut short, Precision::Exact).is_err() || rows == 0);
    }

    #[test]
    fn i16_quantizer_paths_agree(units in 0usize..12, scale in -20i32..20, seed in any::<u64>()) {
        // Identical quants on every path, and the defining relations hold.
        let mut rng = Rng(seed);
        let s = 2f32.powi(scale);
        let mut x: Vec<f32> = (0..units * 32).map(|_| rng.f() * s).collect();
        if units > 1 {
            x[32..64].fill(0.0); // an amax = 0 block
        }
        let qs = quantize_acts_i16_with(KernelPath::Scalar, &x).unwrap();
        for (b, xs) in x.chunks_exact(32).enumerate() {
            let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
            prop_assert_eq!(qs.d[b], amax / 32639.0);
            let q = &qs.qs[b * 32..b * 32 + 32];
            let sum: i32 = q.iter().map(|&v| i32::from(v)).sum();
            prop_assert_eq!(qs.s[b], qs.d[b] * sum as f32);
            for (&v, &qv) in xs.iter().zip(q) {
                prop_assert!(qv.unsigned_abs() <= 32639);
                // within half a step (+ f32 rounding of the scale)
                prop_assert!((f64::from(qv) * f64::from(qs.d[b]) - f64::from(v)).abs()
                    <= f64::from(qs.d[b]) * 0.51, "x={v} q={qv} d={}", qs.d[b]);
            }
        }
        for path in available_paths() {
            prop_assert_eq!(&quantize_acts_i16_with(path, &x).unwrap(), &qs, "{:?}", path);
        }
    }

    #[test]
    fn i8_quantizer_paths_agree(units in 0usize..12, scale in -20i32..20, seed in any::<u64>()) {
        // Identical quants on every path, one scale per 32 (an all-zero block with scale 0, and
        // a tie), and the defining relations hold.
        let mut rng = Rng(seed);
        let s = 2f32.powi(scale);
        let mut x: Vec<f32> = (0..units * 32).map(|_| rng.f() * s).collect();
        if units > 1 {
            x[32..64].fill(0.0);
        }
        if units > 2 {
            // Block 2: a scale of exactly `s`, and a value 2.5 steps: a tie, to 2.
            x[64] = 127.0 * s;
            x[65] = 2.5 * s;
        }
        let qs = quantize_acts_i8_with(KernelPath::Scalar, &x).unwrap();
        prop_assert!(!qs.per_super && qs.d16.is_empty());
        if units > 2 {
            prop_assert_eq!((qs.qs[64], qs.qs[65]), (127, 2));
        }
        for (b, xs) in x.chunks_exact(32).enumerate() {
            let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
            prop_assert_eq!(qs.d[b], amax / 127.0);
            let q = &qs.qs[b * 32..b * 32 + 32];
            let sum: i32 = q.iter().map(|&v| i32::from(v)).sum();
            prop_assert_eq!(qs.s[b], qs.d[b] * sum as f32);
            for (&v, &qv) in xs.iter().zip(q) {
                prop_assert!(qv.unsigned_abs() <= 127);
                prop_assert!((f64::from(qv) * f64::from(qs.d[b]) - f64::from(v)).abs()
                    <= f64::from(qs.d[b]) * 0.51, "x={v} q={qv} d={}", qs.d[b]);
            }
        }
        for path in available_paths() {
            prop_assert_eq!(&quantize_acts_i8_with(path, &x).unwrap(), &qs, "{:?}", path);
        }
    }

    #[test]
    fn i8_super_quantizer_paths_agree(units in 0usize..20, scale in -20i32..20, seed in any::<u64>()) {
        // Identical quants on every path, one scale per 256 (a shorter last group on its own),
        // and the defining relations hold.
        let mut rng = Rng(seed);
        let s = 2f32.powi(scale);
        let mut x: Vec<f32> = (0..units * 32).map(|_| rng.f() * s).collect();
        if units > 8 {
            x[256..].iter_mut().take(256).for_each(|v| *v = 0.0); // an amax = 0 group
        }
        let qs = quantize_acts_i8_super_with(KernelPath::Scalar, &x).unwrap();
        prop_assert!(qs.per_super);
        for (g, xs) in x.chunks(256).enumerate() {
            let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
            for (j, blk) in xs.chunks_exact(32).enumerate() {
                let b = 8 * g + j;
                prop_assert_eq!(qs.d[b], amax / 127.0);
                let q = &qs.qs[b * 32..b * 32 + 32];
                let sum: i32 = q.iter().map(|&v| i32::from(v)).sum();
                prop_assert_eq!(qs.s[b], qs.d[b] * sum as f32);
                for (&v, &qv) in blk.iter().zip(q) {
                    prop_assert!(qv.unsigned_abs() <= 127);
                    prop_assert!((f64::from(qv) * f64::from(qs.d[b]) - f64::from(v)).abs()
                        <= f64::from(qs.d[b]) * 0.51, "x={v} q={qv} d={}", qs.d[b]);
                }
            }
        }
        for path in available_paths() {
            prop_assert_eq!(&quantize_acts_i8_super_with(path, &x).unwrap(), &qs, "{:?}", path);
        }
    }

    #[test]
    fn i8_halves_quantizer_paths_agree(units in 0usize..12, scale in -20i32..20, seed in any::<u64>()) {
        // Identical quants on every path, one scale per 16 (an all-zero half with scale 0), and
        // the defining relations hold.
        let mut rng = Rng(seed);
        let s = 2f32.powi(scale);
        let mut x: Vec<f32> = (0..units * 32).map(|_| rng.f() * s).collect();
        if units > 1 {
            x[48..64].iter_mut().for_each(|v| *v = 0.0);
        }
        let qs = quantize_acts_i8_halves_with(KernelPath::Scalar, &x).unwrap();
        prop_assert!(qs.d.is_empty() && qs.d16.len() == 2 * units && qs.s.len() == units);
        for (h, xs) in x.chunks_exact(16).enumerate() {
            let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
            prop_assert_eq!(qs.d16[h], amax / 127.0);
            for (&v, &qv) in xs.iter().zip(&qs.qs[h * 16..h * 16 + 16]) {
                prop_assert!(qv.unsigned_abs() <= 127);
                prop_assert!((f64::from(qv) * f64::from(qs.d16[h]) - f64::from(v)).abs()
                    <= f64::from(qs.d16[h]) * 0.51, "x={v} q={qv} d={}", qs.d16[h]);
            }
        }
        for b in 0..units {
            let sum = |h: usize| -> f32 {
                qs.qs[h * 16..h * 16 + 16].iter().map(|&v| i32::from(v)).sum::<i32>() as f32
            };
            prop_assert_eq!(qs.s[b], qs.d16[2 * b] * sum(2 * b) + qs.d16[2 * b + 1] * sum(2 * b + 1));
        }
        for path in available_paths() {
            prop_assert_eq!(&quantize_acts_i8_halves_with(path, &x).unwrap(), &qs, "{:?}", path);
        }
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
            // I4Hybrid: the same f32 operations (`s * (q - 8)`, then the
            // outliers in order) on every path, so bit-identical; IQ4_XS too
            // (`d * (ls - 32)`, then times the table value: its scales unpacked
            // by vector on aarch64 must be the scalar unpack's bits).
            if format.is_hybrid() || format == WeightFormat::IQ4_XS {
                prop_assert_eq!(y.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    ys.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "{:?} {:?}", path, format);
            }
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

#[test]
fn matvec_many_rejects_mismatched_shapes() {
    let mut rng = Rng(7);
    let data = random_matrix(WeightFormat::Q4_1, 3, 64, &mut rng);
    let w = QMatrix::new(WeightFormat::Q4_1, 3, 64, &data).unwrap();
    let x = random_vec(64, &mut rng);
    let (mut a, mut b) = (vec![0f32; 3], vec![0f32; 2]);
    // Wrong output length for the second matrix.
    let err = matvec_many(
        &[&w, &w],
        &x,
        &mut [&mut a[..], &mut b[..]],
        Precision::Fast,
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            KernelError::LengthMismatch {
                expected: 3,
                actual: 2,
                ..
            }
        ),
        "{err:?}"
    );
    // Fewer outputs than matrices.
    let err = matvec_many(&[&w, &w], &x, &mut [&mut a[..]], Precision::Fast).unwrap_err();
    assert!(
        matches!(
            err,
            KernelError::LengthMismatch {
                expected: 2,
                actual: 1,
                ..
            }
        ),
        "{err:?}"
    );
    // Wrong input length.
    let err = matvec_many(&[&w], &x[..32], &mut [&mut a[..]], Precision::Fast).unwrap_err();
    assert!(
        matches!(
            err,
            KernelError::LengthMismatch {
                expected: 64,
                actual: 32,
                ..
            }
        ),
        "{err:?}"
    );
}

/// Rows wider than the tiles' column panels (1024 f32, 2048 bf16), with a partial last vector and
/// token counts around the register blocks: every path, every precision, against float64.
#[test]
fn matmul_wide_rows_cross_panels() {
    let mut rng = Rng(0x5eed_7a11);
    for (format, cols) in [
        (WeightFormat::F32, 2048 + 96 + 5),
        (WeightFormat::Q8_0, 4864),
        (WeightFormat::Q4_K, 4864),
    ] {
        let rows = 9;
        let data = random_matrix(format, rows, cols, &mut rng);
        let w = QMatrix::new(format, rows, cols, &data).unwrap();
        let wf = dequant_f64(&w);
        for n in [2, 7, 13, INT_TILE_MIN_TOKENS + 5] {
            let x = random_vec(cols * n, &mut rng);
            for path in available_paths() {
                for precision in PRECISIONS {
                    let mut y = vec![f32::NAN; rows * n];
                    matmul_with(path, &w, &x, n, &mut y, precision).unwrap();
                    let products = tile_products(path, format, precision, n);
                    let bf16 = precision == Precision::Int8
                        && path == KernelPath::Avx512
                        && products.is_none();
                    let eff = products.unwrap_or(Precision::Exact);
                    for t in 0..n {
                        for r in 0..rows {
                            let refv = reference(&wf[r], &x[t * cols..(t + 1) * cols]);
                            let y = y[t * rows + r];
                            let ok = if bf16 {
                                check_bf16(y, refv)
                            } else {
                                check(y, refv, eff)
                            };
                            if let Err(e) = ok {
                                panic!("{path:?} {format:?} {precision:?} n={n} t={t} r={r}: {e}");
                            }
                        }
                    }
                }
            }
        }
    }
}
