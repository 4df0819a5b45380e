//! [`SpecStats`]: what speculative decoding did in a generation (steps, drafted and kept tokens),
//! shared by the generation loop, its trace and the bench.

/// What speculation did in one generation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct SpecStats {
    /// Verification steps (forward steps after the prompt's).
    pub steps: usize,
    /// Tokens drafted and verified.
    pub drafted: usize,
    /// Drafted tokens kept.
    pub accepted: usize,
    /// Tokens run through verification steps (the chosen token of each step plus the drafted ones
    /// kept): these are the tokens whose keys and values the steps added.
    pub decoded: usize,
}

impl SpecStats {
    /// Share of drafted tokens kept (0 when none was drafted).
    pub fn acceptance_rate(&self) -> f64 {
        if self.drafted == 0 {
            0.0
        } else {
            self.accepted as f64 / self.drafted as f64
        }
    }

    /// Tokens kept per verification step (1 without speculation).
    pub fn tokens_per_step(&self) -> f64 {
        if self.steps == 0 {
            0.0
        } else {
            self.decoded as f64 / self.steps as f64
        }
    }

    /// Adds another generation's counts.
    pub fn add(&mut self, o: &SpecStats) {
        self.steps += o.steps;
        self.drafted += o.drafted;
        self.accepted += o.accepted;
        self.decoded += o.decoded;
    }
}
