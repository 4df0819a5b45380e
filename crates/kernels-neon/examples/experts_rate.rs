//! Where an OLMoE-shaped decode step's time goes, kernel by kernel: `experts_ffn` of one token
//! over 8 of 64 experts (d 2048, expert width 1024, Q4_0: OLMoE-1B-7B's layer), the same 24
//! products as one `matvec` call each (the fork and join per product `experts_ffn` saves), one
//! large `matvec` of as many bytes (the rate the products would have with no per-expert cost),
//! the output projection's shape (50304 x 2048) and an attention projection (2048 x 2048); and a
//! prompt's layer (`experts_ffn` of `PROMPT` tokens, default 64, routed top-8 at random; for Q4_0
//! also over the experts' `Q40x8` copies). Rates in
//! GB/s of weight bytes; best of `REPS` (default 20) after a warm-up, on a pool of `THREADS`
//! (default 2), on the active path (`SPARROW_KERNELS` to force one). The 64 experts (226 MB)
//! exceed the last-level cache, and each call picks 8 at random, as decode does.
//!
//! `cargo run --profile ci -p kernels-neon --example experts_rate [-- q4_0|q8_0|q4_k ...]`

use kernels_neon::*;
use std::time::Instant;

#[allow(dead_code)]
#[path = "../benches/common/mod.rs"]
mod common;

const D: usize = 2048;
const FF: usize = 1024;
const EXPERTS: usize = 64;
const TOP: usize = 8;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A random matrix whose f16 block scales (Q4_0/Q8_0) are set to 0.01: random bytes would give
/// NaNs and infinities.
fn matrix(format: WeightFormat, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let mut m = common::random_matrix(format, rows, cols, seed);
    let bb = match format {
        WeightFormat::Q4_0 => 18,
        WeightFormat::Q8_0 => 34,
        _ => return m,
    };
    for b in m.chunks_exact_mut(bb) {
        b[..2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
    }
    m
}

struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
    /// `TOP` distinct experts.
    fn pick(&mut self) -> Vec<usize> {
        let mut e = Vec::new();
        while e.len() < TOP {
            let k = self.below(EXPERTS);
            if !e.contains(&k) {
                e.push(k);
            }
        }
        e
    }
}

/// Best seconds per call of `f` over `reps` timed calls after two warm-ups.
fn best(pool: &rayon::ThreadPool, reps: usize, mut f: impl FnMut() + Send) -> f64 {
    let mut best = f64::MAX;
    for i in 0..reps + 2 {
        let t = Instant::now();
        pool.install(&mut f);
        if i >= 2 {
            best = best.min(t.elapsed().as_secs_f64());
        }
    }
    best
}

