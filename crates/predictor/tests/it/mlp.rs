//! Predictor training, inference and file format.

use crate::common;

use common::{corruptions, seal, tmp};

use predictor::{train, Dataset, Predictor, PredictorSet, Scratch, TrainConfig, TrainProgress};
use proptest::prelude::*;

struct Lcg(u64);
impl Lcg {
    fn u(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 40) as f32 / (1u64 << 24) as f32
    }
    /// Roughly normal (sum of 4 uniforms, variance 1).
    fn n(&mut self) -> f32 {
        (self.u() + self.u() + self.u() + self.u() - 2.0) * 3f32.sqrt()
    }
}

/// Neuron j fires iff `w_j · x > c_j` (random planes, offsets giving 5-40% activity), with inputs whose
/// dimensions have different scales and offsets (as after RMSNorm with a learned weight).
struct Planted {
    d: usize,
    o: usize,
    w: Vec<f32>,
    c: Vec<f32>,
    scale: Vec<f32>,
    shift: Vec<f32>,
    rng: Lcg,
}

impl Planted {
    fn new(d: usize, o: usize, seed: u64) -> Self {
        let mut rng = Lcg(seed);
        let w: Vec<f32> = (0..d * o).map(|_| rng.n() / (d as f32).sqrt()).collect();
        // Offsets: standard-normal quantiles of 0.6..0.95 -> activity 5..40%.
        let c = (0..o).map(|j| 0.25 + 1.4 * (j as f32 / o as f32)).collect();
        let scale = (0..d)
            .map(|i| 0.5 + 2.0 * ((i * 7 % 11) as f32 / 11.0))
            .collect();
        let shift = (0..d).map(|i| ((i % 5) as f32 - 2.0) * 0.3).collect();
        Planted {
            d,
            o,
            w,
            c,
            scale,
            shift,
            rng,
        }
    }

    fn sample(&mut self) -> (Vec<f32>, Vec<bool>) {
        let z: Vec<f32> = (0..self.d).map(|_| self.rng.n()).collect();
        let x: Vec<f32> = (0..self.d)
            .map(|i| z[i] * self.scale[i] + self.shift[i])
            .collect();
        let active = (0..self.o)
            .map(|j| {
                self.w[j * self.d..(j + 1) * self.d]
                    .iter()
                    .zip(&z)
                    .map(|(a, b)| a * b)
                    .sum::<f32>()
                    > self.c[j]
            })
            .collect();
        (x, active)
    }

    fn dataset(&mut self, n: usize) -> Dataset {
        let mut ds = Dataset::new(self.d, self.o);
        for _ in 0..n {
            let (x, a) = self.sample();
            ds.push_mask(&x, |j| a[j]).unwrap();
        }
        ds
    }
}

fn small_cfg() -> TrainConfig {
    TrainConfig {
        hidden_sizes: vec![32, 64],
        epochs: 12,
        batch: 64,
        lr: 0.003,
        ..TrainConfig::default()
    }
}

#[test]
fn planted_pattern_is_learned() {
    let mut p = Planted::new(64, 96, 1);
    let data = p.dataset(4000);
    let mut epochs = 0;
    let mut candidates = 0;
    let (pred, report) = train(&data, &small_cfg(), &mut |e| match e {
        TrainProgress::Epoch { loss, .. } => {
            assert!(loss.is_finite());
            epochs += 1
        }
        TrainProgress::Candidate { .. } => candidates += 1,
    })
    .unwrap();
    assert!(epochs >= 12 && candidates >= 1);
    assert!(report.recall >= 0.95, "{report:?}");
    assert_eq!(report.bytes, pred.bytes());
    assert_eq!(report.hidden, pred.hidden());

    // Fresh samples: recall close to the target, precision far above chance (= true fraction).
    let (mut tp, mut pos, mut predicted, mut total) = (0usize, 0usize, 0usize, 0usize);
    let mut out = Vec::new();
    for _ in 0..1000 {
        let (x, a) = p.sample();
        pred.predict(&x, &mut out).unwrap();
        pos += a.iter().filter(|&&v| v).count();
        predicted += out.len();
        tp += out.iter().filter(|&&j| a[j as usize]).count();
        total += a.len();
    }
    let recall = tp as f32 / pos as f32;
    let precision = tp as f32 / predicted as f32;
    let true_frac = pos as f32 / total as f32;
    eprintln!("{report:?}; fresh: recall {recall}, precision {precision}, true frac {true_frac}");
    assert!(recall >= 0.93, "fresh recall {recall}");
    assert!(
        precision >= 0.6 && precision >= 2.5 * true_frac,
        "fresh precision {precision} (chance {true_frac})"
    );
}

