//! [`Encoder`]: the model inside a `tokenizers` tokenizer here, our compact BPE for a GGUF
//! vocabulary (`bpe.rs`) or whatever model a `tokenizer.json` names, and [`HfTokenizer`], the
//! `tokenizers` tokenizer around it.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use tokenizers::models::TrainerWrapper;
use tokenizers::{
    DecoderWrapper, Model, ModelWrapper, NormalizerWrapper, PostProcessorWrapper,
    PreTokenizedString, PreTokenizerWrapper, Token, TokenizerImpl, TruncationDirection,
};

use crate::bpe::Bpe;

/// A `tokenizers` tokenizer over an [`Encoder`].
pub type HfTokenizer = TokenizerImpl<
    Encoder,
    NormalizerWrapper,
    PreTokenizerWrapper,
    PostProcessorWrapper,
    DecoderWrapper,
>;

/// The model of an [`HfTokenizer`]: the compact byte-level BPE of a GGUF vocabulary (`bpe.rs`:
/// merging as `tokenizers`' `BPE` does, in a quarter of its memory) or the model a
/// `tokenizer.json` names; written to `tokenizer.json` as `tokenizers`' own (the compact BPE as the
/// `BPE` of the same vocabulary and merges), read from it as one.
#[derive(Clone, Debug)]
pub struct Encoder(pub(crate) Inner);

#[derive(Clone, Debug)]
pub(crate) enum Inner {
    Bpe(Bpe),
    Hf(ModelWrapper),
}

impl From<Bpe> for Encoder {
    fn from(b: Bpe) -> Self {
        Encoder(Inner::Bpe(b))
    }
}

impl Serialize for Encoder {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match &self.0 {
            Inner::Hf(m) => m.serialize(s),
            Inner::Bpe(b) => {
                let m = b.to_hf().map_err(serde::ser::Error::custom)?;
                ModelWrapper::BPE(m).serialize(s)
            }
        }
    }
}

impl<'de> Deserialize<'de> for Encoder {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        ModelWrapper::deserialize(d).map(|m| Encoder(Inner::Hf(m)))
    }
}

/// `$e` with `m` the encoder's model, whichever it is.
macro_rules! with_model {
    ($self:expr, $m:ident => $e:expr) => {
        match &$self.0 {
            Inner::Bpe($m) => $e,
            Inner::Hf($m) => $e,
        }
    };
}

impl Model for Encoder {
    type Trainer = TrainerWrapper;
    fn tokenize(&self, sequence: &str) -> tokenizers::Result<Vec<Token>> {
        with_model!(self, m => m.tokenize(sequence))
    }
    fn token_to_id(&self, token: &str) -> Option<u32> {
        with_model!(self, m => m.token_to_id(token))
    }
    fn id_to_token(&self, id: u32) -> Option<String> {
        with_model!(self, m => m.id_to_token(id))
    }
    fn get_vocab(&self) -> std::collections::HashMap<String, u32> {
        with_model!(self, m => m.get_vocab())
    }
    fn get_vocab_size(&self) -> usize {
        with_model!(self, m => m.get_vocab_size())
    }
    fn save(&self, folder: &Path, prefix: Option<&str>) -> tokenizers::Result<Vec<PathBuf>> {
        with_model!(self, m => m.save(folder, prefix))
    }
    fn get_trainer(&self) -> TrainerWrapper {
        with_model!(self, m => m.get_trainer())
    }
    fn tokenize_in_pretokenized(
        &self,
        pretokenized: &mut PreTokenizedString,
        truncation: Option<(usize, TruncationDirection)>,
    ) -> tokenizers::Result<()> {
        with_model!(self, m => m.tokenize_in_pretokenized(pretokenized, truncation))
    }
}
