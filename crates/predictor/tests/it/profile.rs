//! Profile file format, accumulator and statistics.

use crate::common;

use std::path::PathBuf;

use atomic_out::testing::{child_writes, run_in_child};
use common::{corruptions, seal, tmp};

use predictor::{
    calibrate_threshold, ActivationKind, LayerProfile, PredictorError, Profile, ProfileAccumulator,
};
use proptest::prelude::*;

fn sample_profile() -> Profile {
    let layer = |n: u32, k: f32| LayerProfile {
        n_neurons: n,
        threshold: 0.01 * k,
        freq: (0..4)
            .map(|b| {
                (0..n)
                    .map(|j| ((j as f32 + b as f32) * 0.1 * k).fract())
                    .collect()
            })
            .collect(),
        mean_abs: (0..n).map(|j| j as f32 * k).collect(),
        max_abs: (0..n).map(|j| j as f32 * 2.0 * k).collect(),
        coact_gate_up: (0..n).map(|j| 1.0 / (1.0 + j as f32)).collect(),
        coact_gate_down: (0..n).map(|j| 0.5 / (1.0 + j as f32)).collect(),
    };
    Profile {
        model: "SmolLM2-135M-Instruct.Q8_0.gguf".into(),
        model_fingerprint: 0xdead_beef_1234_5678,
        corpus: "wikitext-2/valid.txt".into(),
        tokens: 123_456,
        activation: ActivationKind::Silu,
        score: predictor::ScoreKind::OutputNorm,
        batch_sizes: vec![1, 2, 4, 8],
        layers: vec![layer(7, 1.0), layer(13, 0.3), layer(0, 2.0)],
    }
}

#[test]
fn round_trip() {
    let p = sample_profile();
    let path = tmp("round_trip.prof");
    p.save(&path).unwrap();
    assert_eq!(Profile::load(&path).unwrap(), p);
    // No temporary file is left behind (neither today's name nor the old `<path>.tmp-<pid>`).
    assert_eq!(
        atomic_out::temporaries(&path).unwrap(),
        Vec::<PathBuf>::new()
    );
    let leftovers: Vec<_> = std::fs::read_dir(path.parent().unwrap())
        .unwrap()
        .flatten()
        .filter(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.starts_with("round_trip.prof.tmp") || n.starts_with(".round_trip.prof.")
        })
        .collect();
    assert!(leftovers.is_empty());
}

/// A write that fails half-way (the disk fills: EFBIG past a file-size limit, in a child process)
/// leaves the file already at the destination byte-identical and no temporary behind; so does a write
/// refused before it starts.
#[test]
fn failed_save_leaves_the_old_file_intact() {
    let mut big = sample_profile();
    big.layers = vec![big.layers[0].clone(); 1];
    big.layers[0] = LayerProfile {
        n_neurons: 4096,
        threshold: 0.5,
        freq: vec![vec![0.25; 4096]; 4],
        mean_abs: vec![1.0; 4096],
        max_abs: vec![2.0; 4096],
        coact_gate_up: vec![0.5; 4096],
        coact_gate_down: vec![0.5; 4096],
    };
    child_writes(|p| big.save(p).map_err(|e| e.to_string()));

    let path = tmp("failed_save.prof");
    let old = sample_profile();
    old.save(&path).unwrap();
    let before = std::fs::read(&path).unwrap();
    let limit = before.len() as u64 + 1000;
    let r = run_in_child(
        "profile::failed_save_leaves_the_old_file_intact",
        &path,
        limit,
    );
    if let Some(r) = r {
        let e = r.expect_err("a profile larger than the file-size limit cannot be written");
        assert!(e.contains("failed_save.prof"), "{e}");
    }
    // Refused before writing: inconsistent vectors.
    big.layers[0].mean_abs.pop();
    assert!(big.save(&path).is_err());

    assert_eq!(std::fs::read(&path).unwrap(), before);
    assert_eq!(Profile::load(&path).unwrap(), old);
    assert_eq!(
        atomic_out::temporaries(&path).unwrap(),
        Vec::<PathBuf>::new()
    );
}

#[test]
fn save_rejects_inconsistent_profile() {
    let mut p = sample_profile();
    p.layers[1].mean_abs.pop();
    assert!(matches!(
        p.save(tmp("bad.prof")),
        Err(PredictorError::Input(_))
    ));
}

fn expect_err_naming_path(path: &std::path::Path, needle: &str) {
    let e = Profile::load(path).expect_err("corrupt file must not load");
    let msg = e.to_string();
    assert!(
        msg.contains(&path.display().to_string()),
        "error does not name the file: {msg}"
    );
    assert!(
        msg.contains(needle),
        "error `{msg}` does not say `{needle}`"
    );
}