#[test]
fn training_is_deterministic_given_the_seed() {
    let data = Planted::new(40, 70, 2).dataset(600);
    let cfg = TrainConfig {
        hidden_sizes: vec![32],
        epochs: 3,
        batch: 50,
        ..TrainConfig::default()
    };
    let (a, ra) = train(&data, &cfg, &mut |_| {}).unwrap();
    let (b, rb) = train(&data, &cfg, &mut |_| {}).unwrap();
    assert_eq!(ra, rb);
    let (pa, pb) = (tmp("det-a.pred"), tmp("det-b.pred"));
    PredictorSet {
        model_fingerprint: 1,
        layers: vec![a.clone()],
    }
    .save(&pa)
    .unwrap();
    PredictorSet {
        model_fingerprint: 1,
        layers: vec![b],
    }
    .save(&pb)
    .unwrap();
    assert_eq!(std::fs::read(&pa).unwrap(), std::fs::read(&pb).unwrap());
    // Independent of the number of threads.
    for threads in [1, 3] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        let (c, rc) = pool.install(|| train(&data, &cfg, &mut |_| {})).unwrap();
        assert_eq!((&c, rc), (&a, ra), "{threads} threads");
    }
    // A different seed gives different weights (so the comparison above can fail).
    let (c, _) = train(&data, &TrainConfig { seed: 9, ..cfg }, &mut |_| {}).unwrap();
    assert_ne!(a, c);
}

#[test]
fn max_bytes_limits_growth_and_acceptance_stops_early() {
    let data = Planted::new(32, 64, 3).dataset(500);
    let mut hidden = Vec::new();
    let cfg = TrainConfig {
        hidden_sizes: vec![32, 64, 128],
        epochs: 1,
        batch: 64,
        max_bytes: 1,
        ..TrainConfig::default()
    };
    let (p, _) = train(&data, &cfg, &mut |e| {
        if let TrainProgress::Candidate { report, .. } = e {
            hidden.push(report.hidden)
        }
    })
    .unwrap();
    assert_eq!(hidden, vec![32]); // the smallest is always trained; nothing larger fits in 1 byte
    assert_eq!(p.hidden(), 32);
    // Hidden sizes are rounded up to multiples of 32.
    let cfg = TrainConfig {
        hidden_sizes: vec![20],
        epochs: 1,
        ..cfg
    };
    assert_eq!(train(&data, &cfg, &mut |_| {}).unwrap().0.hidden(), 32);
}

#[test]
fn train_rejects_bad_input() {
    assert!(train(&Dataset::new(8, 8), &TrainConfig::default(), &mut |_| {}).is_err());
    let mut d = Dataset::new(8, 8);
    d.push(&[0.0; 8], &[1, 2]).unwrap();
    let cfg = TrainConfig {
        target_recall: 0.0,
        ..TrainConfig::default()
    };
    assert!(train(&d, &cfg, &mut |_| {}).is_err());
    assert!(d.push(&[0.0; 7], &[1]).is_err());
    assert!(d.push(&[0.0; 8], &[8]).is_err());
    assert!(d.push_mask(&[0.0; 9], |_| true).is_err());
    assert_eq!(d.len(), 1);
}

