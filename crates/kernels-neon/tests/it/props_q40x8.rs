//! `Q40x8` (Q4_0, IQ4_NL, Q5_0, Q4_1, Q5_1, Q4_K, Q5_K, Q6_K and Q8_0 rows repacked eight at a
//! time): against the f64 reference within the `Fast` bound (props.rs) on every path, and bit for
//! bit [`matvec_with`] of the original matrix where `Q40x8::exact_on` says so (the AVX2 path,
//! AVX-512's for Q4_0, IQ4_NL and Q8_0; every format on the aarch64 `dotprod` and `i8mm` paths),
//! whose one-row kernel's (`q40_pairs`, Q4_K's and Q5_K's `q4k_i16_rows`, Q6_K's `q6k_i16_rows`,
//! Q8_0's `dot_i16_rows`, the split rows on aarch64) order it keeps;
//! each token of `Q40x8::matvec_batch` bit for bit its own product.

use crate::common;

use common::*;
use kernels_neon::*;
use proptest::prelude::*;

/// The formats the layout takes block by block: the nibble formats and Q8_0.
const FORMATS: [WeightFormat; 6] = {
    let n = crate::common::Q40X8_FORMATS;
    [n[0], n[1], n[2], n[3], n[4], WeightFormat::Q8_0]
};

