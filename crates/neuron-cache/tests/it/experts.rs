//! Property test of [`ExpertCache`] against a naive model of the same policy, under each
//! [`Eviction`] (a list per layer, linear scans): after every operation of a random sequence both
//! agree on the outcome (ok or error), on which experts are resident, on admission and on the
//! counters; the cache's invariants hold (within budget and shares, pinned and in-use experts never
//! evicted).

use std::collections::HashMap;
use std::sync::Arc;

use neuron_cache::{Eviction, ExpertCache, ExpertId, AGE_EVERY};
use proptest::prelude::*;

const EXPERTS: [usize; 3] = [6, 0, 5];

#[derive(Clone, Debug)]
enum Op {
    Get(usize, u32, bool),
    Insert(usize, u32, usize, bool),
    Pin(usize, u32, usize),
    Release(usize),
    Shares(Vec<usize>),
    Budget(usize, Vec<f64>),
    Scores(usize, Vec<u8>),
}

fn op() -> impl Strategy<Value = Op> {
    let layer = prop_oneof![Just(0usize), Just(2usize), Just(1usize)];
    prop_oneof![
        8 => (layer.clone(), 0u32..7, proptest::bool::weighted(0.15)).prop_map(|(l, e, k)| Op::Get(l, e, k)),
        6 => (layer.clone(), 0u32..7, 1usize..30, proptest::bool::weighted(0.15)).prop_map(|(l, e, s, k)| Op::Insert(l, e, s, k)),
        1 => (layer, 0u32..7, 1usize..20).prop_map(|(l, e, s)| Op::Pin(l, e, s)),
        2 => (0usize..8).prop_map(Op::Release),
        1 => prop::collection::vec(0usize..70, 3).prop_map(Op::Shares),
        1 => (0usize..160, prop::collection::vec(0.0f64..3.0, 3)).prop_map(|(b, w)| Op::Budget(b, w)),
        2 => (0usize..3, prop::collection::vec(0u8..4, 0..8)).prop_map(|(l, s)| Op::Scores(l, s)),
    ]
}

#[derive(Clone, Debug)]
struct E {
    expert: u32,
    bytes: usize,
    count: u64,
    stamp: u64,
    pinned: bool,
}

#[derive(Debug)]
struct Model {
    /// The order modelled.
    eviction: Eviction,
    /// [`Eviction::Predicted`]'s scores, per layer and expert.
    scores: Vec<Vec<u8>>,
    budget: usize,
    shares: Vec<usize>,
    clocks: Vec<u64>,
    layers: Vec<Vec<E>>,
    hits: u64,
    misses: u64,
    insertions: u64,
    evictions: u64,
}