#[test]
fn dataset_labels_and_split() {
    let mut d = Dataset::with_capacity(2, 130, 50);
    for i in 0..50u32 {
        d.push(&[i as f32, 0.0], &[i, 129, 64]).unwrap();
    }
    assert_eq!(d.len(), 50);
    assert!(d.is_active(3, 3) && d.is_active(3, 129) && d.is_active(3, 64) && !d.is_active(3, 4));
    assert!(!d.is_active(3, 500) && !d.is_active(99, 3) && !d.is_active(usize::MAX, 3));
    assert!(d.input(50).is_none() && d.input(usize::MAX).is_none());
    let (tr, ho) = d.split(0.2, 5);
    assert_eq!((tr.len(), ho.len()), (40, 10));
    // Every sample keeps its labels: sample with input i has neuron i active.
    for part in [&tr, &ho] {
        for k in 0..part.len() {
            let i = part.input(k).unwrap()[0] as usize;
            assert!(part.is_active(k, i) && part.is_active(k, 129));
        }
    }
    let mut seen: Vec<usize> = (0..tr.len())
        .map(|k| tr.input(k).unwrap()[0] as usize)
        .collect();
    seen.extend((0..ho.len()).map(|k| ho.input(k).unwrap()[0] as usize));
    seen.sort();
    assert_eq!(seen, (0..50).collect::<Vec<_>>());
    assert_eq!(d.split(0.2, 5), (tr, ho));
}

/// A predictor built from known f32 weights (odd sizes, so both paddings are exercised).
fn known_predictor(seed: u64) -> (Predictor, Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>) {
    let (d, h, o) = (45, 20, 37);
    let mut r = Lcg(seed);
    let w1: Vec<f32> = (0..h * d).map(|_| r.n() * 0.2).collect();
    let b1: Vec<f32> = (0..h).map(|_| r.n() * 0.1).collect();
    let w2: Vec<f32> = (0..o * h).map(|_| r.n() * 0.3).collect();
    let b2: Vec<f32> = (0..o).map(|_| r.n() * 0.1).collect();
    let p = Predictor::from_f32(d, h, o, &w1, &b1, &w2, &b2, 0.1).unwrap();
    (p, w1, b1, w2, b2)
}

#[test]
fn scores_match_the_f32_mlp_and_predict_matches_scores() {
    let (p, w1, b1, w2, b2) = known_predictor(4);
    assert_eq!((p.d_in(), p.hidden(), p.n_out()), (45, 32, 37));
    // Q8_0: 32 hidden rows × 2 blocks + 37 rows × 1 block, 34 bytes each, plus biases.
    assert_eq!(p.bytes(), (32 * 2 + 37) * 34 + 4 * (32 + 37));
    let mut r = Lcg(5);
    let mut s = vec![0f32; 37];
    let mut scratch = Scratch::new();
    let mut out = Vec::new();
    let mut out2 = Vec::new();
    let mut any = 0;
    for _ in 0..50 {
        let x: Vec<f32> = (0..45).map(|_| r.n()).collect();
        let h: Vec<f32> = (0..20)
            .map(|k| {
                (w1[k * 45..(k + 1) * 45]
                    .iter()
                    .zip(&x)
                    .map(|(a, b)| a * b)
                    .sum::<f32>()
                    + b1[k])
                    .max(0.0)
            })
            .collect();
        p.scores(&x, &mut s).unwrap();
        for j in 0..37 {
            let z = w2[j * 20..(j + 1) * 20]
                .iter()
                .zip(&h)
                .map(|(a, b)| a * b)
                .sum::<f32>()
                + b2[j];
            assert!(
                (z - s[j]).abs() < 0.05 * (1.0 + z.abs()),
                "neuron {j}: f32 {z}, quantized {}",
                s[j]
            );
        }
        p.predict(&x, &mut out).unwrap();
        p.predict_with(&x, &mut scratch, &mut out2).unwrap();
        let want: Vec<u32> = (0..37).filter(|&j| s[j as usize] > p.threshold()).collect();
        assert_eq!(out, want);
        assert_eq!(out2, want);
        any += out.len();
    }
    assert!(any > 0 && any < 50 * 37);
    assert!(p.predict(&[0.0; 44], &mut out).is_err());
    assert!(p.scores(&[0.0; 45], &mut [0.0; 36]).is_err());
}

