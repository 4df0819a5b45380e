//! Known-value and error tests of the operations around the weight formats: bad lengths, empty
//! shapes, paths, norms, softmax, activations, RoPE, and the quantizers on ties.

use kernels_neon::*;

use crate::known::h;

#[test]
fn errors_on_bad_lengths() {
    let data = vec![0u8; 2 * 18];
    assert!(matches!(
        QMatrix::new(WeightFormat::Q4_0, 2, 48, &data).map_err(KernelError::from),
        Err(KernelError::Layout(LayoutError::RaggedCols {
            cols: 48,
            block_len: 32,
            ..
        }))
    ));
    let e = KernelError::from(QMatrix::new(WeightFormat::Q4_0, 3, 32, &data).unwrap_err());
    assert_eq!(
        e,
        KernelError::Layout(LayoutError::DataLength {
            what: "matrix data",
            expected: 54,
            actual: 36
        })
    );
    assert!(e.to_string().contains("54") && e.to_string().contains("36"));

    let w = QMatrix::new(WeightFormat::Q4_0, 2, 32, &data).unwrap();
    let mut y = vec![0f32; 2];
    assert!(matches!(
        matvec(&w, &[0.0; 31], &mut y, Precision::Exact),
        Err(KernelError::LengthMismatch {
            expected: 32,
            actual: 31,
            ..
        })
    ));
    assert!(matches!(
        matvec(&w, &[0.0; 32], &mut [0.0; 3], Precision::Fast),
        Err(KernelError::LengthMismatch {
            expected: 2,
            actual: 3,
            ..
        })
    ));
    assert!(matmul(&w, &[0.0; 64], 3, &mut [0.0; 6], Precision::Exact).is_err());
    assert!(matmul(&w, &[0.0; 96], 3, &mut [0.0; 5], Precision::Exact).is_err());
    assert!(matmul(&w, &[0.0; 96], 3, &mut [0.0; 6], Precision::Exact).is_ok());
    let mut out = vec![0f32; 32];
    assert!(dequantize_row(WeightFormat::Q8_0, &[0u8; 33], &mut out).is_err());
    assert!(dequantize_row(WeightFormat::Q8_0, &[0u8; 34], &mut out[..31]).is_err());
    assert!(dequantize_row(WeightFormat::Q8_0, &[0u8; 34], &mut out).is_ok());
    for p in [
        KernelPath::Avx2Fma,
        KernelPath::Avx512,
        KernelPath::Neon,
        KernelPath::NeonDotprod,
        KernelPath::NeonI8mm,
    ] {
        if !p.is_available() {
            assert_eq!(
                matvec_with(p, &w, &[0.0; 32], &mut y, Precision::Exact),
                Err(KernelError::PathUnavailable(p))
            );
        }
    }
}

#[test]
fn empty_shapes() {
    let w = QMatrix::new(WeightFormat::F32, 0, 8, &[]).unwrap();
    let mut y: [f32; 0] = [];
    matvec(&w, &[0.0; 8], &mut y, Precision::Fast).unwrap();
    matmul(&w, &[0.0; 16], 2, &mut y, Precision::Exact).unwrap();
    let w = QMatrix::new(WeightFormat::F32, 2, 0, &[]).unwrap();
    let mut y = [5.0f32; 2];
    matvec(&w, &[], &mut y, Precision::Exact).unwrap();
    assert_eq!(y, [0.0, 0.0]);
}

#[test]
fn arch_name_is_known() {
    assert!([
        "avx2+fma",
        "avx512",
        "neon",
        "neon+dotprod",
        "neon+i8mm",
        "scalar"
    ]
    .contains(&arch_name()));
    #[cfg(target_arch = "x86_64")]
    if std::env::var("SPARROW_KERNELS").is_err()
        && is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
    {
        let want = if is_x86_feature_detected!("avx512f") {
            "avx512"
        } else {
            "avx2+fma"
        };
        assert_eq!(arch_name(), want);
    }
    #[cfg(target_arch = "aarch64")]
    if std::env::var("SPARROW_KERNELS").is_err() {
        assert!(arch_name().starts_with("neon"));
    }
}

