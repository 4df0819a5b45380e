//! The [`Tokenizer`]: construction from GGUF vocabulary metadata or `tokenizer.json`,
//! encoding and decoding.

use std::path::Path;
use std::sync::Arc;

use tokenizers::decoders::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, DecoderWrapper, PreTokenizerWrapper, SplitDelimiterBehavior};

use crate::bpe::Bpe;
use crate::encoder::HfTokenizer;
use crate::pieces::Pieces;
use crate::spm::Spm;
use crate::stream::StreamDecoder;
use crate::{bytes, ChatTemplate, TokenizerError};

/// GGUF token type: control token (`<|im_start|>`, `<s>`, ...).
pub const TOKEN_TYPE_CONTROL: i32 = 3;
/// GGUF token type: user-defined token (matched in text, never split, not special).
pub const TOKEN_TYPE_USER_DEFINED: i32 = 4;

/// Split regex of Llama 3 (`tokenizer.ggml.pre` = "llama-bpe").
pub(crate) const LLAMA3_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Split regex of Qwen2 (`tokenizer.ggml.pre` = "qwen2"): like Llama 3 but single digits.
pub(crate) const QWEN2_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Tokenizer description taken from a GGUF file's `tokenizer.ggml.*` metadata.
///
/// This crate does not read GGUF itself; the caller copies the metadata values in.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct VocabSpec {
    /// `tokenizer.ggml.model`: "gpt2" (byte-level BPE) or "llama" (SentencePiece, merged by
    /// score as llama.cpp's `llm_tokenizer_spm` does).
    pub model: String,
    /// `tokenizer.ggml.pre`: pre-tokenizer flavour ("smollm", "gpt-2", "llama-bpe", "qwen2", ...).
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens` (index = id).
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.token_type` (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused,
    /// 6 byte); may be empty.
    pub token_types: Vec<i32>,
    /// `tokenizer.ggml.merges`, one `"a b"` rule per entry, highest priority first (gpt2).
    pub merges: Vec<String>,
    /// `tokenizer.ggml.scores` (index = id): one per token for "llama" vocabularies, which merge
    /// the highest-scoring pair first; unused by gpt2.
    pub scores: Vec<f32>,
    /// `tokenizer.ggml.add_space_prefix` ("llama" vocabularies: a space before the text and after
    /// each special token; absent means true, as in llama.cpp; Gemma's is false).
    pub add_space_prefix: Option<bool>,
    /// `tokenizer.ggml.bos_token_id`.
    pub bos_id: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos_id: Option<u32>,
    /// `tokenizer.ggml.unknown_token_id`.
    pub unk_id: Option<u32>,
    /// `tokenizer.ggml.padding_token_id`.
    pub pad_id: Option<u32>,
    /// `tokenizer.ggml.eot_token_id`.
    pub eot_id: Option<u32>,
    /// `tokenizer.ggml.add_bos_token` (default false for gpt2 models).
    pub add_bos: bool,
    /// `tokenizer.chat_template`.
    pub chat_template: Option<String>,
}

/// How a [`Tokenizer`] encodes: the `tokenizers` crate (byte-level BPE from GGUF, any
/// `tokenizer.json`) or the SentencePiece merge of [`crate::spm`].
#[derive(Clone)]
pub(crate) enum Backend {
    Hf(Arc<HfTokenizer>),
    Spm(Arc<Spm>),
}

/// A text tokenizer (BPE via the `tokenizers` crate, or SentencePiece by score) with its
/// special-token metadata and optional chat template. `Send + Sync + Clone`.
#[derive(Clone)]
pub struct Tokenizer {
    pub(crate) inner: Backend,
    /// `inner` with special-token matching off (for user text) over `inner`'s model, made on first
    /// use.
    pub(crate) text_inner: std::sync::Arc<std::sync::OnceLock<crate::plain::Plain>>,
    /// Raw vocabulary string of every id (`None` for holes in a tokenizer.json vocab).
    pieces: Arc<Pieces>,
    special: Vec<bool>,
    /// Whether decoding is done here, byte-exact (byte-level BPE and SentencePiece), not by the
    /// `tokenizers` decoder.
    byte_level: bool,
    bos_id: Option<u32>,
    eos_id: Option<u32>,
    eot_id: Option<u32>,
    add_bos: bool,
    stop_ids: Vec<u32>,
    chat_template: Option<ChatTemplate>,
    chat_template_error: Option<String>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.pieces.len())
            .field("byte_level", &self.byte_level)
            .field("bos_id", &self.bos_id)
            .field("eos_id", &self.eos_id)
            .field("eot_id", &self.eot_id)
            .field("stop_ids", &self.stop_ids)
            .field("has_chat_template", &self.chat_template.is_some())
            .finish_non_exhaustive()
    }
}

