//! `Precision::Ggml`, llama.cpp's roundings: its activations (ggml's `block_q8_0` with an f16
//! scale for the 32-element formats, `block_q8_K` with the scale `1/(127/amax)` for the K-quants)
//! equal on every path and as defined; its products within the 8-bit bound (`common::check`) of
//! a float64 reference on every path and equal to the scalar path's up to f32 summation order;
//! a prompt's product is one decode product per token, bit for bit.

use crate::common;

use common::*;
use half::f16;
use kernels_neon::*;
use proptest::prelude::*;

/// The block formats (every one has an 8-bit path in `Ggml`).
fn quantized() -> impl Strategy<Value = WeightFormat> {
    prop::sample::select(
        FORMATS
            .iter()
            .copied()
            .filter(|f| f.is_quantized() && !f.is_hybrid())
            .collect::<Vec<_>>(),
    )
}

/// Whether ggml's `vec_dot_type` of `format` is `block_q8_K` (one scale per 256).
fn q8_k(format: WeightFormat) -> bool {
    format.is_k_quant() || format == WeightFormat::IQ4_XS
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn ggml_activations_are_ggmls_blocks(
        format in quantized(),
        units in 1usize..20,
        scale in -20i32..20,
        seed in any::<u64>(),
    ) {
        let mut rng = Rng(seed);
        let s = 2f32.powi(scale);
        let mut x: Vec<f32> = (0..units * 32).map(|_| rng.f() * s).collect();
        if units > 9 {
            x[256..].iter_mut().take(64).for_each(|v| *v = 0.0); // amax = 0 blocks
        }
        let qs = quantize_acts_ggml_with(KernelPath::Scalar, format, &x).unwrap();
        let group = if q8_k(format) { 256 } else { 32 };
        prop_assert_eq!(qs.per_super, q8_k(format));
        for (g, xs) in x.chunks(group).enumerate() {
            let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = match (q8_k(format), amax > 0.0) {
                (_, false) => 0.0,
                (true, true) => 1.0 / (127.0 / amax),
                (false, true) => f16::from_f32(amax / 127.0).to_f32(),
            };
            for (j, blk) in xs.chunks_exact(32).enumerate() {
                let b = g * group / 32 + j;
                prop_assert_eq!(qs.d[b], d, "{:?} block {}", format, b);
                let q = &qs.qs[b * 32..b * 32 + 32];
                for (&v, &qv) in blk.iter().zip(q) {
                    let want = if amax > 0.0 { (v * (127.0 / amax)).round_ties_even() } else { 0.0 };
                    prop_assert_eq!(f32::from(qv), want, "x={} amax={}", v, amax);
                }
            }
        }
        for path in available_paths() {
            prop_assert_eq!(&quantize_acts_ggml_with(path, format, &x).unwrap(), &qs, "{:?}", path);
        }
    }

    #[test]
    fn ggml_products_match_f64_and_scalar(
        format in quantized(),
        rows in 1usize..40,
        units in 1usize..12,
        n in 1usize..5,
        seed in any::<u64>(),
    ) {
        let cols = cols_for(format, units, 0);
        let mut rng = Rng(seed);
        let data = random_matrix(format, rows, cols, &mut rng);
        let w = QMatrix::new(format, rows, cols, &data).unwrap();
        let x = random_vec(cols * n, &mut rng);
        let wf = dequant_f64(&w);
        let mut scalar = vec![0f32; rows * n];
        matmul_with(KernelPath::Scalar, &w, &x, n, &mut scalar, Precision::Ggml).unwrap();
        for path in available_paths() {
            let mut y = vec![f32::NAN; rows * n];
            matmul_with(path, &w, &x, n, &mut y, Precision::Ggml).unwrap();
            for t in 0..n {
                let xt = &x[t * cols..(t + 1) * cols];
                let mut one = vec![f32::NAN; rows];
                matvec_with(path, &w, xt, &mut one, Precision::Ggml).unwrap();
                prop_assert_eq!(&y[t * rows..(t + 1) * rows], &one[..], "{:?} {:?} token {}", path, format, t);
                for r in 0..rows {
                    let refv = reference(&wf[r], xt);
                    if let Err(e) = check(y[t * rows + r], refv, Precision::Ggml) {
                        prop_assert!(false, "{path:?} {format:?} t={t} r={r}: {e}");
                    }
                    let s = scalar[t * rows + r];
                    prop_assert!((y[t * rows + r] - s).abs() as f64 <= 1e-5 * refv.1 + 1e-6,
                        "{path:?} {format:?} t={t} r={r}: {} vs scalar {s}", y[t * rows + r]);
                }
            }
        }
    }
}

