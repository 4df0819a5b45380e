//! Every integer weight format on every path this machine has, in both integer precisions, for
//! dense rows (`matvec`) and listed rows (`matvec_rows`, and `matvec_rows_prepared` with one
//! preparation for several calls: the sparse FFN's gate/up rows): each
//! result against the scalar path's on the same quantized activations (f32 summation order only:
//! 1e-5 · Σ|w·x| + 1e-6, as `props::integer_paths_match_scalar`). Fixed seeds, several shapes, and
//! every mismatch listed (not only the first), so that one run names every broken kernel. Under
//! `qemu-aarch64 -cpu max` this checks the `dotprod`/`i8mm` kernels and the plain NEON fallback
//! (`neon` is among the available paths there); `-cpu cortex-a53` leaves only `neon` and scalar.

use crate::common::*;
use kernels_neon::*;

/// The mismatches of one format, precision and shape on every available path.
fn mismatches(
    format: WeightFormat,
    precision: Precision,
    rows: usize,
    units: usize,
    seed: u64,
) -> Vec<String> {
    let cols = cols_for(format, units, 0);
    let mut rng = Rng(seed);
    let data = random_matrix(format, rows, cols, &mut rng);
    let w = QMatrix::new(format, rows, cols, &data).unwrap();
    let x = random_vec(cols, &mut rng);
    let wf = dequant_f64(&w);
    // Every other row, backwards: a sparse FFN's unordered subset.
    let list: Vec<u32> = (0..rows as u32).rev().step_by(2).collect();
    // The scalar path's products in the precision `path` takes for them (`matvec_precision`:
    // `Fast` decode would take `Int8`'s where `fast_decode_int8` says so; no format now).
    let scalar = |path: KernelPath| {
        let mut want = vec![0f32; rows];
        let p = matvec_precision(path, format, precision);
        matvec_with(KernelPath::Scalar, &w, &x, &mut want, p).unwrap();
        want
    };
    let mut bad = Vec::new();
    for path in available_paths() {
        let want = scalar(path);
        let mut y = vec![f32::NAN; rows];
        matvec_with(path, &w, &x, &mut y, precision).unwrap();
        let mut ys = vec![f32::NAN; list.len()];
        matvec_rows_with(path, &w, &list, &x, &mut ys, precision).unwrap();
        let dense: Vec<(usize, f32)> = (0..rows).map(|r| (r, y[r])).collect();
        let listed: Vec<(usize, f32)> = list.iter().map(|&r| r as usize).zip(ys).collect();
        // The first mismatch of each kernel.
        for (what, got) in [("matvec", dense), ("matvec_rows", listed)] {
            let off = got.into_iter().find(|&(r, v)| {
                let (_, abs, _) = reference(&wf[r], &x);
                !order_close(v, want[r], abs)
            });
            if let Some((r, v)) = off {
                bad.push(format!(
                    "{what} {path:?} {format:?} {precision:?} {rows}x{cols} row {r}: {v} vs scalar {}",
                    want[r]
                ));
            }
        }
    }
    // The sparse FFN's way on the active path: activations prepared once, then several calls
    // (a neuron store's units) reusing them, each against the scalar path.
    let acts = prepare_acts(format, &x, precision);
    let want = scalar(active_path());
    for chunk in list.chunks(3).chain([&list[..]]) {
        let mut ys = vec![f32::NAN; chunk.len()];
        matvec_rows_prepared(&acts, &w, chunk, &mut ys).unwrap();
        for (&r, &v) in chunk.iter().zip(&ys) {
            let r = r as usize;
            let (_, abs, _) = reference(&wf[r], &x);
            if !order_close(v, want[r], abs) {
                let path = active_path();
                bad.push(format!(
                    "matvec_rows_prepared {path:?} {format:?} {precision:?} {rows}x{cols} row {r}: {v} vs scalar {}",
                    want[r]
                ));
                break;
            }
        }
    }
    bad
}

#[test]
fn every_format_and_path_matches_scalar_dense_and_listed_rows() {
    let mut bad = Vec::new();
    for (i, format) in INT_FORMATS.into_iter().enumerate() {
        for precision in [Precision::Fast, Precision::Int8] {
            for (rows, units) in [(1, 1), (7, 2), (18, 5)] {
                bad.extend(mismatches(
                    format,
                    precision,
                    rows,
                    units,
                    0x5eed + i as u64 * 31 + units as u64,
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
