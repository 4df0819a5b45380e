//! [`Bpe`]: byte-level BPE over a GGUF vocabulary in a compact form, as a `tokenizers` model.
//!
//! `tokenizers`' own `BPE` holds the vocabulary twice (string to id and id to string, a `String`
//! per entry each way) and its merges in a map: about 22 MiB for a 151,936-token vocabulary
//! (Qwen2.5), a fifth of a 105 MiB memory budget. This one reads the strings from the tokenizer's
//! [`Pieces`] (one text buffer), finds ids by a table of 4-byte ids hashed by their strings, and
//! keeps the merges as one map of id pairs: 5.5 MiB beside the pieces' 2.5 (heaptrack, Qwen2.5). It merges as that `BPE`
//! does with no dropout, unknown token, byte fallback or affixes (the configuration
//! `crate::tokenizer` builds): each character of a pre-token looked up (one not in the vocabulary
//! dropped), then the pair of lowest rank merged first, the leftmost of equal ranks, until no
//! pair merges; with `ignore_merges` a pre-token in the vocabulary is one token.

use std::collections::{BinaryHeap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ahash::RandomState;
use hashbrown::HashTable;
use tokenizers::models::bpe::{BpeTrainer, BPE};
use tokenizers::models::TrainerWrapper;
use tokenizers::{Model, Token};

use crate::pieces::Pieces;

/// Byte-level BPE over [`Pieces`] (see the module's description).
#[derive(Clone)]
pub(crate) struct Bpe {
    pieces: Arc<Pieces>,
    /// The id of each string (the first id of a string that repeats), hashed by `hasher`.
    index: HashTable<u32>,
    hasher: RandomState,
    /// `(left << 32) | right` to `(rank << 32) | merged id`; a pair listed twice keeps its later
    /// rank, as `BPE` does.
    merges: HashMap<u64, u64, RandomState>,
    ignore_merges: bool,
}

impl std::fmt::Debug for Bpe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bpe")
            .field("vocab_size", &self.pieces.len())
            .field("merges", &self.merges.len())
            .field("ignore_merges", &self.ignore_merges)
            .finish()
    }
}

/// A symbol of a word being merged: its id, its byte length and its neighbours (`usize::MAX`: none).
#[derive(Clone, Copy)]
struct Symbol {
    id: u32,
    len: usize,
    prev: usize,
    next: usize,
}

const NONE: usize = usize::MAX;

impl Bpe {
    /// The BPE of `pieces` (ids `0..`) with no merges yet ([`Bpe::with_merges`]).
    pub(crate) fn new(pieces: Arc<Pieces>, ignore_merges: bool) -> Bpe {
        let hasher = RandomState::new();
        let mut index = HashTable::with_capacity(pieces.len());
        for id in 0..pieces.len() as u32 {
            let Some(s) = pieces.get(id) else { continue };
            let h = hasher.hash_one(s);
            if index.find(h, |&i: &u32| pieces.get(i) == Some(s)).is_none() {
                // Rehashing (not with this capacity) hashes as `id` looks up: the string.
                let rehash = |&i: &u32| hasher.hash_one(pieces.get(i).unwrap_or_default());
                index.insert_unique(h, id, rehash);
            }
        }
        Bpe {
            pieces,
            index,
            hasher,
            merges: HashMap::default(),
            ignore_merges,
        }
    }

    /// The same with `merges`, each a pair of ids and the id of their concatenation, in rank
    /// order (all in the vocabulary, as the caller checked).
    pub(crate) fn with_merges(mut self, merges: impl IntoIterator<Item = (u32, u32, u32)>) -> Bpe {
        self.merges = merges
            .into_iter()
            .enumerate()
            .map(|(rank, (a, b, m))| (pair(a, b), ((rank as u64) << 32) | u64::from(m)))
            .collect();
        self
    }

    /// The id of string `s`, if it is in the vocabulary.
    pub(crate) fn id(&self, s: &str) -> Option<u32> {
        let h = self.hasher.hash_one(s);
        self.index
            .find(h, |&i| self.pieces.get(i) == Some(s))
            .copied()
    }

    /// The rank and merged id of `a` followed by `b`, if they merge.
    fn merge(&self, a: u32, b: u32) -> Option<(u32, u32)> {
        let v = *self.merges.get(&pair(a, b))?;
        Some(((v >> 32) as u32, v as u32))
    }

    /// The merges in rank order as strings (the later rank of a pair listed twice).
    fn merge_strings(&self) -> Vec<(String, String)> {
        let mut m: Vec<(u64, u64)> = self.merges.iter().map(|(&k, &v)| (v, k)).collect();
        m.sort_unstable();
        let piece = |id: u64| self.pieces.get(id as u32).unwrap_or_default().to_string();
        m.into_iter()
            .map(|(_, k)| (piece(k >> 32), piece(k & 0xFFFF_FFFF)))
            .collect()
    }

