//! A reference beside Belady's bound ([`crate::belady_misses`]): the reads of a *fixed* set of
//! experts for a trace, a cache told how often each expert will be asked for but not when (from a
//! cold start the best fixed set; from a warm one, the set ranked by the reads each would save).
//!
//! When a router's choices are drawn independently from one distribution each token, keeping the
//! likeliest experts is the best any policy that knows only the past can do on average (the
//! independent reference model's optimal replacement keeps the most probable pages), and the set
//! chosen from the trace's own counts is that set told the future counts: the gap between Belady's
//! count and this one is then about the price of not knowing the order of the requests, which an
//! online policy pays too. Where consecutive tokens share experts (locality), a policy that follows
//! the order can beat any fixed set, so this is a reference, not a bound.

use std::collections::{HashMap, HashSet};
use std::hash::Hash;

/// Misses on `trace` of a cache of `capacity` experts that starts holding `initial` (as many as
/// fit) and keeps a fixed set: the `capacity` experts that save the most reads on this trace (an
/// expert's requests, less the one read it needs when the cache does not already hold it; ties to
/// the lower key). An expert of the set is kept once read, in place of one outside it; any other
/// expert is used and not kept.
pub fn fixed_set_misses<K: Copy + Eq + Hash + Ord>(
    trace: &[K],
    capacity: usize,
    initial: &[K],
) -> u64 {
    let mut resident: HashSet<K> = HashSet::new();
    for &e in initial {
        if resident.len() < capacity {
            resident.insert(e);
        }
    }
    let mut counts: HashMap<K, u64> = HashMap::new();
    for &e in trace {
        *counts.entry(e).or_default() += 1;
    }
    let saved = |e: &K, n: u64| n - u64::from(!resident.contains(e));
    let mut ranked: Vec<(K, u64)> = counts.iter().map(|(&e, &n)| (e, saved(&e, n))).collect();
    ranked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let keep: HashSet<K> = ranked
        .iter()
        .take(capacity)
        .filter(|&&(_, s)| s > 0)
        .map(|&(e, _)| e)
        .collect();
    let mut misses = 0;
    for &e in trace {
        if resident.contains(&e) {
            continue;
        }
        misses += 1;
        if !keep.contains(&e) {
            continue;
        }
        if resident.len() >= capacity {
            // One outside the set must be resident: the set has at most `capacity` experts and
            // `e`, one of them, is not resident. The least asked for goes first.
            let victim = resident
                .iter()
                .filter(|v| !keep.contains(v))
                .min_by_key(|&&v| (counts.get(&v).copied().unwrap_or(0), v))
                .copied()
                .expect("a resident expert outside the fixed set");
            resident.remove(&victim);
        }
        resident.insert(e);
    }
    misses
}
