//! Choices, their cost under the [`Tables`], and the default solver: an exhaustive walk over threads,
//! queue depth and dense/sparse (every layer alike, or in memory each layer where its predictor
//! pays), with memory handed out by benefit per byte (OATO's Algorithm 1: every
//! candidate, a further step of a layer's neuron cache or a tensor kept in memory, ordered by the time
//! it saves per byte, re-sorted as memory fills). [`brute_force`] tries every combination and is the
//! reference the tests hold the solvers to; `solve_z3` (feature `z3`) is exact.

use crate::error::{PlannerError, Result};
use crate::tables::Tables;

/// One configuration: an index into each of the tables' choices.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Choice {
    /// Index into `Tables::threads`.
    pub threads: usize,
    /// Index into `Tables::queue_depths`.
    pub queue_depth: usize,
    /// Sparse FFN per layer (else dense, which needs every neuron of the layer in memory). Over a
    /// store every layer is the same (the engine runs one kind of step over it).
    pub sparse: Vec<bool>,
    /// Grid step of each layer's neuron cache.
    pub steps: Vec<u32>,
    /// Whether each tensor outside the FFN stays in memory.
    pub resident: Vec<bool>,
}

/// The cost of a choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cost {
    /// `T_attn` (with tensors read from flash), ns.
    pub attn_ns: u64,
    /// `T_pred`, ns.
    pub pred_ns: u64,
    /// `T_ffn`, ns.
    pub ffn_ns: u64,
    /// `T_io`, ns.
    pub io_ns: u64,
    /// `T_decode = T_attn + T_pred + max(T_ffn, T_io)`, ns.
    pub decode_ns: u64,
    /// Memory, bytes.
    pub memory: u64,
}

impl Tables {
    /// Whether `c` is a configuration these tables describe (indices in range, a dense layer only
    /// with every neuron cached, non-offloadable tensors resident, an in-memory FFN fully cached,
    /// every layer alike over a store).
    pub fn admits(&self, c: &Choice) -> bool {
        c.threads < self.threads.len()
            && c.queue_depth < self.queue_depths.len()
            && c.steps.len() == self.layers()
            && c.resident.len() == self.tensors.len()
            && c.sparse.len() == self.layers()
            && c.steps.iter().all(|&j| j <= self.grid)
            && c.steps
                .iter()
                .zip(&c.sparse)
                .all(|(&j, &s)| s && self.offloaded || j == self.grid)
            && (!self.offloaded || c.sparse.iter().all(|&s| s == c.sparse[0]))
            && c.resident.iter().zip(&self.tensors).all(|(&r, t)| r || t.2)
    }

    /// The cost of `c` (which `admits`).
    pub fn cost(&self, c: &Choice) -> Cost {
        let stream: u64 = c
            .resident
            .iter()
            .zip(&self.tensors)
            .filter(|(r, _)| !**r)
            .map(|(_, t)| t.1)
            .sum();
        let attn_ns = self.attn_ns[c.threads] + stream;
        let (mut pred_ns, mut ffn_ns) = (0, 0);
        for (l, &s) in c.sparse.iter().enumerate() {
            if s {
                pred_ns += self.pred_ns[c.threads][l];
                ffn_ns += self.ffn_sparse_ns[c.threads][l];
            } else {
                ffn_ns += self.ffn_dense_ns[c.threads][l];
            }
        }
        let io_ns: u64 = c
            .steps
            .iter()
            .enumerate()
            .map(|(l, &j)| self.io_ns[c.queue_depth][l][j as usize])
            .sum();
        let memory = self.fixed_bytes
            + c.sparse
                .iter()
                .zip(&self.pred_bytes)
                .filter(|(s, _)| **s)
                .map(|(_, b)| b)
                .sum::<u64>()
            + c.resident
                .iter()
                .zip(&self.tensors)
                .filter(|(r, _)| **r)
                .map(|(_, t)| t.0)
                .sum::<u64>()
            + c.steps
                .iter()
                .enumerate()
                .map(|(l, &j)| self.cache_bytes[l][j as usize])
                .sum::<u64>();
        Cost {
            attn_ns,
            pred_ns,
            ffn_ns,
            io_ns,
            decode_ns: attn_ns + pred_ns + ffn_ns.max(io_ns),
            memory,
        }
    }