impl Model {
    fn new(budget: usize, eviction: Eviction) -> Self {
        Model {
            eviction,
            scores: EXPERTS.iter().map(|&n| vec![0; n]).collect(),
            budget,
            shares: EXPERTS
                .iter()
                .map(|&n| if n > 0 { budget / 2 } else { 0 })
                .collect(),
            clocks: vec![0; 3],
            layers: vec![Vec::new(); 3],
            hits: 0,
            misses: 0,
            insertions: 0,
            evictions: 0,
        }
    }
    fn held(&self, l: usize, inuse: &HashMap<(usize, u32), usize>) -> usize {
        self.layers[l]
            .iter()
            .filter(|e| e.pinned || inuse.get(&(l, e.expert)).is_some_and(|&n| n > 0))
            .map(|e| e.bytes)
            .sum()
    }
    fn used(&self, l: usize) -> usize {
        self.layers[l].iter().map(|e| e.bytes).sum()
    }
    fn evict_to(&mut self, l: usize, cap: usize, inuse: &HashMap<(usize, u32), usize>) {
        while self.used(l) > cap {
            let mut best: Option<usize> = None;
            for (i, e) in self.layers[l].iter().enumerate() {
                if e.pinned || inuse.get(&(l, e.expert)).is_some_and(|&n| n > 0) {
                    continue;
                }
                let key = |x: &E| self.key(l, x);
                let better = best.is_none_or(|b| key(e) < key(&self.layers[l][b]));
                if better {
                    best = Some(i);
                }
            }
            let Some(b) = best else { return };
            self.layers[l].remove(b);
            self.evictions += 1;
        }
    }
    /// The eviction order's key of `x` in layer `l` (smallest first).
    fn key(&self, l: usize, x: &E) -> (u64, u64, u32) {
        match self.eviction {
            Eviction::Recency => (0, x.stamp, x.expert),
            Eviction::Frequency => (x.count, x.stamp, x.expert),
            Eviction::Predicted => (
                u64::from(self.scores[l][x.expert as usize]),
                x.stamp,
                x.expert,
            ),
        }
    }
    /// Whether inserting `e` of `bytes` evicts nothing scored as high as it (always, unless predicted).
    fn admits(&self, l: usize, e: u32, bytes: usize, inuse: &HashMap<(usize, u32), usize>) -> bool {
        if self.eviction != Eviction::Predicted {
            return true;
        }
        if e as usize >= EXPERTS[l] {
            return false;
        }
        let own = self.scores[l][e as usize];
        let mut free: Vec<&E> = self.layers[l]
            .iter()
            .filter(|x| !x.pinned && inuse.get(&(l, x.expert)).is_none_or(|&n| n == 0))
            .collect();
        free.sort_by_key(|x| self.key(l, x));
        let mut used = self.used(l);
        for x in free {
            if used + bytes <= self.shares[l] {
                break;
            }
            if self.scores[l][x.expert as usize] >= own {
                return false;
            }
            used -= x.bytes;
        }
        used + bytes <= self.shares[l]
    }
    fn get(&mut self, l: usize, e: u32) -> bool {
        self.clocks[l] += 1;
        let clock = self.clocks[l];
        if clock % AGE_EVERY == 0 {
            self.layers[l].iter_mut().for_each(|x| x.count /= 2);
        }
        match self.layers[l].iter_mut().find(|x| x.expert == e) {
            Some(x) => {
                x.count += 1;
                x.stamp = clock;
                self.hits += 1;
                true
            }
            None => {
                self.misses += 1;
                false
            }
        }
    }
    fn put(
        &mut self,
        l: usize,
        e: u32,
        bytes: usize,
        pinned: bool,
        inuse: &HashMap<(usize, u32), usize>,
    ) -> bool {
        if e as usize >= EXPERTS[l] {
            return false;
        }
        if let Some(x) = self.layers[l].iter_mut().find(|x| x.expert == e) {
            x.pinned |= pinned;
            return true;
        }
        if self.held(l, inuse) + bytes > self.shares[l] {
            return false;
        }
        self.evict_to(l, self.shares[l] - bytes, inuse);
        let stamp = self.clocks[l];
        self.layers[l].push(E {
            expert: e,
            bytes,
            count: 1,
            stamp,
            pinned,
        });
        self.insertions += 1;
        true
    }
    fn set_shares(&mut self, shares: &[usize], inuse: &HashMap<(usize, u32), usize>) -> bool {
        if shares.iter().sum::<usize>() > self.budget
            || (0..3).any(|l| self.held(l, inuse) > shares[l])
        {
            return false;
        }
        for (l, &s) in shares.iter().enumerate() {
            self.shares[l] = s;
            self.evict_to(l, s, inuse);
        }
        true
    }
}

