//! A GGUF written by an independent implementation, the PyPI `gguf` package's `GGUFWriter`
//! (`fixtures/quants-gguf-python.gguf`, made by `cargo xtask fixtures` with
//! `crates/kernels-neon/tests/data/gen_quants.py`): for every weight format Sparrow reads, a tensor `<format>`
//! of random blocks (2 × 512) and a tensor `<format>.expected` holding its values as `gguf.quants.dequantize`
//! gives them. The GGUF reader must accept every tensor with the format and shape written, and every kernel
//! path's dequantization must give the expected values.

use kernels_neon::{available_paths, dequantize_row_with, WeightFormat};
use model_format::GgufFile;

/// The formats of the fixture, by tensor name, as the writer tagged them.
const FORMATS: [(&str, WeightFormat); 15] = [
    ("f16", WeightFormat::F16),
    ("bf16", WeightFormat::BF16),
    ("q8_0", WeightFormat::Q8_0),
    ("q4_0", WeightFormat::Q4_0),
    ("q4_1", WeightFormat::Q4_1),
    ("q5_0", WeightFormat::Q5_0),
    ("q5_1", WeightFormat::Q5_1),
    ("q4_k", WeightFormat::Q4_K),
    ("q5_k", WeightFormat::Q5_K),
    ("q6_k", WeightFormat::Q6_K),
    ("iq4_nl", WeightFormat::IQ4_NL),
    ("iq4_xs", WeightFormat::IQ4_XS),
    ("q2_k", WeightFormat::Q2_K),
    ("q3_k", WeightFormat::Q3_K),
    ("f32", WeightFormat::F32),
];

#[test]
fn every_format_of_a_gguf_python_file_loads_with_its_values() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/quants-gguf-python.gguf");
    let file = GgufFile::open(&path).unwrap();
    assert_eq!(file.tensors().count(), 2 * FORMATS.len());
    for (name, format) in FORMATS {
        let t = file.tensor(name).unwrap_or_else(|| panic!("{name}"));
        assert_eq!(t.dtype, format, "{name}");
        assert_eq!(t.shape, &[2, 512], "{name}");
        let e = file.tensor(&format!("{name}.expected")).unwrap();
        assert_eq!((e.dtype, e.shape), (WeightFormat::F32, &[2usize, 512][..]));
        let expected: Vec<f32> = e
            .data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        assert!(expected.iter().any(|&v| v != 0.0), "{name}");
        let rb = format.row_bytes(512).unwrap();
        assert_eq!(t.data.len(), 2 * rb, "{name}");
        for path in available_paths() {
            for (r, want) in expected.chunks_exact(512).enumerate() {
                let mut got = vec![f32::NAN; 512];
                dequantize_row_with(path, format, &t.data[r * rb..(r + 1) * rb], &mut got).unwrap();
                for (j, (&a, &w)) in got.iter().zip(want).enumerate() {
                    // numpy may round scale products in another order: a few f32 ulps.
                    assert!(
                        (a - w).abs() <= 4e-6 * w.abs().max(1e-3),
                        "{path:?} {name} row {r} element {j}: {a} vs gguf {w}"
                    );
                }
            }
        }
    }
}
