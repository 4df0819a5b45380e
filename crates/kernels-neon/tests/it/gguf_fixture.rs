//! Independent check of the block layouts: random blocks of every format dequantized by the `gguf`
//! Python package (llama.cpp's reference dequantizers in numpy, `gguf.quants.dequantize`), stored in
//! `tests/data/<format>.bin` by `tests/data/gen_quants.py` (run by `cargo xtask fixtures`): 1024
//! elements of blocks, followed by the 1024 expected values as little-endian f32. Every kernel path's
//! `dequantize_row` must give them.

use kernels_neon::*;

const N: usize = 1024;

fn check_fixture(format: WeightFormat, bytes: &[u8]) {
    let raw_len = format.row_bytes(N).unwrap();
    assert_eq!(bytes.len(), raw_len + N * 4, "{format:?} fixture size");
    let (raw, expected) = bytes.split_at(raw_len);
    let expected: Vec<f32> = expected
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let amax = expected.iter().fold(0f32, |m, v| m.max(v.abs()));
    assert!(amax > 0.0 && expected.iter().all(|v| v.is_finite()));
    for path in available_paths() {
        let mut out = vec![f32::NAN; N];
        dequantize_row_with(path, format, raw, &mut out).unwrap();
        for (i, (&a, &e)) in out.iter().zip(&expected).enumerate() {
            // numpy may round `d * sc` / `dmin * m` products in another order, or fuse
            // `d * q + m` differently: allow a few f32 ulps of the largest term.
            let tol = 4e-6 * e.abs().max(1e-3);
            assert!(
                (a - e).abs() <= tol,
                "{path:?} {format:?} element {i}: {a} vs gguf {e}"
            );
        }
    }
}

macro_rules! fixtures {
    ($($test:ident: $format:ident = $file:literal,)*) => {$(
        #[test]
        fn $test() {
            check_fixture(WeightFormat::$format, include_bytes!(concat!("../data/", $file)));
        }
    )*};
}

fixtures! {
    f32_matches_gguf_python: F32 = "f32.bin",
    f16_matches_gguf_python: F16 = "f16.bin",
    bf16_matches_gguf_python: BF16 = "bf16.bin",
    q8_0_matches_gguf_python: Q8_0 = "q8_0.bin",
    q4_0_matches_gguf_python: Q4_0 = "q4_0.bin",
    q4_1_matches_gguf_python: Q4_1 = "q4_1.bin",
    q5_0_matches_gguf_python: Q5_0 = "q5_0.bin",
    q5_1_matches_gguf_python: Q5_1 = "q5_1.bin",
    q2_k_matches_gguf_python: Q2_K = "q2_k.bin",
    q3_k_matches_gguf_python: Q3_K = "q3_k.bin",
    q4_k_matches_gguf_python: Q4_K = "q4_k.bin",
    q5_k_matches_gguf_python: Q5_K = "q5_k.bin",
    q6_k_matches_gguf_python: Q6_K = "q6_k.bin",
    iq4_nl_matches_gguf_python: IQ4_NL = "iq4_nl.bin",
    iq4_xs_matches_gguf_python: IQ4_XS = "iq4_xs.bin",
}