/// Splits one GGUF merge line `"a b"` at its first space (a space at position 0 belongs to
/// the left token, as in llama.cpp).
fn parse_merge(line: usize, merge: &str) -> Result<(String, String), TokenizerError> {
    let bad = |reason: &str| TokenizerError::InvalidMerge {
        line,
        merge: merge.to_owned(),
        reason: reason.to_owned(),
    };
    let split = merge
        .char_indices()
        .skip(1)
        .find(|&(_, c)| c == ' ')
        .map(|(i, _)| i)
        .ok_or_else(|| bad("expected two tokens separated by a space"))?;
    let (a, b) = (&merge[..split], &merge[split + 1..]);
    if a.is_empty() || b.is_empty() {
        return Err(bad("expected two non-empty tokens separated by a space"));
    }
    Ok((a.to_owned(), b.to_owned()))
}

/// The pre-tokenizer for a GGUF `tokenizer.ggml.pre` value.
///
/// * "smollm", "starcoder", "refact", "gpt-2", "gpt2", "default", none: GPT-2 byte-level
///   regex (the first three additionally split every digit on its own).
/// * "llama-bpe"/"llama3", "qwen2": their split regex, then byte-level mapping.
/// * anything else: falls back to the GPT-2 byte-level regex. This is right for many
///   models but not all; unknown names are not an error so that new models still load.
fn pre_tokenizer_for(pre: Option<&str>) -> Result<PreTokenizerWrapper, TokenizerError> {
    let byte_level_regex = || PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, true));
    let split_then_bytes = |pattern: &str| -> Result<PreTokenizerWrapper, TokenizerError> {
        let split = Split::new(
            SplitPattern::Regex(pattern.to_owned()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| TokenizerError::backend("compiling the pre-tokenizer regex", e))?;
        Ok(PreTokenizerWrapper::Sequence(Sequence::new(vec![
            PreTokenizerWrapper::Split(split),
            PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, false)),
        ])))
    };
    Ok(match pre {
        Some("smollm") | Some("starcoder") | Some("refact") => {
            PreTokenizerWrapper::Sequence(Sequence::new(vec![
                PreTokenizerWrapper::Digits(Digits::new(true)),
                byte_level_regex(),
            ]))
        }
        Some("llama-bpe") | Some("llama3") => split_then_bytes(LLAMA3_PATTERN)?,
        Some("qwen2") => split_then_bytes(QWEN2_PATTERN)?,
        // "gpt-2", "gpt2", "default", None and unknown names.
        _ => byte_level_regex(),
    })
}

fn dedup(ids: impl IntoIterator<Item = Option<u32>>) -> Vec<u32> {
    let mut out = Vec::new();
    for id in ids.into_iter().flatten() {
        if !out.contains(&id) {
            out.push(id);
        }
    }
    out
}

