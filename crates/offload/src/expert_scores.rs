//! The scores [`crate::ExpertOffload`] hands an expert cache that evicts by prediction
//! (`neuron_cache::Eviction::Predicted`): per layer, how soon each expert is likely wanted again,
//! from the layer's router logits.
//!
//! Each layer keeps a few moving averages of its tokens' logits, from fast (recent tokens: routers
//! pick many of the previous token's experts again, and those ranked just below the chosen ones) to
//! slow (popular experts); each token's logits count `1 - memory` in an average. A further candidate
//! ranks each expert by its better rank in the fastest and the slowest average (the cache then holds
//! half of each one's top, as ARC keeps a recent and a frequent list), and a last one counts how
//! often each expert was picked (a slowly decaying count: what a fixed set of the experts asked for
//! most would keep, when the routing has no order to follow). Which candidate the cache is
//! given is decided per layer by a duel of shadow caches: before a token's logits are folded in,
//! each candidate's top `capacity` experts (as many as the layer's share of the cache holds) are
//! counted against the experts the token picked, and the candidate with the most hits lately (a
//! decaying tally) wins. The averages start from the routing profile's log shares when there is one.

/// One layer's averages and pick counts, and the candidates' tallies: one per memory, then the
/// union's, then the counts'.
#[derive(Debug, Clone, Default)]
struct Layer {
    avgs: Vec<Vec<f32>>,
    /// How often each expert was picked, each token's picks counting one and the past decaying by
    /// [`PICKS_KEEP`] a token.
    picks: Vec<f32>,
    /// Decaying count of each candidate's shadow hits.
    tally: Vec<f32>,
}

/// Which candidate a layer's duel picks.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Candidate {
    /// An average, by its index.
    Avg(usize),
    /// The union of the fastest and the slowest average.
    Union,
    /// The pick counts.
    Picks,
}

impl Layer {
    /// The union candidate's scores: minus each expert's better rank in the first and last average.
    fn union(&self) -> Vec<f32> {
        let (Some(a), Some(b)) = (self.avgs.first(), self.avgs.last()) else {
            return Vec::new();
        };
        if a.len() != b.len() {
            return Vec::new();
        }
        let mut best = vec![usize::MAX; a.len()];
        for avg in [a, b] {
            for (r, i) in top(avg, avg.len()).into_iter().enumerate() {
                best[i] = best[i].min(r);
            }
        }
        best.iter().map(|&r| -(r as f32)).collect()
    }
}

/// Weight of the past in the duel's tallies, per token.
const TALLY_KEEP: f32 = 0.9;

/// Weight of the past in the pick counts, per token (a memory of about a thousand tokens).
const PICKS_KEEP: f32 = 0.999;

/// The picks the routing profile's shares stand for at the start (those of 32 tokens of 8 picks).
const PRIOR_PICKS: f32 = 256.0;

/// Every layer's scores (see the module docs).
#[derive(Debug, Clone)]
pub(crate) struct ExpertScores {
    layers: Vec<Layer>,
    /// Weight of the past in each average.
    memory: Vec<f32>,
}

/// The indices of the `k` largest of `row` (ties to the lower index).
fn top(row: &[f32], k: usize) -> Vec<usize> {
    let mut ix: Vec<usize> = (0..row.len()).collect();
    ix.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
    ix.truncate(k);
    ix
}

impl ExpertScores {
    /// Scores for `layers` layers, one average per entry of `memory` (the weight of the past).
    pub(crate) fn new(layers: usize, memory: &[f32]) -> Self {
        let memory: Vec<f32> = memory.iter().map(|m| m.clamp(0.0, 1.0)).collect();
        let layer = Layer {
            avgs: vec![Vec::new(); memory.len()],
            picks: Vec::new(),
            tally: vec![0.0; memory.len() + 2],
        };
        ExpertScores {
            layers: vec![layer; layers],
            memory,
        }
    }