/// `cpu_features` names what the paths detect: `dotprod` exactly where the `neon+dotprod` path is
/// available, `i8mm` where `neon+i8mm` is, SVE with a vector length SVE allows (a multiple of 128
/// bits up to 2048); AVX2 and AVX-512F where their paths are.
#[test]
fn cpu_features_agree_with_the_paths() {
    let f = cpu_features();
    println!("cpu features: {f}");
    let has = |name: &str| f.split(' ').any(|w| w == name);
    assert_eq!(
        has("dotprod"),
        KernelPath::NeonDotprod.is_available(),
        "{f}"
    );
    assert_eq!(has("i8mm"), KernelPath::NeonI8mm.is_available(), "{f}");
    assert_eq!(has("neon"), KernelPath::Neon.is_available(), "{f}");
    assert_eq!(
        has("avx2") && has("fma") && has("f16c"),
        KernelPath::Avx2Fma.is_available(),
        "{f}"
    );
    if KernelPath::Avx512.is_available() {
        assert!(has("avx512f") && has("avx512vnni"), "{f}");
    }
    #[cfg(target_arch = "aarch64")]
    {
        let sve = f
            .split(' ')
            .find_map(|w| w.strip_prefix("sve(")?.strip_suffix("-bit)"));
        assert_eq!(
            sve.is_some(),
            std::arch::is_aarch64_feature_detected!("sve"),
            "{f}"
        );
        if let Some(bits) = sve {
            let bits: usize = bits.parse().expect("a number of bits");
            assert!(bits % 128 == 0 && (128..=2048).contains(&bits), "{f}");
        }
    }
}

#[test]
fn rms_norm_known() {
    let x = [1.0f32, 2.0, 3.0, 4.0];
    let w = [1.0f32, 1.0, 2.0, 0.5];
    let mut out = [0f32; 4];
    rms_norm(&x, &w, 0.0, &mut out);
    let r = (7.5f32).sqrt();
    let expect = [1.0 / r, 2.0 / r, 6.0 / r, 2.0 / r];
    for (a, b) in out.iter().zip(expect) {
        assert!((a - b).abs() < 1e-6, "{a} vs {b}");
    }
    rms_norm(&[0.0; 3], &[1.0; 3], 1e-5, &mut out[..3]);
    assert_eq!(&out[..3], &[0.0; 3]);
}

#[test]
fn softmax_known() {
    let mut x = [0.0f32, 2f32.ln(), f32::NEG_INFINITY];
    softmax_inplace(&mut x);
    assert!((x[0] - 1.0 / 3.0).abs() < 1e-6 && (x[1] - 2.0 / 3.0).abs() < 1e-6 && x[2] == 0.0);
    let mut big = [1000.0f32, 1000.0];
    softmax_inplace(&mut big);
    assert_eq!(big, [0.5, 0.5]);
    softmax_inplace(&mut []);
}

#[test]
fn silu_relu_known() {
    let mut g = [0.0f32, 1.0, -1.0, 20.0];
    silu_mul_inplace(&mut g, &[1.0, 2.0, 1.0, 1.0]);
    let s1 = 1.0 / (1.0 + (-1.0f32).exp());
    assert_eq!(g[0], 0.0);
    assert!((g[1] - 2.0 * s1).abs() < 1e-6);
    assert!((g[2] + (1.0 - s1)).abs() < 1e-6);
    assert!((g[3] - 20.0).abs() < 1e-5);
    let mut g = [-1.0f32, 3.0];
    relu_mul_inplace(&mut g, &[5.0, 2.0]);
    assert_eq!(g, [0.0, 6.0]);
}

