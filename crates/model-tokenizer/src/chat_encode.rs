//! A conversation to token ids with the messages' text kept as text: special (control) tokens
//! come only from the chat template, never from what a user or system message says.
//!
//! The template is rendered twice: with the messages as they are, and with each message's content
//! replaced by a marker (a private-use character not found anywhere in the prompt, the message's
//! index, the character again). Putting the contents back in place of the markers must give the
//! first render exactly (with the contents as they are, or all trimmed, as templates such as Llama
//! 3's do); then the byte ranges of every message's content are known. Special-token strings are
//! matched outside those ranges only; the text between two matched specials is encoded with
//! special-token matching off ([`Tokenizer::encode_text`]), so a message containing
//! `<|im_end|>` gets the ids of the characters `<`, `|`, `im`, ..., not the control token.
//!
//! A template that rewrites contents some other way (slices, changes case) cannot be traced: its
//! prompt is encoded as before when no message contains a special-token string, and refused with
//! [`TokenizerError::Render`] when one does.

use std::ops::Range;

use crate::{ChatMessage, ChatTemplate, Tokenizer, TokenizerError};

impl Tokenizer {
    /// Encodes `text` as plain text: special-token strings written in it (`<|im_end|>`) are
    /// ordinary characters, not control tokens. User-defined (non-special) added tokens are still
    /// matched, as [`Tokenizer::encode`] does. No BOS is added.
    pub fn encode_text(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        let hf = match &self.inner {
            crate::tokenizer::Backend::Hf(hf) => hf,
            crate::tokenizer::Backend::Spm(spm) => return spm.encode(text, false),
        };
        let plain = match self.text_inner.get() {
            Some(p) => p,
            None => {
                let p = crate::plain::plain(hf)
                    .map_err(|e| TokenizerError::backend("making the plain-text tokenizer", e))?;
                self.text_inner.get_or_init(|| p)
            }
        };
        let enc = plain
            .encode_fast(text, false)
            .map_err(|e| TokenizerError::backend("encoding text", e))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Renders `messages` with the model's chat template (ChatML when it has none) and encodes the
    /// result, special tokens coming from the template only (see the module's description). The
    /// template writes its own BOS, so none is added. A template that does not compile is
    /// [`TokenizerError::Template`].
    pub fn encode_chat(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        if let Some(e) = self.chat_template_error() {
            return Err(TokenizerError::Template(e.to_string()));
        }
        let fallback;
        let tpl = match self.chat_template() {
            Some(t) => t,
            None => {
                fallback = ChatTemplate::chatml();
                &fallback
            }
        };
        let piece = |id: Option<u32>| id.and_then(|i| self.id_to_piece(i)).unwrap_or("");
        let (bos, eos) = (piece(self.bos_id()), piece(self.eos_id()));
        let text = tpl.render(messages, add_generation_prompt, bos, eos)?;
        let specials = self.special_strings();
        let user = match content_ranges(tpl, messages, add_generation_prompt, bos, eos, &text)? {
            Some(r) => r,
            None => {
                let says_special = messages
                    .iter()
                    .any(|m| specials.iter().any(|(s, _)| m.content.contains(s)));
                if says_special {
                    return Err(TokenizerError::Render(
                        "a message contains a special-token string and the chat template rewrites message contents, so that text cannot be kept as text".into(),
                    ));
                }
                Vec::new()
            }
        };
        let mut ids = Vec::new();
        let mut from = 0;
        for (at, len, id) in template_specials(&text, &user, &specials) {
            if at > from {
                ids.extend(self.encode_text(&text[from..at])?);
            }
            ids.push(id);
            from = at + len;
        }
        if from < text.len() {
            ids.extend(self.encode_text(&text[from..])?);
        }
        Ok(ids)
    }

    /// Every special token's string and id, longest first.
    fn special_strings(&self) -> Vec<(&str, u32)> {
        let mut v: Vec<(&str, u32)> = (0..self.vocab_size() as u32)
            .filter(|&id| self.is_special(id))
            .filter_map(|id| Some((self.id_to_piece(id)?, id)))
            .filter(|(s, _)| !s.is_empty())
            .collect();
        v.sort_by_key(|(s, _)| std::cmp::Reverse(s.len()));
        v
    }
}

/// The byte ranges of `text` (the template's render of `messages`) that are message contents, or
/// `None` when the template does not insert contents as they are (or trimmed).
fn content_ranges(
    tpl: &ChatTemplate,
    messages: &[ChatMessage],
    add_generation_prompt: bool,
    bos: &str,
    eos: &str,
    text: &str,
) -> Result<Option<Vec<Range<usize>>>, TokenizerError> {
    if messages.iter().all(|m| m.content.is_empty()) {
        return Ok(Some(Vec::new()));
    }
    // A private-use character that appears nowhere in the prompt or the template.
    let Some(mark) = ('\u{F0000}'..='\u{FFFFD}')
        .take(64)
        .find(|&c| !text.contains(c) && !tpl.source().contains(c))
    else {
        return Ok(None);
    };
    let marked: Vec<ChatMessage> = messages
        .iter()
        .enumerate()
        .map(|(i, m)| ChatMessage::new(m.role.clone(), format!("{mark}{i}{mark}")))
        .collect();
    let skeleton = tpl.render(&marked, add_generation_prompt, bos, eos)?;
    for trimmed in [false, true] {
        if let Some(r) = splice(&skeleton, mark, messages, trimmed, text) {
            return Ok(Some(r));
        }
    }
    Ok(None)
}

/// Puts the contents (trimmed or not) in place of the markers of `skeleton`; the contents' ranges
/// when the result is `text`.
fn splice(
    skeleton: &str,
    mark: char,
    messages: &[ChatMessage],
    trimmed: bool,
    text: &str,
) -> Option<Vec<Range<usize>>> {
    let mut out = String::with_capacity(text.len());
    let mut ranges = Vec::new();
    for (k, part) in skeleton.split(mark).enumerate() {
        if k % 2 == 0 {
            out.push_str(part);
            continue;
        }
        let i: usize = part.parse().ok()?;
        let c = messages.get(i)?.content.as_str();
        let c = if trimmed { c.trim() } else { c };
        ranges.push(out.len()..out.len() + c.len());
        out.push_str(c);
        if !text.starts_with(&out) {
            return None;
        }
    }
    (out == text).then_some(ranges)
}

/// The special tokens written by the template: `(offset, length, id)` of each leftmost-longest
/// match of a special string in `text` that overlaps no range of `user`.
fn template_specials(
    text: &str,
    user: &[Range<usize>],
    specials: &[(&str, u32)],
) -> Vec<(usize, usize, u32)> {
    let mut first = [false; 256];
    for (s, _) in specials {
        first[s.as_bytes()[0] as usize] = true;
    }
    let bytes = text.as_bytes();
    let mut found = Vec::new();
    let mut at = 0;
    let mut next_user = 0;
    while at < bytes.len() {
        // Skip a content range whole.
        while next_user < user.len() && user[next_user].end <= at {
            next_user += 1;
        }
        if let Some(r) = user.get(next_user) {
            if r.start <= at {
                at = r.end.max(at + 1);
                continue;
            }
        }
        let limit = user.get(next_user).map_or(bytes.len(), |r| r.start);
        if first[bytes[at] as usize] {
            let hit = specials
                .iter()
                .find(|(s, _)| at + s.len() <= limit && bytes[at..].starts_with(s.as_bytes()));
            if let Some(&(s, id)) = hit {
                found.push((at, s.len(), id));
                at += s.len();
                continue;
            }
        }
        at += 1;
    }
    found
}
