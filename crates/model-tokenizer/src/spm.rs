//! SentencePiece vocabularies from GGUF (`tokenizer.ggml.model = "llama"`: Llama 1/2, Gemma),
//! encoded the way llama.cpp's `llm_tokenizer_spm` does (src/llama-vocab.cpp), written here from
//! its description:
//!
//! 1. **Special tokens first.** Control, user-defined and unknown tokens (types 3, 4, 2), longest
//!    first (a stable sort by byte length), are cut out of the text: for each in turn, every
//!    occurrence in the text not yet cut, left to right. When special tokens are not parsed
//!    ([`Spm::encode`] with `parse_special` false) control and unknown tokens are skipped and only
//!    user-defined ones are cut (Gemma's runs of newlines, spaces and tabs, its HTML tags).
//! 2. **Each remaining fragment** gets a leading space if `add_space_prefix` is set and it follows
//!    a special token or starts the text (Gemma: not set), then every `' '` becomes `"▁"`.
//! 3. **Bigram merging by score.** The fragment starts as one symbol per character. Every pair of
//!    neighbours whose concatenation is a token is queued with that token's score; the
//!    highest-scoring pair (the leftmost of equal scores) is merged, the pairs it forms with its
//!    new neighbours are queued, and so on until the queue is empty. A queued pair whose symbols
//!    changed since is skipped.
//! 4. **Output.** Each final symbol is its token; a symbol that is no token (a single character
//!    outside the vocabulary: merges only ever form tokens) becomes one byte token `<0xNN>` per
//!    UTF-8 byte (or, failing that, the token that is the byte itself).
//!
//! llama.cpp's LSTRIP/RSTRIP token attributes (set by model name for Phi-3 and a few BERTs, not in
//! GGUF) are not applied. Decoding ([`Spm::piece_bytes`]) follows llama.cpp's `token_to_piece`:
//! normal tokens with `"▁"` as a space, byte tokens as their byte, control, unknown and
//! user-defined tokens as their text, and tokens of any other type (unused) as nothing. The space
//! that `add_space_prefix` adds is not removed by decoding.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use crate::{TokenizerError, VocabSpec};

const TYPE_NORMAL: i32 = 1;
const TYPE_UNKNOWN: i32 = 2;
const TYPE_CONTROL: i32 = 3;
const TYPE_USER_DEFINED: i32 = 4;
const TYPE_BYTE: i32 = 6;

/// A SentencePiece vocabulary: scores, token types and the text of every token.
#[derive(Debug)]
pub(crate) struct Spm {
    /// Text to id; on duplicate strings the last id wins (llama.cpp's `token_to_id[word] = i`).
    ids: HashMap<String, u32>,
    tokens: Vec<String>,
    scores: Vec<f32>,
    types: Vec<i32>,
    /// Per byte: its token (`<0xNN>`, else the one-byte token), if any.
    byte_ids: [Option<u32>; 256],
    /// Tokens cut out of the text before merging, longest first: `(id, parsed only with specials)`.
    specials: Vec<(u32, bool)>,
    add_space_prefix: bool,
}

/// A piece of the text: not yet tokenized, or a special token cut out of it.
#[derive(Clone, Debug, PartialEq)]
enum Fragment {
    Text(std::ops::Range<usize>),
    Token(u32),
}

/// One symbol of a fragment being merged (a byte range of the escaped fragment and its
/// neighbours; `len == 0` once merged into its left neighbour).
#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// A pair of neighbouring symbols whose concatenation is a token.
struct Bigram {
    left: usize,
    right: usize,
    score: f32,
    size: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    /// The heap's greatest: the highest score, then the leftmost.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then(other.left.cmp(&self.left))
    }
}

