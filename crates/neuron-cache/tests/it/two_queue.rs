//! Unit tests of the cache's policies: two-queue promotion, the 90% active limit, eviction order, pinning,
//! the hot region, layout changes and statistics.

use std::sync::Arc;

use neuron_cache::{CacheError, ClusterId, NeuronCache, NeuronId, Region, SharedNeuronCache};

fn n(i: u32) -> NeuronId {
    NeuronId {
        layer: 0,
        neuron: i,
    }
}
fn c(i: u32) -> ClusterId {
    ClusterId {
        layer: 1,
        cluster: i,
    }
}
fn bytes(len: usize, fill: u8) -> Arc<[u8]> {
    vec![fill; len].into()
}
fn ids(v: &[u32]) -> Vec<NeuronId> {
    v.iter().map(|&i| n(i)).collect()
}

#[test]
fn new_neurons_enter_inactive_and_a_second_hit_promotes() {
    let mut cache = NeuronCache::new(100);
    for i in 0..3 {
        cache.insert_neuron(n(i), bytes(10, i as u8)).unwrap();
    }
    assert_eq!(cache.cold_order(), (ids(&[]), ids(&[2, 1, 0])));
    assert_eq!(&*cache.get_neuron(n(1)).unwrap(), &[1u8; 10][..]);
    assert_eq!(cache.cold_order(), (ids(&[1]), ids(&[2, 0])));
    cache.get_neuron(n(0)).unwrap();
    cache.get_neuron(n(1)).unwrap();
    assert_eq!(cache.cold_order(), (ids(&[1, 0]), ids(&[2])));
    // Inserting a resident neuron changes nothing (not even its bytes).
    cache.insert_neuron(n(2), bytes(10, 99)).unwrap();
    assert_eq!(cache.cold_order(), (ids(&[1, 0]), ids(&[2])));
    assert_eq!(cache.get_neuron(n(2)).unwrap()[0], 2);
    assert!(cache.get_neuron(n(7)).is_none());
    let s = cache.stats().cold;
    assert_eq!(
        (
            s.hits,
            s.misses,
            s.insertions,
            s.evictions,
            s.bytes,
            s.entries
        ),
        (4, 1, 3, 0, 30, 3)
    );
    cache.check_invariants().unwrap();
}

#[test]
fn active_list_is_held_at_90_percent_of_the_cold_region() {
    let mut cache = NeuronCache::new(100);
    for i in 0..10 {
        cache.insert_neuron(n(i), bytes(10, 0)).unwrap();
    }
    for i in 0..10 {
        cache.get_neuron(n(i)).unwrap();
        assert!(cache.stats().active_bytes <= 90);
    }
    // The 10th promotion pushed the active list to 100 bytes: its tail (0) went to the inactive head.
    assert_eq!(
        cache.cold_order(),
        (ids(&[9, 8, 7, 6, 5, 4, 3, 2, 1]), ids(&[0]))
    );
    assert_eq!(cache.active_limit(), 90);
    // The demoted neuron is the next victim.
    cache.insert_neuron(n(10), bytes(10, 0)).unwrap();
    assert!(!cache.contains_neuron(n(0)));
    assert_eq!(
        cache.cold_order(),
        (ids(&[9, 8, 7, 6, 5, 4, 3, 2, 1]), ids(&[10]))
    );
    cache.check_invariants().unwrap();
}

#[test]
fn eviction_takes_the_inactive_tail_first_then_the_active_tail() {
    let mut cache = NeuronCache::new(50);
    for i in 0..5 {
        cache.insert_neuron(n(i), bytes(10, 0)).unwrap();
    }
    cache.get_neuron(n(1)).unwrap();
    cache.insert_neuron(n(5), bytes(10, 0)).unwrap();
    assert_eq!(cache.cold_order(), (ids(&[1]), ids(&[5, 4, 3, 2])));
    cache.insert_neuron(n(6), bytes(20, 0)).unwrap(); // evicts 2 and 3
    assert_eq!(cache.cold_order(), (ids(&[1]), ids(&[6, 5, 4])));
    assert_eq!(cache.stats().cold.evictions, 3);
    // Every inactive neuron pinned: the active tail goes.
    for i in [4, 5, 6] {
        cache.insert_neuron_pinned(n(i), bytes(1, 0)).unwrap();
    }
    cache.insert_neuron(n(7), bytes(10, 0)).unwrap();
    assert!(!cache.contains_neuron(n(1)));
    assert_eq!(cache.cold_order(), (ids(&[]), ids(&[7, 6, 5, 4])));
    cache.check_invariants().unwrap();
}

#[test]
fn pinned_neurons_are_never_evicted_and_a_full_pinned_cache_refuses() {
    let mut cache = NeuronCache::new(30);
    for i in 0..3 {
        cache.insert_neuron_pinned(n(i), bytes(10, 0)).unwrap();
    }
    let e = cache.insert_neuron(n(3), bytes(10, 0)).unwrap_err();
    assert_eq!(
        e,
        CacheError::BudgetExhausted {
            region: Region::Cold,
            key: "layer 0 neuron 3".into(),
            needed: 10,
            capacity: 30,
            used: 30,
            pinned: 30
        }
    );
    assert!(e.to_string().contains("layer 0 neuron 3"));
    assert_eq!(cache.stats().cold.bytes, 30);
    cache.pin_neuron(n(1)).unwrap(); // pinned twice
    cache.unpin_neuron(n(1)).unwrap();
    assert!(
        cache.insert_neuron(n(3), bytes(10, 0)).is_err(),
        "still pinned once"
    );
    cache.unpin_neuron(n(1)).unwrap();
    assert!(matches!(
        cache.unpin_neuron(n(1)),
        Err(CacheError::NotPinned { .. })
    ));
    cache.insert_neuron(n(3), bytes(10, 0)).unwrap();
    assert!(
        !cache.contains_neuron(n(1)) && cache.contains_neuron(n(0)) && cache.contains_neuron(n(2))
    );
    // Too big for the region even when empty of unpinned entries: refused, nothing evicted.
    assert!(cache.insert_neuron(n(9), bytes(11, 0)).is_err());
    assert!(cache.contains_neuron(n(3)));
    cache.check_invariants().unwrap();
}