    /// `tokenizers`' `BPE` of the same vocabulary and merges (for `tokenizer.json`).
    pub(crate) fn to_hf(&self) -> tokenizers::Result<BPE> {
        BPE::builder()
            .vocab_and_merges(
                Model::get_vocab(self)
                    .into_iter()
                    .collect::<tokenizers::models::bpe::Vocab>(),
                self.merge_strings(),
            )
            .ignore_merges(self.ignore_merges)
            .build()
    }

    /// The tokens of one pre-token `w`: its characters (each a symbol; one not in the vocabulary
    /// dropped), merged lowest rank first, the leftmost of equal ranks.
    fn merge_word(&self, w: &str) -> Vec<Symbol> {
        let mut syms: Vec<Symbol> = Vec::with_capacity(w.len());
        let mut buf = [0u8; 4];
        for c in w.chars() {
            if let Some(id) = self.id(c.encode_utf8(&mut buf)) {
                let n = syms.len();
                syms.push(Symbol {
                    id,
                    len: c.len_utf8(),
                    prev: n.checked_sub(1).unwrap_or(NONE),
                    next: n + 1,
                });
            }
        }
        if let Some(last) = syms.last_mut() {
            last.next = NONE;
        }
        // Min-heap of (rank, position, merged id).
        let mut queue: BinaryHeap<std::cmp::Reverse<(u32, usize, u32)>> = syms
            .windows(2)
            .enumerate()
            .filter_map(|(i, p)| {
                let (rank, m) = self.merge(p[0].id, p[1].id)?;
                Some(std::cmp::Reverse((rank, i, m)))
            })
            .collect();
        while let Some(std::cmp::Reverse((_, pos, m))) = queue.pop() {
            let s = syms[pos];
            if s.len == 0 || s.next == NONE {
                continue;
            }
            let right = syms[s.next];
            // A stale entry: the pair at `pos` is no longer the one queued.
            if self.merge(s.id, right.id).map(|(_, id)| id) != Some(m) {
                continue;
            }
            syms[pos] = Symbol {
                id: m,
                len: s.len + right.len,
                prev: s.prev,
                next: right.next,
            };
            syms[s.next].len = 0;
            if right.next != NONE {
                syms[right.next].prev = pos;
            }
            if s.prev != NONE {
                if let Some((rank, id)) = self.merge(syms[s.prev].id, m) {
                    queue.push(std::cmp::Reverse((rank, s.prev, id)));
                }
            }
            if right.next != NONE {
                if let Some((rank, id)) = self.merge(m, syms[right.next].id) {
                    queue.push(std::cmp::Reverse((rank, pos, id)));
                }
            }
        }
        syms.retain(|s| s.len > 0);
        syms
    }
}

fn pair(a: u32, b: u32) -> u64 {
    (u64::from(a) << 32) | u64::from(b)
}

impl Model for Bpe {
    type Trainer = TrainerWrapper;

    fn tokenize(&self, sequence: &str) -> tokenizers::Result<Vec<Token>> {
        if sequence.is_empty() {
            return Ok(Vec::new());
        }
        if self.ignore_merges {
            if let Some(id) = self.id(sequence) {
                return Ok(vec![Token::new(id, sequence.into(), (0, sequence.len()))]);
            }
        }
        let mut at = 0;
        Ok(self
            .merge_word(sequence)
            .into_iter()
            .map(|s| {
                let value = self.pieces.get(s.id).unwrap_or_default().to_string();
                let t = Token::new(s.id, value, (at, at + s.len));
                at += s.len;
                t
            })
            .collect())
    }

    fn token_to_id(&self, token: &str) -> Option<u32> {
        self.id(token)
    }

    fn id_to_token(&self, id: u32) -> Option<String> {
        // Only the id a string maps to (the first of a repeated string), as `BPE`'s.
        let s = self.pieces.get(id)?;
        (self.id(s) == Some(id)).then(|| s.to_string())
    }

    fn get_vocab(&self) -> std::collections::HashMap<String, u32> {
        self.index
            .iter()
            .filter_map(|&id| Some((self.pieces.get(id)?.to_string(), id)))
            .collect()
    }

    fn get_vocab_size(&self) -> usize {
        self.index.len()
    }

    fn save(&self, folder: &Path, prefix: Option<&str>) -> tokenizers::Result<Vec<PathBuf>> {
        self.to_hf()?.save(folder, prefix)
    }