impl Tokenizer {
    /// Builds a tokenizer from GGUF `tokenizer.ggml.*` metadata.
    ///
    /// Control tokens (type 3) become special added tokens and user-defined tokens
    /// (type 4) plain added tokens: both are matched in input text and never split. When
    /// `token_types` is empty, the bos/eos/eot/pad/unk tokens are treated as control tokens.
    ///
    /// A chat template that does not compile does not fail the tokenizer: it is dropped
    /// and the error is kept in [`Tokenizer::chat_template_error`]. Without a template, a
    /// vocabulary with `<start_of_turn>` and `<end_of_turn>` tokens gets [`ChatTemplate::gemma`]
    /// (other vocabularies none: [`Tokenizer::encode_chat`] then uses ChatML).
    pub fn from_vocab(spec: &VocabSpec) -> Result<Tokenizer, TokenizerError> {
        check_spec(spec)?;
        let pieces = Arc::new(Pieces::new(spec.tokens.iter().map(|t| Some(t.as_str()))));
        if spec.model == "llama" {
            let (spm, special) = Spm::new(spec)?;
            let inner = Backend::Spm(Arc::new(spm));
            return Ok(Self::with_backend(spec, inner, special, pieces));
        }
        let mut inner = bpe_tokenizer(spec, &pieces)?;
        let special = add_special_tokens(&mut inner, spec)?;
        let inner = Backend::Hf(Arc::new(inner));
        Ok(Self::with_backend(spec, inner, special, pieces))
    }

    /// The tokenizer of a GGUF vocabulary around its encoder. Its stop ids are eos, eot and the
    /// end-of-turn tokens llama.cpp also stops at when present (`<|im_end|>` of ChatML,
    /// `<end_of_turn>` of Gemma).
    fn with_backend(
        spec: &VocabSpec,
        inner: Backend,
        special: Vec<bool>,
        pieces: Arc<Pieces>,
    ) -> Tokenizer {
        let find = |text: &str| spec.tokens.iter().position(|t| t == text).map(|i| i as u32);
        let stop_ids = dedup([
            spec.eos_id,
            spec.eot_id,
            find("<|im_end|>"),
            find("<end_of_turn>"),
        ]);
        let (chat_template, chat_template_error) = match spec.chat_template.as_deref() {
            // Gemma's GGUF files may ship no template; their turn tokens say which one fits.
            None if find("<start_of_turn>").is_some() && find("<end_of_turn>").is_some() => {
                (Some(ChatTemplate::gemma()), None)
            }
            None => (None, None),
            Some(src) => match ChatTemplate::new(src) {
                Ok(t) => (Some(t), None),
                Err(e) => (None, Some(e.to_string())),
            },
        };
        Tokenizer {
            inner,
            text_inner: Default::default(),
            pieces,
            special,
            byte_level: true,
            bos_id: spec.bos_id,
            eos_id: spec.eos_id,
            eot_id: spec.eot_id,
            add_bos: spec.add_bos,
            stop_ids,
            chat_template,
            chat_template_error,
        }
    }

