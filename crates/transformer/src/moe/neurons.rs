//! [`NeuronTrace`]: which neurons of each expert a ReLU-family MoE model activates (an expert's
//! activation profile, the statistics neuron-level offload of experts starts from). While a trace is
//! alive, every expert step of the MoE block counts, per expert (named by its gate matrix's address),
//! the tokens it computed and, per neuron, those whose `act(gate·x) * (up·x)` was not zero. With
//! SiLU every neuron counts on nearly every token; with ReLU only the neurons whose gate fired.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// Live [`NeuronTrace`]s; while there is none, a block counts nothing (one relaxed load a step).
static TRACERS: AtomicUsize = AtomicUsize::new(0);
/// Per expert (its gate matrix's address): tokens computed and each neuron's count of non-zeros.
static COUNTS: Mutex<Option<HashMap<usize, ExpertNeurons>>> = Mutex::new(None);

/// What a [`NeuronTrace`] counted for one expert.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExpertNeurons {
    /// Tokens the expert computed.
    pub tokens: u64,
    /// Per neuron: tokens on which it was active (a non-zero activation).
    pub active: Vec<u64>,
}

impl ExpertNeurons {
    /// Active neurons per token over all neurons (0 when nothing was counted).
    pub fn density(&self) -> f64 {
        let total: u64 = self.active.iter().sum();
        total as f64 / (self.tokens.max(1) * self.active.len().max(1) as u64) as f64
    }

    /// Share of all activations that the most active `frac` of the neurons carry.
    pub fn top_share(&self, frac: f64) -> f64 {
        let mut c = self.active.clone();
        c.sort_unstable_by(|a, b| b.cmp(a));
        let k = ((c.len() as f64 * frac).round() as usize).min(c.len());
        let total: u64 = c.iter().sum();
        c[..k].iter().sum::<u64>() as f64 / total.max(1) as f64
    }
}

/// Counts the active neurons of every expert the MoE blocks of the process compute while it is
/// alive (tests and measurements run side by side, so callers look their own experts up by
/// address, [`NeuronTrace::of`]). Dropping the last trace clears the counts.
pub struct NeuronTrace(());

impl NeuronTrace {
    /// Starts counting.
    pub fn start() -> NeuronTrace {
        TRACERS.fetch_add(1, Ordering::SeqCst);
        NeuronTrace(())
    }

    /// What was counted for the expert whose gate matrix's bytes start at `gate`.
    pub fn of(&self, gate: *const u8) -> Option<ExpertNeurons> {
        let all = COUNTS.lock().unwrap_or_else(|e| e.into_inner());
        all.as_ref().and_then(|m| m.get(&(gate as usize)).cloned())
    }
}

impl Drop for NeuronTrace {
    fn drop(&mut self) {
        if TRACERS.fetch_sub(1, Ordering::SeqCst) == 1 {
            *COUNTS.lock().unwrap_or_else(|e| e.into_inner()) = None;
        }
    }
}

/// Counts the activations `h` (`m` tokens of `ff` neurons) of the expert whose gate starts at `gate`.
pub(crate) fn note(gate: *const u8, m: usize, ff: usize, h: &[f32]) {
    if TRACERS.load(Ordering::Relaxed) == 0 || ff == 0 {
        return;
    }
    let mut all = COUNTS.lock().unwrap_or_else(|e| e.into_inner());
    let e = all
        .get_or_insert_with(HashMap::new)
        .entry(gate as usize)
        .or_default();
    if e.active.len() != ff {
        e.active = vec![0; ff];
    }
    e.tokens += m as u64;
    for row in h[..m * ff].chunks(ff) {
        for (c, &v) in e.active.iter_mut().zip(row) {
            *c += u64::from(v != 0.0);
        }
    }
}

/// The active neurons of every expert of a model counted on calibration text (what a
/// [`NeuronTrace`] saw, per layer and expert): the order a neuron-major expert store writes each
/// expert's neurons in (most active first) and how many of them a step computes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExpertNeuronProfile {
    /// Per layer, per expert (none for a layer without experts).
    pub experts: Vec<Vec<ExpertNeurons>>,
}

impl ExpertNeuronProfile {
    /// The `ff` neurons of expert `e` of layer `l`, most often active first (ties and neurons never
    /// counted: by id).
    pub fn order(&self, l: usize, e: usize, ff: usize) -> Vec<u32> {
        let counts = self.counts(l, e, ff);
        let mut order: Vec<u32> = (0..ff as u32).collect();
        order.sort_by_key(|&j| std::cmp::Reverse(counts[j as usize]));
        order
    }

    /// How many neurons at the front of [`Self::order`] carry at least `recall` of the expert's
    /// counted activations (all `ff` when `recall >= 1` or nothing was counted).
    pub fn prefix(&self, l: usize, e: usize, ff: usize, recall: f64) -> usize {
        let mut counts = self.counts(l, e, ff);
        let total: u64 = counts.iter().sum();
        if recall >= 1.0 || total == 0 {
            return ff;
        }
        counts.sort_unstable_by(|a, b| b.cmp(a));
        let mut sum = 0u64;
        for (i, c) in counts.iter().enumerate() {
            sum += c;
            if sum as f64 >= recall * total as f64 {
                return i + 1;
            }
        }
        ff
    }

    fn counts(&self, l: usize, e: usize, ff: usize) -> Vec<u64> {
        match self.experts.get(l).and_then(|x| x.get(e)) {
            Some(x) if x.active.len() == ff => x.active.clone(),
            _ => vec![0; ff],
        }
    }
}