#[test]
fn corruption_is_rejected_with_the_path() {
    let path = tmp("corrupt.prof");
    sample_profile().save(&path).unwrap();
    let good = std::fs::read(&path).unwrap();

    let mut b = good.clone();
    b[40] ^= 0x10;
    std::fs::write(&path, &b).unwrap();
    expect_err_naming_path(&path, "checksum");

    std::fs::write(&path, &good[..good.len() - 5]).unwrap();
    expect_err_naming_path(&path, "truncated");

    std::fs::write(&path, &good[..10]).unwrap();
    expect_err_naming_path(&path, "truncated");

    let mut b = good.clone();
    b[0] = b'X';
    std::fs::write(&path, &b).unwrap();
    expect_err_naming_path(&path, "not a profile file");

    let mut b = good.clone();
    b[8] = 2;
    std::fs::write(&path, &b).unwrap();
    expect_err_naming_path(&path, "version 2");

    let mut b = good.clone();
    b.push(0);
    std::fs::write(&path, &b).unwrap();
    expect_err_naming_path(&path, "trailing");

    std::fs::remove_file(&path).unwrap();
    expect_err_naming_path(&path, "reading");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test]
    fn any_flipped_byte_or_truncation_is_an_error(pos in 0usize..10_000, bit in 0u8..8, cut in 0usize..10_000) {
        let path = tmp(&format!("prop-{pos}-{bit}-{cut}.prof"));
        sample_profile().save(&path).unwrap();
        let good = std::fs::read(&path).unwrap();
        for bad in corruptions(&good, pos, bit, cut) {
            std::fs::write(&path, &bad).unwrap();
            prop_assert!(Profile::load(&path).is_err());
        }
        std::fs::remove_file(&path).unwrap();
    }
}

/// Payload bytes that pass the container checks but lie about lengths must be errors, not panics or huge
/// allocations.
#[test]
fn lying_lengths_with_valid_checksum_are_errors() {
    let path = tmp("lying.prof");
    let p = Profile {
        layers: vec![],
        ..sample_profile()
    };
    p.save(&path).unwrap();
    let good = std::fs::read(&path).unwrap();
    let payload = &good[24..good.len() - 8];
    for (off, val) in [
        (0usize, u32::MAX),
        (payload.len() - 4, 1000),
        (payload.len() - 4, u32::MAX),
    ] {
        let mut pl = payload.to_vec();
        pl[off..off + 4].copy_from_slice(&val.to_le_bytes());
        let mut b = good[..24].to_vec();
        b.extend_from_slice(&pl);
        std::fs::write(&path, seal(b)).unwrap();
        expect_err_naming_path(&path, "payload ends");
    }
}

#[test]
fn accumulator_on_a_hand_made_example() {
    // 3 neurons, 8 tokens. Active (|a| > 0.5): neuron 0 at tokens 0 and 5; neuron 1 at every token;
    // neuron 2 never (|a| = 0.5 is not > 0.5).
    let n = 3;
    let mut act = Vec::new();
    let mut up = Vec::new();
    for t in 0..8 {
        act.extend_from_slice(&[if t == 0 || t == 5 { -2.0 } else { 0.1 }, 1.0, 0.5]);
        up.extend_from_slice(&[1.0, if t % 2 == 0 { 3.0 } else { 0.1 }, 4.0]);
    }
    let mut acc = ProfileAccumulator::new(n, &[1, 2, 4, 8], 0.5, 0.2, 1.5).unwrap();
    // Fed in two calls of 3 and 5 tokens: groups continue across calls.
    acc.observe(&act[..9], &up[..9], 3).unwrap();
    acc.observe(&act[9..], &up[9..], 5).unwrap();
    let l = acc.finish();
    assert_eq!(l.n_neurons, 3);
    assert_eq!(l.threshold, 0.5);
    // Batch 1: 2/8; batch 2: groups {0,1} {2,3} {4,5} {6,7} -> 2/4; batch 4: {0..3} {4..7} -> 2/2; batch 8: 1/1.
    assert_eq!(l.freq[0], vec![0.25, 1.0, 0.0]);
    assert_eq!(l.freq[1], vec![0.5, 1.0, 0.0]);
    assert_eq!(l.freq[2], vec![1.0, 1.0, 0.0]);
    assert_eq!(l.freq[3], vec![1.0, 1.0, 0.0]);
    // |a*u|: neuron 0: 2,0.1,0.1,0.1,0.1,2,0.1,0.1 -> mean 4.6/8, max 2.
    assert!((l.mean_abs[0] - 4.6 / 8.0).abs() < 1e-6);
    assert_eq!(l.max_abs[0], 2.0);
    assert_eq!(l.max_abs[2], 2.0);
    // Neuron 0: gate active twice, up (|1| > 0.2) both times, out (|2| > 1.5) both times.
    assert_eq!(l.coact_gate_up[0], 1.0);
    assert_eq!(l.coact_gate_down[0], 1.0);
    // Neuron 1: gate always active; up active at even tokens (3.0 > 0.2), out |3| > 1.5 at even tokens.
    assert_eq!(l.coact_gate_up[1], 0.5);
    assert_eq!(l.coact_gate_down[1], 0.5);
    // Neuron 2 never active: conditional probabilities are 0.
    assert_eq!(l.coact_gate_up[2], 0.0);

    assert!((l.sparsity(0).unwrap() - (1.0 - 1.25 / 3.0)).abs() < 1e-6);
    assert_eq!(l.hot_order(0).unwrap(), vec![1, 0, 2]);
    assert!(l.sparsity(9).is_none());
}

