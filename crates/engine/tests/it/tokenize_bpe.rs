//! The compact byte-level BPE that GGUF vocabularies get (`model-tokenizer`'s `Bpe`) against
//! `tokenizers`' own `BPE` on the two real BPE vocabularies: the GGUF tokenizer and its
//! `tokenizer.json` (written by `to_json`, read back by `from_tokenizer_json`, which encodes with
//! `tokenizers`' `BPE` over the same vocabulary, merges and pre-tokenizer) give the same ids over
//! WikiText-2 test text, chat specials and all.

use crate::common;

use engine::ModelFile;
use model_tokenizer::Tokenizer;

/// The first `n` bytes of WikiText-2 test (at a character boundary), in paragraphs.
fn wikitext(n: usize) -> Vec<String> {
    let p = common::shared_dir().join("data/wikitext-2/test.txt");
    let text = std::fs::read_to_string(&p).expect("wikitext-2/test.txt is readable");
    let mut end = n.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].split("\n \n").map(str::to_owned).collect()
}

fn same_ids(path: &std::path::Path, tag: &str) {
    let file = ModelFile::open(path).expect("the model opens");
    let ours = engine::load_tokenizer(&file).expect("its tokenizer loads");
    let dir = std::env::temp_dir().join(format!("sparrow-bpe-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("tokenizer.json");
    std::fs::write(&json, ours.to_json(false).unwrap()).unwrap();
    let theirs = Tokenizer::from_tokenizer_json(&json).expect("tokenizer.json loads");
    std::fs::remove_dir_all(&dir).unwrap();
    let mut tokens = 0;
    let mut texts = wikitext(300_000);
    texts.push("<|im_start|>user\nfn main() { println!(\"héllo 😀 世界\"); }<|im_end|>\n".into());
    for t in &texts {
        let a = ours.encode(t, false).unwrap();
        assert_eq!(a, theirs.encode(t, false).unwrap(), "{tag}: {t:?}");
        assert_eq!(
            ours.encode_text(t).unwrap(),
            theirs.encode_text(t).unwrap(),
            "{tag}: {t:?}"
        );
        tokens += a.len();
    }
    assert!(tokens > 50_000, "{tag}: only {tokens} tokens compared");
}

#[test]
fn smollm2_bpe_matches_tokenizers() {
    same_ids(&common::model_path(), "smollm2");
}

#[test]
fn qwen_bpe_matches_tokenizers() {
    let m = engine::fetch::known_model("qwen2.5-coder-0.5b").expect("a known model");
    let path = engine::fetch::ensure_model(m, |line| eprintln!("test setup: {line}"))
        .expect("qwen2.5-coder-0.5b can be fetched");
    same_ids(&path, "qwen");
}