/// `Q40x8::matvec_with` on every path against the reference, and against `matvec_with` where
/// `Q40x8::exact_on` holds (at least on AVX2, where the machine has it).
fn check_all_paths(w: &QMatrix, x: &[f32]) -> Result<(), String> {
    let packed = Q40x8::repack(w).ok_or("not repacked")?;
    if packed.bytes() != w.data().len() || packed.format() != w.format() {
        return Err(format!("{} bytes", packed.bytes()));
    }
    let wf = dequant_f64(w);
    for path in available_paths() {
        let mut y = vec![f32::NAN; w.rows()];
        packed
            .matvec_with(path, x, &mut y)
            .map_err(|e| e.to_string())?;
        for (r, &v) in y.iter().enumerate() {
            check(v, reference(&wf[r], x), Precision::Fast)
                .map_err(|e| format!("{path:?} row {r}: {e}"))?;
        }
        // Where each format's copies must be exact: every format on AVX2 and on the aarch64
        // paths with `dotprod`, Q8_0 on AVX-512 too.
        let neon = matches!(path, KernelPath::NeonDotprod | KernelPath::NeonI8mm);
        let must = match w.format() {
            WeightFormat::Q8_0 => neon || matches!(path, KernelPath::Avx2Fma | KernelPath::Avx512),
            _ => neon || path == KernelPath::Avx2Fma,
        };
        if must && !Q40x8::exact_on(path, w.format()) {
            return Err(format!("{:?} not exact on {path:?}", w.format()));
        }
        if Q40x8::exact_on(path, w.format()) {
            let mut want = vec![f32::NAN; w.rows()];
            matvec_with(path, w, x, &mut want, Precision::Fast).map_err(|e| e.to_string())?;
            if want.iter().zip(&y).any(|(a, b)| a.to_bits() != b.to_bits()) {
                return Err(format!("{path:?}: {y:?} vs matvec {want:?}"));
            }
        }
        // The AVX-512 path runs the AVX2 path's kernels with `vpdpwssd` for `vpmaddwd` and
        // `vpaddd`: the same exact integer sums, so the same bits.
        if path == KernelPath::Avx512 {
            let mut avx2 = vec![f32::NAN; w.rows()];
            packed
                .matvec_with(KernelPath::Avx2Fma, x, &mut avx2)
                .map_err(|e| e.to_string())?;
            if avx2.iter().zip(&y).any(|(a, b)| a.to_bits() != b.to_bits()) {
                return Err(format!("AVX-512 {y:?} vs AVX2 {avx2:?}"));
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn q40x8_matches_f64_and_avx2_matvec(
        format in prop::sample::select(FORMATS.to_vec()),
        groups in 1usize..7,
        blocks in 1usize..19,
        chunk in prop::sample::select(vec![0usize, 1, 5, 16]),
        seed in any::<u64>(),
    ) {
        // Whole quads of blocks and a tail of 1-3 blocks.
        let (rows, cols) = (8 * groups, 32 * blocks);
        let mut rng = Rng(seed);
        let data = random_matrix(format, rows, cols, &mut rng);
        let w = QMatrix::new(format, rows, cols, &data).unwrap();
        let x = random_vec(cols, &mut rng);
        set_chunk_rows(chunk);
        let res = check_all_paths(&w, &x);
        set_chunk_rows(0);
        prop_assert!(res.is_ok(), "{format:?} {rows}x{cols}: {}", res.unwrap_err());
    }
}

/// Rows of 128 blocks and more (the AVX-512 path's one-token kernel for them was `q40_512` until
/// 2026-12-04): bit for bit `matvec_with` there too, with a tail of one block.
#[test]
fn q40x8_long_rows_match_matvec() {
    for format in FORMATS {
        for (seed, blocks) in [(1u64, 128usize), (2, 129), (3, 448)] {
            let (rows, cols) = (16, 32 * blocks);
            let mut rng = Rng(seed);
            let data = random_matrix(format, rows, cols, &mut rng);
            let w = QMatrix::new(format, rows, cols, &data).unwrap();
            let x = random_vec(cols, &mut rng);
            if let Err(e) = check_all_paths(&w, &x) {
                panic!("{format:?} {rows}x{cols}: {e}");
            }
        }
    }
}

/// The largest sums the kernel's i32 lanes hold: every quant 15 (the Q5s 31, IQ4_NL the table's
/// last, Q8_0 -128 and 127; and every quant 0) against activations all at +32639 and all at
/// -32639, and alternating.
#[test]
fn q40x8_extreme_quants_and_activations() {
    for (rows, cols) in [(16, 256), (16, 224)] {
        extreme(rows, cols);
    }
}

fn extreme(rows: usize, cols: usize) {
    let scale = half::f16::from_f32(0.01).to_le_bytes();
    let min = half::f16::from_f32(-0.01).to_le_bytes();
    for (format, fill) in FORMATS
        .into_iter()
        .flat_map(|f| [0xFFu8, 0x00, 0xF0, 0x0F, 0x5A, 0x80, 0x7F].map(|b| (f, b)))
    {
        // The scale (and the min: -0.01) from the pattern, the rest of the block filled.
        let head: Vec<u8> = match format {
            WeightFormat::Q4_1 | WeightFormat::Q5_1 => [scale, min].concat(),
            _ => scale.to_vec(),
        };
        let quants = format.block_bytes() - head.len();
        let block: Vec<u8> = head.into_iter().chain(vec![fill; quants]).collect();
        let data = block.repeat(rows * cols / 32);
        let w = QMatrix::new(format, rows, cols, &data).unwrap();
        for x in extreme_vecs(cols) {
            check_all_paths(&w, &x).unwrap_or_else(|e| panic!("{format:?} fill {fill:#x}: {e}"));
        }
    }
}

/// Which prompts read a copy (`Q40x8::takes_prompt`): where it batches, those below
/// `INT_TILE_MIN_TOKENS` tokens (decode's products), and up to 64 tokens Q4_0's on the AVX-512
/// path and Q4_0's and Q4_1's on the AVX2 path (the 16-bit tile's products); never where the copy
/// takes one token at a time.
#[test]
fn q40x8_prompts_read_copies_where_their_batch_beats_the_tile() {
    let mut rng = Rng(17);
    for format in [
        WeightFormat::Q4_0,
        WeightFormat::Q4_1,
        WeightFormat::Q5_0,
        WeightFormat::Q8_0,
        WeightFormat::Q4_K,
        WeightFormat::Q5_K,
    ] {
        let cols = if matches!(format, WeightFormat::Q4_K | WeightFormat::Q5_K) {
            256
        } else {
            64
        };
        let data = random_matrix(format, 8, cols, &mut rng);
        let p = Q40x8::repack(&QMatrix::new(format, 8, cols, &data).unwrap()).unwrap();
        // The x86 paths' rule, whichever path this machine runs (a pure function of the path).
        for path in [KernelPath::Avx512, KernelPath::Avx2Fma] {
            let wide = match path {
                KernelPath::Avx512 => format == WeightFormat::Q4_0,
                _ => matches!(format, WeightFormat::Q4_0 | WeightFormat::Q4_1),
            };
            for (n, want) in [
                (2, true),
                (INT_TILE_MIN_TOKENS - 1, true),
                (INT_TILE_MIN_TOKENS, wide),
                (64, wide),
                (65, false),
            ] {
                let got = p.takes_prompt_on(path, n);
                assert_eq!(got, want && p.batches_on(path), "{path:?} {format:?} n={n}");
                assert_eq!(
                    p.serves_steps_on(path),
                    p.batches_on(path),
                    "{path:?} {format:?}"
                );
                // On x86 the K-quants' copies take one token at a time.
                let k = matches!(format, WeightFormat::Q4_K | WeightFormat::Q5_K);
                assert_eq!(p.batches_on(path), !k && format != WeightFormat::Q8_0);
            }
        }
        for n in [2, INT_TILE_MIN_TOKENS, 64, 65] {
            assert_eq!(p.takes_prompt(n), p.takes_prompt_on(active_path(), n));
        }
        // On aarch64 with `dotprod` every copy serves the decode kernels' steps of several
        // tokens (the originals' batch runs a product a token there), so prompts below
        // `INT_TILE_MIN_TOKENS` tokens read it; on plain NEON (where the engine makes no copies)
        // only those that batch.
        for (path, serves) in [(KernelPath::NeonDotprod, true), (KernelPath::Neon, false)] {
            assert_eq!(
                p.serves_steps_on(path),
                serves || p.batches_on(path),
                "{path:?} {format:?}"
            );
            assert_eq!(
                p.takes_prompt_on(path, 2),
                serves || p.batches_on(path),
                "{path:?} {format:?}"
            );
            assert!(
                !p.takes_prompt_on(path, INT_TILE_MIN_TOKENS),
                "{path:?} {format:?}"
            );
        }
    }
}

/// Only the nibble formats (Q4_0, IQ4_NL, Q5_0, Q4_1, Q5_1), Q4_K, Q5_K, Q6_K and Q8_0 with rows a
/// multiple of 8 and at least one block a row repack.
#[test]
fn q40x8_repacks_only_its_shapes() {
    let mut rng = Rng(7);
    for (format, rows, cols, ok) in [
        (WeightFormat::Q4_0, 8, 128, true),
        (WeightFormat::Q4_0, 12, 128, false),
        (WeightFormat::Q4_0, 8, 96, true),
        (WeightFormat::Q4_0, 8, 0, false),
        (WeightFormat::IQ4_NL, 8, 64, true),
        (WeightFormat::IQ4_NL, 4, 64, false),
        (WeightFormat::Q5_0, 16, 32, true),
        (WeightFormat::Q5_0, 9, 32, false),
        (WeightFormat::Q4_1, 8, 128, true),
        (WeightFormat::Q5_1, 24, 32, true),
        (WeightFormat::Q5_1, 20, 32, false),
        (WeightFormat::Q4_K, 8, 256, true),
        (WeightFormat::Q4_K, 12, 256, false),
        (WeightFormat::Q8_0, 8, 64, true),
        (WeightFormat::Q8_0, 12, 64, false),
        (WeightFormat::Q5_K, 8, 256, true),
        (WeightFormat::Q5_K, 12, 256, false),
        (WeightFormat::Q3_K, 8, 256, false),
        (WeightFormat::Q6_K, 8, 256, true),
        (WeightFormat::Q6_K, 16, 512, true),
        (WeightFormat::Q6_K, 12, 256, false),
    ] {
        let data = random_matrix(format, rows, cols, &mut rng);
        let w = QMatrix::new(format, rows, cols, &data).unwrap();
        assert_eq!(Q40x8::repack(&w).is_some(), ok, "{format:?} {rows}x{cols}");
    }
    let data = random_matrix(WeightFormat::Q4_0, 8, 128, &mut rng);
    let w = QMatrix::new(WeightFormat::Q4_0, 8, 128, &data).unwrap();
    let p = Q40x8::repack(&w).unwrap();
    let mut y = vec![0f32; 8];
    assert!(p.matvec(&[0f32; 96], &mut y).is_err());
    assert!(p.matvec(&[0f32; 160], &mut y).is_err());
    assert!(p.matvec(&[0f32; 128], &mut y[..7]).is_err());
}

/// `Q40x8::matvec_many` and `Q40x8::matvec_gated` on every path: bit for bit one
/// `Q40x8::matvec_with` per matrix (and `act_mul_inplace` after the gated pair), whatever the
/// row chunks; on AVX2 so bit for bit `matvec_many_with` and `matvec_gated_with` of the originals.
fn check_many_and_gated(ws: &[QMatrix; 3], x: &[f32], act: Activation) -> Result<(), String> {
    let packed: Vec<Q40x8> = ws.iter().map(|w| Q40x8::repack(w).unwrap()).collect();
    let same = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(a, b)| a.to_bits() == b.to_bits());
    for path in available_paths() {
        let one: Vec<Vec<f32>> = packed
            .iter()
            .map(|p| {
                let mut y = vec![f32::NAN; p.rows()];
                p.matvec_with(path, x, &mut y).unwrap();
                y
            })
            .collect();
        let mut ys: Vec<Vec<f32>> = packed.iter().map(|p| vec![f32::NAN; p.rows()]).collect();
        let mut outs: Vec<&mut [f32]> = ys.iter_mut().map(|y| &mut y[..]).collect();
        let refs: Vec<&Q40x8> = packed.iter().collect();
        Q40x8::matvec_many_with(path, &refs, x, &mut outs).map_err(|e| e.to_string())?;
        if !ys.iter().zip(&one).all(|(a, b)| same(a, b)) {
            return Err(format!("{path:?}: matvec_many {ys:?} vs matvec {one:?}"));
        }
        let mut g = vec![f32::NAN; packed[0].rows()];
        Q40x8::matvec_gated_with(path, &packed[0], &packed[1], act, x, &mut g)
            .map_err(|e| e.to_string())?;
        let mut want = one[0].clone();
        act_mul_inplace(act, &mut want, &one[1]);
        if !same(&g, &want) {
            return Err(format!("{path:?}: matvec_gated {g:?} vs {want:?}"));
        }
        if Q40x8::exact_on(path, ws[0].format()) {
            let mut orig: Vec<Vec<f32>> = ws.iter().map(|w| vec![f32::NAN; w.rows()]).collect();
            let mut outs: Vec<&mut [f32]> = orig.iter_mut().map(|y| &mut y[..]).collect();
            let refs: Vec<&QMatrix> = ws.iter().collect();
            matvec_many_with(path, &refs, x, &mut outs, Precision::Fast).unwrap();
            let mut og = vec![f32::NAN; ws[0].rows()];
            matvec_gated_with(path, &ws[0], &ws[1], act, x, 1, &mut og, Precision::Fast).unwrap();
            if !ys.iter().zip(&orig).all(|(a, b)| same(a, b)) || !same(&g, &og) {
                return Err(format!(
                    "{path:?}: differs from the original matrices' products"
                ));
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn q40x8_many_and_gated_match_matvec(
        format in prop::sample::select(FORMATS.to_vec()),
        groups in prop::array::uniform3(1usize..7),
        blocks in 1usize..15,
        chunk in prop::sample::select(vec![0usize, 1, 5, 16]),
        act in prop::sample::select(vec![Activation::Silu, Activation::Relu, Activation::GeluTanh]),
        seed in any::<u64>(),
    ) {
        let cols = 32 * blocks;
        // Gate and up (0 and 1) of one shape; the third of its own.
        let rows = [8 * groups[0], 8 * groups[0], 8 * groups[2]];
        let mut rng = Rng(seed);
        let data: Vec<Vec<u8>> =
            rows.iter().map(|&r| random_matrix(format, r, cols, &mut rng)).collect();
        let ws = [0, 1, 2].map(|i| QMatrix::new(format, rows[i], cols, &data[i]).unwrap());
        let x = random_vec(cols, &mut rng);
        set_chunk_rows(chunk);
        let res = check_many_and_gated(&ws, &x, act);
        set_chunk_rows(0);
        prop_assert!(res.is_ok(), "{format:?} {rows:?}x{cols}: {}", res.unwrap_err());
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    /// Q4_K, Q5_K and Q6_K rows (super-blocks of 256): the same checks, bit for bit
    /// `q4k_i16_rows` on AVX2 (Q4_K, Q5_K) and the split rows on aarch64 with `dotprod` (all).
    #[test]
    fn q4k_q6k_x8_match_f64_and_matvec(
        format in prop::sample::select(
            vec![WeightFormat::Q4_K, WeightFormat::Q5_K, WeightFormat::Q6_K]
        ),
        groups in 1usize..5,
        sbs in 1usize..5,
        chunk in prop::sample::select(vec![0usize, 1, 5, 16]),
        act in prop::sample::select(vec![Activation::Silu, Activation::Relu]),
        seed in any::<u64>(),
    ) {
        let (rows, cols) = (8 * groups, 256 * sbs);
        let mut rng = Rng(seed);
        let data: Vec<Vec<u8>> = (0..3)
            .map(|_| random_matrix(format, rows, cols, &mut rng))
            .collect();
        let ws = [0, 1, 2].map(|i| QMatrix::new(format, rows, cols, &data[i]).unwrap());
        let x = random_vec(cols, &mut rng);
        set_chunk_rows(chunk);
        let res = check_all_paths(&ws[0], &x).and_then(|_| check_many_and_gated(&ws, &x, act));
        set_chunk_rows(0);
        prop_assert!(res.is_ok(), "{format:?} {rows}x{cols}: {}", res.unwrap_err());
    }
}

/// Q4_K's and Q5_K's largest sums: every quant 15 (Q5_K 31) with every scale and min 63 (and the
/// other fills) against activations at the extremes.
#[test]
fn q4k_x8_extreme_quants_and_activations() {
    let (rows, cols) = (16, 512);
    let head: Vec<u8> = [0.01f32, -0.01]
        .iter()
        .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
        .collect();
    for format in [WeightFormat::Q4_K, WeightFormat::Q5_K] {
        for fill in [0xFFu8, 0x00, 0xF0, 0x0F, 0x5A] {
            let rest = vec![fill; format.block_bytes() - 4];
            let block: Vec<u8> = head.iter().copied().chain(rest).collect();
            let data = block.repeat(rows * cols / 256);
            let w = QMatrix::new(format, rows, cols, &data).unwrap();
            for x in extreme_vecs(cols) {
                check_all_paths(&w, &x)
                    .unwrap_or_else(|e| panic!("{format:?} fill {fill:#x}: {e}"));
            }
        }
    }
}

/// Q6_K's largest sums: every quant 63 (and the other fills, whose scales are the same bytes:
/// -1, 0, -16, 15, 90) against activations at the extremes.
#[test]
fn q6k_x8_extreme_quants_and_activations() {
    let (rows, cols) = (16, 512);
    let d = half::f16::from_f32(0.01).to_le_bytes();
    for fill in [0xFFu8, 0x00, 0xF0, 0x0F, 0x5A] {
        let block: Vec<u8> = vec![fill; 208].into_iter().chain(d).collect();
        let data = block.repeat(rows * cols / 256);
        let w = QMatrix::new(WeightFormat::Q6_K, rows, cols, &data).unwrap();
        for x in extreme_vecs(cols) {
            check_all_paths(&w, &x).unwrap_or_else(|e| panic!("Q6_K fill {fill:#x}: {e}"));
        }
    }
}

/// `Q40x8::matvec_batch` on every path: each token's results bit for bit its own
/// `Q40x8::matvec_with`, for 1-5 tokens (pairs, three at once and a single one), every format,
/// Q4_K, Q5_K and Q6_K too (two super-blocks a row).
#[test]
fn q40x8_batch_is_each_tokens_matvec() {
    let mut rng = Rng(91);
    let shapes = FORMATS.into_iter().map(|f| (f, 24, 224)).chain([
        (WeightFormat::Q4_K, 16, 512),
        (WeightFormat::Q5_K, 16, 512),
        (WeightFormat::Q6_K, 16, 512),
    ]);
    for (format, rows, cols) in shapes {
        let data = random_matrix(format, rows, cols, &mut rng);
        let w = QMatrix::new(format, rows, cols, &data).unwrap();
        let p = Q40x8::repack(&w).unwrap();
        // The K-quants' copies read once for several tokens on aarch64 with `dotprod` only.
        let neon = matches!(
            active_path(),
            KernelPath::NeonDotprod | KernelPath::NeonI8mm
        );
        let one_token = match format {
            WeightFormat::Q8_0 => true,
            WeightFormat::Q4_K | WeightFormat::Q5_K | WeightFormat::Q6_K => !neon,
            _ => false,
        };
        assert_eq!(p.batches(), !one_token);
        for n in 1..=5 {
            let x = random_vec(n * cols, &mut rng);
            for path in available_paths() {
                for chunk in [0, 8] {
                    set_chunk_rows(chunk);
                    let mut y = vec![f32::NAN; n * rows];
                    p.matvec_batch_with(path, &x, n, &mut y).unwrap();
                    set_chunk_rows(0);
                    for t in 0..n {
                        let mut one = vec![f32::NAN; rows];
                        p.matvec_with(path, &x[t * cols..(t + 1) * cols], &mut one)
                            .unwrap();
                        let got = &y[t * rows..(t + 1) * rows];
                        assert!(
                            got.iter()
                                .zip(&one)
                                .all(|(a, b)| a.to_bits() == b.to_bits()),
                            "{format:?} {path:?} n={n} token {t}: {got:?} vs {one:?}"
                        );
                    }
                }
            }
        }
        let mut y = vec![0f32; 2 * rows];
        assert!(p
            .matvec_batch(&vec![0f32; 2 * cols + 1], 2, &mut y)
            .is_err());
        assert!(p
            .matvec_batch(&vec![0f32; 2 * cols], 2, &mut y[1..])
            .is_err());
    }
}