    fn get_trainer(&self) -> TrainerWrapper {
        TrainerWrapper::BpeTrainer(BpeTrainer::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator (xorshift64*).
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    /// A vocabulary of `alphabet`'s characters (some twice) and merges of random pairs, some
    /// listed twice and some whose concatenation is already a token, as `(tokens, merges)`.
    fn random_vocab(
        rng: &mut Rng,
        alphabet: &[char],
        n_merges: usize,
    ) -> (Vec<String>, Vec<(String, String)>) {
        let mut tokens: Vec<String> = alphabet.iter().map(|c| c.to_string()).collect();
        // A repeated string: the first id is the one the vocabulary maps it to.
        tokens.push(alphabet[0].to_string());
        let mut merges: Vec<(String, String)> = Vec::new();
        while merges.len() < n_merges {
            // Short tokens more often, as real merges go.
            let pick = |rng: &mut Rng, tokens: &[String]| {
                let n = tokens.len();
                tokens[rng.below(n).min(rng.below(n))].clone()
            };
            let (a, b) = (pick(rng, &tokens), pick(rng, &tokens));
            if rng.below(20) == 0 && !merges.is_empty() {
                let again = merges[rng.below(merges.len())].clone();
                merges.push(again);
                continue;
            }
            let joined = format!("{a}{b}");
            if !tokens.contains(&joined) {
                tokens.push(joined);
            }
            merges.push((a, b));
        }
        (tokens, merges)
    }

    fn ours(tokens: &[String], merges: &[(String, String)], ignore: bool) -> Bpe {
        let pieces = Arc::new(Pieces::new(tokens.iter().map(|t| Some(t.as_str()))));
        let b = Bpe::new(pieces, ignore);
        let ids: Vec<(u32, u32, u32)> = merges
            .iter()
            .map(|(x, y)| {
                let id = |s: &str| b.id(s).expect("in the vocabulary");
                (id(x), id(y), id(&format!("{x}{y}")))
            })
            .collect();
        b.with_merges(ids)
    }

    fn theirs(tokens: &[String], merges: &[(String, String)], ignore: bool) -> BPE {
        let mut vocab = tokenizers::models::bpe::Vocab::new();
        for (id, t) in tokens.iter().enumerate() {
            vocab.entry(t.clone()).or_insert(id as u32);
        }
        BPE::builder()
            .vocab_and_merges(vocab, merges.to_vec())
            .ignore_merges(ignore)
            .build()
            .unwrap()
    }

    fn ids(m: &impl Model, w: &str) -> Vec<(u32, (usize, usize))> {
        m.tokenize(w)
            .unwrap()
            .into_iter()
            .map(|t| (t.id, t.offsets))
            .collect()
    }

    #[test]
    fn merges_as_tokenizers_bpe_does() {
        // Byte-level-looking letters, a space mark, and characters of 2-4 bytes; one character
        // (`?`) in no vocabulary, dropped by both.
        let alphabet: Vec<char> = "abcdeĠ12éΩ中😀".chars().collect();
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let mut words = 0;
        for round in 0..24 {
            let (tokens, merges) = random_vocab(&mut rng, &alphabet, 40 + 40 * (round % 6));
            let ignore = round % 2 == 1;
            let (a, b) = (
                ours(&tokens, &merges, ignore),
                theirs(&tokens, &merges, ignore),
            );
            assert_eq!(a.get_vocab(), b.get_vocab());
            assert_eq!(a.get_vocab_size(), b.get_vocab_size());
            for id in 0..tokens.len() as u32 + 2 {
                assert_eq!(a.id_to_token(id), b.id_to_token(id), "id {id}");
            }
            for _ in 0..300 {
                let len = 1 + rng.below(24);
                let w: String = (0..len)
                    .map(|_| match rng.below(40) {
                        0 => '?',
                        _ => alphabet[rng.below(alphabet.len())],
                    })
                    .collect();
                assert_eq!(ids(&a, &w), ids(&b, &w), "{w:?} (round {round})");
                words += 1;
            }
            // Every token whole: one token under `ignore_merges`, the merges' result otherwise.
            for t in &tokens {
                assert_eq!(ids(&a, t), ids(&b, t), "{t:?} (round {round})");
            }
        }
        assert_eq!(words, 24 * 300);
    }

    #[test]
    fn tokenizer_json_keeps_the_merges() {
        let alphabet: Vec<char> = "abcĠ".chars().collect();
        let mut rng = Rng(7);
        let (tokens, merges) = random_vocab(&mut rng, &alphabet, 60);
        let a = ours(&tokens, &merges, false);
        let b = a.to_hf().unwrap();
        for _ in 0..500 {
            let w: String = (0..1 + rng.below(16))
                .map(|_| alphabet[rng.below(alphabet.len())])
                .collect();
            assert_eq!(ids(&a, &w), ids(&b, &w), "{w:?}");
        }
    }
}