    /// Loads an HF `tokenizer.json`. If a `tokenizer_config.json` lies next to it, its
    /// `bos_token`, `eos_token`, `add_bos_token` and `chat_template` are used; if a
    /// `generation_config.json` lies next to it, its `eos_token_id`s are added to the stop ids.
    pub fn from_tokenizer_json(path: &Path) -> Result<Tokenizer, TokenizerError> {
        let text = read(path)?;
        let json_error = |e: serde_json::Error| TokenizerError::Json {
            path: path.to_owned(),
            message: e.to_string(),
        };
        // Syntax first, structure second: `tokenizers` 0.23 panics (`expect("Helper")` in its decoder
        // deserializer) on a syntax error inside the `decoder` object when it reads text directly;
        // reading a parsed value cannot meet a syntax error. Found by the fuzz round.
        let value: serde_json::Value = serde_json::from_str(&text).map_err(json_error)?;
        let inner: HfTokenizer = serde_json::from_value(value).map_err(json_error)?;
        let dir = path.parent().unwrap_or_else(|| Path::new("."));

        let vocab = inner.get_vocab(true);
        let size = vocab.values().map(|&id| id as usize + 1).max().unwrap_or(0);
        if size > 2 * vocab.len() + 65_536 {
            return Err(TokenizerError::InvalidVocab(format!(
                "{}: token ids are too sparse ({} tokens, largest id {})",
                path.display(),
                vocab.len(),
                size - 1
            )));
        }
        let mut by_id = vec![None; size];
        for (tok, id) in vocab {
            by_id[id as usize] = Some(tok);
        }
        let pieces = Arc::new(Pieces::new(by_id.iter().map(|p| p.as_deref())));
        let mut special = vec![false; size];
        for (id, tok) in inner.get_added_tokens_decoder() {
            if tok.special {
                if let Some(s) = special.get_mut(id as usize) {
                    *s = true;
                }
            }
        }
        let byte_level = matches!(inner.get_decoder(), Some(DecoderWrapper::ByteLevel(_)));

        let mut bos_id = None;
        let mut eos_id = None;
        let mut add_bos = false;
        let mut chat_template = None;
        let mut chat_template_error = None;
        let config_path = dir.join("tokenizer_config.json");
        if config_path.is_file() {
            let config = read_json(&config_path)?;
            bos_id = token_field(&config, "bos_token").and_then(|t| inner.token_to_id(t));
            eos_id = token_field(&config, "eos_token").and_then(|t| inner.token_to_id(t));
            add_bos = config
                .get("add_bos_token")
                .and_then(|v| v.as_bool())
                .unwrap_or(false);
            if let Some(src) = template_field(&config) {
                match ChatTemplate::new(src) {
                    Ok(t) => chat_template = Some(t),
                    Err(e) => chat_template_error = Some(e.to_string()),
                }
            }
        }
        let mut extra_eos = Vec::new();
        let gen_path = dir.join("generation_config.json");
        if gen_path.is_file() {
            let gen = read_json(&gen_path)?;
            match gen.get("eos_token_id") {
                Some(serde_json::Value::Number(n)) => extra_eos.extend(n.as_u64()),
                Some(serde_json::Value::Array(a)) => {
                    extra_eos.extend(a.iter().filter_map(|v| v.as_u64()))
                }
                _ => {}
            }
            if bos_id.is_none() {
                bos_id = gen
                    .get("bos_token_id")
                    .and_then(|v| v.as_u64())
                    .and_then(|v| u32::try_from(v).ok());
            }
        }
        // Ids from generation_config.json must name tokens: an id outside the vocabulary is an error
        // naming the file, not a stop id silently dropped.
        let out_of_range = |what: &str, id: u64| {
            TokenizerError::InvalidVocab(format!(
                "{}: {what} {id} is outside the vocabulary ({size} tokens)",
                gen_path.display()
            ))
        };
        let mut checked_eos = Vec::with_capacity(extra_eos.len());
        for id in extra_eos {
            match u32::try_from(id).ok().filter(|&i| (i as usize) < size) {
                Some(i) => checked_eos.push(Some(i)),
                None => return Err(out_of_range("eos_token_id", id)),
            }
        }
        if let Some(b) = bos_id.filter(|&b| b as usize >= size) {
            return Err(out_of_range("bos_token_id", u64::from(b)));
        }
        let im_end = inner.token_to_id("<|im_end|>");
        let stop_ids = dedup([eos_id, im_end].into_iter().chain(checked_eos));

        Ok(Tokenizer {
            inner: Backend::Hf(Arc::new(inner)),
            text_inner: Default::default(),
            pieces,
            special,
            byte_level,
            bos_id,
            eos_id,
            eot_id: None,
            add_bos,
            stop_ids,
            chat_template,
            chat_template_error,
        })
    }

    /// Encodes text to ids. Special tokens written in the text (e.g. `<|im_start|>`) are
    /// recognised as single tokens (see [`Tokenizer::encode_text`] and
    /// [`Tokenizer::encode_chat`] for text a user wrote). BOS is prepended only if `add_bos` is set and the model
    /// has a BOS token; no other post-processing is applied.
    pub fn encode(&self, text: &str, add_bos: bool) -> Result<Vec<u32>, TokenizerError> {
        let mut out = Vec::new();
        if add_bos {
            out.extend(self.bos_id);
        }
        match &self.inner {
            Backend::Hf(inner) => {
                let enc = inner
                    .encode_fast(text, false)
                    .map_err(|e| TokenizerError::backend("encoding text", e))?;
                out.extend_from_slice(enc.get_ids());
            }
            Backend::Spm(spm) => out.extend(spm.encode(text, true)?),
        }
        Ok(out)
    }