    /// The smallest memory any configuration needs: sparse with nothing cached, or dense with every
    /// neuron cached (without predictors), each with everything offloadable on flash.
    pub fn min_memory(&self) -> u64 {
        let resident: Vec<bool> = self.tensors.iter().map(|t| !t.2).collect();
        let dense = Choice {
            threads: 0,
            queue_depth: 0,
            sparse: vec![false; self.layers()],
            steps: vec![self.grid; self.layers()],
            resident: resident.clone(),
        };
        let mut min = self.cost(&dense).memory;
        if self.offloaded {
            let sparse = Choice {
                sparse: vec![true; self.layers()],
                steps: vec![0; self.layers()],
                ..dense
            };
            min = min.min(self.cost(&sparse).memory);
        }
        min
    }
}

/// `a` decodes faster than `b`, or as fast in less memory, or as fast in as much with a deeper queue
/// (where reads do not bound a step, or the envelope of [`crate::DeviceProfile::io_rate`] evened
/// the depths out, more reads in flight cost nothing and leave room for a burst of misses).
fn better(a: &(Choice, Cost), b: &Option<(Choice, Cost)>) -> bool {
    match b {
        None => true,
        Some((bq, bc)) => {
            let (ka, kb) = ((a.1.decode_ns, a.1.memory), (bc.decode_ns, bc.memory));
            ka < kb || (ka == kb && a.0.queue_depth > bq.queue_depth)
        }
    }
}

fn infeasible(t: &Tables, budget: u64) -> PlannerError {
    PlannerError::Infeasible(format!(
        "the budget of {:.1} MiB is below the {:.1} MiB the smallest configuration needs (KV cache, resident weights, process)",
        budget as f64 / 1048576.0,
        t.min_memory() as f64 / 1048576.0
    ))
}

/// The default solver (see the module docs). Returns the fastest configuration found within
/// `budget`, ties broken by less memory, then by the deeper queue.
pub fn search(t: &Tables, budget: u64) -> Result<(Choice, Cost)> {
    let mut best: Option<(Choice, Cost)> = None;
    for ti in 0..t.threads.len() {
        for qi in 0..t.queue_depths.len() {
            for sparse in patterns(t, ti, budget) {
                let cand = allocate(t, ti, qi, sparse, budget);
                if let Some(c) = cand {
                    if better(&c, &best) {
                        best = Some(c);
                    }
                }
            }
        }
    }
    best.ok_or_else(|| infeasible(t, budget))
}

/// The dense/sparse patterns worth placing memory for at thread choice `ti`: every layer dense,
/// every layer sparse and, where the FFN is in memory (each layer then its own choice, and the
/// predictors the only memory it moves), the layers whose predictor saves time, taken by time saved
/// per predictor byte while they fit.
fn patterns(t: &Tables, ti: usize, budget: u64) -> Vec<Vec<bool>> {
    let layers = t.layers();
    let mut out = vec![vec![false; layers], vec![true; layers]];
    if t.offloaded {
        return out;
    }
    let saving = |l: usize| {
        t.ffn_dense_ns[ti][l] as i64 - (t.ffn_sparse_ns[ti][l] + t.pred_ns[ti][l]) as i64
    };
    let mut order: Vec<usize> = (0..layers).filter(|&l| saving(l) > 0).collect();
    let per_byte = |l: usize| saving(l) as f64 / t.pred_bytes[l].max(1) as f64;
    order.sort_by(|&a, &b| per_byte(b).total_cmp(&per_byte(a)));
    // In memory the smallest configuration is every layer dense, whatever the threads.
    let mut used = t.min_memory();
    let mut mixed = vec![false; layers];
    for l in order {
        if used + t.pred_bytes[l] <= budget {
            used += t.pred_bytes[l];
            mixed[l] = true;
        }
    }
    if !out.contains(&mixed) {
        out.push(mixed);
    }
    out
}

