//! `Fast` decode keeps 16-bit activations (`fast_decode_int8`: no format, no path) at the shape of
//! SmolLM2-135M's FFN down projection (576 rows of 1536 columns: six super-blocks a row), with
//! activations like a SwiGLU product's (a few outliers 40 times the rest): every quantized format on
//! every path this machine has, dense and listed rows, within `props.rs`'s Fast bound of float64.
//! The 8-bit products that `Fast` decode of Q2_K/Q3_K took on AVX2 (until this test) fell up to 9
//! times outside that bound here (and changed 4 of 7 greedy continuations of SmolLM2 re-quantized to Q2_K, whose
//! `ffn_down` is Q3_K). Also each path's `Int8` rows against the scalar path's at that shape
//! (f32 summation order only), so the 8-bit kernels `--int8` takes are checked there too.

use crate::common::*;
use kernels_neon::*;

const ROWS: usize = 576;
const COLS: usize = 1536;

/// A matrix of `format` at the down projection's shape and SwiGLU-like activations.
fn case(format: WeightFormat, seed: u64) -> (Vec<u8>, Vec<f32>) {
    let mut rng = Rng(seed);
    let data = random_matrix(format, ROWS, COLS, &mut rng);
    let mut x = random_vec(COLS, &mut rng);
    for i in (5..COLS).step_by(97) {
        x[i] *= 40.0;
    }
    (data, x)
}

/// The first row of `y` (dense rows, or `list`'s) outside `precision`'s bound of float64.
fn first_off(
    wf: &[Vec<f64>],
    x: &[f32],
    rows: &[usize],
    y: &[f32],
    p: Precision,
) -> Option<String> {
    rows.iter().zip(y).find_map(|(&r, &v)| {
        check(v, reference(&wf[r], x), p)
            .err()
            .map(|e| format!("row {r}: {e}"))
    })
}

#[test]
fn fast_decode_takes_16_bit_activations_at_smollm2_down_shape() {
    let mut bad = Vec::new();
    for (i, format) in INT_FORMATS.into_iter().enumerate() {
        let (data, x) = case(format, 0xd0_11 + i as u64);
        let w = QMatrix::new(format, ROWS, COLS, &data).unwrap();
        let wf = dequant_f64(&w);
        let dense: Vec<usize> = (0..ROWS).collect();
        let list: Vec<u32> = (0..ROWS as u32).rev().step_by(3).collect();
        let listed: Vec<usize> = list.iter().map(|&r| r as usize).collect();
        for path in available_paths() {
            let mut y = vec![f32::NAN; ROWS];
            matvec_with(path, &w, &x, &mut y, Precision::Fast).unwrap();
            let mut ys = vec![f32::NAN; list.len()];
            matvec_rows_with(path, &w, &list, &x, &mut ys, Precision::Fast).unwrap();
            for (what, rows, got) in [("matvec", &dense, &y), ("matvec_rows", &listed, &ys)] {
                if let Some(e) = first_off(&wf, &x, rows, got, Precision::Fast) {
                    bad.push(format!("{what} {path:?} {format:?} Fast {ROWS}x{COLS} {e}"));
                }
            }
        }
    }
    assert!(
        bad.is_empty(),
        "{} outside the Fast bound:\n{}",
        bad.len(),
        bad.join("\n")
    );
}

#[test]
fn int8_rows_match_scalar_at_smollm2_down_shape() {
    let mut bad = Vec::new();
    for (i, format) in INT_FORMATS.into_iter().enumerate() {
        let (data, x) = case(format, 0x18_11 + i as u64);
        let w = QMatrix::new(format, ROWS, COLS, &data).unwrap();
        let wf = dequant_f64(&w);
        let mut want = vec![f32::NAN; ROWS];
        matvec_with(KernelPath::Scalar, &w, &x, &mut want, Precision::Int8).unwrap();
        for path in available_paths() {
            let mut y = vec![f32::NAN; ROWS];
            matvec_with(path, &w, &x, &mut y, Precision::Int8).unwrap();
            let off = (0..ROWS).find(|&r| {
                let (_, abs, _) = reference(&wf[r], &x);
                !order_close(y[r], want[r], abs)
            });
            if let Some(r) = off {
                bad.push(format!(
                    "{path:?} {format:?} Int8 row {r}: {} vs scalar {}",
                    y[r], want[r]
                ));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "{} mismatches:\n{}",
        bad.len(),
        bad.join("\n")
    );
}