    /// Decodes ids to text. With `skip_special`, special (control) tokens are left out.
    /// Invalid UTF-8 produced by byte tokens is replaced by U+FFFD. Unknown ids are an error.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, TokenizerError> {
        for &id in ids {
            self.check_id(id)?;
        }
        if self.byte_level {
            let mut buf = Vec::new();
            for &id in ids {
                self.push_token_bytes(id, skip_special, &mut buf);
            }
            Ok(String::from_utf8_lossy(&buf).into_owned())
        } else {
            self.hf_decode(ids, skip_special)
        }
    }

    /// The raw vocabulary string of `id` (byte-level form, e.g. `"Ġthe"`).
    pub fn id_to_piece(&self, id: u32) -> Option<&str> {
        self.pieces.get(id)
    }

    /// The id of a raw vocabulary string, if present.
    pub fn piece_to_id(&self, piece: &str) -> Option<u32> {
        match &self.inner {
            Backend::Hf(inner) => inner.token_to_id(piece),
            Backend::Spm(spm) => spm.token_to_id(piece),
        }
    }

    /// Number of ids (one past the largest id).
    pub fn vocab_size(&self) -> usize {
        self.pieces.len()
    }

    /// The BOS token id, if the model has one.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos_id
    }

    /// The EOS token id, if the model has one.
    pub fn eos_id(&self) -> Option<u32> {
        self.eos_id
    }

    /// The end-of-turn token id (GGUF `tokenizer.ggml.eot_token_id`), if any.
    pub fn eot_id(&self) -> Option<u32> {
        self.eot_id
    }

    /// Whether the model's metadata asks for BOS to be prepended
    /// (`tokenizer.ggml.add_bos_token` / `add_bos_token`). Callers pass this to [`Self::encode`].
    pub fn add_bos_default(&self) -> bool {
        self.add_bos && self.bos_id.is_some()
    }

    /// Ids that end generation: eos, eot and, for ChatML models, `<|im_end|>` (plus
    /// `generation_config.json` eos ids for tokenizer.json models); deduplicated.
    pub fn stop_ids(&self) -> Vec<u32> {
        self.stop_ids.clone()
    }

    /// The model's chat template, if it has one that compiles.
    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat_template.as_ref()
    }

    /// Why the model's chat template was dropped, if it failed to compile.
    pub fn chat_template_error(&self) -> Option<&str> {
        self.chat_template_error.as_deref()
    }

    /// Whether `id` is a special (control) token. False for unknown ids.
    pub fn is_special(&self, id: u32) -> bool {
        self.special.get(id as usize).copied().unwrap_or(false)
    }

    /// Serialises to HF `tokenizer.json` text. A SentencePiece vocabulary read from GGUF has no
    /// such form here: [`TokenizerError::UnsupportedModel`].
    pub fn to_json(&self, pretty: bool) -> Result<String, TokenizerError> {
        match &self.inner {
            Backend::Hf(inner) => inner
                .to_string(pretty)
                .map_err(|e| TokenizerError::backend("serialising to tokenizer.json", e)),
            Backend::Spm(_) => Err(TokenizerError::UnsupportedModel {
                model: "llama".into(),
                reason: "a SentencePiece vocabulary read from GGUF cannot be written as \
                         tokenizer.json"
                    .into(),
            }),
        }
    }

    /// An incremental decoder for streaming output.
    pub fn stream_decoder(&self, skip_special: bool) -> StreamDecoder<'_> {
        StreamDecoder::new(self, skip_special)
    }

    /// The underlying `tokenizers` tokenizer (`None` for a SentencePiece vocabulary from GGUF,
    /// which is encoded here).
    pub fn hf_tokenizer(&self) -> Option<&HfTokenizer> {
        match &self.inner {
            Backend::Hf(inner) => Some(inner.as_ref()),
            Backend::Spm(_) => None,
        }
    }

    pub(crate) fn check_id(&self, id: u32) -> Result<(), TokenizerError> {
        match self.pieces.get(id) {
            Some(_) => Ok(()),
            _ => Err(TokenizerError::UnknownId {
                id,
                vocab_size: self.pieces.len(),
            }),
        }
    }

    pub(crate) fn is_byte_level(&self) -> bool {
        self.byte_level
    }

    /// Appends the bytes of token `id` (already checked) unless it is skipped.
    pub(crate) fn push_token_bytes(&self, id: u32, skip_special: bool, out: &mut Vec<u8>) {
        if skip_special && self.is_special(id) {
            return;
        }
        match &self.inner {
            Backend::Spm(spm) => spm.piece_bytes(id, out),
            Backend::Hf(_) => {
                if let Some(piece) = self.pieces.get(id) {
                    bytes::piece_bytes(piece, out);
                }
            }
        }
    }

    pub(crate) fn hf_decode(
        &self,
        ids: &[u32],
        skip_special: bool,
    ) -> Result<String, TokenizerError> {
        match &self.inner {
            Backend::Hf(inner) => inner
                .decode(ids, skip_special)
                .map_err(|e| TokenizerError::backend("decoding ids", e)),
            Backend::Spm(_) => {
                let mut buf = Vec::new();
                for &id in ids {
                    self.push_token_bytes(id, skip_special, &mut buf);
                }
                Ok(String::from_utf8_lossy(&buf).into_owned())
            }
        }
    }
}

