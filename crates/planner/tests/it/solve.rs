//! The solvers against brute force on small grids, and no plan over its budget.

use crate::common;

use common::{device, model, small_case};
use planner::{brute_force, make_plan, search, Constraints, Solver, Tables};
use proptest::prelude::*;

fn tables(layers: usize, neurons: usize, grid: u32, alpha: f64) -> Tables {
    let m = model(layers, neurons, grid, alpha, true);
    let c = Constraints {
        context: 256,
        ..Constraints::default()
    };
    Tables::build(&device(2, 1.0), &m, &c, 0).unwrap()
}

/// An in-memory model whose layer `l` has every neuron firing with probability `firing[l]` (some
/// layers sparse enough for their predictor to pay, others not).
fn in_memory(firing: &[f32]) -> planner::ModelSummary {
    let mut m = model(firing.len(), 32, 2, 1.0, false);
    for (l, &p) in m.layers.iter_mut().zip(firing) {
        let f = vec![p; 32];
        *l = planner::FfnLayer::from_frequencies(12288, "q4_0", 16384, 1, &[f.clone(), f], 2)
            .unwrap();
    }
    m
}

fn in_memory_tables(firing: &[f32]) -> Tables {
    let c = Constraints {
        context: 256,
        ..Constraints::default()
    };
    Tables::build(&device(2, 1.0), &in_memory(firing), &c, 0).unwrap()
}