/// The ggml attention: the query rounded to f16 before the scores, the weights f16 values
/// summing to 1 within f16 rounding; its output within the f16 roundings of the f32 attention's
/// over an f16 cache, and not equal to it.
#[test]
fn ggml_attention_rounds_query_and_weights_to_f16() {
    let (hd, ctx) = (64usize, 40usize);
    let mut rng = Rng(7);
    let q: Vec<f32> = (0..hd).map(|_| rng.f() * 3.0).collect();
    let rows: Vec<Vec<f32>> = (0..2 * ctx)
        .map(|_| (0..hd).map(|_| rng.f()).collect())
        .collect();
    let encode = |rs: &[Vec<f32>]| {
        let mut bytes = Vec::new();
        for r in rs {
            let mut row = vec![0u8; 2 * r.len()];
            kv_encode(KvFormat::F16, r, &mut row).unwrap();
            bytes.extend(row);
        }
        vec![bytes]
    };
    let (kc, vc) = (encode(&rows[..ctx]), encode(&rows[ctx..]));
    let view = |c| KvChunks {
        format: KvFormat::F16,
        chunk: ctx,
        chunks: c,
    };
    let layout = KvLayout {
        stride: hd,
        offset: 0,
        head_dim: hd,
    };
    let scale = 0.125;
    let (mut s1, mut s2) = (Vec::new(), Vec::new());
    let (mut plain, mut ggml) = (vec![0f32; hd], vec![0f32; hd]);
    let span = 3..ctx;
    attend_cache_span(
        &q,
        view(&kc),
        view(&vc),
        layout,
        span.clone(),
        scale,
        &mut s1,
        &mut plain,
    )
    .unwrap();
    attend_cache_span_ggml(
        &q,
        view(&kc),
        view(&vc),
        layout,
        span,
        scale,
        &mut s2,
        &mut ggml,
    )
    .unwrap();
    for &w in &s2 {
        assert_eq!(w, f16::from_f32(w).to_f32(), "weight {w} is an f16 value");
    }
    let total: f32 = s2.iter().sum();
    assert!((total - 1.0).abs() < 1e-3, "weights sum to {total}");
    for (a, b) in s1.iter().zip(&s2) {
        assert!((a - b).abs() <= a.abs() * 1e-2 + 1e-6, "{a} vs {b}");
    }
    assert_ne!(plain, ggml);
    for (a, b) in plain.iter().zip(&ggml) {
        assert!((a - b).abs() < 5e-3, "{a} vs {b}");
    }
}

/// ggml's RMSNorm: the squares summed in f64, then f32; within f32 rounding of `rms_norm`.
#[test]
fn ggml_rms_norm_sums_squares_in_f64() {
    let mut rng = Rng(11);
    let x: Vec<f32> = (0..640).map(|_| rng.f() * 40.0).collect();
    let w: Vec<f32> = (0..640).map(|_| 1.0 + rng.f().abs() * 300.0).collect();
    let (mut a, mut b) = (vec![0f32; 640], vec![0f32; 640]);
    rms_norm_ggml(&x, &w, 1e-6, &mut a);
    rms_norm(&x, &w, 1e-6, &mut b);
    let sum: f64 = x.iter().map(|&v| f64::from(v * v)).sum();
    let scale = 1.0 / ((sum / 640.0) as f32 + 1e-6).sqrt();
    for i in 0..640 {
        assert_eq!(a[i], x[i] * scale * w[i], "element {i}");
        assert!(
            (a[i] - b[i]).abs() <= a[i].abs() * 1e-5,
            "{} vs {}",
            a[i],
            b[i]
        );
    }
}
