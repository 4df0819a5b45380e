//! Q4_0 decode products in `Fast` over rows long enough for the AVX-512 kernel's whole groups of
//! eight blocks, its pairs after them and an odd last block (`arch/x86_64/q40_512.rs`; every path
//! runs them): `matvec` within the Fast bound of `props.rs` against float64, listed rows
//! (`matvec_rows`) and batched tokens (`matvec_batch`, 1 to 19 tokens: the batch kernel's 8, 4, 2
//! and 1 at a time) bit for bit `matvec`'s. Rows of 126-131 blocks as well: a dense matrix's rows
//! of 128 blocks or more go four a step.

use crate::common;

use common::*;
use kernels_neon::*;
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn q4_0_fast_decode_long_rows_batch_and_lists_equal_matvec(
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
        for path in available_paths() {
            let mut got = vec![f32::NAN; n * rows];
            matvec_batch_with(path, &w, &x, n, &mut got, Precision::Fast).unwrap();
            for t in 0..n {
                let xt = &x[t * cols..(t + 1) * cols];
                let mut want = vec![f32::NAN; rows];
                matvec_with(path, &w, xt, &mut want, Precision::Fast).unwrap();
                for (r, &y) in want.iter().enumerate() {
                    let (dot, abs, qerr) = reference(&wf[r], xt);
                    let bound = qerr / 65534.0 * 1.02 + 1e-5 * abs + 1e-6;
                    prop_assert!((f64::from(y) - dot).abs() <= bound, "{path:?} {rows}x{cols} row {r}: {y} vs {dot}");
                }
                let row = &got[t * rows..(t + 1) * rows];
                let same = want.iter().zip(row).all(|(a, b)| a.to_bits() == b.to_bits());
                prop_assert!(same, "{path:?} batch {rows}x{cols} n={n} token {t}: {row:?} vs {want:?}");
                let mut listed = vec![f32::NAN; list.len()];
                matvec_rows_with(path, &w, &list, xt, &mut listed, Precision::Fast).unwrap();
                let same = list.iter().zip(&listed).all(|(&r, v)| v.to_bits() == want[r as usize].to_bits());
                prop_assert!(same, "{path:?} listed {rows}x{cols}: {listed:?} vs {want:?}");
            }
        }
    }
}
