//! Training samples of one layer and the deterministic random numbers that split and shuffle them.

use super::*;

// ---------------------------------------------------------------------------------------------------------
// Random numbers (deterministic, no dependency).

/// SplitMix64: small, fast, and good enough for shuffles and initialization.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x5851_f42d_4c95_7f2d)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `[0, 1)`.
    pub fn f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (((self.next_u64() >> 11) as u128 * n as u128) >> 53) as usize
    }
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i + 1);
            v.swap(i, j);
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// Dataset.

/// Training samples of one layer: inputs (`d_in` floats each) and the set of active neurons (a bitset of
/// `n_out` bits each).
#[derive(Debug, Clone, PartialEq)]
pub struct Dataset {
    pub(super) d_in: usize,
    pub(super) n_out: usize,
    pub(super) words: usize,
    pub(super) n: usize,
    pub(super) inputs: Vec<f32>,
    pub(super) labels: Vec<u64>,
}

impl Dataset {
    /// An empty dataset of `d_in`-wide inputs and `n_out` neurons.
    pub fn new(d_in: usize, n_out: usize) -> Self {
        Dataset {
            d_in,
            n_out,
            words: n_out.div_ceil(64),
            n: 0,
            inputs: Vec::new(),
            labels: Vec::new(),
        }
    }

    /// An empty dataset with room for `samples` samples (no reallocation while pushing that many).
    pub fn with_capacity(d_in: usize, n_out: usize, samples: usize) -> Self {
        let mut d = Self::new(d_in, n_out);
        d.inputs.reserve(samples.saturating_mul(d_in));
        d.labels.reserve(samples.saturating_mul(d.words));
        d
    }

    /// Input width.
    pub fn d_in(&self) -> usize {
        self.d_in
    }

    /// Number of neurons.
    pub fn n_out(&self) -> usize {
        self.n_out
    }

    /// Adds a sample: input `x` (`d_in` floats) and the indices of the active neurons (any order, each
    /// `< n_out`).
    pub fn push(&mut self, x: &[f32], active: &[u32]) -> Result<()> {
        self.check_x(x)?;
        if let Some(&j) = active.iter().find(|&&j| j as usize >= self.n_out) {
            return input_err(format!(
                "Dataset::push: neuron {j} out of range (n_out = {})",
                self.n_out
            ));
        }
        self.inputs.extend_from_slice(x);
        let base = self.labels.len();
        self.labels.resize(base + self.words, 0);
        self.n += 1;
        for &j in active {
            self.labels[base + j as usize / 64] |= 1 << (j % 64);
        }
        Ok(())
    }

    /// Adds a sample: input `x` (`d_in` floats) and `active(j)` for every neuron `j < n_out`.
    pub fn push_mask(&mut self, x: &[f32], active: impl Fn(usize) -> bool) -> Result<()> {
        self.check_x(x)?;
        self.inputs.extend_from_slice(x);
        let base = self.labels.len();
        self.labels.resize(base + self.words, 0);
        self.n += 1;
        for j in 0..self.n_out {
            if active(j) {
                self.labels[base + j / 64] |= 1 << (j % 64);
            }
        }
        Ok(())
    }

    fn check_x(&self, x: &[f32]) -> Result<()> {
        if x.len() != self.d_in {
            return input_err(format!(
                "Dataset: input has {} values, d_in is {}",
                x.len(),
                self.d_in
            ));
        }
        Ok(())
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.n
    }

    /// Whether there are no samples.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Input of sample `i` (`None` if out of range).
    pub fn input(&self, i: usize) -> Option<&[f32]> {
        let start = i.checked_mul(self.d_in)?;
        self.inputs.get(start..start.checked_add(self.d_in)?)
    }

    /// Whether neuron `j` is active in sample `i` (false if either is out of range).
    pub fn is_active(&self, i: usize, j: usize) -> bool {
        j < self.n_out
            && i < self.n
            && self
                .labels
                .get(i * self.words + j / 64)
                .is_some_and(|w| w >> (j % 64) & 1 == 1)
    }

    /// Fraction of (sample, neuron) pairs that are active (0 when empty).
    pub fn active_frac(&self) -> f32 {
        let total = self.len() * self.n_out;
        if total == 0 {
            return 0.0;
        }
        let ones: u64 = self.labels.iter().map(|w| u64::from(w.count_ones())).sum();
        (ones as f64 / total as f64) as f32
    }

    /// Splits into `(train, holdout)`: a seeded random `holdout` fraction (clamped to 0..=1, rounded down)
    /// goes to the second part.
    pub fn split(&self, holdout: f32, seed: u64) -> (Dataset, Dataset) {
        let n = self.len();
        let h = if holdout.is_nan() {
            0.0
        } else {
            holdout.clamp(0.0, 1.0)
        };
        let n_hold = ((f64::from(h) * n as f64).floor() as usize).min(n);
        let mut idx: Vec<usize> = (0..n).collect();
        Rng::new(seed).shuffle(&mut idx);
        let (hold, train) = idx.split_at(n_hold);
        (self.subset(train), self.subset(hold))
    }

    fn subset(&self, idx: &[usize]) -> Dataset {
        let mut d = Dataset::new(self.d_in, self.n_out);
        for &i in idx {
            d.inputs
                .extend_from_slice(&self.inputs[i * self.d_in..(i + 1) * self.d_in]);
            d.labels
                .extend_from_slice(&self.labels[i * self.words..(i + 1) * self.words]);
        }
        d.n = idx.len();
        d
    }
}