#[test]
fn hot_region_is_a_cluster_lru_and_shrinking_it_evicts() {
    let mut cache = NeuronCache::new(100);
    cache.set_hot_bytes(60).unwrap();
    assert_eq!((cache.hot_capacity(), cache.cold_capacity()), (60, 40));
    for i in 0..3 {
        cache.insert_cluster(c(i), bytes(20, i as u8)).unwrap();
    }
    assert_eq!(cache.get_cluster(c(0)).unwrap()[0], 0);
    assert_eq!(cache.hot_order(), vec![c(0), c(2), c(1)]);
    cache.insert_cluster(c(3), bytes(20, 3)).unwrap(); // evicts 1
    assert_eq!(cache.hot_order(), vec![c(3), c(0), c(2)]);
    cache.pin_cluster(c(2)).unwrap();
    cache.set_hot_bytes(20).unwrap(); // evicts 0 and 3, keeps pinned 2
    assert_eq!(cache.hot_order(), vec![c(2)]);
    assert_eq!(cache.cold_capacity(), 80);
    assert!(matches!(
        cache.set_hot_bytes(10),
        Err(CacheError::Pinned {
            region: Region::Hot,
            ..
        })
    ));
    assert_eq!(cache.hot_capacity(), 20, "a failed resize changes nothing");
    let e = cache.insert_cluster(c(4), bytes(1, 0));
    assert!(matches!(
        e,
        Err(CacheError::BudgetExhausted {
            region: Region::Hot,
            ..
        })
    ));
    cache.unpin_cluster(c(2)).unwrap();
    let s = cache.stats().hot;
    assert_eq!((s.hits, s.insertions, s.evictions, s.bytes), (2, 4, 3, 20));
    cache.check_invariants().unwrap();
}

#[test]
fn growing_hot_or_fixed_shrinks_cold_and_evicts() {
    let mut cache = NeuronCache::new(100);
    for i in 0..10 {
        cache.insert_neuron(n(i), bytes(10, 0)).unwrap();
    }
    cache.get_neuron(n(0)).unwrap();
    cache.reserve_fixed(30).unwrap();
    assert_eq!(cache.cold_capacity(), 70);
    assert_eq!(cache.stats().cold.bytes, 70);
    assert!(
        cache.contains_neuron(n(0)),
        "active survives, inactive tail goes first"
    );
    assert!(
        !cache.contains_neuron(n(1)) && !cache.contains_neuron(n(3)) && cache.contains_neuron(n(4))
    );
    cache.set_hot_bytes(20).unwrap();
    assert_eq!(cache.stats().cold.bytes, 50);
    assert!(matches!(
        cache.reserve_fixed(51),
        Err(CacheError::Layout {
            fixed: 81,
            hot: 20,
            budget: 100
        })
    ));
    assert!(matches!(
        cache.release_fixed(31),
        Err(CacheError::FixedUnderflow {
            bytes: 31,
            reserved: 30
        })
    ));
    cache.release_fixed(30).unwrap();
    assert_eq!(cache.cold_capacity(), 80);
    let pinned = cache.pin_neuron(n(9)).unwrap();
    assert_eq!(pinned.len(), 10);
    assert!(matches!(
        cache.reserve_fixed(80),
        Err(CacheError::Pinned {
            region: Region::Cold,
            ..
        })
    ));
    cache.check_invariants().unwrap();
    let s = cache.stats();
    assert!(s.resident_bytes() <= s.budget);
}

#[test]
fn shared_cache_guards_pin_until_dropped() {
    let cache = SharedNeuronCache::new(NeuronCache::new(20));
    let g = cache.insert_neuron_pinned(n(0), bytes(10, 7)).unwrap();
    assert_eq!((g.id(), g[0]), (n(0), 7));
    cache.insert_neuron(n(1), bytes(10, 1)).unwrap();
    let g1 = cache.get_neuron(n(1)).unwrap();
    assert!(
        cache.insert_neuron(n(2), bytes(10, 2)).is_err(),
        "both pinned"
    );
    drop(g1);
    cache.insert_neuron(n(2), bytes(10, 2)).unwrap();
    assert!(cache.lock().contains_neuron(n(0)) && !cache.lock().contains_neuron(n(1)));
    drop(g);
    assert!(!cache.lock().is_neuron_pinned(n(0)));
    cache.lock().set_hot_bytes(10).unwrap();
    let cg = cache.insert_cluster_pinned(c(0), bytes(10, 3)).unwrap();
    assert_eq!(cg.id(), c(0));
    assert!(cache.get_cluster(c(0)).is_some());
    assert!(cache.get_cluster(c(1)).is_none());
    drop(cg);
    assert_eq!(cache.stats().hot.pinned_bytes, 0);
    cache.lock().check_invariants().unwrap();
}
