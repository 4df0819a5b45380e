//! `experts_ffn_packed` (one token's experts over their `Q40x8` copies) against `experts_ffn` over
//! the original Q4_0, IQ4_NL, Q5_0, Q4_1 and Q5_1 matrices in `Fast`: bit for bit where `Q40x8::exact_on` holds
//! (the copies keep `q40_pairs`' order), within `Fast`'s reach of them elsewhere; the activations
//! each job shows too; and its refusals. `experts_ffn` with each job's copies: the originals' bits,
//! the copies read wherever the decode kernels run in `Fast` on the paths where they are exact.

use crate::common::{random_matrix, random_vec, Rng};
use kernels_neon::*;

/// The formats the copies take block by block.
const FORMATS: [WeightFormat; 5] = crate::common::Q40X8_FORMATS;

struct Expert {
    mats: [Vec<u8>; 3],
    ff: usize,
    format: WeightFormat,
}

impl Expert {
    fn new(rng: &mut Rng, d: usize, ff: usize) -> Expert {
        Expert::of(WeightFormat::Q4_0, rng, d, ff)
    }

    fn of(format: WeightFormat, rng: &mut Rng, d: usize, ff: usize) -> Expert {
        let q = |rows, cols, rng: &mut Rng| random_matrix(format, rows, cols, rng);
        Expert {
            mats: [q(ff, d, rng), q(ff, d, rng), q(d, ff, rng)],
            ff,
            format,
        }
    }

    fn matrices(&self, d: usize) -> [QMatrix<'_>; 3] {
        let m = |i: usize, rows, cols| QMatrix::new(self.format, rows, cols, &self.mats[i]);
        [
            m(0, self.ff, d).unwrap(),
            m(1, self.ff, d).unwrap(),
            m(2, d, self.ff).unwrap(),
        ]
    }
}

type Run = (Vec<f32>, Vec<Vec<f32>>);

/// `experts_ffn` of the one token `x` over the original matrices of `picked` (expert, weight),
/// added to `init`.
fn original(
    path: KernelPath,
    mats: &[[QMatrix; 3]],
    picked: &[(usize, f32)],
    x: &[f32],
    init: &[f32],
) -> Run {
    let ws: Vec<[f32; 1]> = picked.iter().map(|&(_, w)| [w]).collect();
    let jobs: Vec<ExpertJob> = picked
        .iter()
        .zip(&ws)
        .map(|(&(e, _), w)| ExpertJob {
            gate: &mats[e][0],
            up: &mats[e][1],
            down: &mats[e][2],
            tokens: &[0],
            weights: w,
            copies: None,
        })
        .collect();
    let mut out = init.to_vec();
    let mut seen = Vec::new();
    experts_ffn_with(
        path,
        &jobs,
        Activation::Silu,
        x,
        1,
        &mut out,
        Precision::Fast,
        true,
        &mut ExpertsScratch::default(),
        &mut |_, g| seen.push(g.to_vec()),
    )
    .unwrap();
    (out, seen)
}