fn resident(m: &Model, l: usize) -> Vec<u32> {
    let mut v: Vec<u32> = m.layers[l].iter().map(|e| e.expert).collect();
    v.sort();
    v
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn expert_cache_matches_its_model(ops in prop::collection::vec(op(), 1..300), order in 0usize..3) {
        let budget = 100;
        let eviction = [Eviction::Recency, Eviction::Frequency, Eviction::Predicted][order];
        let mut cache: ExpertCache<u32> = ExpertCache::new(&EXPERTS, budget).with_eviction(eviction);
        let mut model = Model::new(budget, eviction);
        let mut kept: Vec<((usize, u32), Arc<u32>)> = Vec::new();
        let mut inuse: HashMap<(usize, u32), usize> = HashMap::new();
        for op in ops {
            let id = |l: usize, e: u32| ExpertId { layer: l as u32, expert: e };
            match op {
                Op::Get(l, e, keep) => {
                    let got = cache.get(id(l, e));
                    prop_assert_eq!(got.is_some(), model.get(l, e));
                    if let (Some(v), true) = (got, keep) {
                        prop_assert_eq!(*v, e * 1000 + l as u32);
                        *inuse.entry((l, e)).or_default() += 1;
                        kept.push(((l, e), v));
                    }
                }
                Op::Insert(l, e, s, _) | Op::Pin(l, e, s) => {
                    let pinned = matches!(op, Op::Pin(..));
                    let keep = matches!(op, Op::Insert(_, _, _, true));
                    let v = Arc::new(e * 1000 + l as u32);
                    prop_assert_eq!(cache.admits(id(l, e), s), model.admits(l, e, s, &inuse), "admits {}/{}", l, e);
                    let r = if pinned { cache.pin(id(l, e), v, s) } else { cache.insert(id(l, e), v, s) };
                    prop_assert_eq!(r.is_ok(), model.put(l, e, s, pinned, &inuse), "{:?}", r);
                    if let (Ok(v), true) = (r, keep) {
                        *inuse.entry((l, e)).or_default() += 1;
                        kept.push(((l, e), v));
                    }
                }
                Op::Release(i) => {
                    if !kept.is_empty() {
                        let (k, v) = kept.swap_remove(i % kept.len());
                        drop(v);
                        *inuse.get_mut(&k).unwrap() -= 1;
                    }
                }
                Op::Shares(s) => {
                    let r = cache.set_shares(&s);
                    prop_assert_eq!(r.is_ok(), model.set_shares(&s, &inuse), "{:?}", r);
                }
                Op::Budget(b, w) => {
                    let sum: f64 = w.iter().sum();
                    let shares: Vec<usize> = (0..3).map(|l| match (EXPERTS[l], sum > 0.0) {
                        (0, _) => 0,
                        (_, true) => (b as f64 * w[l] / sum).floor() as usize,
                        (_, false) => b / 2,
                    }).collect();
                    let old = model.budget;
                    model.budget = b;
                    let ok = model.set_shares(&shares, &inuse);
                    if !ok { model.budget = old; }
                    prop_assert_eq!(cache.set_budget(b, &w).is_ok(), ok);
                }
                Op::Scores(l, s) => {
                    let f: Vec<f32> = s.iter().map(|&x| f32::from(x)).collect();
                    cache.set_scores(l, &f);
                    let n = EXPERTS[l].min(s.len());
                    model.scores[l][..n].copy_from_slice(&s[..n]);
                }
            }
            cache.check_invariants();
            prop_assert_eq!(cache.shares(), model.shares.clone());
            for l in 0..3 {
                prop_assert_eq!(cache.resident(l), resident(&model, l), "layer {}", l);
                prop_assert!(cache.layer_bytes(l) <= model.shares[l]);
                // Pinned and in-use experts are resident.
                for x in &model.layers[l] { prop_assert!(cache.contains(id(l, x.expert))); }
                for (&(kl, ke), &n) in &inuse {
                    if n > 0 { prop_assert!(cache.contains(id(kl, ke)), "in-use {}/{} evicted", kl, ke); }
                }
            }
            let st = cache.stats();
            prop_assert!(st.bytes <= cache.budget());
            prop_assert_eq!((st.hits, st.misses, st.insertions, st.evictions), (model.hits, model.misses, model.insertions, model.evictions));
        }
    }
}
