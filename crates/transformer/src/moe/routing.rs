//! The router's decision for a token: softmax over every expert's logit, the `k` most probable
//! experts, their weights normalised as the family says ([`TopKNorm`]); and the grouping of a
//! step's tokens by expert, so each expert's rows are read once for all the tokens that chose it.

use super::family::TopKNorm;

/// llama.cpp clamps the sum of the selected weights below at the smallest normal f16 (2^-14,
/// its `6.103515625e-5`) before dividing by it (`build_moe_ffn`).
pub const MIN_WEIGHT_SUM: f32 = 1.0 / 16384.0;

/// One selected expert of a token and the weight of its output.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Route {
    /// The expert.
    pub expert: u32,
    /// The weight its output is multiplied by.
    pub weight: f32,
}

/// Routes one token: `logits` (one per expert) become probabilities by a softmax over all of them,
/// the `k` largest are kept (ties to the lower expert index), in decreasing order, normalised by
/// `norm`; they are written to `out` (cleared first). `probs` is scratch of `logits.len()`.
pub fn route(logits: &[f32], k: usize, norm: TopKNorm, probs: &mut Vec<f32>, out: &mut Vec<Route>) {
    out.clear();
    probs.clear();
    probs.extend_from_slice(logits);
    if probs.is_empty() {
        return;
    }
    let max = probs.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f32;
    for p in probs.iter_mut() {
        *p = (*p - max).exp();
        sum += *p;
    }
    probs.iter_mut().for_each(|p| *p /= sum);
    let k = k.min(probs.len());
    for _ in 0..k {
        // k is small (8 of 128 at most in the families here): k linear scans beat a sort.
        let mut best: Option<usize> = None;
        for (e, &p) in probs.iter().enumerate() {
            let taken = out.iter().any(|r| r.expert as usize == e);
            if !taken && best.is_none_or(|b| p > probs[b] || probs[b].is_nan()) {
                best = Some(e);
            }
        }
        let Some(e) = best else { break };
        out.push(Route {
            expert: e as u32,
            weight: probs[e],
        });
    }
    if norm == TopKNorm::Renormalize {
        let s = out
            .iter()
            .map(|r| r.weight)
            .sum::<f32>()
            .max(MIN_WEIGHT_SUM);
        out.iter_mut().for_each(|r| r.weight /= s);
    }
}

/// A step's routes grouped by expert: for each expert, the tokens that chose it and their weights.
#[derive(Debug, Default, Clone)]
pub struct ExpertGroups {
    /// `starts[e]..starts[e + 1]` indexes `tokens` and `weights` for expert `e`.
    starts: Vec<usize>,
    tokens: Vec<u32>,
    weights: Vec<f32>,
}

impl ExpertGroups {
    /// Groups `routes` (`k` per token, token-major) over `n_experts` experts, tokens in order
    /// within each expert. Routes naming an expert `>= n_experts` are dropped (the router has one
    /// row per expert, so none do).
    pub fn build(&mut self, routes: &[Route], k: usize, n_experts: usize) {
        self.starts.clear();
        self.starts.resize(n_experts + 1, 0);
        let valid = |r: &Route| (r.expert as usize) < n_experts;
        for r in routes.iter().filter(|r| valid(r)) {
            self.starts[r.expert as usize + 1] += 1;
        }
        for e in 0..n_experts {
            self.starts[e + 1] += self.starts[e];
        }
        let total = self.starts[n_experts];
        self.tokens.clear();
        self.tokens.resize(total, 0);
        self.weights.clear();
        self.weights.resize(total, 0.0);
        let mut next = self.starts.clone();
        for (i, r) in routes.iter().enumerate().filter(|(_, r)| valid(r)) {
            let slot = &mut next[r.expert as usize];
            self.tokens[*slot] = (i / k.max(1)) as u32;
            self.weights[*slot] = r.weight;
            *slot += 1;
        }
    }

    /// Experts that have at least one token, with their tokens and weights.
    pub fn iter(&self) -> impl Iterator<Item = (usize, &[u32], &[f32])> + '_ {
        self.starts
            .windows(2)
            .enumerate()
            .filter(|(_, w)| w[1] > w[0])
            .map(|(e, w)| (e, &self.tokens[w[0]..w[1]], &self.weights[w[0]..w[1]]))
    }

    /// Tokens routed to expert `e` (0 for an expert out of range).
    pub fn load(&self, e: usize) -> usize {
        match (self.starts.get(e), self.starts.get(e + 1)) {
            (Some(a), Some(b)) => b - a,
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn softmax(x: &[f32]) -> Vec<f32> {
        let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let e: Vec<f32> = x.iter().map(|v| (v - m).exp()).collect();
        let s: f32 = e.iter().sum();
        e.iter().map(|v| v / s).collect()
    }

    #[test]
    fn top_k_raw_and_renormalised() {
        let logits = [0.5, 2.0, -1.0, 1.5, 2.0, 0.0];
        let p = softmax(&logits);
        let (mut probs, mut out) = (Vec::new(), Vec::new());
        route(&logits, 3, TopKNorm::Raw, &mut probs, &mut out);
        let experts: Vec<u32> = out.iter().map(|r| r.expert).collect();
        // Ties (experts 1 and 4) go to the lower index first.
        assert_eq!(experts, [1, 4, 3]);
        for r in &out {
            assert!((r.weight - p[r.expert as usize]).abs() < 1e-6);
        }
        route(&logits, 3, TopKNorm::Renormalize, &mut probs, &mut out);
        let s = p[1] + p[4] + p[3];
        for r in &out {
            assert!((r.weight - p[r.expert as usize] / s).abs() < 1e-6);
        }
        assert!((out.iter().map(|r| r.weight).sum::<f32>() - 1.0).abs() < 1e-6);
        // Renormalising the top-k of a softmax is a softmax over the selected logits (Mixtral).
        let sel = softmax(&[2.0, 2.0, 1.5]);
        for (r, q) in out.iter().zip(sel) {
            assert!((r.weight - q).abs() < 1e-6);
        }
    }

    #[test]
    fn groups_follow_the_routes() {
        let r = |expert, weight| Route { expert, weight };
        // 3 tokens, k = 2, 4 experts.
        let routes = [
            r(2, 0.6),
            r(0, 0.4),
            r(2, 0.9),
            r(3, 0.1),
            r(0, 0.5),
            r(1, 0.5),
        ];
        let mut g = ExpertGroups::default();
        g.build(&routes, 2, 4);
        let got: Vec<(usize, Vec<u32>, Vec<f32>)> = g
            .iter()
            .map(|(e, t, w)| (e, t.to_vec(), w.to_vec()))
            .collect();
        assert_eq!(
            got,
            vec![
                (0, vec![0, 2], vec![0.4, 0.5]),
                (1, vec![2], vec![0.5]),
                (2, vec![0, 1], vec![0.6, 0.9]),
                (3, vec![1], vec![0.1]),
            ]
        );
        assert_eq!((g.load(0), g.load(1), g.load(4)), (2, 1, 0));
    }
}
