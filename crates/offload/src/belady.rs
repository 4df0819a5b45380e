//! The least reads any cache of a given size could have done on a trace: Belady's optimal
//! policy, the bound `sparrow bench` prints beside an expert offload's bytes per token.

/// Misses of Belady's optimal policy on `trace` (experts in the order asked: one layer's, or every
/// layer's when they share one pool of experts of one size) for a cache of `capacity` experts
/// holding `initial` at the start (as many as fit): the fewest reads any cache of that size,
/// starting so, could have done. An expert asked for need not be kept (it is used from its read
/// buffer), so each miss either evicts the resident expert wanted last or, when that is itself,
/// keeps nothing.
pub fn belady_misses<K: Copy + Eq + std::hash::Hash + Ord>(
    trace: &[K],
    capacity: usize,
    initial: &[K],
) -> u64 {
    let n = trace.len();
    // next[i]: the next position asking for trace[i] after i (n: never).
    let mut next = vec![n; n];
    let mut last: std::collections::HashMap<K, usize> = std::collections::HashMap::new();
    for i in (0..n).rev() {
        next[i] = last.get(&trace[i]).copied().unwrap_or(n);
        last.insert(trace[i], i);
    }
    let mut resident: std::collections::HashMap<K, usize> = std::collections::HashMap::new();
    for &e in initial.iter().take(capacity) {
        resident.insert(e, trace.iter().position(|&t| t == e).unwrap_or(n));
    }
    let mut misses = 0;
    for i in 0..n {
        let e = trace[i];
        if let Some(nx) = resident.get_mut(&e) {
            *nx = next[i];
            continue;
        }
        misses += 1;
        if capacity == 0 {
            continue;
        }
        if resident.len() >= capacity {
            let (&victim, &far) = resident
                .iter()
                .max_by_key(|(&k, &nx)| (nx, k))
                .expect("full");
            // The one asked for now may be the one wanted last: then it is used and not kept
            // (as `ExpertCache::admits` lets the run do).
            if (next[i], e) > (far, victim) {
                continue;
            }
            resident.remove(&victim);
        }
        resident.insert(e, next[i]);
    }
    misses
}
