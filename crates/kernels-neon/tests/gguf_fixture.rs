//! Independent check of the K-quant layouts: random super-blocks dequantized
//! by the `gguf` Python package (llama.cpp's reference implementation in
//! numpy), stored once in `tests/data/{q4_k,q6_k}.bin` by
//! `tests/data/gen_kquant.py` (4 super-blocks each, followed by the 1024
//! expected values as little-endian f32).

use kernels_neon::*;

fn check_fixture(format: WeightFormat, bytes: &[u8]) {
    let nb = 4;
    let raw_len = nb * format.block_bytes();
    assert_eq!(
        bytes.len(),
        raw_len + nb * 256 * 4,
        "{format:?} fixture size"
    );
    let (raw, expected) = bytes.split_at(raw_len);
    let expected: Vec<f32> = expected
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    for path in available_paths() {
        let mut out = vec![f32::NAN; nb * 256];
        dequantize_row_with(path, format, raw, &mut out).unwrap();
        for (i, (&a, &e)) in out.iter().zip(&expected).enumerate() {
            // numpy may round `d * sc` / `dmin * m` products in a different
            // order: allow a few f32 ulps of the largest term.
            let tol = 4e-6 * e.abs().max(1e-3);
            assert!(
                (a - e).abs() <= tol,
                "{path:?} {format:?} element {i}: {a} vs gguf {e}"
            );
        }
    }
}

#[test]
fn q4_k_matches_gguf_python() {
    check_fixture(WeightFormat::Q4_K, include_bytes!("data/q4_k.bin"));
}

#[test]
fn q6_k_matches_gguf_python() {
    check_fixture(WeightFormat::Q6_K, include_bytes!("data/q6_k.bin"));
}
