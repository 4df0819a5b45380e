//! Where a speculative verification step of `n` tokens spends its time, part by part, against a
//! one-token step: the q/k/v, attention-output, gate/up and down products of every layer, the
//! output projection, the greedy argmax of each row, and the whole step (`Engine::verify_logits`,
//! which adds attention, norms, RoPE, the KV writes and the thread hand-offs). Every part runs on
//! the engine's pool with the model's own matrices, `n` = 1 and the batch sizes asked for
//! interleaved round by round (A B A B), so that their ratios are measured on one machine state.
//! Prints each part's median time per step and the cost of an extra token relative to the whole
//! one-token step: `(T(n) - T(1)) / ((n - 1) * step(1))`.
//!
//! `cargo run --release -p engine --example verify_parts -- [MODEL] [ROUNDS] [N,N,...]`
//! (MODEL: a path or a known name, default `qwen2.5-coder-0.5b`; threads: `THREADS`, default 2;
//! context position of the step: `POS`, default 256).

use std::time::Instant;

use engine::{Engine, EngineOptions, ModelFile, Precision};

/// A part's timing: its name and one closure per batch size.
type Part<'a> = (&'static str, Box<dyn Fn(usize) + 'a>);

fn main() -> Result<(), engine::EngineError> {
    let mut args = std::env::args().skip(1);
    let model = args.next().unwrap_or_else(|| "qwen2.5-coder-0.5b".into());
    let rounds: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(20);
    let ns: Vec<usize> = args
        .next()
        .unwrap_or_else(|| "2,3,4,8".into())
        .split(',')
        .filter_map(|s| s.parse().ok())
        .collect();
    let env = |k: &str, d: usize| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let threads = env("THREADS", 2);
    let pos = env("POS", 256);
    let path = if std::path::Path::new(&model).exists() {
        model.into()
    } else {
        let known = engine::fetch::known_model(&model).expect("a model path or a known name");
        engine::fetch::ensure_model(known, |l| eprintln!("{l}"))?
    };
    let file = ModelFile::open(path)?;
    let engine = Engine::new(
        &file,
        EngineOptions {
            threads,
            precision: Precision::Fast,
            context: 2048,
            ..Default::default()
        },
    )?;
    let m = engine.model();
    let cfg = &m.config;
    let (d, vocab) = (cfg.d_model, cfg.vocab_size);
    let l0 = &m.layers[0];
    let g0 = l0.ffn.gated().expect("a gated FFN");
    eprintln!(
        "model: d {d}, vocab {vocab}, layers {}; q {:?} k {:?} v {:?} o {:?} gate {:?} up {:?} down {:?} \
         (layer 0), output {:?}; {threads} threads, position {pos}",
        m.layers.len(),
        l0.wq.format(),
        l0.wk.format(),
        l0.wv.format(),
        l0.wo.format(),
        g0.gate.format(),
        g0.up.format(),
        g0.down.format(),
        m.output.format()
    );
    let nmax = ns.iter().copied().max().unwrap_or(1).max(1);
    let x: Vec<f32> = (0..nmax * 4 * cfg.d_ff.max(d))
        .map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * 0.5)
        .collect();
    // Scratch outputs, big enough for any part at `nmax` tokens.
    let out = std::cell::RefCell::new(vec![0f32; nmax * vocab.max(4 * cfg.d_ff)]);
    // The whole step after `pos` positions of a prompt, cut back after each step.
    let mut cache = engine.new_cache();
    let prompt: Vec<u32> = (0..pos as u32).map(|i| 100 + i * 37 % 5000).collect();
    engine.forward(&mut cache, &prompt, engine::Logits::None)?;
    let cache = std::cell::RefCell::new(cache);
    let mut parts: Vec<Part<'_>> = Vec::new();
    parts.extend(kernel_parts(&engine, &x, &out));
    parts.push((
        "whole step",
        Box::new(|n| {
            let mut c = cache.borrow_mut();
            let toks: Vec<u32> = (0..n as u32).map(|i| 200 + i).collect();
            let l = engine.verify_logits(&mut c, &toks).expect("step");
            std::hint::black_box(&l);
            c.truncate(pos);
        }),
    ));
    report(&parts, &ns, rounds);
    Ok(())
}

