//! Trains one predictor at engine scale on synthetic data and prints the time per epoch and the report.
//!
//! `cargo run --release -p predictor --example train_cost -- [samples] [d_in] [n_out] [epochs] [batch]`
//! (defaults: 20000 576 1536 4 256). Inputs are random; neuron `j` fires iff a random plane `w_j · x > c_j`.

use std::time::Instant;

use predictor::{train, Dataset, TrainConfig, TrainProgress};

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let arg = |i: usize, d: usize| args.get(i).copied().unwrap_or(d);
    let (n, d, o, epochs, batch) = (
        arg(0, 20_000),
        arg(1, 576),
        arg(2, 1536),
        arg(3, 4),
        arg(4, 256),
    );
    let mut s = 1u64;
    let mut u = move || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    };
    // Low-rank planes (rank 32) so that a small hidden layer can represent them.
    let r = 32;
    let basis: Vec<f32> = (0..r * d).map(|_| u()).collect();
    let mix: Vec<f32> = (0..o * r).map(|_| u()).collect();
    let c: Vec<f32> = (0..o).map(|j| 0.5 + 1.5 * j as f32 / o as f32).collect();
    let t0 = Instant::now();
    let mut data = Dataset::new(d, o);
    let mut proj = vec![0f32; r];
    for _ in 0..n {
        let x: Vec<f32> = (0..d).map(|_| u() * 3.4).collect();
        for k in 0..r {
            proj[k] = basis[k * d..(k + 1) * d]
                .iter()
                .zip(&x)
                .map(|(a, b)| a * b)
                .sum::<f32>()
                / (d as f32 / 12.0).sqrt();
        }
        data.push_mask(&x, |j| {
            mix[j * r..(j + 1) * r]
                .iter()
                .zip(&proj)
                .map(|(a, b)| a * b)
                .sum::<f32>()
                / (r as f32 / 12.0).sqrt()
                > c[j]
        })
        .expect("shape");
    }
    eprintln!(
        "data: {n} × {d} → {o}, active {:.3}, built in {:.1?}",
        data.active_frac(),
        t0.elapsed()
    );
    let cfg = TrainConfig {
        epochs,
        batch,
        ..TrainConfig::default()
    };
    let t = Instant::now();
    let mut last = Instant::now();
    let (_p, report) = train(&data, &cfg, &mut |e| {
        match e {
            TrainProgress::Epoch {
                hidden,
                epoch,
                loss,
                ..
            } => {
                eprintln!(
                    "hidden {hidden} epoch {epoch}: loss {loss:.4} ({:.2?})",
                    last.elapsed()
                )
            }
            TrainProgress::Candidate { report, accepted } => {
                eprintln!("candidate {report:?} accepted {accepted}")
            }
        }
        last = Instant::now();
    })
    .expect("train");
    eprintln!("total {:.2?}: {report:?}", t.elapsed());
}
