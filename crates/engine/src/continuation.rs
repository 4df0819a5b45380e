//! One sequence's continuation as tokens are chosen: end-of-sequence tokens, stop strings held
//! back until they can be ruled out, the text that is final. [`crate::Engine::generate`] streams one;
//! [`crate::Engine::generate_best_of`] runs several side by side.

use model_tokenizer::{StreamDecoder, Tokenizer};

use crate::error::Result;
use sampling::{GenerateRequest, StopReason};

/// What accepting a token did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Accepted {
    /// The sequence goes on; `text[from..to]` of [`Continuation::text`] became final (possibly
    /// empty).
    Going { from: usize, to: usize },
    /// The sequence ended.
    Ended(StopReason),
}

/// A sequence's generated tokens and text.
pub(crate) struct Continuation<'t> {
    req: &'t GenerateRequest,
    stop_ids: Vec<u32>,
    /// Prompt and generated ids (the repetition penalty's history).
    pub history: Vec<u32>,
    /// Generated ids, an end-of-sequence token that ended it included.
    pub generated: Vec<u32>,
    decoder: StreamDecoder<'t>,
    /// The text so far (a stop string cut off).
    pub text: String,
    emitted: usize,
}

impl<'t> Continuation<'t> {
    /// An empty continuation of `prompt_ids`.
    pub fn new(tokenizer: &'t Tokenizer, prompt_ids: &[u32], req: &'t GenerateRequest) -> Self {
        Continuation {
            req,
            stop_ids: if req.stop_at_eos {
                tokenizer.stop_ids()
            } else {
                Vec::new()
            },
            history: prompt_ids.to_vec(),
            generated: Vec::new(),
            decoder: tokenizer.stream_decoder(true),
            text: String::new(),
            emitted: 0,
        }
    }

    /// Whether `id` ends the sequence (an end-of-sequence token it stops at).
    pub fn ends_at(&self, id: u32) -> bool {
        self.stop_ids.contains(&id)
    }

    /// Takes the next token: ends the sequence at an end-of-sequence token, a stop string or
    /// `max_tokens`, else says which text became final.
    pub fn accept(&mut self, next: u32) -> Result<Accepted> {
        self.generated.push(next);
        self.history.push(next);
        if self.stop_ids.contains(&next) {
            return Ok(Accepted::Ended(StopReason::Eos));
        }
        self.text.push_str(&self.decoder.push(next)?);
        let stops = &self.req.stop_strings;
        if let Some(at) = stops
            .iter()
            .filter_map(|s| self.text.find(s.as_str()))
            .min()
        {
            self.text.truncate(at);
            return Ok(Accepted::Ended(StopReason::StopString));
        }
        if self.generated.len() >= self.req.max_tokens {
            // Nothing more to hold back for: `finish` gives the rest of the text.
            return Ok(Accepted::Ended(StopReason::Length));
        }
        let safe = self.text.len() - held_back(&self.text, stops);
        let from = self.emitted;
        self.emitted = safe.max(from);
        Ok(Accepted::Going {
            from,
            to: self.emitted,
        })
    }

    /// Ends the text after `reason` (the decoder's held-back bytes, unless a stop string cut it) and
    /// returns what was not yet final before.
    pub fn finish(&mut self, reason: StopReason) -> &str {
        if reason != StopReason::StopString {
            let tail = self.decoder.finish();
            self.text.push_str(&tail);
        }
        let from = self.emitted.min(self.text.len());
        self.emitted = self.text.len();
        &self.text[from..]
    }
}

/// Holds back the end of the text that could still become a stop string.
pub(crate) fn held_back(text: &str, stops: &[String]) -> usize {
    let mut hold = 0;
    for s in stops {
        for k in (1..s.len()).rev() {
            if k <= hold {
                break;
            }
            if s.is_char_boundary(k) && text.ends_with(&s[..k]) {
                hold = k;
                break;
            }
        }
    }
    hold
}

#[cfg(test)]
mod tests {
    use super::held_back;

    #[test]
    fn holds_back_partial_stop_strings() {
        let stops = vec!["</s>".to_string(), "\n\n".to_string()];
        assert_eq!(held_back("hello </", &stops), 2);
        assert_eq!(held_back("hello\n", &stops), 1);
        assert_eq!(held_back("hello", &stops), 0);
    }
}