/// The largest tokenizer or configuration JSON read (the largest real `tokenizer.json` are tens of MiB).
const MAX_JSON_BYTES: u64 = 256 << 20;

/// The text of `path`: a regular file (a FIFO or device is refused before it is read) of at most
/// [`MAX_JSON_BYTES`].
fn read(path: &Path) -> Result<String, TokenizerError> {
    atomic_out::read_bounded_text(path, MAX_JSON_BYTES).map_err(|e| TokenizerError::Io {
        path: path.to_owned(),
        source: e.into(),
    })
}

fn read_json(path: &Path) -> Result<serde_json::Value, TokenizerError> {
    serde_json::from_str(&read(path)?).map_err(|e| TokenizerError::Json {
        path: path.to_owned(),
        message: e.to_string(),
    })
}

/// `"bos_token": "<s>"` or `"bos_token": {"content": "<s>", ...}`.
fn token_field<'a>(config: &'a serde_json::Value, key: &str) -> Option<&'a str> {
    match config.get(key)? {
        serde_json::Value::String(s) => Some(s),
        serde_json::Value::Object(o) => o.get("content")?.as_str(),
        _ => None,
    }
}

/// `"chat_template": "..."` or `[{"name": "default", "template": "..."}, ...]`.
fn template_field(config: &serde_json::Value) -> Option<&str> {
    match config.get("chat_template")? {
        serde_json::Value::String(s) => Some(s),
        serde_json::Value::Array(list) => {
            let named = |name: &str| {
                list.iter()
                    .find(|t| t.get("name").and_then(|n| n.as_str()) == Some(name))
            };
            named("default")
                .or_else(|| list.first())?
                .get("template")?
                .as_str()
        }
        _ => None,
    }
}

/// The vocabulary's model kind, size, token types and special ids are coherent.
fn check_spec(spec: &VocabSpec) -> Result<(), TokenizerError> {
    if !matches!(spec.model.as_str(), "gpt2" | "llama") {
        return Err(TokenizerError::UnsupportedModel {
            model: spec.model.clone(),
            reason: "supported: byte-level BPE ('gpt2') and SentencePiece ('llama')".into(),
        });
    }
    let n = spec.tokens.len();
    if n == 0 {
        return Err(TokenizerError::InvalidVocab(
            "tokenizer.ggml.tokens is empty".into(),
        ));
    }
    if n > u32::MAX as usize {
        return Err(TokenizerError::InvalidVocab(format!(
            "{n} tokens is too many"
        )));
    }
    if !spec.token_types.is_empty() && spec.token_types.len() != n {
        return Err(TokenizerError::InvalidVocab(format!(
            "tokenizer.ggml.token_type has {} entries but tokenizer.ggml.tokens has {n}",
            spec.token_types.len()
        )));
    }
    for (name, id) in [
        ("bos", spec.bos_id),
        ("eos", spec.eos_id),
        ("unk", spec.unk_id),
        ("pad", spec.pad_id),
        ("eot", spec.eot_id),
    ] {
        if let Some(id) = id {
            if id as usize >= n {
                return Err(TokenizerError::SpecialIdOutOfRange {
                    name,
                    id,
                    vocab_size: n,
                });
            }
        }
    }
    Ok(())
}

