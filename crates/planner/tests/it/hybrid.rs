//! Hybrid decode's split: against brute force over every combination of per-layer counts, the
//! limits (a free accelerator takes every neuron, a useless one none), counts that never shrink as
//! the batch grows, and a named error for an accelerator the device profile lacks.

use crate::common;

use common::{device, model, npu, small_case, with};
use planner::{
    hybrid_layer_ns, hybrid_split, make_plan, step_neurons, AccelRate, Constraints, DeviceProfile,
    ModelSummary, Solver, HYBRID_BATCHES,
};
use proptest::prelude::*;

/// The batch-1 step's FFN time of every layer at the grid steps `js` (one per layer).
fn step_ns(d: &DeviceProfile, m: &ModelSummary, name: &str, js: &[u32]) -> u64 {
    m.layers
        .iter()
        .zip(js)
        .map(|(l, &j)| {
            let a = d.accel_rate(name, &l.format, 2).unwrap();
            hybrid_layer_ns(d, m, l, &a, 2, (0, 1), j)
        })
        .sum()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// At batch size 1 the split is the cheapest of every combination of per-layer counts, and
    /// counts never shrink as the batch grows; the predicted time is that combination's.
    #[test]
    fn the_split_is_brute_forces_best_and_grows_with_the_batch(
        (layers, neurons, grid, alpha, _) in small_case(),
        speed in 0.05f64..20.0,
        parallel in any::<bool>(),
    ) {
        let m = model(layers, neurons, grid, alpha, false);
        let d = with(device(2, 1.0), AccelRate { parallel, ..npu(4e9 * speed) });
        let h = hybrid_split(&d, &m, "qnn", 2).unwrap();
        let mut best = u64::MAX;
        let combos = (grid as usize + 1).pow(layers as u32);
        for mut k in 0..combos {
            let js: Vec<u32> = (0..layers)
                .map(|_| {
                    let j = (k % (grid as usize + 1)) as u32;
                    k /= grid as usize + 1;
                    j
                })
                .collect();
            best = best.min(step_ns(&d, &m, "qnn", &js));
        }
        prop_assert_eq!(h.ffn_ns[0], best);
        prop_assert!(h.ffn_ns[0] <= h.sparse_ns[0]);
        for (c, l) in h.counts.iter().zip(&m.layers) {
            prop_assert!(c.windows(2).all(|w| w[0] <= w[1]), "{:?}", c);
            prop_assert!(c.iter().all(|&k| k <= l.neurons));
            prop_assert!(c.iter().all(|&k| (0..=grid).any(|j| step_neurons(l.neurons, grid, j) == k)));
        }
    }
}

#[test]
fn a_free_accelerator_takes_every_neuron_and_a_useless_one_none() {
    let m = model(2, 48, 4, 0.8, false);
    let free = with(
        device(2, 1.0),
        AccelRate {
            call_ns: 0.0,
            ..npu(1e18)
        },
    );
    let h = hybrid_split(&free, &m, "qnn", 2).unwrap();
    for (c, l) in h.counts.iter().zip(&m.layers) {
        assert_eq!(c, &[l.neurons; 4], "{h:?}");
    }
    let useless = with(
        device(2, 1.0),
        AccelRate {
            call_ns: 1e9,
            ..npu(1.0)
        },
    );
    let h = hybrid_split(&useless, &m, "qnn", 2).unwrap();
    assert!(h.counts.iter().all(|c| c == &[0; 4]), "{h:?}");
    assert_eq!(h.ffn_ns, h.sparse_ns);
}

