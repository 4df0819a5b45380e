//! Q4_0 decode products in `Fast` and `Int8` over long rows: whole groups of eight blocks, their
//! pairs or fours after them and odd last blocks (`arch/x86_64/q40_512_i8.rs`, 8-bit activations,
//! which `Int8` takes on the AVX-512 path; 16-bit ones take `q40_pairs` on both x86 paths, whose
//! rows of 128 blocks or more went to `q40_512` until 2026-12-04; every path runs them): `matvec`
//! within the bound of `props.rs` for the precision it takes (`matvec_precision`) against
//! float64, listed rows (`matvec_rows`) and batched tokens (`matvec_batch`, 1 to 19 tokens) bit for
//! bit `matvec`'s. Rows of 126-131 blocks as well.

use crate::common;

use common::*;
use kernels_neon::*;
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn q4_0_fast_and_int8_decode_long_rows_batch_and_lists_equal_matvec(
        rows in 1usize..24,
        blocks in prop_oneof![1usize..40, 126usize..132],
        n in 1usize..20,
        list_seed in any::<u64>(),
        seed in any::<u64>(),
    ) {
        let format = WeightFormat::Q4_0;
        let cols = 32 * blocks;
        let mut rng = Rng(seed);
        let data = random_matrix(format, rows, cols, &mut rng);
        let w = QMatrix::new(format, rows, cols, &data).unwrap();
        let wf = dequant_f64(&w);
        let x = random_vec(n * cols, &mut rng);
        let mut lr = Rng(list_seed);
        let list: Vec<u32> = (0..rows + 3).map(|_| (lr.f().abs() * rows as f32) as u32 % rows as u32).collect();
        for (path, precision) in available_paths().into_iter().flat_map(|p| [(p, Precision::Fast), (p, Precision::Int8)]) {
            let eff = matvec_precision(path, format, precision);
            let mut got = vec![f32::NAN; n * rows];
            matvec_batch_with(path, &w, &x, n, &mut got, precision).unwrap();
            for t in 0..n {
                let xt = &x[t * cols..(t + 1) * cols];
                let mut want = vec![f32::NAN; rows];
                matvec_with(path, &w, xt, &mut want, precision).unwrap();
                for (r, &y) in want.iter().enumerate() {
                    if let Err(e) = check(y, reference(&wf[r], xt), eff) {
                        prop_assert!(false, "{path:?} {precision:?} {rows}x{cols} row {r}: {e}");
                    }
                }
                let row = &got[t * rows..(t + 1) * rows];
                let same = want.iter().zip(row).all(|(a, b)| a.to_bits() == b.to_bits());
                prop_assert!(same, "{path:?} {precision:?} batch {rows}x{cols} n={n} token {t}: {row:?} vs {want:?}");
                let mut listed = vec![f32::NAN; list.len()];
                matvec_rows_with(path, &w, &list, xt, &mut listed, precision).unwrap();
                let same = list.iter().zip(&listed).all(|(&r, v)| v.to_bits() == want[r as usize].to_bits());
                prop_assert!(same, "{path:?} {precision:?} listed {rows}x{cols}: {listed:?} vs {want:?}");
            }
        }
    }
}