    /// Starts layer `l`'s averages at `prior` (the log of each expert's share of the profile's
    /// picks), and its pick counts at those shares of [`PRIOR_PICKS`].
    pub(crate) fn prior(&mut self, l: usize, prior: &[f32]) {
        if let Some(x) = self.layers.get_mut(l) {
            x.avgs.iter_mut().for_each(|a| *a = prior.to_vec());
            x.picks = prior.iter().map(|&p| PRIOR_PICKS * p.exp()).collect();
        }
    }

    /// The candidate the duel picks for layer `l` (the first of the best tallies; `None` without
    /// layer `l`).
    fn chosen(&self, l: usize) -> Option<Candidate> {
        let x = self.layers.get(l)?;
        let best = (0..x.tally.len()).reduce(|a, b| if x.tally[b] > x.tally[a] { b } else { a })?;
        let n = x.avgs.len();
        Some(match best {
            i if i < n => Candidate::Avg(i),
            i if i == n => Candidate::Union,
            _ => Candidate::Picks,
        })
    }

    /// Layer `l`'s scores by the candidate the duel picks.
    fn scores(&self, l: usize) -> Vec<f32> {
        let Some(x) = self.layers.get(l) else {
            return Vec::new();
        };
        match self.chosen(l) {
            Some(Candidate::Avg(i)) => x.avgs[i].clone(),
            Some(Candidate::Picks) => x.picks.clone(),
            _ => x.union(),
        }
    }

    /// Folds `n` tokens' logits of layer `l` (`e` a token, `k` of them picked, the layer's cache
    /// holding `capacity` experts) into its averages; returns the scores to give the cache.
    pub(crate) fn observe(
        &mut self,
        l: usize,
        logits: &[f32],
        (e, k): (usize, usize),
        n: usize,
        capacity: usize,
    ) -> Vec<f32> {
        if l >= self.layers.len() || e == 0 {
            return Vec::new();
        }
        let x = &mut self.layers[l];
        for row in logits.chunks_exact(e).take(n) {
            let picked = top(row, k);
            let hits = |s: &[f32]| {
                let held = top(s, capacity);
                picked.iter().filter(|p| held.contains(p)).count() as f32
            };
            let union = x.union();
            let n_avgs = x.avgs.len();
            if union.len() == e {
                x.tally[n_avgs] = TALLY_KEEP * x.tally[n_avgs] + hits(&union);
            }
            if x.picks.len() == e {
                x.tally[n_avgs + 1] = TALLY_KEEP * x.tally[n_avgs + 1] + hits(&x.picks);
            } else {
                x.picks = vec![0.0; e];
            }
            x.picks.iter_mut().for_each(|p| *p *= PICKS_KEEP);
            for &p in &picked {
                x.picks[p] += 1.0;
            }
            for ((avg, tally), &keep) in x.avgs.iter_mut().zip(&mut x.tally).zip(&self.memory) {
                if avg.len() != e {
                    *avg = row.to_vec();
                    continue;
                }
                *tally = TALLY_KEEP * *tally + hits(avg);
                avg.iter_mut()
                    .zip(row)
                    .for_each(|(a, &v)| *a = keep * *a + (1.0 - keep) * v);
            }
        }
        self.scores(l)
    }