/// The CPU stand-in shares the cores: its block and the sparse rest add up, and a block there
/// costs the dense kernels' rate. With those rates at most the sparse ones per byte, neurons that
/// rarely fire stay sparse at batch size 1, and larger batches (more of them firing) take more.
#[test]
fn the_cpu_stand_in_is_costed_from_the_kernels_and_adds_to_the_sparse_work() {
    let m = model(3, 64, 8, 1.2, false);
    let d = device(2, 1.0);
    let a = d
        .accel_rate("cpu", "q4_0", 2)
        .expect("the stand-in needs no entry");
    assert!(!a.parallel);
    assert_eq!(a.bps, d.kernel_rate("q4_0", 2).0);
    let l = &m.layers[0];
    let (cpu, all) = (
        hybrid_layer_ns(&d, &m, l, &a, 2, (0, 1), 0),
        hybrid_layer_ns(&d, &m, l, &a, 2, (0, 1), m.grid),
    );
    let half = hybrid_layer_ns(&d, &m, l, &a, 2, (0, 1), m.grid / 2);
    let parallel = hybrid_layer_ns(
        &d,
        &m,
        l,
        &AccelRate {
            parallel: true,
            ..a.clone()
        },
        2,
        (0, 1),
        m.grid / 2,
    );
    assert!(parallel < half, "the stand-in adds what an NPU overlaps");
    assert!(cpu > 0 && all > 0);
    let h = hybrid_split(&d, &m, "cpu", 2).unwrap();
    let total = |k: usize| h.counts.iter().map(|c| c[k]).sum::<u32>();
    assert!(
        total(0) < m.layers.iter().map(|l| l.neurons).sum::<u32>(),
        "{h:?}"
    );
    assert!(total(3) >= total(0), "{h:?}");
}

/// Without predictors, in memory the CPU computes every neuron's gate and up rows whatever the
/// block holds (whole-matrix products): the block saves the CPU only the cold rows' down columns;
/// over a store the CPU reads only the cold neurons, so the block saves their gate and up rows too.
#[test]
fn without_predictors_in_memory_the_block_saves_the_cpu_only_down_columns() {
    let d = device(2, 1.0);
    // Free and beside the cores: a step costs exactly the CPU's part.
    let free = AccelRate {
        call_ns: 0.0,
        ..npu(1e18)
    };
    let saved = |offloaded: bool| {
        let mut m = model(1, 64, 8, 1.2, offloaded);
        m.predicted = false;
        let l = &m.layers[0];
        let at = |j| hybrid_layer_ns(&d, &m, l, &free, 2, (0, 1), j);
        at(0) - at(m.grid / 2)
    };
    let (memory, store) = (saved(false), saved(true));
    assert!(memory > 0, "the cold part's down columns shrink");
    assert!(
        memory < store,
        "in memory {memory} ns saved, over a store {store} ns"
    );
}

#[test]
fn an_accelerator_the_profile_lacks_is_a_named_error_and_plans_carry_the_split() {
    let m = model(2, 32, 4, 1.0, false);
    let err = hybrid_split(&device(2, 1.0), &m, "qnn", 2)
        .unwrap_err()
        .to_string();
    assert!(err.contains("'qnn'"), "{err}");
    let c = Constraints {
        accelerator: Some("cpu".into()),
        ..Constraints::default()
    };
    let plan = make_plan(&device(2, 1.0), &m, &c, Solver::Search).unwrap();
    let h = plan
        .hybrid
        .as_ref()
        .expect("a split for the named accelerator");
    assert_eq!(h.counts.len(), m.layers.len());
    let bare = hybrid_split(&device(2, 1.0), &m, "cpu", plan.threads).unwrap();
    assert_eq!((&h.counts, h.ffn_ns), (&bare.counts, bare.ffn_ns));
    // The step: attention as planned, the predictors, the split's FFN.
    let p = &plan.predicted[0];
    let attn = (p.attn_s * 1e9).round() as u64;
    assert!(h.decode_ns > h.ffn_ns[0] + attn / 2, "{h:?} {p:?}");
    assert!(h.tok_s().unwrap() > 0.0 && bare.tok_s().is_none());
    assert!(plan
        .describe()
        .contains("hybrid decode on the cpu accelerator"));
    assert_eq!(HYBRID_BATCHES, [1, 2, 4, 8]);
    let none = make_plan(&device(2, 1.0), &m, &Constraints::default(), Solver::Search).unwrap();
    assert!(none.hybrid.is_none());
    // An accelerator the profile has no rate for: a plan all the same, without a split.
    let qnn = Constraints {
        accelerator: Some("qnn".into()),
        ..Constraints::default()
    };
    let plan = make_plan(&device(2, 1.0), &m, &qnn, Solver::Search).unwrap();
    assert!(plan.hybrid.is_none());
    let plan = make_plan(&with(device(2, 1.0), npu(1e9)), &m, &qnn, Solver::Search).unwrap();
    assert_eq!(plan.hybrid.unwrap().accelerator, "qnn");
}