/// `experts_ffn_packed` of `x` over the copies of `picked`, added to `init`.
fn packed(
    path: KernelPath,
    copies: &[[Q40x8; 3]],
    picked: &[(usize, f32)],
    x: &[f32],
    init: &[f32],
) -> Run {
    let jobs: Vec<PackedExpertJob> = picked
        .iter()
        .map(|&(e, weight)| PackedExpertJob {
            gate: &copies[e][0],
            up: &copies[e][1],
            down: &copies[e][2],
            weight,
        })
        .collect();
    let mut out = init.to_vec();
    let mut seen = Vec::new();
    experts_ffn_packed_with(path, &jobs, Activation::Silu, x, &mut out, &mut |_, g| {
        seen.push(g.to_vec())
    })
    .unwrap();
    (out, seen)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

#[test]
fn experts_ffn_packed_equals_experts_ffn_over_the_originals() {
    let mut rng = Rng(31);
    // Hidden sizes of 2, 8 and 9 blocks, experts of 4-20 groups of rows (the last, wider, stands
    // for a shared expert).
    let shapes = [(64usize, 32usize), (256, 96), (288, 160)];
    for (format, (d, ff)) in FORMATS.into_iter().flat_map(|f| shapes.map(|s| (f, s))) {
        let experts: Vec<Expert> = (0..6)
            .map(|e| Expert::of(format, &mut rng, d, if e == 5 { 2 * ff } else { ff }))
            .collect();
        let mats: Vec<[QMatrix; 3]> = experts.iter().map(|e| e.matrices(d)).collect();
        let copies: Vec<[Q40x8; 3]> = mats
            .iter()
            .map(|m| m.each_ref().map(|m| Q40x8::repack(m).unwrap()))
            .collect();
        for chunk in [0, 8, 24] {
            set_chunk_rows(chunk);
            for picked in [
                vec![(2, 0.7)],
                vec![(4, 0.25), (0, 0.5), (1, 0.25), (5, 1.0)],
            ] {
                let x = random_vec(d, &mut rng);
                let init = random_vec(d, &mut rng);
                for path in available_paths() {
                    let what =
                        format!("{format:?} {path:?} d={d} ff={ff} chunk={chunk} {picked:?}");
                    let (want, want_g) = original(path, &mats, &picked, &x, &init);
                    let (got, got_g) = packed(path, &copies, &picked, &x, &init);
                    assert_eq!(got_g.len(), picked.len(), "{what}");
                    if Q40x8::exact_on(path, format) {
                        assert_eq!(bits(&got), bits(&want), "{what}: outputs");
                        for (a, b) in got_g.iter().zip(&want_g) {
                            assert_eq!(bits(a), bits(b), "{what}: activations");
                        }
                    } else {
                        // Other paths take a scalar loop over the copies, AVX-512 its own Q5_0
                        // kernel for the originals: `Fast`'s reach.
                        let scale = want.iter().fold(1f32, |m, v| m.max(v.abs()));
                        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                            assert!((a - b).abs() <= 2e-2 * scale, "{what}: [{i}] {a} vs {b}");
                        }
                    }
                }
            }
        }
        set_chunk_rows(0);
    }
}

#[test]
fn experts_ffn_packed_refuses_bad_shapes() {
    let mut rng = Rng(5);
    let (d, ff) = (64, 32);
    let a = Expert::new(&mut rng, d, ff);
    let b = Expert::new(&mut rng, 2 * d, ff);
    let copy = |e: &Expert, d| e.matrices(d).each_ref().map(|m| Q40x8::repack(m).unwrap());
    let (ca, cb) = (copy(&a, d), copy(&b, 2 * d));
    fn job(c: &[Q40x8; 3]) -> PackedExpertJob<'_> {
        PackedExpertJob {
            gate: &c[0],
            up: &c[1],
            down: &c[2],
            weight: 1.0,
        }
    }
    let x = random_vec(d, &mut rng);
    let run = |jobs: &[PackedExpertJob], out: &mut [f32]| {
        experts_ffn_packed(jobs, Activation::Silu, &x, out, &mut |_, _| {})
    };
    assert!(run(&[job(&ca)], &mut vec![0.0; d]).is_ok());
    // An expert of another hidden size, an output of the wrong length.
    assert!(matches!(
        run(&[job(&ca), job(&cb)], &mut vec![0.0; d]),
        Err(KernelError::LengthMismatch { .. })
    ));
    assert!(matches!(
        run(&[job(&ca)], &mut vec![0.0; d + 1]),
        Err(KernelError::LengthMismatch { .. })
    ));
    // Up of another width than gate.
    let mixed = PackedExpertJob {
        up: &cb[1],
        ..job(&ca)
    };
    assert!(run(&[mixed], &mut vec![0.0; d]).is_err());
}