impl Spm {
    /// The vocabulary of `spec` (already checked for size, type count and special ids).
    /// Returns it and which ids are special (control or unknown: left out by
    /// `decode(.., skip_special)`).
    pub(crate) fn new(spec: &VocabSpec) -> Result<(Spm, Vec<bool>), TokenizerError> {
        let n = spec.tokens.len();
        if spec.scores.len() != n {
            return Err(TokenizerError::InvalidVocab(format!(
                "tokenizer.ggml.scores has {} entries but tokenizer.ggml.tokens has {n}",
                spec.scores.len()
            )));
        }
        // Without types every token is normal, except the ids the metadata names (as gpt2 does).
        let mut types = if spec.token_types.is_empty() {
            vec![TYPE_NORMAL; n]
        } else {
            spec.token_types.clone()
        };
        if spec.token_types.is_empty() {
            for id in [spec.bos_id, spec.eos_id, spec.eot_id, spec.pad_id]
                .into_iter()
                .flatten()
            {
                types[id as usize] = TYPE_CONTROL;
            }
            if let Some(id) = spec.unk_id {
                types[id as usize] = TYPE_UNKNOWN;
            }
        }
        let mut ids = HashMap::with_capacity(n);
        for (id, tok) in spec.tokens.iter().enumerate() {
            ids.insert(tok.clone(), id as u32);
        }
        let mut byte_ids = [None; 256];
        for (b, slot) in byte_ids.iter_mut().enumerate() {
            *slot = ids
                .get(format!("<0x{b:02X}>").as_str())
                .or_else(|| {
                    let one = [b as u8];
                    std::str::from_utf8(&one).ok().and_then(|s| ids.get(s))
                })
                .copied();
        }
        let mut specials: Vec<(u32, bool)> = types
            .iter()
            .enumerate()
            .filter(|(id, _)| !spec.tokens[*id].is_empty())
            .filter_map(|(id, &t)| match t {
                TYPE_CONTROL | TYPE_UNKNOWN => Some((id as u32, true)),
                TYPE_USER_DEFINED => Some((id as u32, false)),
                _ => None,
            })
            .collect();
        specials.sort_by_key(|&(id, _)| std::cmp::Reverse(spec.tokens[id as usize].len()));
        let special = types
            .iter()
            .map(|&t| t == TYPE_CONTROL || t == TYPE_UNKNOWN)
            .collect();
        let spm = Spm {
            ids,
            tokens: spec.tokens.clone(),
            scores: spec.scores.clone(),
            types,
            byte_ids,
            specials,
            add_space_prefix: spec.add_space_prefix.unwrap_or(true),
        };
        Ok((spm, special))
    }

    /// The id of a token's text.
    pub(crate) fn token_to_id(&self, text: &str) -> Option<u32> {
        self.ids.get(text).copied()
    }

    /// The ids of `text`; special tokens written in it are matched only with `parse_special`
    /// (user-defined tokens always are). No BOS is added.
    pub(crate) fn encode(
        &self,
        text: &str,
        parse_special: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        let mut out = Vec::new();
        let mut prev_special = true;
        for fragment in self.partition(text, parse_special) {
            match fragment {
                Fragment::Token(id) => {
                    out.push(id);
                    prev_special = true;
                }
                Fragment::Text(range) => {
                    let mut piece = String::with_capacity(range.len() + 3);
                    if self.add_space_prefix && prev_special {
                        piece.push('▁');
                    }
                    for c in text[range].chars() {
                        piece.push(if c == ' ' { '▁' } else { c });
                    }
                    self.merge(&piece, &mut out)?;
                    prev_special = false;
                }
            }
        }
        Ok(out)
    }

    /// `text` cut at the special tokens that occur in it (step 1 of the module's description).
    fn partition(&self, text: &str, parse_special: bool) -> Vec<Fragment> {
        let mut fragments = vec![Fragment::Text(0..text.len())];
        if text.is_empty() {
            return Vec::new();
        }
        for &(id, needs_special) in &self.specials {
            if needs_special && !parse_special {
                continue;
            }
            let tok = self.tokens[id as usize].as_str();
            // Most of a large vocabulary's specials are absent: one search of the whole text
            // skips them.
            if !text.contains(tok) {
                continue;
            }
            let mut next = Vec::with_capacity(fragments.len() + 2);
            for f in fragments {
                let Fragment::Text(mut range) = f else {
                    next.push(f);
                    continue;
                };
                while let Some(at) = text[range.clone()].find(tok) {
                    let at = range.start + at;
                    if at > range.start {
                        next.push(Fragment::Text(range.start..at));
                    }
                    next.push(Fragment::Token(id));
                    range.start = at + tok.len();
                }
                if !range.is_empty() {
                    next.push(Fragment::Text(range));
                }
            }
            fragments = next;
        }
        fragments
    }

