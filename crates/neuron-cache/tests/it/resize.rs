//! A live budget: shrinking evicts least recently used neurons and drops their bytes, pinned entries
//! stop a shrink that would need them, growing lets the cache fill again, and removal never touches a
//! pinned entry.

use std::sync::Arc;

use neuron_cache::{CacheError, ClusterId, NeuronCache, NeuronId};

fn nid(n: u32) -> NeuronId {
    NeuronId {
        layer: 0,
        neuron: n,
    }
}

#[test]
fn shrinking_the_budget_evicts_lru_neurons_and_frees_their_bytes() {
    let mut c = NeuronCache::new(10 * 100);
    let held: Vec<Arc<[u8]>> = (0..10).map(|_| Arc::from(vec![7u8; 100])).collect();
    for (n, d) in held.iter().enumerate() {
        c.insert_neuron(nid(n as u32), d.clone()).unwrap();
    }
    assert_eq!(c.stats().cold.bytes, 1000);
    // Neuron 0 used again: it survives the shrink, the oldest others go.
    assert!(c.get_neuron(nid(0)).is_some());
    c.set_budget(300).unwrap();
    c.check_invariants().unwrap();
    let s = c.stats();
    assert_eq!((s.budget, s.cold.capacity, s.cold.bytes), (300, 300, 300));
    assert!(c.contains_neuron(nid(0)) && c.contains_neuron(nid(9)));
    assert!(!c.contains_neuron(nid(1)));
    // The cache no longer holds the evicted bytes: only this test's copy is left.
    let counts: Vec<usize> = held.iter().map(Arc::strong_count).collect();
    assert_eq!(counts.iter().filter(|&&n| n == 2).count(), 3, "{counts:?}");

    // Growing: room again, the cache fills.
    c.set_budget(1000).unwrap();
    for n in 10..17 {
        c.insert_neuron(nid(n), Arc::from(vec![1u8; 100])).unwrap();
    }
    c.check_invariants().unwrap();
    assert_eq!(c.stats().cold.bytes, 1000);
    assert_eq!(c.stats().cold.evictions, 7);
}

#[test]
fn a_shrink_that_needs_pinned_or_reserved_bytes_fails_and_changes_nothing() {
    let mut c = NeuronCache::new(1000);
    c.reserve_fixed(200).unwrap();
    c.set_hot_bytes(300).unwrap();
    c.insert_neuron_pinned(nid(1), Arc::from(vec![0u8; 150]))
        .unwrap();
    let before = c.stats();
    // Fixed + hot do not fit.
    assert!(matches!(
        c.set_budget(400),
        Err(CacheError::Layout { budget: 400, .. })
    ));
    // The cold region would be 100 bytes, below its 150 pinned.
    assert!(matches!(c.set_budget(600), Err(CacheError::Pinned { .. })));
    assert_eq!(c.stats(), before);
    // Shrinking the hot region first makes room.
    c.set_hot_bytes(0).unwrap();
    c.set_budget(400).unwrap();
    c.check_invariants().unwrap();
    assert_eq!(c.stats().cold.capacity, 200);
}

#[test]
fn removal_skips_pinned_entries() {
    let mut c = NeuronCache::new(1000);
    c.set_hot_bytes(500).unwrap();
    let id = ClusterId {
        layer: 2,
        cluster: 0,
    };
    let pinned = c
        .insert_cluster_pinned(id, Arc::from(vec![0u8; 200]))
        .unwrap();
    assert!(matches!(
        c.remove_cluster(id),
        Err(CacheError::InUse { .. })
    ));
    c.unpin_cluster(id).unwrap();
    assert!(c.remove_cluster(id).unwrap());
    assert!(!c.remove_cluster(id).unwrap());
    assert_eq!(Arc::strong_count(&pinned), 1);
    c.insert_neuron(nid(3), Arc::from(vec![0u8; 10])).unwrap();
    assert!(c.remove_neuron(nid(3)).unwrap());
    assert_eq!(c.stats().cold.bytes, 0);
    c.check_invariants().unwrap();
}