#[test]
fn predictor_set_round_trip() {
    let set = PredictorSet {
        model_fingerprint: 42,
        layers: vec![known_predictor(1).0, known_predictor(2).0],
    };
    let path = tmp("rt.pred");
    set.save(&path).unwrap();
    assert_eq!(PredictorSet::load(&path).unwrap(), set);
    let empty = PredictorSet {
        model_fingerprint: 0,
        layers: vec![],
    };
    empty.save(&path).unwrap();
    assert_eq!(PredictorSet::load(&path).unwrap(), empty);
}

#[test]
fn predictor_set_corruption_names_the_path() {
    let set = PredictorSet {
        model_fingerprint: 42,
        layers: vec![known_predictor(1).0],
    };
    let path = tmp("corrupt.pred");
    set.save(&path).unwrap();
    let good = std::fs::read(&path).unwrap();
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (
            {
                let mut b = good.clone();
                b[100] ^= 4;
                b
            },
            "checksum",
        ),
        (good[..good.len() - 1].to_vec(), "truncated"),
        (
            {
                let mut b = good.clone();
                b[1] = b'Q';
                b
            },
            "not a predictor file",
        ),
        (
            {
                let mut b = good.clone();
                b[8] = 7;
                b
            },
            "version 7",
        ),
    ];
    for (bytes, needle) in cases {
        std::fs::write(&path, &bytes).unwrap();
        let msg = PredictorSet::load(&path).unwrap_err().to_string();
        assert!(
            msg.contains(&path.display().to_string()) && msg.contains(needle),
            "{msg} / {needle}"
        );
    }
    // A profile is not a predictor set.
    assert!(PredictorSet::load(tmp("nonexistent.pred"))
        .unwrap_err()
        .to_string()
        .contains("nonexistent.pred"));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test]
    fn predictor_set_any_corruption_is_an_error(pos in 0usize..100_000, bit in 0u8..8, cut in 0usize..100_000) {
        let set = PredictorSet { model_fingerprint: 7, layers: vec![known_predictor(3).0] };
        let path = tmp(&format!("prop-{pos}-{bit}-{cut}.pred"));
        set.save(&path).unwrap();
        let good = std::fs::read(&path).unwrap();
        for bad in corruptions(&good, pos, bit, cut) {
            std::fs::write(&path, &bad).unwrap();
            prop_assert!(PredictorSet::load(&path).is_err());
        }
        std::fs::remove_file(&path).unwrap();
    }
}

#[test]
fn constant_and_outlier_dimensions_do_not_break_training() {
    // Dimension 0 is nearly constant, dimension 1 is huge noise: standardization must not turn either into
    // weights that ruin the Q8_0 blocks.
    let mut p = Planted::new(64, 64, 11);
    let mut r = Lcg(12);
    let warp = |x: &mut Vec<f32>, r: &mut Lcg| {
        x[0] = 5.0 + 1e-5 * r.n();
        x[1] = 1000.0 * r.n();
    };
    let mut data = Dataset::new(64, 64);
    for _ in 0..3000 {
        let (mut x, a) = p.sample();
        warp(&mut x, &mut r);
        data.push_mask(&x, |j| a[j]).unwrap();
    }
    let cfg = TrainConfig {
        hidden_sizes: vec![64],
        ..small_cfg()
    };
    let (pred, _) = train(&data, &cfg, &mut |_| {}).unwrap();
    let (mut tp, mut pos, mut predicted, mut total) = (0usize, 0usize, 0usize, 0usize);
    let mut out = Vec::new();
    for _ in 0..500 {
        let (mut x, a) = p.sample();
        warp(&mut x, &mut r);
        pred.predict(&x, &mut out).unwrap();
        pos += a.iter().filter(|&&v| v).count();
        predicted += out.len();
        tp += out.iter().filter(|&&j| a[j as usize]).count();
        total += a.len();
    }
    let (recall, precision) = (tp as f32 / pos as f32, tp as f32 / predicted as f32);
    let chance = pos as f32 / total as f32;
    assert!(
        recall >= 0.9 && precision >= 2.0 * chance,
        "recall {recall}, precision {precision}, chance {chance}"
    );
}