/// `experts_ffn` of `n` tokens over `mats` routed as `routed`, each job with its copies where
/// `copies` is given.
#[allow(clippy::too_many_arguments)]
fn routed_run(
    path: KernelPath,
    mats: &[[QMatrix; 3]],
    copies: Option<&[[Q40x8; 3]]>,
    routed: &[(usize, Vec<u32>, Vec<f32>)],
    x: &[f32],
    n: usize,
    precision: Precision,
    decode: bool,
) -> Run {
    let jobs: Vec<ExpertJob> = routed
        .iter()
        .map(|(e, tokens, weights)| ExpertJob {
            gate: &mats[*e][0],
            up: &mats[*e][1],
            down: &mats[*e][2],
            tokens,
            weights,
            copies: copies.map(|c| ExpertCopies {
                gate: &c[*e][0],
                up: &c[*e][1],
                down: &c[*e][2],
            }),
        })
        .collect();
    let d = mats[0][0].cols();
    let mut out = vec![0f32; n * d];
    let mut seen = Vec::new();
    experts_ffn_with(
        path,
        &jobs,
        Activation::Silu,
        x,
        n,
        &mut out,
        precision,
        decode,
        &mut ExpertsScratch::default(),
        &mut |_, g| seen.push(g.to_vec()),
    )
    .unwrap();
    (out, seen)
}

#[test]
fn copies_in_experts_ffn_give_the_originals_bits_and_are_read_where_they_apply() {
    for format in FORMATS {
        copies_read_where_they_apply(format);
    }
}

fn copies_read_where_they_apply(format: WeightFormat) {
    let mut rng = Rng(77);
    let (d, ff, n_experts) = (288, 96, 6);
    // The last expert stands for a shared one, wider, every token routed to it.
    let experts: Vec<Expert> = (0..=n_experts)
        .map(|e| {
            Expert::of(
                format,
                &mut rng,
                d,
                if e == n_experts { 2 * ff } else { ff },
            )
        })
        .collect();
    let mats: Vec<[QMatrix; 3]> = experts.iter().map(|e| e.matrices(d)).collect();
    let copies: Vec<[Q40x8; 3]> = mats
        .iter()
        .map(|m| m.each_ref().map(|m| Q40x8::repack(m).unwrap()))
        .collect();
    // Wrong copies of the right shapes: expert 0's gate copy is expert 1's.
    let wrong: Vec<[Q40x8; 3]> = mats
        .iter()
        .enumerate()
        .map(|(e, m)| {
            let gate = if e == 0 { &mats[1][0] } else { &m[0] };
            [gate, &m[1], &m[2]].map(|m| Q40x8::repack(m).unwrap())
        })
        .collect();
    // One token; groups of 1-4 tokens (the decode kernels); groups from 32 (the tiles) but for
    // the shared expert's.
    for n in [1usize, 7, 70] {
        let x = random_vec(n * d, &mut rng);
        let routed = crate::experts::routes(&mut rng, n, n_experts, 3);
        for path in available_paths() {
            for precision in [Precision::Fast, Precision::Exact] {
                for decode in [false, true] {
                    let what = format!("{format:?} {path:?} n={n} {precision:?} decode={decode}");
                    let run = |c| routed_run(path, &mats, c, &routed, &x, n, precision, decode);
                    let (want, want_g) = run(None);
                    let (got, got_g) = run(Some(&copies));
                    assert_eq!(bits(&got), bits(&want), "{what}: outputs");
                    for (a, b) in got_g.iter().zip(&want_g) {
                        assert_eq!(bits(a), bits(b), "{what}: activations");
                    }
                    // Where expert 0's products run the decode kernels (a decode step, or a
                    // group of fewer than 32 tokens) in `Fast` on the paths where the copies
                    // are exact, they read its copies (the wrong one shows); nowhere else. For
                    // one token only where the copies do not serve steps of several
                    // (`serves_steps_on`: Q4_K's and Q8_0's on x86).
                    let m = routed.iter().find(|r| r.0 == 0).map_or(0, |r| r.1.len());
                    let reads = m > 0
                        && (decode || m < 32)
                        && (m == 1 || copies[0][0].serves_steps_on(path))
                        && precision == Precision::Fast
                        && Q40x8::exact_on(path, format);
                    let (odd, _) = run(Some(&wrong));
                    assert_eq!(bits(&odd) != bits(&want), reads, "{what}: copies read");
                }
            }
        }
    }
}
