//! Hybrid decode's split over a neuron store: each layer's count against every step that fits its
//! share of the cache, the block's memory within that share, and the limits (a free accelerator
//! with the whole layer in memory takes every neuron, a block larger than the cache share none).

use crate::common;

use common::{device, model, npu, small_case, with};
use planner::{
    hybrid_split_over_store, make_plan, step_neurons, store_layer_ns, AccelRate, Constraints,
    Solver, StoreMemory,
};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Each layer's count is the cheapest step whose block fits the layer's cache share, the
    /// block never takes more than that share, one count serves every batch size, and the split
    /// is never slower than no block.
    #[test]
    fn each_layer_takes_the_cheapest_block_that_fits_its_cache(
        (layers, neurons, grid, alpha, share) in small_case(),
        speed in 0.05f64..20.0,
        parallel in any::<bool>(),
        block_ratio in 0.5f64..4.0,
        predicted in any::<bool>(),
    ) {
        let mut m = model(layers, neurons, grid, alpha, true);
        m.predicted = predicted;
        let d = with(device(2, 1.0), AccelRate { parallel, ..npu(4e9 * speed) });
        let nb = m.layers[0].neuron_bytes;
        let cache = (share * (neurons as u64 * nb) as f64) as u64;
        let block = (nb as f64 * block_ratio) as u64;
        let mem = StoreMemory {
            cache_bytes: vec![cache; layers],
            block_neuron_bytes: Some(block),
            queue_depth: 4,
        };
        let h = hybrid_split_over_store(&d, &m, "qnn", 2, &mem).unwrap();
        let mut best_sum = 0;
        for (c, l) in h.counts.iter().zip(&m.layers) {
            prop_assert!(c.iter().all(|&k| k == c[0]), "{:?}", c);
            prop_assert!(c[0] as u64 * block <= cache, "{} × {} > {}", c[0], block, cache);
            let a = d.accel_rate("qnn", &l.format, 2).unwrap();
            let at = |j| store_layer_ns(&d, &m, l, &a, 2, (0, 1), j, (cache, block, 4));
            let best = (0..=grid).filter_map(at).min().unwrap();
            let j = (0..=grid).find(|&j| step_neurons(l.neurons, grid, j) == c[0]).unwrap();
            prop_assert_eq!(at(j), Some(best));
            best_sum += best;
        }
        prop_assert_eq!(h.ffn_ns[0], best_sum);
        prop_assert!(h.ffn_ns[0] <= h.sparse_ns[0]);
    }
}

#[test]
fn a_free_accelerator_takes_what_the_cache_holds_and_nothing_past_it() {
    let m = model(2, 48, 4, 0.8, true);
    let free = with(
        device(2, 1.0),
        AccelRate {
            call_ns: 0.0,
            ..npu(1e18)
        },
    );
    let nb = m.layers[0].neuron_bytes;
    // The whole layer in memory: no reads, so the block takes every neuron.
    let whole = StoreMemory {
        cache_bytes: vec![48 * nb; 2],
        block_neuron_bytes: None,
        queue_depth: 4,
    };
    let h = hybrid_split_over_store(&free, &m, "qnn", 2, &whole).unwrap();
    assert!(h.counts.iter().all(|c| c == &[48; 4]), "{h:?}");
    assert!(h.ffn_ns[0] < h.sparse_ns[0]);
    // A block that costs more than the layer's share fits nowhere.
    let small = StoreMemory {
        cache_bytes: vec![nb; 2],
        block_neuron_bytes: Some(2 * nb),
        queue_depth: 4,
    };
    let h = hybrid_split_over_store(&free, &m, "qnn", 2, &small).unwrap();
    assert!(h.counts.iter().all(|c| c == &[0; 4]), "{h:?}");
    assert_eq!(h.ffn_ns, h.sparse_ns);
    // A share for another number of layers is a named error.
    let wrong = StoreMemory {
        cache_bytes: vec![nb; 3],
        ..small
    };
    let err = hybrid_split_over_store(&free, &m, "qnn", 2, &wrong).unwrap_err();
    assert!(err.to_string().contains("3 layers"), "{err}");
}

/// A plan over a store carries the split made within its own cache: the blocks fit each layer's
/// equal share of it, and the decode prediction counts them.
#[test]
fn a_plan_over_a_store_splits_within_its_cache() {
    let m = model(2, 64, 4, 1.0, true);
    let d = with(
        device(2, 1.0),
        AccelRate {
            call_ns: 0.0,
            ..npu(1e12)
        },
    );
    let nb = m.layers[0].neuron_bytes;
    let c = Constraints {
        memory_budget: Some((40 << 20) + 48 * nb),
        context: 256,
        accelerator: Some("qnn".into()),
        accel_neuron_bytes: Some(nb + nb / 2),
        ..Constraints::default()
    };
    let p = make_plan(&d, &m, &c, Solver::Search).unwrap();
    let h = p.hybrid.as_ref().expect("a split");
    let share = p.ffn_cache_bytes / 2;
    assert!(
        h.counts.iter().any(|c| c[0] > 0),
        "{h:?} in {share} bytes a layer"
    );
    for c in &h.counts {
        assert!(c[0] as u64 * (nb + nb / 2) <= share, "{c:?} in {share}");
        assert!(c.iter().all(|&k| k == c[0]));
    }
    assert!(h.decode_ns > 0 && h.decode_ns >= h.ffn_ns[0]);
}