#[test]
fn save_into_a_missing_directory_names_the_path_and_leaves_nothing() {
    let dir = tmp("missing-dir");
    let path = dir.join("x.pred");
    let set = PredictorSet {
        model_fingerprint: 1,
        layers: vec![],
    };
    let msg = set.save(&path).unwrap_err().to_string();
    assert!(msg.contains("missing-dir"), "{msg}");
    assert!(!dir.exists());
}

/// Shapes that lie (with a valid checksum) are errors, not panics or huge allocations.
#[test]
fn predictor_set_lying_shapes_are_errors() {
    let set = PredictorSet {
        model_fingerprint: 42,
        layers: vec![known_predictor(1).0],
    };
    let path = tmp("lying.pred");
    set.save(&path).unwrap();
    let good = std::fs::read(&path).unwrap();
    // Payload: u64 fingerprint, u32 layers, then d_in, hidden, n_out (u32 each), u8 format, f32 threshold.
    let cases: [(usize, u32, &str); 7] = [
        (20, 36, "unexpected bytes"),      // one neuron fewer than stored
        (8, u32::MAX, "payload ends"),     // layer count
        (12, 0, "bad shape"),              // d_in = 0
        (16, 33, "bad shape"),             // hidden not a multiple of 32
        (16, 0xFFFF_FFE0, "payload ends"), // huge hidden
        (20, u32::MAX, "payload ends"),    // huge n_out
        (20, 38, "payload ends"),          // one more neuron than stored
    ];
    for (off, val, needle) in cases {
        let mut b = good[..good.len() - 8].to_vec();
        b[24 + off..24 + off + 4].copy_from_slice(&val.to_le_bytes());
        std::fs::write(&path, seal(b)).unwrap();
        let msg = PredictorSet::load(&path).unwrap_err().to_string();
        assert!(
            msg.contains(&path.display().to_string()) && msg.contains(needle),
            "{off}: {msg}"
        );
    }
    let mut b = good[..good.len() - 8].to_vec();
    b[24 + 24] = 3; // weight format code
    std::fs::write(&path, seal(b)).unwrap();
    assert!(PredictorSet::load(&path)
        .unwrap_err()
        .to_string()
        .contains("weight format"));
}

#[test]
fn easy_pattern_accepts_the_smallest_candidate() {
    // Neuron j fires iff x[j] > 1: a 32-wide hidden layer represents this exactly, so the first candidate
    // meets the acceptance rule and no larger one is trained.
    let mut r = Lcg(21);
    let mut data = Dataset::new(32, 32);
    for _ in 0..3000 {
        let x: Vec<f32> = (0..32).map(|_| r.n()).collect();
        data.push_mask(&x, |j| x[j] > 1.0).unwrap();
    }
    let mut events = Vec::new();
    let cfg = TrainConfig {
        hidden_sizes: vec![32, 64, 128],
        epochs: 80,
        ..small_cfg()
    };
    let (p, report) = train(&data, &cfg, &mut |e| {
        if let TrainProgress::Candidate { report, accepted } = e {
            events.push((report.hidden, accepted))
        }
    })
    .unwrap();
    assert_eq!(events, vec![(32, true)], "{report:?}");
    assert_eq!(p.hidden(), 32);
    let limit = (1.25 * report.true_frac).max(report.true_frac + 0.05);
    assert!(
        report.predicted_frac <= limit && report.recall >= 0.95,
        "{report:?}"
    );
}