/// Memory by benefit per byte for one (threads, depth, dense/sparse pattern) choice.
fn allocate(
    t: &Tables,
    ti: usize,
    qi: usize,
    sparse: Vec<bool>,
    budget: u64,
) -> Option<(Choice, Cost)> {
    let mut c = Choice {
        threads: ti,
        queue_depth: qi,
        // Dense layers, and an FFN that is not offloaded, hold every neuron.
        steps: sparse
            .iter()
            .map(|&s| if s && t.offloaded { 0 } else { t.grid })
            .collect(),
        sparse,
        resident: t.tensors.iter().map(|x| !x.2).collect(),
    };
    let mut used = t.cost(&c).memory;
    if used > budget {
        return None;
    }
    loop {
        // Candidates: one more step of a layer, or one more tensor kept; benefit per byte.
        let mut pick: Option<(f64, usize, bool)> = None;
        for (l, &j) in c.steps.iter().enumerate() {
            if j < t.grid {
                let bytes = t.cache_bytes[l][j as usize + 1] - t.cache_bytes[l][j as usize];
                let saved = t.io_ns[qi][l][j as usize] - t.io_ns[qi][l][j as usize + 1];
                if used + bytes <= budget {
                    let r = saved as f64 / bytes.max(1) as f64;
                    if pick.is_none_or(|p| r > p.0) {
                        pick = Some((r, l, false));
                    }
                }
            }
        }
        for (i, (&r, x)) in c.resident.iter().zip(&t.tensors).enumerate() {
            if !r && used + x.0 <= budget {
                let ratio = x.1 as f64 / x.0.max(1) as f64;
                if pick.is_none_or(|p| ratio > p.0) {
                    pick = Some((ratio, i, true));
                }
            }
        }
        match pick {
            None => break,
            Some((_, i, true)) => {
                c.resident[i] = true;
                used += t.tensors[i].0;
            }
            Some((_, l, false)) => {
                let j = c.steps[l] as usize;
                used += t.cache_bytes[l][j + 1] - t.cache_bytes[l][j];
                c.steps[l] += 1;
            }
        }
    }
    let cost = t.cost(&c);
    Some((c, cost))
}

/// Every combination (exponential: small grids only); the reference for the solvers' tests.
pub fn brute_force(t: &Tables, budget: u64) -> Result<(Choice, Cost)> {
    let layers = t.layers();
    let steps_total = (t.grid as u64 + 1).checked_pow(layers as u32);
    let patterns = 1u64.checked_shl(layers as u32).filter(|&p| p <= 1 << 16);
    let combos = steps_total
        .and_then(|s| s.checked_mul(1u64 << t.tensors.len().min(63)))
        .filter(|&n| patterns.is_some_and(|p| n.saturating_mul(p) <= 50_000_000))
        .ok_or_else(|| PlannerError::Input("brute force over too large a grid".into()))?;
    let patterns = patterns.expect("checked above");
    let mut best: Option<(Choice, Cost)> = None;
    for ti in 0..t.threads.len() {
        for qi in 0..t.queue_depths.len() {
            for pattern in 0..patterns {
                let sparse: Vec<bool> = (0..layers).map(|l| pattern >> l & 1 == 1).collect();
                for code in 0..combos {
                    let mut rest = code;
                    let mut steps = Vec::with_capacity(layers);
                    for _ in 0..layers {
                        steps.push((rest % (t.grid as u64 + 1)) as u32);
                        rest /= t.grid as u64 + 1;
                    }
                    let resident = (0..t.tensors.len()).map(|i| rest >> i & 1 == 1).collect();
                    let c = Choice {
                        threads: ti,
                        queue_depth: qi,
                        sparse: sparse.clone(),
                        steps,
                        resident,
                    };
                    if !t.admits(&c) {
                        continue;
                    }
                    let cost = t.cost(&c);
                    if cost.memory <= budget {
                        let cand = (c, cost);
                        if better(&cand, &best) {
                            best = Some(cand);
                        }
                    }
                }
            }
        }
    }
    best.ok_or_else(|| infeasible(t, budget))
}