/// A budget `frac` of the way from the smallest configuration to everything in memory.
pub(crate) fn budget(t: &Tables, frac: f64) -> u64 {
    let lo = t.min_memory();
    let all: u64 = t.fixed_bytes
        + t.all_pred_bytes()
        + t.tensors.iter().map(|x| x.0).sum::<u64>()
        + t.cache_bytes
            .iter()
            .map(|c| *c.last().unwrap())
            .sum::<u64>();
    lo + ((all - lo) as f64 * frac) as u64
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// The default search is never better than brute force (it cannot be: same tables), within its
    /// budget, and close to optimal: greedy placement by benefit per byte loses at most 10% here.
    #[test]
    fn search_is_within_budget_and_near_brute_force((layers, neurons, grid, alpha, frac) in small_case()) {
        let t = tables(layers, neurons, grid, alpha);
        let b = budget(&t, frac);
        let (bc, bcost) = brute_force(&t, b).unwrap();
        let (sc, scost) = search(&t, b).unwrap();
        prop_assert!(t.admits(&sc) && t.admits(&bc));
        prop_assert!(scost.memory <= b);
        prop_assert_eq!(t.cost(&sc), scost);
        prop_assert!(scost.decode_ns >= bcost.decode_ns);
        prop_assert!(
            scost.decode_ns as f64 <= bcost.decode_ns as f64 * 1.10,
            "search {} ns vs brute force {} ns", scost.decode_ns, bcost.decode_ns
        );
    }

    /// Plans never exceed their budget, on any model and device, offloaded or not, and predictions
    /// are finite and positive.
    #[test]
    fn no_plan_exceeds_its_budget(
        (layers, neurons, grid, alpha, frac) in small_case(),
        speed in 0.1f64..4.0,
        offloaded in any::<bool>(),
        cores in 1u32..=4,
    ) {
        let m = model(layers, neurons, grid, alpha, offloaded);
        let d = device(cores, speed);
        let t = Tables::build(&d, &m, &Constraints { context: 256, ..Constraints::default() }, 0).unwrap();
        let b = budget(&t, frac);
        let c = Constraints { memory_budget: Some(b), context: 256, ..Constraints::default() };
        match make_plan(&d, &m, &c, Solver::Search) {
            Ok(p) => {
                prop_assert!(p.memory <= b, "plan uses {} of {}", p.memory, b);
                let cache: u64 = p.hot_neurons.iter().zip(&m.layers).map(|(&n, l)| n as u64 * l.neuron_bytes).sum();
                prop_assert_eq!(cache, p.ffn_cache_bytes);
                prop_assert!(p.predicted.iter().all(|x| x.tok_s.is_finite() && x.tok_s > 0.0));
                prop_assert_eq!(p.predicted.len(), m.batch_sizes.len());
            }
            Err(e) => prop_assert!(b < t.min_memory(), "no plan at {} (min {}): {}", b, t.min_memory(), e),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// In memory each layer is dense or sparse on its own, and the search finds brute force's
    /// optimum over every pattern: the predictors are the only memory the choice moves.
    #[test]
    fn in_memory_search_picks_each_layer_as_brute_force_does(
        firing in proptest::collection::vec(0.02f32..1.0, 1..=5),
        frac in 0.0f64..1.2,
    ) {
        let t = in_memory_tables(&firing);
        let b = budget(&t, frac);
        let (_, bcost) = brute_force(&t, b).unwrap();
        let (sc, scost) = search(&t, b).unwrap();
        prop_assert!(t.admits(&sc));
        prop_assert!(scost.memory <= b);
        prop_assert_eq!((scost.decode_ns, scost.memory), (bcost.decode_ns, bcost.memory));
    }
}

/// Two layers in memory, one with every neuron firing and one with few: the plan keeps the first
/// dense and makes the second sparse, and predicts the step faster than either uniform choice.
#[test]
fn in_memory_each_layer_is_dense_or_sparse_on_its_own() {
    let m = in_memory(&[1.0, 0.05]);
    let c = Constraints {
        context: 256,
        ..Constraints::default()
    };
    let d = device(2, 1.0);
    let p = make_plan(&d, &m, &c, Solver::Search).unwrap();
    assert_eq!(p.sparse, vec![false, true], "{}", p.describe());
    assert!(
        p.describe().contains("1 of 2 layers sparse"),
        "{}",
        p.describe()
    );
    let t = Tables::build(&d, &m, &c, 0).unwrap();
    let (mixed, cost) = search(&t, u64::MAX).unwrap();
    let uniform = |s: bool| {
        t.cost(&planner::Choice {
            sparse: vec![s; 2],
            ..mixed.clone()
        })
        .decode_ns
    };
    assert!(cost.decode_ns < uniform(false) && cost.decode_ns < uniform(true));
    // Only the sparse layer's predictor is held.
    assert_eq!(
        cost.memory,
        t.cost(&planner::Choice {
            sparse: vec![false; 2],
            ..mixed
        })
        .memory
            + t.pred_bytes[1]
    );
}

/// A batch whose sequences together fire every neuron runs dense though one sequence runs sparse:
/// the plan's batch size 2 is dense, with batch size 1's threads and placement.
#[test]
fn a_batch_that_fires_every_neuron_runs_dense() {
    let mut m = in_memory(&[0.05, 0.05]);
    for l in &mut m.layers {
        let (few, all) = (vec![0.05f32; 32], vec![1.0f32; 32]);
        *l = planner::FfnLayer::from_frequencies(12288, "q4_0", 16384, 1, &[few, all], 2).unwrap();
    }
    let c = Constraints {
        context: 256,
        ..Constraints::default()
    };
    let p = make_plan(&device(2, 1.0), &m, &c, Solver::Search).unwrap();
    assert_eq!(p.sparse, vec![true, true], "{}", p.describe());
    assert!(
        p.predicted[0].sparse && !p.predicted[1].sparse,
        "{}",
        p.describe()
    );
    assert_eq!(p.predicted[1].threads, p.threads);
    assert!(p.describe().contains("batch 2: dense"), "{}", p.describe());
}

#[test]
fn more_memory_is_never_slower() {
    let t = tables(3, 40, 4, 0.8);
    let mut last = u64::MAX;
    for i in 0..=10 {
        let (_, c) = brute_force(&t, budget(&t, i as f64 / 10.0)).unwrap();
        assert!(
            c.decode_ns <= last,
            "budget step {i}: {} > {last}",
            c.decode_ns
        );
        last = c.decode_ns;
    }
}

#[test]
fn everything_in_memory_picks_dense_when_dense_is_faster() {
    // Frequencies near one: sparse computes nearly every neuron at the slower sparse rate, plus the
    // predictors, so with the whole FFN in memory the plan must be dense.
    let mut m = model(2, 32, 4, 0.0, true);
    for l in &mut m.layers {
        let f = vec![1.0f32; 32];
        *l = planner::FfnLayer::from_frequencies(12288, "q4_0", 16384, 1, &[f.clone(), f], 4)
            .unwrap();
    }
    let c = Constraints {
        context: 256,
        ..Constraints::default()
    };
    let p = make_plan(&device(2, 1.0), &m, &c, Solver::Search).unwrap();
    assert!(p.sparse.iter().all(|&s| !s), "{}", p.describe());
    // And with few neurons firing and a tight budget, sparse.
    let m = model(2, 32, 4, 1.5, true);
    let t = Tables::build(&device(2, 1.0), &m, &c, 0).unwrap();
    let c = Constraints {
        memory_budget: Some(budget(&t, 0.3)),
        ..c
    };
    let p = make_plan(&device(2, 1.0), &m, &c, Solver::Search).unwrap();
    assert!(p.sparse.iter().all(|&s| s), "{}", p.describe());
}

#[test]
fn a_budget_below_the_minimum_is_a_named_error() {
    let t = tables(2, 16, 2, 1.0);
    let err = search(&t, t.min_memory() - 1).unwrap_err().to_string();
    assert!(err.contains("no plan fits") && err.contains("MiB"), "{err}");
    let err = brute_force(&t, t.min_memory() - 1).unwrap_err().to_string();
    assert!(err.contains("no plan fits"), "{err}");
}

#[cfg(feature = "z3")]
mod z3 {
    use super::*;
    use planner::solve_z3;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        /// Z3's optimum equals brute force's: same decode time and memory.
        #[test]
        fn z3_equals_brute_force((layers, neurons, grid, alpha, frac) in small_case()) {
            let t = tables(layers, neurons, grid, alpha);
            let b = budget(&t, frac);
            let (_, bcost) = brute_force(&t, b).unwrap();
            let (zc, zcost) = solve_z3(&t, b).unwrap();
            prop_assert!(t.admits(&zc));
            prop_assert_eq!(t.cost(&zc), zcost);
            prop_assert_eq!((zcost.decode_ns, zcost.memory), (bcost.decode_ns, bcost.memory));
        }

        /// In memory, Z3 picks each layer dense or sparse as brute force does.
        #[test]
        fn z3_picks_each_layer_in_memory_as_brute_force_does(
            firing in proptest::collection::vec(0.02f32..1.0, 1..=4),
            frac in 0.0f64..1.2,
        ) {
            let t = in_memory_tables(&firing);
            let b = budget(&t, frac);
            let (_, bcost) = brute_force(&t, b).unwrap();
            let (zc, zcost) = solve_z3(&t, b).unwrap();
            prop_assert!(t.admits(&zc));
            prop_assert_eq!((zcost.decode_ns, zcost.memory), (bcost.decode_ns, bcost.memory));
        }
    }

    #[test]
    fn z3_reports_an_infeasible_budget() {
        let t = tables(2, 16, 2, 1.0);
        let err = solve_z3(&t, t.min_memory() - 1).unwrap_err().to_string();
        assert!(err.contains("no configuration fits"), "{err}");
    }
}
