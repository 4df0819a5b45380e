//! Prompt lookup ([`Lookup`], `--lookup N`): drafts by copying what followed an earlier occurrence
//! of the text's latest tokens, in the prompt or the output so far.

use crate::speculate::DraftSource;

/// Prompt lookup (n-gram drafting): finds the earlier occurrence of the history's latest tokens
/// that matches the most of them (the longest match, up to `max_match` tokens; the latest of equal
/// ones) and proposes the tokens that followed it.
///
/// How many it proposes follows the match length `m` (the source sizes its own drafts,
/// [`DraftSource::draft_len`]): a long match is usually code being copied (kept 95% of the time
/// at `m >= 8` on the code-editing prompts), a short one usually prose, where a drafted token is
/// mostly rejected and costs its share of the verification step. So `m` tokens are drafted when
/// `m >= 3` (up to the step's maximum), one when `m` is 2, and after a one-token match one only while
/// such drafts have been kept at least half the time in this generation (it starts at one kept of
/// two); nothing below `min_match`. Made anew for each generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lookup {
    /// Longest match measured (longer ones count as this long).
    pub max_match: usize,
    /// Shortest match that drafts (at least 1).
    pub min_match: usize,
    /// Drafts after a one-token match: kept (first token), tried.
    one_token: (u32, u32),
    /// The last draft after a one-token match: the history length then, its first token.
    pending: Option<(usize, u32)>,
}

impl Default for Lookup {
    fn default() -> Self {
        Lookup {
            max_match: 64,
            min_match: 1,
            one_token: (1, 2),
            pending: None,
        }
    }
}

/// The longest match of `history`'s last tokens earlier in it, at most `cap` long, the latest of
/// equal ones: `(m, from)`, the match length and where what followed it starts (`from <
/// history.len()`); `None` when the last token occurs nowhere earlier.
pub(crate) fn longest_match(history: &[u32], cap: usize) -> Option<(usize, usize)> {
    let (&last, before) = history.split_last()?;
    let len = history.len();
    let mut best: Option<(usize, usize)> = None;
    for j in (0..before.len()).rev() {
        if history[j] != last {
            continue;
        }
        let m = 1
            + (1..cap.max(1))
                .take_while(|&i| i <= j && history[j - i] == history[len - 1 - i])
                .count();
        if best.is_none_or(|(b, _)| m > b) {
            best = Some((m, j + 1));
            if m >= cap {
                break;
            }
        }
    }
    best
}

impl Lookup {
    /// Counts whether the last draft after a one-token match was kept (its first token is where
    /// the history went on).
    fn learn(&mut self, history: &[u32]) {
        if let Some((at, first)) = self.pending.take() {
            if let Some(&t) = history.get(at) {
                self.one_token.0 += u32::from(t == first);
                self.one_token.1 += 1;
            }
        }
    }
}

impl DraftSource for Lookup {
    fn draft(&mut self, history: &[u32], max: usize, out: &mut Vec<u32>) {
        self.learn(history);
        let Some((m, from)) = longest_match(history, self.max_match) else {
            return;
        };
        let n = match m {
            _ if m < self.min_match.max(1) => 0,
            1 if 2 * self.one_token.0 < self.one_token.1 => 0,
            1 | 2 => 1,
            _ => m,
        };
        let take = n.min(max).min(history.len() - from);
        if take == 0 {
            return;
        }
        if m == 1 {
            self.pending = Some((history.len(), history[from]));
        }
        out.extend_from_slice(&history[from..from + take]);
    }

    fn draft_len(&self, _adapted: usize, max: usize) -> usize {
        max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup(history: &[u32], max: usize) -> Vec<u32> {
        let mut out = Vec::new();
        Lookup::default().draft(history, max, &mut out);
        out
    }

    #[test]
    fn the_longest_match_wins_then_the_latest() {
        // "7 2 3" (3 tokens) beats the later "2 3" (2 tokens).
        assert_eq!(
            longest_match(&[7, 2, 3, 8, 2, 3, 5, 7, 2, 3], 64),
            Some((3, 3))
        );
        // Of equal matches, the latest.
        assert_eq!(longest_match(&[3, 1, 3, 2, 3], 64), Some((1, 3)));
        // The cap.
        assert_eq!(longest_match(&[1, 2, 3, 9, 1, 2, 3], 2), Some((2, 3)));
        assert_eq!(longest_match(&[1, 2, 3], 8), None);
        assert_eq!(longest_match(&[], 8), None);
    }

    #[test]
    fn the_draft_is_as_long_as_the_match() {
        // A 3-token match drafts 3 tokens (of the 4 that followed), capped by max.
        assert_eq!(lookup(&[1, 2, 3, 4, 5, 6, 9, 1, 2, 3], 8), vec![4, 5, 6]);
        assert_eq!(lookup(&[1, 2, 3, 4, 5, 6, 9, 1, 2, 3], 2), vec![4, 5]);
        // A match running into the end of the history stops there.
        assert_eq!(lookup(&[5, 5, 5, 5, 5], 8), vec![5]);
        // A 2-token match drafts one.
        assert_eq!(lookup(&[1, 2, 7, 8, 1, 2], 8), vec![7]);
        // A 1-token match drafts one to begin with.
        assert_eq!(lookup(&[3, 1, 3, 2, 3], 8), vec![2]);
        assert!(lookup(&[1, 2, 3], 4).is_empty());
        assert!(lookup(&[1, 2, 1], 0).is_empty());
        assert!(lookup(&[], 3).is_empty());
    }

    #[test]
    fn one_token_matches_stop_drafting_when_their_drafts_are_rejected() {
        let mut l = Lookup::default();
        let mut h = vec![1, 2, 9, 3, 1];
        let mut out = Vec::new();
        // "1" matched once: drafts "2"; the model goes on with 6 instead.
        l.draft(&h, 8, &mut out);
        assert_eq!(out, vec![2]);
        h.extend([6, 1]);
        // One kept of three (counting the start's one of two): no more drafts after a one-token
        // match (it would propose 6)...
        out.clear();
        l.draft(&h, 8, &mut out);
        assert!(out.is_empty(), "{out:?}");
        // ... while a longer match still drafts ("1 2 9": 3 tokens).
        h.extend([2, 9]);
        l.draft(&h, 8, &mut out);
        assert_eq!(out, vec![3, 1, 6]);
        // A fresh source drafts after the same one-token match.
        out.clear();
        Lookup::default().draft(&h[..7], 8, &mut out);
        assert_eq!(out, vec![6]);
    }
}
