//! `experts_ffn` (all experts of an MoE layer in two parallel regions) against the same experts run
//! one at a time through the public kernels, as the MoE block ran them before: `matvec_gated` for
//! one token or a decode batch, else `matmul` of gate and up and `act_mul_inplace`; the down product
//! by `matvec`, `matvec_batch` or `matmul`; `axpy_f32` of each token's output in the jobs' order
//! (except that a prompt's groups of fewer than `INT_TILE_MIN_TOKENS` tokens in `Fast` take the
//! decode kernels, 16-bit activations, rather than `matmul`'s f32 tile, where `matmul` takes no
//! 16-bit tile). Bit for bit, on every path, in every precision, for token groups of every
//! kernel's size.

use crate::common::{halves_tile, random_matrix, random_vec, short_i16_tile, Rng};
use kernels_neon::*;

struct Expert {
    gate: Vec<u8>,
    up: Vec<u8>,
    down: Vec<u8>,
}

/// `jobs` run one at a time, as the MoE block did before `experts_ffn`.
#[allow(clippy::too_many_arguments)]
fn one_at_a_time(
    path: KernelPath,
    jobs: &[ExpertJob<'_>],
    act: Activation,
    x: &[f32],
    n: usize,
    precision: Precision,
    decode: bool,
) -> (Vec<f32>, Vec<Vec<f32>>) {
    let d = jobs[0].gate.cols();
    let mut out = vec![0f32; n * d];
    let mut gated = Vec::new();
    for job in jobs {
        let (m, ff) = (job.tokens.len(), job.gate.rows());
        let xs: Vec<f32> = job
            .tokens
            .iter()
            .flat_map(|&t| x[t as usize * d..(t as usize + 1) * d].to_vec())
            .collect();
        // A prompt's groups of fewer than `INT_TILE_MIN_TOKENS` tokens in `Fast` take the decode
        // kernels (16-bit activations) rather than `matmul`'s f32 tile, but where `matmul` takes
        // an integer tile (aarch64 with dotprod, from `short_prompt_tokens`: the 16-bit one, or
        // for Q4_0/Q4_1 the 8-bit one with a scale per 16).
        let format = job.gate.format();
        let decode = decode
            || (precision == Precision::Fast
                && m < INT_TILE_MIN_TOKENS
                && !short_i16_tile(path, format, m)
                && !halves_tile(path, format, precision, m));
        let mut g = vec![0f32; m * ff];
        if decode || m == 1 {
            matvec_gated_with(path, job.gate, job.up, act, &xs, m, &mut g, precision).unwrap();
        } else {
            let mut u = vec![0f32; m * ff];
            matmul_with(path, job.gate, &xs, m, &mut g, precision).unwrap();
            matmul_with(path, job.up, &xs, m, &mut u, precision).unwrap();
            act_mul_inplace(act, &mut g, &u);
        }
        let mut ys = vec![0f32; m * d];
        match (m, decode) {
            (1, _) => matvec_with(path, job.down, &g, &mut ys, precision).unwrap(),
            (_, true) => matvec_batch_with(path, job.down, &g, m, &mut ys, precision).unwrap(),
            (_, false) => matmul_with(path, job.down, &g, m, &mut ys, precision).unwrap(),
        }
        for (i, (&t, &w)) in job.tokens.iter().zip(job.weights).enumerate() {
            let t = t as usize;
            axpy_f32(w, &ys[i * d..(i + 1) * d], &mut out[t * d..(t + 1) * d]);
        }
        gated.push(g);
    }
    (out, gated)
}

/// Each of `n` tokens routed to `k` of `experts` experts (random weights), grouped by expert in
/// the experts' order, tokens ascending; then one job of every token (a shared expert).
pub(crate) fn routes(
    rng: &mut Rng,
    n: usize,
    experts: usize,
    k: usize,
) -> Vec<(usize, Vec<u32>, Vec<f32>)> {
    let mut groups: Vec<(Vec<u32>, Vec<f32>)> = vec![(Vec::new(), Vec::new()); experts];
    for t in 0..n {
        let mut picked = Vec::new();
        while picked.len() < k {
            let e = (rng.next_u64() % experts as u64) as usize;
            if !picked.contains(&e) {
                picked.push(e);
            }
        }
        picked.sort_unstable();
        for e in picked {
            groups[e].0.push(t as u32);
            groups[e].1.push(rng.f().abs() + 0.01);
        }
    }
    let mut jobs: Vec<(usize, Vec<u32>, Vec<f32>)> = groups
        .into_iter()
        .enumerate()
        .filter(|(_, g)| !g.0.is_empty())
        .map(|(e, (t, w))| (e, t, w))
        .collect();
    jobs.push((
        experts,
        (0..n as u32).collect(),
        (0..n).map(|_| rng.f()).collect(),
    ));
    jobs
}

#[test]
fn experts_ffn_equals_one_expert_at_a_time() {
    let formats = [
        WeightFormat::Q4_0,
        WeightFormat::Q8_0,
        WeightFormat::Q4_K,
        WeightFormat::F16,
    ];
    let precisions = [
        Precision::Exact,
        Precision::Fast,
        Precision::Int8,
        Precision::Ggml,
    ];
    let (d, n_experts) = (256, 6);
    let mut rng = Rng(48);
    for path in available_paths() {
        for format in formats {
            // K-quant rows are multiples of 256 wide (the down rows are `ff` wide).
            let ff = if format == WeightFormat::Q4_K {
                256
            } else {
                160
            };
            // The last expert stands for a shared one, wider.
            let experts: Vec<Expert> = (0..=n_experts)
                .map(|e| {
                    let ff = if e == n_experts { 2 * ff } else { ff };
                    Expert {
                        gate: random_matrix(format, ff, d, &mut rng),
                        up: random_matrix(format, ff, d, &mut rng),
                        down: random_matrix(format, d, ff, &mut rng),
                    }
                })
                .collect();
            let mats: Vec<[QMatrix; 3]> = experts
                .iter()
                .enumerate()
                .map(|(e, ex)| {
                    let ff = if e == n_experts { 2 * ff } else { ff };
                    [
                        QMatrix::new(format, ff, d, &ex.gate).unwrap(),
                        QMatrix::new(format, ff, d, &ex.up).unwrap(),
                        QMatrix::new(format, d, ff, &ex.down).unwrap(),
                    ]
                })
                .collect();
            // One token; a few (groups of 1-3); enough for the integer tiles in some groups.
            for n in [1, 5, 70] {
                let x = random_vec(n * d, &mut rng);
                let routed = routes(&mut rng, n, n_experts, 3);
                let jobs: Vec<ExpertJob> = routed
                    .iter()
                    .map(|(e, tokens, weights)| ExpertJob {
                        gate: &mats[*e][0],
                        up: &mats[*e][1],
                        down: &mats[*e][2],
                        tokens,
                        weights,
                        copies: None,
                    })
                    .collect();
                for precision in precisions {
                    for decode in [false, true] {
                        let what =
                            format!("{path:?} {format:?} {precision:?} n={n} decode={decode}");
                        let (want, want_g) =
                            one_at_a_time(path, &jobs, Activation::Silu, &x, n, precision, decode);
                        let mut got = vec![0f32; n * d];
                        let mut seen = Vec::new();
                        experts_ffn_with(
                            path,
                            &jobs,
                            Activation::Silu,
                            &x,
                            n,
                            &mut got,
                            precision,
                            decode,
                            &mut ExpertsScratch::default(),
                            &mut |j, g| seen.push((j, g.to_vec())),
                        )
                        .unwrap();
                        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                        assert_eq!(bits(&got), bits(&want), "{what}: outputs");
                        let seen_g: Vec<Vec<f32>> = seen.into_iter().map(|(_, g)| g).collect();
                        assert_eq!(seen_g.len(), want_g.len(), "{what}");
                        for (a, b) in seen_g.iter().zip(&want_g) {
                            assert_eq!(bits(a), bits(b), "{what}: activations");
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn experts_ffn_refuses_bad_jobs() {
    let mut rng = Rng(7);
    let (d, ff) = (64, 32);
    let g = random_matrix(WeightFormat::Q8_0, ff, d, &mut rng);
    let dn = random_matrix(WeightFormat::Q8_0, d, ff, &mut rng);
    let gate = QMatrix::new(WeightFormat::Q8_0, ff, d, &g).unwrap();
    let down = QMatrix::new(WeightFormat::Q8_0, d, ff, &dn).unwrap();
    let x = random_vec(2 * d, &mut rng);
    let run = |tokens: &[u32], weights: &[f32]| {
        let job = ExpertJob {
            gate: &gate,
            up: &gate,
            down: &down,
            tokens,
            weights,
            copies: None,
        };
        let mut out = vec![0f32; 2 * d];
        experts_ffn(
            &[job],
            Activation::Silu,
            &x,
            2,
            &mut out,
            Precision::Fast,
            false,
            &mut ExpertsScratch::default(),
            &mut |_, _| {},
        )
    };
    assert!(run(&[0, 1], &[0.5, 0.5]).is_ok());
    assert!(matches!(
        run(&[0, 2], &[0.5, 0.5]),
        Err(KernelError::RowOutOfRange { row: 2, .. })
    ));
    assert!(matches!(
        run(&[0, 1], &[0.5]),
        Err(KernelError::LengthMismatch { .. })
    ));
}