    /// Merges one escaped fragment by score and appends its ids (steps 3 and 4).
    fn merge(&self, text: &str, out: &mut Vec<u32>) -> Result<(), TokenizerError> {
        let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
        for (i, (start, c)) in text.char_indices().enumerate() {
            symbols.push(Symbol {
                start,
                len: c.len_utf8(),
                prev: i.checked_sub(1),
                next: None,
            });
            if i > 0 {
                symbols[i - 1].next = Some(i);
            }
        }
        if symbols.is_empty() {
            return Ok(());
        }
        let mut queue = BinaryHeap::new();
        for i in 1..symbols.len() {
            self.try_bigram(text, &symbols, i - 1, Some(i), &mut queue);
        }
        while let Some(b) = queue.pop() {
            let (l, r) = (symbols[b.left], symbols[b.right]);
            if l.len == 0 || r.len == 0 || l.len + r.len != b.size {
                continue;
            }
            symbols[b.left].len += r.len;
            symbols[b.right].len = 0;
            symbols[b.left].next = r.next;
            if let Some(n) = r.next {
                symbols[n].prev = Some(b.left);
            }
            if let Some(p) = l.prev {
                self.try_bigram(text, &symbols, p, Some(b.left), &mut queue);
            }
            self.try_bigram(text, &symbols, b.left, r.next, &mut queue);
        }
        let mut at = Some(0);
        while let Some(i) = at {
            let s = symbols[i];
            let piece = &text[s.start..s.start + s.len];
            match self.token_to_id(piece) {
                Some(id) => out.push(id),
                None => {
                    for &byte in piece.as_bytes() {
                        out.push(self.byte_ids[byte as usize].ok_or_else(|| {
                            TokenizerError::InvalidVocab(format!(
                                "{piece:?} is not in the vocabulary and byte 0x{byte:02X} has no \
                                 <0x{byte:02X}> token to fall back on"
                            ))
                        })?);
                    }
                }
            }
            at = s.next;
        }
        Ok(())
    }

    /// Queues the pair `left`, `right` if their text together is a token.
    fn try_bigram(
        &self,
        text: &str,
        symbols: &[Symbol],
        left: usize,
        right: Option<usize>,
        queue: &mut BinaryHeap<Bigram>,
    ) {
        let Some(right) = right else { return };
        let (l, r) = (symbols[left], symbols[right]);
        let size = l.len + r.len;
        let Some(pair) = text.get(l.start..l.start + size) else {
            return;
        };
        if let Some(id) = self.token_to_id(pair) {
            queue.push(Bigram {
                left,
                right,
                score: self.scores[id as usize],
                size,
            });
        }
    }

    /// Appends the bytes `id` (in range) decodes to.
    pub(crate) fn piece_bytes(&self, id: u32, out: &mut Vec<u8>) {
        let text = &self.tokens[id as usize];
        match self.types[id as usize] {
            TYPE_NORMAL => out.extend_from_slice(text.replace('▁', " ").as_bytes()),
            TYPE_BYTE => match byte_token_value(text) {
                Some(b) => out.push(b),
                None => out.extend_from_slice(text.as_bytes()),
            },
            TYPE_CONTROL | TYPE_UNKNOWN | TYPE_USER_DEFINED => {
                out.extend_from_slice(text.as_bytes())
            }
            _ => {}
        }
    }
}

/// The byte of a `<0xNN>` token.
fn byte_token_value(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}