/// The products of every layer, the output projection and the argmax, on `engine`'s pool with
/// `x`'s made-up activations, into `out`.
fn kernel_parts<'a>(
    engine: &'a Engine<'_>,
    x: &'a [f32],
    out: &'a std::cell::RefCell<Vec<f32>>,
) -> Vec<Part<'a>> {
    let m = engine.model();
    let cfg = &m.config;
    let (d, vocab) = (cfg.d_model, cfg.vocab_size);
    let p = Precision::Fast;
    let kernel = |r: Result<(), kernels_neon::KernelError>| r.expect("kernel");
    let mut parts: Vec<Part<'a>> = Vec::new();
    parts.push((
        "q/k/v",
        Box::new(move |n| {
            let mut o = out.borrow_mut();
            for l in &m.layers {
                let (a, rest) = o.split_at_mut(n * l.wq.rows());
                let (b, rest) = rest.split_at_mut(n * l.wk.rows());
                let c = &mut rest[..n * l.wv.rows()];
                let ws = [&l.wq, &l.wk, &l.wv];
                let xs = &x[..n * d];
                let mut ys = [a, b, c];
                engine.install(|| kernel(kernels_neon::matvec_batch_many(&ws, xs, n, &mut ys, p)));
            }
        }),
    ));
    parts.push((
        "attn out",
        Box::new(move |n| {
            let mut o = out.borrow_mut();
            for l in &m.layers {
                let y = &mut o[..n * l.wo.rows()];
                let xs = &x[..n * l.wo.cols()];
                engine.install(|| kernel(kernels_neon::matvec_batch(&l.wo, xs, n, y, p)));
            }
        }),
    ));
    parts.push((
        "gate/up",
        Box::new(move |n| {
            let mut o = out.borrow_mut();
            for l in &m.layers {
                let g = l.ffn.gated().unwrap();
                let y = &mut o[..n * g.gate.rows()];
                let xs = &x[..n * d];
                engine.install(|| {
                    kernel(kernels_neon::matvec_gated(
                        &g.gate,
                        &g.up,
                        cfg.activation,
                        xs,
                        n,
                        y,
                        p,
                    ))
                });
            }
        }),
    ));
    parts.push((
        "down",
        Box::new(move |n| {
            let mut o = out.borrow_mut();
            for l in &m.layers {
                let g = l.ffn.gated().unwrap();
                let y = &mut o[..n * g.down.rows()];
                let xs = &x[..n * g.down.cols()];
                engine.install(|| kernel(kernels_neon::matvec_batch(&g.down, xs, n, y, p)));
            }
        }),
    ));
    parts.push((
        "output",
        Box::new(move |n| {
            let mut o = out.borrow_mut();
            let y = &mut o[..n * vocab];
            let xs = &x[..n * d];
            engine.install(|| kernel(kernels_neon::matvec_batch(&m.output, xs, n, y, p)));
        }),
    ));
    parts.push((
        "argmax",
        Box::new(move |n| {
            let o = out.borrow();
            let mut s = 0usize;
            for row in o[..n * vocab].chunks(vocab) {
                s += engine::argmax(row) as usize;
            }
            std::hint::black_box(s);
        }),
    ));
    parts
}

/// Times every part at one token and at `ns` tokens, `rounds` rounds interleaved, and prints the
/// medians (the last part is the whole step).
fn report(parts: &[Part<'_>], ns: &[usize], rounds: usize) {
    let mut sizes = vec![1];
    sizes.extend(ns.iter().copied().filter(|&n| n > 1));
    // times[part][size] = one sample per round.
    let mut times = vec![vec![Vec::with_capacity(rounds); sizes.len()]; parts.len()];
    for (_, f) in parts {
        for &n in &sizes {
            f(n);
        }
    }
    for round in 0..rounds {
        for (pi, (_, f)) in parts.iter().enumerate() {
            // Alternate the order of the sizes, round by round.
            let order: Vec<usize> = if round % 2 == 0 {
                (0..sizes.len()).collect()
            } else {
                (0..sizes.len()).rev().collect()
            };
            for si in order {
                let t = Instant::now();
                f(sizes[si]);
                times[pi][si].push(t.elapsed().as_secs_f64() * 1e3);
            }
        }
    }
    let median = |v: &Vec<f64>| {
        let mut s = v.clone();
        s.sort_by(f64::total_cmp);
        s[s.len() / 2]
    };
    let med: Vec<Vec<f64>> = times
        .iter()
        .map(|per| per.iter().map(median).collect())
        .collect();
    let step1 = med[parts.len() - 1][0];
    print!("{:<11} {:>9}", "part", "n=1 ms");
    for &n in &sizes[1..] {
        print!(" {:>9} {:>7}", format!("n={n} ms"), "extra");
    }
    println!();
    for (pi, (name, _)) in parts.iter().enumerate() {
        print!("{name:<11} {:>9.3}", med[pi][0]);
        for (si, &n) in sizes.iter().enumerate().skip(1) {
            let extra = (med[pi][si] - med[pi][0]) / ((n - 1) as f64 * step1);
            print!(" {:>9.3} {:>7.3}", med[pi][si], extra);
        }
        println!();
    }
    println!(
        "(extra: the part's time per extra token over the whole one-token step's {step1:.3} ms)"
    );
}