#[test]
fn rope_known_and_styles_agree() {
    // head_dim 2, pos 1, base 10000: theta_0 = 1 rad.
    let mut x = [1.0f32, 0.0];
    rope_inplace(&mut x, 1, 2, 2, 1, 10000.0, RopeStyle::Interleaved);
    assert!((x[0] - 1f32.cos()).abs() < 1e-6 && (x[1] - 1f32.sin()).abs() < 1e-6);
    // pos 0 is the identity.
    let orig: Vec<f32> = (0..16).map(|j| j as f32).collect();
    let mut y = orig.clone();
    rope_inplace(&mut y, 2, 8, 8, 0, 10000.0, RopeStyle::Half);
    assert_eq!(y, orig);

    // Half == Interleaved after permuting dims, incl. partial rotation.
    let (n_heads, hd, rot) = (3usize, 12usize, 8usize);
    let inter: Vec<f32> = (0..n_heads * hd)
        .map(|j| ((j * 37 % 11) as f32 - 5.0) * 0.3)
        .collect();
    let perm = |v: &[f32]| -> Vec<f32> {
        let mut out = v.to_vec();
        for hh in 0..n_heads {
            for i in 0..rot / 2 {
                out[hh * hd + i] = v[hh * hd + 2 * i];
                out[hh * hd + i + rot / 2] = v[hh * hd + 2 * i + 1];
            }
        }
        out
    };
    let mut a = inter.clone();
    let mut b = perm(&inter);
    rope_inplace(
        &mut a,
        n_heads,
        hd,
        rot,
        17,
        10000.0,
        RopeStyle::Interleaved,
    );
    rope_inplace(&mut b, n_heads, hd, rot, 17, 10000.0, RopeStyle::Half);
    assert_eq!(perm(&a), b);
    // dims >= rot untouched
    for hh in 0..n_heads {
        assert_eq!(
            &a[hh * hd + rot..(hh + 1) * hd],
            &inter[hh * hd + rot..(hh + 1) * hd]
        );
    }
    // second pair rotates with theta_1 = pos * base^(-2/rot)
    let th = 17.0f32 * (10000f64.powf(-2.0 / 8.0) as f32);
    let (x0, x1) = (inter[2], inter[3]);
    assert!((a[2] - (x0 * th.cos() - x1 * th.sin())).abs() < 1e-5);
}

#[test]
fn print_available_paths() {
    let paths = available_paths();
    println!("available paths: {paths:?}, active: {}", arch_name());
    assert_eq!(paths[0], KernelPath::Scalar);
    #[cfg(target_arch = "aarch64")]
    assert!(paths.contains(&KernelPath::Neon));
}

#[test]
fn int8_paths_identical_on_ties() {
    // amax = 127 gives scale 1, so x = k + 0.5 are exact rounding ties; every
    // path must quantize them the same way (ties to even), so Int8 results
    // agree to float rounding.
    let x: Vec<f32> = (0..64)
        .map(|j| {
            if j % 32 == 31 {
                127.0
            } else {
                (j % 32) as f32 - 15.5
            }
        })
        .collect();
    let mut row = Vec::new();
    for _ in 0..2 {
        row.extend(h(1.0));
        row.extend((0..32).map(|j| (j as i8 - 10) as u8));
    }
    let w = QMatrix::new(WeightFormat::Q8_0, 1, 64, &row).unwrap();
    let mut ys = [0f32];
    matvec_with(KernelPath::Scalar, &w, &x, &mut ys, Precision::Int8).unwrap();
    for path in available_paths() {
        let mut y = [0f32];
        matvec_with(path, &w, &x, &mut y, Precision::Int8).unwrap();
        assert!(
            (y[0] - ys[0]).abs() <= 1e-5 * ys[0].abs(),
            "{path:?}: {} vs {}",
            y[0],
            ys[0]
        );
    }
}

