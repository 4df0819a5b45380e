//! The fuzz targets: each parser of untrusted files, its seeds (fixtures, or small valid files
//! written here) and what is done with an input it accepts (so the code behind the parser runs too).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use engine::{load_tokenizer, Model, ModelFile};
use model_format::GgufFile;
use model_tokenizer::{ChatMessage, ChatTemplate, Tokenizer, VocabSpec};
use neuron_store::{BundleLayout, Formats, LayerInput, NeuronStore, StoreWriter};
use predictor::{ActivationKind, LayerProfile, Predictor, PredictorSet, Profile, ScoreKind};
use tensor_types::WeightFormat;
use ufs_io::{IoConfig, IoEngine, OpenOptions};

use super::runner::{Case, Target};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

/// JSON syntax, boundary numbers and the keys the JSON readers look at.
const JSON_DICT: &[&[u8]] = &[
    b"\"",
    b"{",
    b"}",
    b"[",
    b"]",
    b":",
    b",",
    b"null",
    b"true",
    b"-1",
    b"1e308",
    b"-0.0",
    b"4294967296",
    b"18446744073709551615",
    b"9223372036854775808",
    b"\"\\u0000\"",
    b"\"\\ud800\"",
    b"[[[[[[[[[[[[[[[[",
    b"\"type\"",
    b"\"BPE\"",
    b"\"ByteLevel\"",
    b"\"Sequence\"",
    b"\"merges\"",
    b"\"vocab\"",
    b"\"added_tokens\"",
    b"\"id\"",
    b"\"content\"",
    b"\"special\"",
    b"\"dtype\"",
    b"\"shape\"",
    b"\"data_offsets\"",
    b"\"F16\"",
    b"\"BF16\"",
    b"\"I64\"",
    b"\"U8\"",
    b"\"F8_E4M3\"",
    b"\"hidden_size\"",
    b"\"num_hidden_layers\"",
    b"\"num_attention_heads\"",
    b"\"num_key_value_heads\"",
    b"\"intermediate_size\"",
    b"\"vocab_size\"",
    b"\"weight_map\"",
    b"\"model.safetensors\"",
    b"\"../config.json\"",
    b"\"/etc/passwd\"",
    b"\"__metadata__\"",
    b"\"chat_template\"",
    b"\"eos_token_id\"",
    b"\"bos_token\"",
];

/// Jinja syntax and the functions chat templates use.
const JINJA_DICT: &[&[u8]] = &[
    b"{{",
    b"}}",
    b"{%",
    b"%}",
    b"{#",
    b"#}",
    b"{%- for m in messages %}",
    b"{% endfor %}",
    b"{% if ",
    b"{% else %}",
    b"{% endif %}",
    b"loop.index",
    b"loop.last",
    b"|tojson",
    b"|length",
    b"|trim",
    b"|upper",
    b"raise_exception('no')",
    b"strftime_now('%Y-%m-%d %%')",
    b"range(",
    b"* 99999999",
    b"'ab' * 100000",
    b"namespace(x=1)",
    b"recursive",
    b"loop(",
    b"{% macro m() %}",
    b"{% endmacro %}",
    b"{% call ",
    b"{% set x = ",
    b"~",
    b"[",
    b"]",
    b"(",
    b")",
    b".",
    b"|",
    b",",
    b"9223372036854775807",
    b"-1",
    b"messages[0]['content']",
    b"message.role",
    b"bos_token",
    b"add_generation_prompt",
    b"[::-1]",
    b"[1:-1]",
    b".split(",
    b".startswith(",
    b"{% raw %}",
    b"{% endraw %}",
    b"{% include 'x' %}",
    b"{% extends 'x' %}",
    b"{% filter upper %}",
];

/// Binary targets: strings a GGUF reader looks up.
const GGUF_DICT: &[&[u8]] = &[
    b"general.architecture",
    b"llama",
    b"qwen2",
    b"tokenizer.chat_template",
    b"tokenizer.ggml.tokens",
    b"general.alignment",
    b"{{ messages }}",
];

