//! Load-time re-quantization (`engine::requant`) on the tiny F16 fixture: the overlay holds every layer
//! matrix in the asked format, its rows are the file's rows quantized, and the engine runs on it.

use std::path::PathBuf;

use engine::{Engine, EngineOptions, Logits, ModelFile, Overlay, Precision, Requant};
use kernels_neon::{dequantize_row, WeightFormat};

fn fixture() -> ModelFile {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tiny-llama-f16.gguf");
    ModelFile::open(p).unwrap()
}

fn logits(file: &ModelFile, overlay: Option<&Overlay>) -> Vec<f32> {
    let opts = EngineOptions {
        threads: 1,
        precision: Precision::Exact,
        context: 64,
        ..Default::default()
    };
    let eng = Engine::new_with_overlay(file, overlay, opts).unwrap();
    let mut cache = eng.new_cache();
    eng.forward(&mut cache, &[1, 70, 80, 90, 100, 33], Logits::All)
        .unwrap()
}

/// max |a - b| / max |b|.
fn rel_drift(a: &[f32], b: &[f32]) -> f32 {
    let m = b.iter().fold(0f32, |m, v| m.max(v.abs()));
    a.iter().zip(b).fold(0f32, |d, (x, y)| d.max((x - y).abs())) / m
}

#[test]
fn overlay_holds_every_layer_matrix_in_the_target_format() {
    let file = fixture();
    let cfg = file.config().unwrap();
    for (spec, want) in [
        ("q4_0", WeightFormat::Q4_0),
        (
            "int4",
            WeightFormat::I4Hybrid {
                outliers_per_row: 0,
            },
        ),
        (
            "hybrid:5%",
            WeightFormat::I4Hybrid {
                outliers_per_row: 4,
            },
        ), // ceil(0.05 * 64)
    ] {
        let o = Overlay::build(&file, spec.parse::<Requant>().unwrap()).unwrap();
        assert_eq!(o.len(), cfg.n_layers * 7, "{spec}");
        let t = o.get("blk.0.attn_q.weight").unwrap();
        assert_eq!(
            (t.format, t.rows, t.cols),
            (want, cfg.q_dim(), cfg.d_model),
            "{spec}"
        );
        // 64-wide rows: 4.5 (Q4_0), 5.0 (8 + 32 bytes), 6.5 (8 + 32 + 12 bytes).
        assert!(
            o.bits_per_weight() > 4.0 && o.bits_per_weight() <= 6.5,
            "{spec}: {}",
            o.bits_per_weight()
        );
        // The engine takes the overlay's matrices; embedding/output stay as in the file.
        let eng = Engine::new_with_overlay(&file, Some(&o), EngineOptions::default()).unwrap();
        assert_eq!(eng.model().layers[0].wq.format(), t.format);
        assert_eq!(
            eng.model().layers[1].ffn.gated().unwrap().down.format(),
            o.get("blk.1.ffn_down.weight").unwrap().format
        );
        assert_eq!(eng.model().embed.format(), WeightFormat::F16);
    }
}

#[test]
fn overlay_rows_are_the_file_rows_quantized() {
    let file = fixture();
    let o = Overlay::build(&file, Requant::Hybrid { outlier_frac: 0.05 }).unwrap();
    let t = o.get("blk.1.ffn_down.weight").unwrap();
    let m = t.matrix().unwrap();
    let ModelFile::Gguf(g) = &file else {
        unreachable!()
    };
    let src = g.tensor("blk.1.ffn_down.weight").unwrap();
    let rb = src.data.len() / t.rows;
    for r in 0..t.rows {
        let mut want = vec![0f32; t.cols];
        dequantize_row(
            WeightFormat::F16,
            &src.data[r * rb..(r + 1) * rb],
            &mut want,
        )
        .unwrap();
        let mut got = vec![0f32; t.cols];
        dequantize_row(t.format, m.row_data(r), &mut got).unwrap();
        let amax = want.iter().fold(0f32, |a, v| a.max(v.abs()));
        let mut sq = 0f32;
        for (a, b) in got.iter().zip(&want) {
            // The scale search clips at 0.7 * max|rest| at most.
            assert!((a - b).abs() <= 0.3 * amax + 1e-6, "row {r}: {a} vs {b}");
            sq += (a - b) * (a - b);
        }
        // RMS error below half an INT4 step of the unclipped scale (amax / 7).
        let rms = (sq / t.cols as f32).sqrt();
        assert!(rms <= amax / 14.0, "row {r}: rms {rms} vs amax {amax}");
    }
}

#[test]
fn engine_runs_on_re_quantized_weights() {
    let file = fixture();
    let base = logits(&file, None);
    // Every weight an INT8 outlier (k = cols): per-row INT8, nearly the F16 model.
    let all8 = Overlay::build(&file, Requant::Hybrid { outlier_frac: 1.0 }).unwrap();
    let d8 = rel_drift(&logits(&file, Some(&all8)), &base);
    assert!(d8 < 0.02, "int8 drift {d8}");
    // INT4 variants drift more, but stay finite and the same order of magnitude.
    for r in [
        Requant::Q4_0,
        Requant::Int4PerChannel,
        Requant::Hybrid { outlier_frac: 0.02 },
    ] {
        let o = Overlay::build(&file, r).unwrap();
        let l = logits(&file, Some(&o));
        assert!(l.iter().all(|v| v.is_finite()), "{r}");
        let d = rel_drift(&l, &base);
        assert!(d > d8 && d < 0.5, "{r}: drift {d} (int8 {d8})");
    }
}