#[test]
fn incomplete_groups_are_dropped_and_end_sequence_resets() {
    let mut acc = ProfileAccumulator::new(1, &[1, 4], 0.0, 0.0, 0.0).unwrap();
    // 3 tokens active, end of sequence, 4 tokens inactive, 1 token active (incomplete group).
    acc.observe(&[1.0, 1.0, 1.0], &[1.0; 3], 3).unwrap();
    acc.end_sequence();
    acc.observe(&[0.0, 0.0, 0.0, 0.0, 1.0], &[1.0; 5], 5)
        .unwrap();
    let l = acc.finish();
    assert_eq!(l.freq[0], vec![4.0 / 8.0]);
    assert_eq!(l.freq[1], vec![0.0]); // only the all-zero group of 4 is complete
    assert_eq!(acc.tokens(), 8);
}

#[test]
fn accumulator_rejects_bad_shapes() {
    let mut acc = ProfileAccumulator::new(4, &[1], 0.0, 0.0, 0.0).unwrap();
    assert!(acc.observe(&[0.0; 8], &[0.0; 7], 2).is_err());
    assert!(acc.observe(&[0.0; 8], &[0.0; 8], 3).is_err());
    assert!(ProfileAccumulator::new(4, &[1, 0], 0.0, 0.0, 0.0).is_err());
}

#[test]
fn calibrate_threshold_on_known_data() {
    let mut v: Vec<f32> = (1..=100).rev().map(|i| i as f32).collect();
    assert_eq!(calibrate_threshold(&mut v, 0.9), 90.0);
    assert_eq!(calibrate_threshold(&mut v, 0.5), 50.0);
    assert_eq!(calibrate_threshold(&mut v, 0.905), 91.0); // ceil(90.5) = 91 samples <= t
    assert_eq!(calibrate_threshold(&mut v, 1.0), 100.0);
    let t0 = calibrate_threshold(&mut v, 0.0);
    assert!(t0 < 1.0 && t0 > 0.99);
    assert_eq!(calibrate_threshold(&mut [], 0.5), 0.0);
    // Fraction of samples <= t is at least the target, for random data.
    let mut s = 7u64;
    let mut r: Vec<f32> = (0..1000)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 40) as f32
        })
        .collect();
    let orig = r.clone();
    for target in [0.1f32, 0.37, 0.8, 0.99] {
        let t = calibrate_threshold(&mut r, target);
        let below = orig.iter().filter(|&&x| x <= t).count() as f32 / orig.len() as f32;
        assert!(
            below >= target && below < target + 0.01,
            "target {target}: {below}"
        );
    }
}

#[test]
fn share_for_mass_on_a_planted_power_law() {
    // 1000 neurons; the first 100 are active 81 times as often as the other 900:
    // mass of the hot 10% = 100*81 / (100*81 + 900) = 0.9.
    let n = 1000;
    let f: Vec<f32> = (0..n).map(|j| if j < 100 { 0.81 } else { 0.01 }).collect();
    let l = LayerProfile {
        n_neurons: n as u32,
        threshold: 0.0,
        freq: vec![f.clone(), f],
        mean_abs: vec![0.0; n],
        max_abs: vec![0.0; n],
        coact_gate_up: vec![0.0; n],
        coact_gate_down: vec![0.0; n],
    };
    assert!(
        (l.share_for_mass(0.9) - 0.1).abs() < 1e-6,
        "{}",
        l.share_for_mass(0.9)
    );
    assert!(l.share_for_mass(0.5) <= 0.1 && l.share_for_mass(0.5) > 0.05);
    assert_eq!(l.share_for_mass(1.0), 1.0);
    assert_eq!(l.overlap_top(0, 1, 0.1), Some(1.0));
    assert!(l.overlap_top(0, 5, 0.1).is_none());
}

#[test]
fn overlap_top_of_disjoint_and_shifted_sets() {
    let n = 10;
    let a: Vec<f32> = (0..n).map(|j| if j < 2 { 1.0 } else { 0.0 }).collect();
    let b: Vec<f32> = (0..n)
        .map(|j| if (1..3).contains(&j) { 1.0 } else { 0.0 })
        .collect();
    let c: Vec<f32> = (0..n).map(|j| if j >= 8 { 1.0 } else { 0.0 }).collect();
    let l = LayerProfile {
        n_neurons: n as u32,
        threshold: 0.0,
        freq: vec![a, b, c],
        mean_abs: vec![0.0; n],
        max_abs: vec![0.0; n],
        coact_gate_up: vec![0.0; n],
        coact_gate_down: vec![0.0; n],
    };
    assert_eq!(l.overlap_top(0, 1, 0.2), Some(1.0 / 3.0));
    assert_eq!(l.overlap_top(0, 2, 0.2), Some(0.0));
    // Hand-built rows of different lengths: no panic.
    let mut m = l.clone();
    m.freq[1].truncate(4);
    assert!(m.overlap_top(0, 1, 0.5).is_some() && m.overlap_top(1, 0, 0.5).is_some());
    assert_eq!(m.hot_order(1).unwrap().len(), 4);
}