/// FNV-1a 64 (the predictor crate's file checksum).
fn fnv(d: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &x in d {
        h ^= x as u64;
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}

/// CRC-32 (IEEE, reflected), bit by bit: the neuron store's checksum.
fn crc32(d: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in d {
        c ^= b as u32;
        for _ in 0..8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ 0xEDB8_8320
            } else {
                c >> 1
            };
        }
    }
    !c
}

/// Profile and predictor files: re-seal the trailing checksum.
fn reseal_fnv(_: &str, b: &mut [u8]) {
    if b.len() >= 8 {
        let n = b.len() - 8;
        let h = fnv(&b[..n]);
        b[n..].copy_from_slice(&h.to_le_bytes());
    }
}

/// Neuron stores: index CRC, file length and header CRC made to agree with the bytes.
fn reseal_store(_: &str, b: &mut [u8]) {
    if b.len() < 48 {
        return;
    }
    let index_len = u64::from_le_bytes(b[16..24].try_into().unwrap());
    if let Some(end) = index_len.checked_add(48).filter(|&e| e <= b.len() as u64) {
        let c = crc32(&b[48..end as usize]);
        b[12..16].copy_from_slice(&c.to_le_bytes());
    }
    let len = b.len() as u64;
    b[32..40].copy_from_slice(&len.to_le_bytes());
    let c = crc32(&b[..40]);
    b[40..44].copy_from_slice(&c.to_le_bytes());
}

fn one(name: &str, bytes: Vec<u8>) -> Case {
    vec![(name.to_string(), bytes)]
}

fn e(x: impl std::fmt::Display) -> String {
    x.to_string()
}

/// Opens a model file the way the CLI does, then its configuration, tokenizer (and chat template)
/// and weights.
fn open_model(path: &Path) -> Result<(), String> {
    let file = ModelFile::open(path).map_err(e)?;
    if let ModelFile::Gguf(g) = &file {
        for (_, v) in g.metadata() {
            let _ = (v.as_str(), v.as_u64(), v.to_string_vec());
        }
        for t in g.tensors() {
            let _ = (
                t.rows(),
                t.cols(),
                t.n_elements(),
                t.data.first(),
                t.data.last(),
            );
        }
    }
    if let ModelFile::Hf(h) = &file {
        for t in h.tensors() {
            let _ = (
                t.rows(),
                t.cols(),
                t.n_elements(),
                t.data.first(),
                t.data.last(),
            );
        }
    }
    let config = file.config();
    if let Ok(tok) = load_tokenizer(&file) {
        use_tokenizer(&tok)?;
    }
    config.map_err(e)?;
    Model::load(&file).map_err(e)?;
    Ok(())
}

/// Encodes, decodes and streams a text with special tokens; renders the chat template if any.
fn use_tokenizer(tok: &Tokenizer) -> Result<(), String> {
    let ids = tok
        .encode("<|im_start|>hello 12 wörld 😀<|im_end|>", true)
        .map_err(e)?;
    let _ = tok.decode(&ids, false);
    let _ = tok.decode(&ids, true);
    let _ = tok.decode(&[0, u32::MAX, tok.vocab_size() as u32], false);
    let mut s = tok.stream_decoder(true);
    for &id in &ids {
        let _ = s.push(id);
    }
    let _ = s.finish();
    for id in [0, tok.vocab_size() as u32, u32::MAX] {
        let _ = (tok.id_to_piece(id), tok.is_special(id));
    }
    if let Some(t) = tok.chat_template() {
        render(t).map_err(e)?;
    }
    Ok(())
}

fn render(t: &ChatTemplate) -> Result<String, model_tokenizer::TokenizerError> {
    let messages = [
        ChatMessage::new("system", "You are terse."),
        ChatMessage::new("user", "Hi {{ 1 }} <|im_end|>"),
        ChatMessage::new("assistant", ""),
        ChatMessage::new("user", "x"),
    ];
    t.render(&messages, true, "<s>", "</s>")
}

mod files;
mod model;
mod text;

use files::{manifest, plan, predictor, profile, store};
use model::{gguf, hf};
use text::{chat, tokenizer};

/// Every target, in a fixed order.
pub fn all() -> Vec<Target> {
    vec![
        gguf(),
        hf(),
        tokenizer(),
        chat(),
        profile(),
        predictor(),
        store(),
        manifest(),
        plan(),
    ]
}
