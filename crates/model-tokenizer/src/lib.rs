//! Tokenizers and chat templates for LLMs.
//!
//! A [`Tokenizer`] is built either from a GGUF file's `tokenizer.ggml.*` vocabulary
//! metadata (copied by the caller into a [`VocabSpec`]; this crate reads no GGUF itself) or
//! from an HF `tokenizer.json` (plus an optional `tokenizer_config.json` next to it). It
//! encodes text to ids, decodes ids to text, decodes incrementally for streaming
//! ([`StreamDecoder`]), can be written back as `tokenizer.json` ([`Tokenizer::to_json`]) and
//! carries the model's [`ChatTemplate`].
//!
//! Supported GGUF vocabularies: `tokenizer.ggml.model = "gpt2"` (byte-level BPE: `tokenizers`'
//! pre-tokenizers and added vocabulary around this crate's compact BPE model, [`Encoder`], which
//! merges as `tokenizers`' `BPE` does in a quarter of its memory) with
//! pre-tokenizers "smollm"/"starcoder"/"refact" (digits split one by one), "gpt-2"/"default"
//! (GPT-2 regex), "llama-bpe"/"llama3" and "qwen2" (their split regexes). Unknown `pre`
//! values fall back to the GPT-2 regex. `tokenizer.ggml.model = "llama"` (SentencePiece with
//! `tokenizer.ggml.scores`: Llama 2, Gemma) is encoded as llama.cpp's `llm_tokenizer_spm` does:
//! special tokens cut out first, `"▁"` for spaces, pairs merged highest score first, characters
//! outside the vocabulary as `<0xNN>` byte tokens (checked against `llama-tokenize` on Gemma 3's
//! vocabulary by `crates/engine/tests/it/tokenize_gemma.rs`).
//!
//! # Example
//!
//! ```
//! use model_tokenizer::{ChatMessage, ChatTemplate, Tokenizer, VocabSpec};
//!
//! // A toy byte-level vocabulary: one token per byte plus two special tokens.
//! let mut tokens = vec!["<|im_start|>".to_string(), "<|im_end|>".to_string()];
//! let bytes: Vec<u8> = (0..=255).collect();
//! let chars = model_tokenizer::byte_level_chars(&bytes);
//! tokens.extend(chars.chars().map(|c| c.to_string()));
//! let mut token_types = vec![3, 3];
//! token_types.extend(std::iter::repeat(1).take(256));
//! let spec = VocabSpec {
//!     model: "gpt2".into(),
//!     pre: Some("smollm".into()),
//!     tokens,
//!     token_types,
//!     eos_id: Some(1),
//!     ..VocabSpec::default()
//! };
//! let tok = Tokenizer::from_vocab(&spec)?;
//!
//! let prompt = ChatTemplate::chatml().render(&[ChatMessage::new("user", "Hi")], true, "", "")?;
//! let ids = tok.encode(&prompt, false)?;
//! assert_eq!(ids[0], 0); // "<|im_start|>" is one token
//! assert_eq!(tok.decode(&ids, false)?, prompt);
//! assert_eq!(tok.stop_ids(), vec![1]);
//!
//! let mut stream = tok.stream_decoder(true);
//! let mut text = String::new();
//! for id in tok.encode("héllo", false)? {
//!     text += &stream.push(id)?;
//! }
//! text += &stream.finish();
//! assert_eq!(text, "héllo");
//! # Ok::<(), model_tokenizer::TokenizerError>(())
//! ```
//!
//! # Invariants
//!
//! * No panics on any input: bad vocabularies, merges, ids, templates and text give a
//!   [`TokenizerError`] (or U+FFFD for undecodable bytes), never a panic.
//! * Special (control) and user-defined tokens written in the input text are matched as
//!   whole tokens and never split by BPE by [`Tokenizer::encode`]; [`Tokenizer::encode_text`]
//!   reads special-token strings as plain text, and [`Tokenizer::encode_chat`] takes special
//!   tokens from the chat template only, never from a message's content.
//! * [`StreamDecoder::push`] only ever returns complete UTF-8 characters; bytes of a
//!   character split over several tokens are held back until it is complete, and the
//!   concatenated stream equals [`Tokenizer::decode`] of all ids.
//! * [`Tokenizer`] and [`ChatTemplate`] are `Send + Sync + Clone`.

mod bpe;
mod bytes;
mod chat;
mod chat_encode;
mod encoder;
mod error;
mod pieces;
mod plain;
mod sandbox;
mod spm;
mod stream;
#[cfg(any(target_os = "linux", target_os = "android"))]
mod sys;
mod tokenizer;

#[cfg(test)]
mod spm_tests;
#[cfg(test)]
mod tests;

pub use chat::{ChatMessage, ChatTemplate};
pub use encoder::{Encoder, HfTokenizer};
pub use error::TokenizerError;
pub use sandbox::{RENDER_MAX_MEMORY, RENDER_TIMEOUT};
pub use stream::StreamDecoder;
pub use tokenizer::{Tokenizer, VocabSpec, TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED};

/// Maps raw bytes to their GPT-2 byte-level representation (e.g. `b" the"` -> `"Ġthe"`), the
/// form in which byte-level BPE vocabularies store tokens.
pub fn byte_level_chars(bytes: &[u8]) -> String {
    bytes.iter().map(|&b| bytes::byte_to_char(b)).collect()
}