    /// Layer `l`'s scores were `logits` (the last of `n` rows of `e`: the layer's router applied
    /// ahead) folded in, without folding them in.
    pub(crate) fn ahead(&self, l: usize, logits: &[f32], e: usize, n: usize) -> Vec<f32> {
        if e == 0 || n == 0 || logits.len() < n * e {
            return Vec::new();
        }
        let row = &logits[(n - 1) * e..n * e];
        let Some(x) = self.layers.get(l) else {
            return row.to_vec();
        };
        // The union and the counts: the predicted token's picks first, then the candidate's order.
        let first = |u: &[f32], top_score: f32| {
            let picked = top(row, (e / 16).max(1));
            u.iter()
                .enumerate()
                .map(|(i, &s)| if picked.contains(&i) { top_score } else { s })
                .collect()
        };
        match self.chosen(l) {
            Some(Candidate::Avg(i)) if x.avgs[i].len() == e => {
                let keep = self.memory[i];
                x.avgs[i]
                    .iter()
                    .zip(row)
                    .map(|(&a, &v)| keep * a + (1.0 - keep) * v)
                    .collect()
            }
            Some(Candidate::Union) => {
                let u = x.union();
                if u.len() != e {
                    return row.to_vec();
                }
                first(&u, 1.0)
            }
            Some(Candidate::Picks) if x.picks.len() == e => {
                let most = x.picks.iter().copied().fold(0.0f32, f32::max);
                first(&x.picks, most + 1.0)
            }
            _ => row.to_vec(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Logits of 8 experts where `picked` score 5 and the rest 0.
    fn row(picked: &[usize]) -> Vec<f32> {
        (0..8)
            .map(|i| if picked.contains(&i) { 5.0 } else { 0.0 })
            .collect()
    }

    fn top2(s: &[f32]) -> Vec<usize> {
        let mut t = top(s, 2);
        t.sort();
        t
    }

    #[test]
    fn the_duel_follows_a_drifting_routing_with_the_fast_average() {
        let mut sc = ExpertScores::new(1, &[0.3, 0.8, 0.99]);
        let mut s = Vec::new();
        // Each pair of experts is picked for 4 tokens, then the next pair.
        for t in 0..40 {
            let a = (t / 4) % 8;
            s = sc.observe(0, &row(&[a, (a + 1) % 8]), (8, 2), 1, 2);
        }
        assert_eq!(top2(&s), vec![1, 2], "{s:?}");
        assert_eq!(sc.chosen(0), Some(Candidate::Avg(0)));
    }

    #[test]
    fn the_duel_keeps_popular_experts_with_the_slow_average() {
        let mut sc = ExpertScores::new(1, &[0.3, 0.8, 0.99]);
        let mut s = Vec::new();
        // Experts 0 and 1 on two tokens of three; the third picks a pair of the others in turn.
        for t in 0..60 {
            let picked = if t % 3 == 2 {
                let a = 2 + (t / 3) % 3 * 2;
                vec![a, a + 1]
            } else {
                vec![0, 1]
            };
            s = sc.observe(0, &row(&picked), (8, 2), 1, 2);
        }
        // The last token picked two others: the fast average would hold them now.
        assert_eq!(top2(&s), vec![0, 1], "{s:?}");
        assert_ne!(sc.chosen(0), Some(Candidate::Avg(0)));
    }

    #[test]
    fn the_duel_takes_the_pick_counts_where_the_logits_mislead() {
        let mut sc = ExpertScores::new(1, &[0.3, 0.8, 0.99]);
        let mut s = Vec::new();
        // Expert 6 is picked on four tokens of five with a small lead; expert 1 on the fifth with
        // a huge one, which every average of the logits ranks first for many tokens after.
        for t in 0..60 {
            let mut r = vec![0.0; 8];
            if t % 5 == 4 {
                r[1] = 100.0;
            } else {
                r[6] = 1.0;
            }
            s = sc.observe(0, &r, (8, 1), 1, 1);
        }
        assert_eq!(sc.chosen(0), Some(Candidate::Picks));
        assert_eq!(top(&s, 1), vec![6], "{s:?}");
    }

    #[test]
    fn scores_ahead_do_not_change_the_averages() {
        let mut sc = ExpertScores::new(1, &[0.3, 0.99]);
        let before = sc.observe(0, &row(&[0, 1]), (8, 2), 1, 2);
        let ahead = sc.ahead(0, &row(&[6, 7]), 8, 1);
        assert_eq!(top2(&ahead), vec![6, 7]);
        assert_eq!(sc.observe(0, &[], (8, 2), 0, 2), before);
    }
}
