//! Multi-threaded stress test of [`SharedNeuronCache`] (used instead of `loom`: the cache is one mutex,
//! so what needs testing is guard hygiene and the invariants under real interleavings). Compute-like
//! threads look neurons and clusters up, insert on misses, hold a few pins while checking their bytes
//! and that they stay pinned; a "planner" thread moves the hot/cold split and checks every invariant
//! while holding the lock. After the join: no pins left, invariants hold, statistics add up.

use std::sync::atomic::{AtomicU64, Ordering};

use neuron_cache::{CacheError, ClusterId, NeuronCache, NeuronId, SharedNeuronCache};

struct XorShift(u64);
impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn fill(id: NeuronId) -> u8 {
    (id.layer * 31 + id.neuron) as u8
}

#[test]
fn concurrent_users_keep_the_invariants() {
    const BUDGET: usize = 64 * 1024;
    const THREADS: u64 = 4;
    const OPS: u64 = 20_000;
    let mut cache = NeuronCache::new(BUDGET);
    cache.reserve_fixed(8 * 1024).unwrap();
    cache.set_hot_bytes(16 * 1024).unwrap();
    let cache = SharedNeuronCache::new(cache);
    let lookups = AtomicU64::new(0);
    let refused = AtomicU64::new(0);

    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (cache, lookups, refused) = (cache.clone(), &lookups, &refused);
            s.spawn(move || {
                let mut rng = XorShift(0x9E37_79B9_7F4A_7C15 ^ ((t + 1) * 0x1234_5678));
                let mut held = Vec::new();
                let mut held_clusters = Vec::new();
                for _ in 0..OPS {
                    // Skewed ids: a few hot neurons, many cold ones.
                    let neuron = if rng.below(4) == 0 {
                        rng.below(16)
                    } else {
                        rng.below(400)
                    } as u32;
                    let id = NeuronId {
                        layer: (neuron % 4),
                        neuron,
                    };
                    lookups.fetch_add(1, Ordering::Relaxed);
                    let guard = match cache.get_neuron(id) {
                        Some(g) => Some(g),
                        None => {
                            let size = 64 + 64 * (neuron as usize % 8);
                            match cache.insert_neuron_pinned(id, vec![fill(id); size].into()) {
                                Ok(g) => Some(g),
                                Err(CacheError::BudgetExhausted { .. }) => {
                                    refused.fetch_add(1, Ordering::Relaxed);
                                    None
                                }
                                Err(e) => panic!("unexpected error {e}"),
                            }
                        }
                    };
                    if let Some(g) = guard {
                        assert!(g.iter().all(|&b| b == fill(id)), "bytes of {id} corrupted");
                        held.push(g);
                    }
                    if rng.below(8) == 0 {
                        let c = ClusterId {
                            layer: 0,
                            cluster: rng.below(24) as u32,
                        };
                        lookups.fetch_add(1, Ordering::Relaxed);
                        match cache.get_cluster(c) {
                            Some(g) => held_clusters.push(g),
                            None => match cache
                                .insert_cluster_pinned(c, vec![c.cluster as u8; 2048].into())
                            {
                                Ok(g) => held_clusters.push(g),
                                Err(CacheError::BudgetExhausted { .. }) => {}
                                Err(e) => panic!("unexpected error {e}"),
                            },
                        }
                    }
                    // Hold up to 6 neurons and 2 clusters "being computed"; they must stay pinned.
                    while held.len() > 6 {
                        let g = held.remove(rng.below(held.len() as u64) as usize);
                        assert!(
                            cache.lock().is_neuron_pinned(g.id()),
                            "{} evicted while pinned",
                            g.id()
                        );
                        assert!(g.iter().all(|&b| b == fill(g.id())));
                    }
                    while held_clusters.len() > 2 {
                        let g = held_clusters.remove(0);
                        assert!(cache.lock().contains_cluster(g.id()));
                        assert!(g.iter().all(|&b| b == g.id().cluster as u8));
                    }
                }
            });
        }
        let cache = cache.clone();
        s.spawn(move || {
            let mut rng = XorShift(42);
            for _ in 0..2_000 {
                let mut c = cache.lock();
                let _ = c.set_hot_bytes(8 * 1024 + 1024 * rng.below(16) as usize);
                if let Err(e) = c.check_invariants() {
                    panic!("invariant broken under concurrency: {e}");
                }
                drop(c);
                std::thread::yield_now();
            }
        });
    });

    let c = cache.lock();
    c.check_invariants().unwrap();
    let s = c.stats();
    assert_eq!(
        (s.cold.pinned_bytes, s.hot.pinned_bytes),
        (0, 0),
        "every guard unpinned"
    );
    assert!(s.resident_bytes() <= BUDGET);
    let lookups = lookups.load(Ordering::Relaxed);
    assert_eq!(
        s.cold.hits + s.cold.misses + s.hot.hits + s.hot.misses,
        lookups
    );
    assert!(
        s.cold.hits > 0 && s.cold.evictions > 0 && s.hot.evictions > 0,
        "{s:?}"
    );
    // Every insertion follows a miss; a miss may insert nothing (refused, or another thread inserted the
    // neuron first).
    assert!(
        s.cold.insertions <= s.cold.misses - refused.load(Ordering::Relaxed),
        "{s:?}"
    );
}
