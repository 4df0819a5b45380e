//! The plain-text form of a `tokenizers` tokenizer ([`plain`]): special-token strings are ordinary
//! characters (`Tokenizer::encode_text`), with the tokenizer's own model, not a copy of it.
//!
//! Cloning a `tokenizers::Tokenizer` to turn special-token matching off copies its model, held as
//! long as the tokenizer: for a byte-level vocabulary of 151,936 tokens (Qwen2.5) 23.4 MiB with
//! `tokenizers`' own `BPE` (measured), 5.5 MiB of tables with ours (`crate::bpe`), either more than
//! a memory budget of ~100 MiB should give to a second copy. [`Shared`] lends the original's model
//! to a second `TokenizerImpl` that copies only the small parts (normalizer, pre-tokenizer,
//! post-processor, decoder, added vocabulary).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokenizers::models::TrainerWrapper;
use tokenizers::{
    DecoderWrapper, Model, NormalizerWrapper, PostProcessorWrapper, PreTokenizedString,
    PreTokenizerWrapper, Token, TokenizerImpl, TruncationDirection,
};

use crate::encoder::HfTokenizer;

/// A tokenizer's model, used through the tokenizer that owns it.
#[derive(Clone)]
pub(crate) struct Shared(pub(crate) Arc<HfTokenizer>);

impl Model for Shared {
    type Trainer = TrainerWrapper;
    fn tokenize(&self, sequence: &str) -> tokenizers::Result<Vec<Token>> {
        self.0.get_model().tokenize(sequence)
    }
    fn token_to_id(&self, token: &str) -> Option<u32> {
        self.0.get_model().token_to_id(token)
    }
    fn id_to_token(&self, id: u32) -> Option<String> {
        self.0.get_model().id_to_token(id)
    }
    fn get_vocab(&self) -> HashMap<String, u32> {
        self.0.get_model().get_vocab()
    }
    fn get_vocab_size(&self) -> usize {
        self.0.get_model().get_vocab_size()
    }
    fn save(&self, folder: &Path, prefix: Option<&str>) -> tokenizers::Result<Vec<PathBuf>> {
        self.0.get_model().save(folder, prefix)
    }
    fn get_trainer(&self) -> TrainerWrapper {
        self.0.get_model().get_trainer()
    }
    fn tokenize_in_pretokenized(
        &self,
        pretokenized: &mut PreTokenizedString,
        truncation: Option<(usize, TruncationDirection)>,
    ) -> tokenizers::Result<()> {
        self.0
            .get_model()
            .tokenize_in_pretokenized(pretokenized, truncation)
    }
}

/// A tokenizer over another's model ([`Shared`]).
pub(crate) type Plain = TokenizerImpl<
    Shared,
    NormalizerWrapper,
    PreTokenizerWrapper,
    PostProcessorWrapper,
    DecoderWrapper,
>;

/// `hf` with special-token matching off (user-defined added tokens still matched), its model
/// shared.
pub(crate) fn plain(hf: &Arc<HfTokenizer>) -> tokenizers::Result<Plain> {
    let mut t = Plain::new(Shared(Arc::clone(hf)));
    // The added vocabulary before the normalizer, which refreshes its normalized forms.
    t.with_added_vocabulary(hf.get_added_vocabulary().clone())
        .with_pre_tokenizer(hf.get_pre_tokenizer().cloned())
        .with_post_processor(hf.get_post_processor().cloned())
        .with_decoder(hf.get_decoder().cloned())
        .with_padding(hf.get_padding().cloned());
    t.with_normalizer(hf.get_normalizer().cloned())?
        .with_truncation(hf.get_truncation().cloned())?;
    t.set_encode_special_tokens(true);
    Ok(t)
}