fn main() {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(env("THREADS", 2))
        .build()
        .unwrap();
    let reps = env("REPS", 20);
    let prompt = env("PROMPT", 64);
    let format = match std::env::args().nth(1).as_deref().unwrap_or("q4_0") {
        "q8_0" => WeightFormat::Q8_0,
        "q4_k" => WeightFormat::Q4_K,
        _ => WeightFormat::Q4_0,
    };
    let bytes = |r: usize, c: usize| format.row_bytes(c).unwrap() * r;
    let data: Vec<[Vec<u8>; 3]> = (0..EXPERTS as u64)
        .map(|e| {
            [
                matrix(format, FF, D, 3 * e),
                matrix(format, FF, D, 3 * e + 1),
                matrix(format, D, FF, 3 * e + 2),
            ]
        })
        .collect();
    let ms: Vec<[QMatrix; 3]> = data
        .iter()
        .map(|[g, u, d]| {
            [
                QMatrix::new(format, FF, D, g).unwrap(),
                QMatrix::new(format, FF, D, u).unwrap(),
                QMatrix::new(format, D, FF, d).unwrap(),
            ]
        })
        .collect();
    let expert_bytes = 2 * bytes(FF, D) + bytes(D, FF);
    let x: Vec<f32> = (0..D * prompt.max(1))
        .map(|i| ((i * 31) % 61) as f32 / 61.0 - 0.5)
        .collect();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    println!(
        "path {} format {format:?} threads {} reps {reps}",
        active_path().name(),
        pool.current_num_threads()
    );

    // `experts_ffn` of one token.
    let mut out = vec![0f32; D];
    let mut scratch = ExpertsScratch::default();
    let (tok, wt) = ([0u32], [0.125f32]);
    let s = best(&pool, reps, || {
        let pick = rng.pick();
        let jobs: Vec<ExpertJob> = pick
            .iter()
            .map(|&e| ExpertJob {
                gate: &ms[e][0],
                up: &ms[e][1],
                down: &ms[e][2],
                tokens: &tok,
                weights: &wt,
                copies: None,
            })
            .collect();
        let (a, p) = (Activation::Silu, Precision::Fast);
        experts_ffn(
            &jobs,
            a,
            &x[..D],
            1,
            &mut out,
            p,
            true,
            &mut scratch,
            &mut |_, _| {},
        )
        .unwrap();
    });
    let b = (TOP * expert_bytes) as f64;
    println!(
        "experts_ffn 1 token, {TOP} experts: {:.1} us, {:.1} GB/s",
        s * 1e6,
        b / s / 1e9
    );

    // The same products, one `matvec` each.
    let (mut g, mut u, mut y) = (vec![0f32; FF], vec![0f32; FF], vec![0f32; D]);
    let s = best(&pool, reps, || {
        for e in rng.pick() {
            matvec(&ms[e][0], &x[..D], &mut g, Precision::Fast).unwrap();
            matvec(&ms[e][1], &x[..D], &mut u, Precision::Fast).unwrap();
            silu_mul_inplace(&mut g, &u);
            matvec(&ms[e][2], &g, &mut y, Precision::Fast).unwrap();
        }
    });
    println!(
        "3 x {TOP} matvec calls: {:.1} us, {:.1} GB/s",
        s * 1e6,
        b / s / 1e9
    );

    // One large product of about the same bytes, and the dense shapes of the model.
    for (what, rows, cols) in [
        ("one matvec of 8 experts' bytes", TOP * 3 * FF, D),
        ("output projection", 50304, D),
        ("attention projection", D, D),
    ] {
        let m = matrix(format, rows, cols, 99);
        let w = QMatrix::new(format, rows, cols, &m).unwrap();
        let mut y = vec![0f32; rows];
        let inner = if m.len() < 8 << 20 { 50 } else { 1 };
        let s = best(&pool, reps, || {
            for _ in 0..inner {
                matvec(&w, &x[..cols], &mut y, Precision::Fast).unwrap();
            }
        }) / inner as f64;
        let gbs = m.len() as f64 / s / 1e9;
        println!("{what} {rows}x{cols}: {:.1} us, {gbs:.1} GB/s", s * 1e6);
    }

    // A prompt's layer: `prompt` tokens, each routed to 8 random experts.
    if prompt > 1 {
        let mut tokens: Vec<Vec<u32>> = vec![Vec::new(); EXPERTS];
        for t in 0..prompt {
            for e in rng.pick() {
                tokens[e].push(t as u32);
            }
        }
        let weights: Vec<Vec<f32>> = tokens.iter().map(|t| vec![0.125; t.len()]).collect();
        let mut out = vec![0f32; D * prompt];
        // The experts' Q40x8 copies, where the format repacks (Q4_0).
        let copies: Vec<[Q40x8; 3]> = ms
            .iter()
            .filter_map(|m| {
                let [g, u, d] = m.each_ref().map(Q40x8::repack);
                Some([g?, u?, d?])
            })
            .collect();
        let over: &[Option<&[[Q40x8; 3]]>] = match copies.len() {
            EXPERTS => &[None, Some(&copies)],
            _ => &[None],
        };
        for &c in over {
            let s = best(&pool, reps.min(5), || {
                let jobs: Vec<ExpertJob> = (0..EXPERTS)
                    .filter(|&e| !tokens[e].is_empty())
                    .map(|e| ExpertJob {
                        gate: &ms[e][0],
                        up: &ms[e][1],
                        down: &ms[e][2],
                        tokens: &tokens[e],
                        weights: &weights[e],
                        copies: c.map(|c| ExpertCopies {
                            gate: &c[e][0],
                            up: &c[e][1],
                            down: &c[e][2],
                        }),
                    })
                    .collect();
                let (a, p) = (Activation::Silu, Precision::Fast);
                experts_ffn(
                    &jobs,
                    a,
                    &x,
                    prompt,
                    &mut out,
                    p,
                    false,
                    &mut scratch,
                    &mut |_, _| {},
                )
                .unwrap();
            });
            println!(
                "experts_ffn prompt of {prompt} tokens{}: {:.0} us, {:.0} tokens/s of one layer's experts",
                if c.is_some() { " over the Q40x8 copies" } else { "" },
                s * 1e6,
                prompt as f64 / s
            );
        }
    }
}