/// A measured accelerator rated in multiply-adds (`sparrow calibrate --accel`): a block of `k`
/// neurons costs `k × 3 × d_model` of them (the width from the summary's down-projection MACs),
/// whatever the file's format; without the width, planning for it is a named error.
#[test]
fn an_accelerator_rated_in_multiply_adds_costs_the_block_by_the_models_width() {
    let mut m = model(2, 40, 4, 1.0, false);
    let neurons: u32 = m.layers.iter().map(|l| l.neurons).sum();
    let macs = AccelRate {
        bps: 0.0,
        macs_per_s: 1e9,
        call_ns: 0.0,
        batch_cost: 0.5,
        ..npu(0.0)
    };
    let d = with(device(2, 1.0), macs.clone());
    let err = hybrid_split(&d, &m, "qnn", 2).unwrap_err().to_string();
    assert!(err.contains("width"), "{err}");
    m.down_macs_per_token = f64::from(neurons) * 1024.0;
    assert_eq!(m.neuron_macs(), 3072.0);
    let l = &m.layers[0];
    let all = |b: (usize, u32)| hybrid_layer_ns(&d, &m, l, &macs, 2, b, m.grid);
    // Every neuron on the accelerator, nothing left for the CPU: the block alone.
    assert_eq!(all((0, 1)), u64::from(l.neurons) * 3072);
    assert_eq!(all((1, 2)), u64::from(l.neurons) * 3072 * 3 / 2);
    let h = hybrid_split(&d, &m, "qnn", 2).unwrap();
    assert!(h.ffn_ns[0] <= h.sparse_ns[0], "{h:?}");
    // A profile with neither rate does not validate.
    let none = with(
        device(2, 1.0),
        AccelRate {
            macs_per_s: 0.0,
            ..macs
        },
    );
    assert!(none.validate().is_err());
}

/// Over a store each cold unit is its own kernel call, as in sparse decode: with every neuron cold
/// the layer costs what the sparse step's tables cost it beyond the long row lists' rates, and
/// neurons on the accelerator take their units' calls off the CPU.
#[test]
fn over_a_store_the_cold_units_cost_their_calls() {
    let m = model(1, 64, 4, 1.0, true);
    // On the CPU's cores (summed), so that the CPU's part shows whatever the block costs.
    let d = with(
        device(2, 1.0),
        AccelRate {
            parallel: false,
            ..npu(4e9)
        },
    );
    let mut slow = d.clone();
    for k in &mut slow.kernels {
        k.unit_rows_bps = k.sparse_bps / 2.0;
        k.unit_axpy_bps = k.sparse_bps / 4.0;
    }
    let at = |d: &DeviceProfile, j: u32| step_ns(d, &m, "qnn", &[j]) as i64;
    let tables = |d: &DeviceProfile| {
        let c = Constraints {
            context: 256,
            ..Constraints::default()
        };
        let t = planner::Tables::build(d, &m, &c, 0).unwrap();
        let i = t.threads.iter().position(|&x| x == 2).unwrap();
        t.sparse_ffn_ns(i) as i64
    };
    let extra = tables(&slow) - tables(&d);
    assert!(extra > 0);
    assert!((at(&slow, 0) - at(&d, 0) - extra).abs() <= 1);
    let half = at(&slow, 2) - at(&d, 2);
    assert!(half > 0 && half < extra, "{half} vs {extra}");
    assert_eq!(at(&slow, 4), at(&d, 4));
}
