//! Incremental detokenization for streaming generation.

use crate::{Tokenizer, TokenizerError};

/// Incremental detokenizer for streaming: push one id at a time, get the new text that is
/// complete.
///
/// Never splits a UTF-8 character across pushes: a byte-level token that ends in the middle
/// of a character is held back until the character is complete. Byte sequences that can
/// never become valid UTF-8 are emitted as U+FFFD (as [`Tokenizer::decode`] does), so the
/// concatenation of all pushes plus [`StreamDecoder::finish`] equals `decode` of all ids.
#[derive(Debug)]
pub struct StreamDecoder<'a> {
    tok: &'a Tokenizer,
    skip_special: bool,
    state: State,
}

#[derive(Debug)]
enum State {
    /// Byte-level models: bytes not yet emitted (at most an incomplete character).
    Bytes { pending: Vec<u8> },
    /// Other decoders (SentencePiece-style tokenizer.json): re-decode a small window of ids
    /// and emit the difference, like `tokenizers`' `DecodeStream`.
    Window {
        ids: Vec<u32>,
        prefix: String,
        prefix_index: usize,
    },
}

impl<'a> StreamDecoder<'a> {
    pub(crate) fn new(tok: &'a Tokenizer, skip_special: bool) -> Self {
        let state = if tok.is_byte_level() {
            State::Bytes {
                pending: Vec::new(),
            }
        } else {
            State::Window {
                ids: Vec::new(),
                prefix: String::new(),
                prefix_index: 0,
            }
        };
        StreamDecoder {
            tok,
            skip_special,
            state,
        }
    }

    /// Adds one token id and returns the text that became complete (possibly empty).
    /// An unknown id is an error and leaves the decoder unchanged.
    pub fn push(&mut self, id: u32) -> Result<String, TokenizerError> {
        self.tok.check_id(id)?;
        match &mut self.state {
            State::Bytes { pending } => {
                self.tok.push_token_bytes(id, self.skip_special, pending);
                Ok(take_complete_utf8(pending))
            }
            State::Window {
                ids,
                prefix,
                prefix_index,
            } => {
                ids.push(id);
                let text = self.tok.hf_decode(ids, self.skip_special)?;
                if text.len() > prefix.len() && !text.ends_with('\u{FFFD}') {
                    let new_text = match text.get(prefix.len()..) {
                        Some(t) if text.starts_with(prefix.as_str()) => t.to_owned(),
                        // The decoder rewrote earlier text; emit what is new as best we can.
                        _ => text.chars().skip(prefix.chars().count()).collect(),
                    };
                    let new_prefix_index = ids.len() - *prefix_index;
                    ids.drain(..*prefix_index);
                    *prefix = self.tok.hf_decode(ids, self.skip_special)?;
                    *prefix_index = new_prefix_index;
                    Ok(new_text)
                } else {
                    Ok(String::new())
                }
            }
        }
    }

    /// Flushes whatever is held back (an incomplete character becomes U+FFFD) and resets the
    /// decoder.
    pub fn finish(&mut self) -> String {
        match &mut self.state {
            State::Bytes { pending } => {
                let out = String::from_utf8_lossy(pending).into_owned();
                pending.clear();
                out
            }
            State::Window {
                ids,
                prefix,
                prefix_index,
            } => {
                let text = self
                    .tok
                    .hf_decode(ids, self.skip_special)
                    .unwrap_or_default();
                let out = match text.get(prefix.len()..) {
                    Some(t) if text.starts_with(prefix.as_str()) => t.to_owned(),
                    _ => String::new(),
                };
                ids.clear();
                prefix.clear();
                *prefix_index = 0;
                out
            }
        }
    }
}

/// Removes and returns the longest prefix of `pending` that is complete UTF-8; invalid
/// sequences become U+FFFD, an incomplete trailing character stays in `pending`.
fn take_complete_utf8(pending: &mut Vec<u8>) -> String {
    let mut out = String::new();
    let mut start = 0;
    loop {
        match std::str::from_utf8(&pending[start..]) {
            Ok(s) => {
                out.push_str(s);
                start = pending.len();
                break;
            }
            Err(e) => {
                let valid = e.valid_up_to();
                // from_utf8 guarantees that the first `valid` bytes are valid UTF-8.
                out.push_str(std::str::from_utf8(&pending[start..start + valid]).unwrap_or(""));
                start += valid;
                match e.error_len() {
                    Some(len) => {
                        out.push('\u{FFFD}');
                        start += len;
                    }
                    None => break, // incomplete character at the end: hold it back
                }
            }
        }
    }
    pending.drain(..start);
    out
}

#[cfg(test)]
mod tests {
    use super::take_complete_utf8;

    #[test]
    fn holds_back_incomplete_and_replaces_invalid() {
        let mut p = "a😀".as_bytes()[..3].to_vec();
        assert_eq!(take_complete_utf8(&mut p), "a");
        assert_eq!(p.len(), 2);
        p.extend_from_slice(&"😀".as_bytes()[2..]);
        assert_eq!(take_complete_utf8(&mut p), "😀");
        assert!(p.is_empty());
        let mut p = vec![b'x', 0xFF, b'y', 0xE2, 0x82];
        assert_eq!(take_complete_utf8(&mut p), "x\u{FFFD}y");
        assert_eq!(p, vec![0xE2, 0x82]);
    }
}