#[test]
fn i16_quantizer_known_values() {
    // Block 0: amax = 32639 (the largest quant, `<i16 as Quant>::MAX`) gives
    // d = 1 and id = 1, so k + 0.5 are exact rounding ties: to even on every
    // path. Block 1: amax = 0 (all zero, d = 0, s = 0). Block 2: amax = 2 from
    // a negative value (d = 2/32639).
    let mut x = vec![0f32; 96];
    let ties = [
        (0.5f32, 0i16),
        (1.5, 2),
        (2.5, 2),
        (-0.5, 0),
        (-1.5, -2),
        (-2.5, -2),
        (3.49, 3),
        (-3.51, -4),
        (32637.5, 32638),
        (-32638.5, -32638),
        (32639.0, 32639),
    ];
    for (j, &(v, _)) in ties.iter().enumerate() {
        x[j] = v;
    }
    x[64] = -2.0;
    x[65] = 1.0;
    x[66] = 1.0 / 3.0;
    for path in available_paths() {
        let q = quantize_acts_i16_with(path, &x).unwrap();
        assert_eq!((q.d.len(), q.s.len(), q.qs.len()), (3, 3, 96), "{path:?}");
        assert_eq!(q.d[0], 1.0, "{path:?}");
        for (j, &(v, e)) in ties.iter().enumerate() {
            assert_eq!(q.qs[j], e, "{path:?}: x = {v}");
        }
        assert!(q.qs[ties.len()..32].iter().all(|&v| v == 0), "{path:?}");
        let sum0: i32 = ties.iter().map(|&(_, e)| i32::from(e)).sum();
        assert_eq!(q.s[0], sum0 as f32, "{path:?}");
        // amax = 0 block
        assert_eq!((q.d[1], q.s[1]), (0.0, 0.0), "{path:?}");
        assert!(q.qs[32..64].iter().all(|&v| v == 0), "{path:?}");
        // scaled block: id = 32639/2 = 16319.5
        assert_eq!(q.d[2], 2.0f32 / 32639.0, "{path:?}");
        // 1/3 * 16319.5 = 5439.83 -> 5440; 1.0 -> 16319.5 -> tie -> 16320 (even)
        assert_eq!(&q.qs[64..68], &[-32639, 16320, 5440, 0], "{path:?}");
        assert_eq!(q.s[2], q.d[2] * (-32639 + 16320 + 5440) as f32, "{path:?}");
    }
    // Length must be a multiple of 32.
    assert!(quantize_acts_i16_with(KernelPath::Scalar, &[0.0; 33]).is_err());
}

#[test]
fn fast_paths_identical_on_ties_and_exact_on_integers() {
    // amax = 32639 (the largest quant) gives scale 1: integer activations are
    // represented exactly, so Fast equals Exact (all products are small
    // integers), and k + 0.5 ties round the same way on every path.
    let mut x: Vec<f32> = (0..64).map(|j| (j as f32 - 31.0) * 100.0).collect();
    x[0] = 32639.0;
    x[32] = -32639.0;
    let mut row = Vec::new();
    for _ in 0..2 {
        row.extend(h(1.0));
        row.extend((0..32).map(|j| (j as i8 - 10) as u8));
    }
    let w = QMatrix::new(WeightFormat::Q8_0, 1, 64, &row).unwrap();
    let exact: f32 = (0..64).map(|j| ((j % 32) as f32 - 10.0) * x[j]).sum();
    for path in available_paths() {
        let mut y = [0f32];
        matvec_with(path, &w, &x, &mut y, Precision::Fast).unwrap();
        assert_eq!(y[0], exact, "{path:?}");
    }
    for v in x.iter_mut().skip(1).take(30) {
        *v += 0.5;
    }
    let mut ys = [0f32];
    matvec_with(KernelPath::Scalar, &w, &x, &mut ys, Precision::Fast).unwrap();
    for path in available_paths() {
        let mut y = [0f32];
        matvec_with(path, &w, &x, &mut y, Precision::Fast).unwrap();
        assert_eq!(y[0], ys[0], "{path:?}");
    }
}

#[test]
fn matvec_gated_refuses_gate_and_up_of_different_shapes() {
    let g = vec![0u8; 4 * 32 * 4];
    let u = vec![0u8; 5 * 32 * 4];
    let gate = QMatrix::new(WeightFormat::F32, 4, 32, &g).unwrap();
    let up = QMatrix::new(WeightFormat::F32, 5, 32, &u).unwrap();
    let x = vec![1.0f32; 32];
    let mut out = vec![0.0f32; 4];
    let e = matvec_gated(
        &gate,
        &up,
        Activation::Silu,
        &x,
        1,
        &mut out,
        Precision::Fast,
    );
    assert!(
        matches!(
            e,
            Err(KernelError::LengthMismatch {
                expected: 4,
                actual: 5,
                ..
            })
        ),
        "{e:?}"
    );
    let up = QMatrix::new(WeightFormat::F32, 2, 64, &g).unwrap();
    let e = matvec_gated(
        &gate,
        &up,
        Activation::Relu,
        &x,
        1,
        &mut out,
        Precision::Fast,
    );
    assert!(e.is_err());
}