/// Byte-level BPE over the vocabulary and merges (each merge's parts and result in the vocabulary),
/// with the pre-tokenizer `tokenizer.ggml.pre` names.
fn bpe_tokenizer(spec: &VocabSpec, pieces: &Arc<Pieces>) -> Result<HfTokenizer, TokenizerError> {
    let pre = spec.pre.as_deref();
    // Vocabulary: on duplicate strings the first id wins (as in llama.cpp).
    let vocab = Bpe::new(
        Arc::clone(pieces),
        matches!(pre, Some("llama-bpe") | Some("llama3")),
    );
    let mut merges = Vec::with_capacity(spec.merges.len());
    for (i, merge) in spec.merges.iter().enumerate() {
        let line = i + 1;
        let (a, b) = parse_merge(line, merge)?;
        let mut ids = [0; 2];
        for (part, id) in [&a, &b].into_iter().zip(&mut ids) {
            *id = vocab.id(part).ok_or_else(|| TokenizerError::InvalidMerge {
                line,
                merge: merge.clone(),
                reason: format!("token {part:?} is not in the vocabulary"),
            })?;
        }
        let joined = format!("{a}{b}");
        let Some(m) = vocab.id(&joined) else {
            return Err(TokenizerError::InvalidMerge {
                line,
                merge: merge.clone(),
                reason: format!("merged token {joined:?} is not in the vocabulary"),
            });
        };
        merges.push((ids[0], ids[1], m));
    }
    let bpe = vocab.with_merges(merges);

    let mut inner = HfTokenizer::new(bpe.into());
    inner.with_pre_tokenizer(Some(pre_tokenizer_for(pre)?));
    inner.with_decoder(Some(ByteLevel::default()));
    inner.with_post_processor(Some(ByteLevel::default().add_prefix_space(false)));

    Ok(inner)
}

/// Adds the control tokens (special) and user-defined tokens (plain) to `inner`, matched in input
/// text and never split; returns which ids are special.
fn add_special_tokens(
    inner: &mut HfTokenizer,
    spec: &VocabSpec,
) -> Result<Vec<bool>, TokenizerError> {
    let n = spec.tokens.len();
    let mut special = vec![false; n];
    let mut user_defined = Vec::new();
    if spec.token_types.is_empty() {
        for id in [
            spec.bos_id,
            spec.eos_id,
            spec.eot_id,
            spec.pad_id,
            spec.unk_id,
        ]
        .into_iter()
        .flatten()
        {
            special[id as usize] = true;
        }
    } else {
        for (id, &ty) in spec.token_types.iter().enumerate() {
            match ty {
                TOKEN_TYPE_CONTROL => special[id] = true,
                TOKEN_TYPE_USER_DEFINED => user_defined.push(id),
                _ => {}
            }
        }
    }
    let special_tokens: Vec<AddedToken> = special
        .iter()
        .enumerate()
        .filter(|(id, &s)| s && !spec.tokens[*id].is_empty())
        .map(|(id, _)| AddedToken::from(spec.tokens[id].clone(), true).normalized(false))
        .collect();
    if !special_tokens.is_empty() {
        inner
            .add_special_tokens(special_tokens)
            .map_err(|e| TokenizerError::backend("adding control tokens", e))?;
    }
    let user_tokens: Vec<AddedToken> = user_defined
        .iter()
        .filter(|&&id| !spec.tokens[id].is_empty())
        .map(|&id| AddedToken::from(spec.tokens[id].clone(), false).normalized(false))
        .collect();
    if !user_tokens.is_empty() {
        inner
            .add_tokens(user_tokens)
            .map_err(|e| TokenizerError::backend("adding user-defined tokens", e))?;
    }

    Ok(special)
}
