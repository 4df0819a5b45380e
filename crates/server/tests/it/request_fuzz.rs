//! The request parser under mutated bodies (the server's stable fuzz round; the libFuzzer target is
//! `fuzz/fuzz_targets/server_request.rs`): valid OpenAI bodies, mutated byte-wise and by splicing JSON
//! tokens, give `Ok` or a 4xx [`server::ApiError`], never a panic.

use proptest::prelude::*;

fn tokenizer() -> &'static engine::Tokenizer {
    static TOK: std::sync::OnceLock<engine::Tokenizer> = std::sync::OnceLock::new();
    TOK.get_or_init(load_tokenizer)
}

fn load_tokenizer() -> engine::Tokenizer {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../fixtures/tiny-llama-silu-q4_0.gguf"
    );
    let file = engine::ModelFile::open(path).expect("the fixture opens");
    engine::load_tokenizer(&file).expect("the fixture has a tokenizer")
}

/// (chat endpoint, body): valid requests using every field the parser reads.
const SEEDS: &[(bool, &str)] = &[
    (
        false,
        r#"{"prompt": "hello", "max_tokens": 4, "temperature": 0.5, "top_p": 0.9, "stop": ["\n", "x"], "seed": 3, "n": 2, "model": "m"}"#,
    ),
    (
        false,
        r#"{"prompt": [1, 2, 3], "stream": true, "stream_options": {"include_usage": true}, "ignore_eos": true}"#,
    ),
    (
        false,
        r#"{"prompt": ["a"], "max_completion_tokens": 2, "stop": "y"}"#,
    ),
    (
        true,
        r#"{"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}], "max_tokens": 3}"#,
    ),
    (
        true,
        r#"{"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "text", "text": " there"}]}], "n": 1, "seed": 9}"#,
    ),
];

const TOKENS: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    ":",
    ",",
    "\"",
    "null",
    "true",
    "-1",
    "1e308",
    "-0.0",
    "4294967296",
    "18446744073709551615",
    "NaN",
    "\"\\ud800\"",
    "[[[[[[[[",
    "\"prompt\"",
    "\"messages\"",
    "\"content\"",
    "\"role\"",
    "\"max_tokens\"",
    "\"n\"",
    "\"stop\"",
    "\"temperature\"",
    "\"top_p\"",
    "\"seed\"",
    "\"stream\"",
    "\"model\"",
];

/// One edit of a body: flip a byte, delete a range, or splice in a JSON token.
#[derive(Debug, Clone)]
enum Edit {
    Flip(usize, u8),
    Delete(usize, usize),
    Splice(usize, usize),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Edit::Flip(i, b)),
        (any::<usize>(), 1usize..16).prop_map(|(i, n)| Edit::Delete(i, n)),
        (any::<usize>(), 0..TOKENS.len()).prop_map(|(i, t)| Edit::Splice(i, t)),
    ]
}

fn apply(body: &mut Vec<u8>, e: &Edit) {
    let at = |i: usize, len: usize| if len == 0 { 0 } else { i % (len + 1) };
    match *e {
        Edit::Flip(i, b) if !body.is_empty() => {
            let n = body.len();
            body[i % n] ^= b.max(1);
        }
        Edit::Flip(..) => {}
        Edit::Delete(i, n) => {
            let start = at(i, body.len()).min(body.len());
            let end = (start + n).min(body.len());
            body.drain(start..end);
        }
        Edit::Splice(i, t) => {
            let p = at(i, body.len());
            body.splice(p..p, TOKENS[t].bytes());
        }
    }
}

#[test]
fn the_seeds_are_accepted() {
    let tok = tokenizer();
    for (chat, body) in SEEDS {
        server::check_request(*chat, body.as_bytes(), tok, 256)
            .unwrap_or_else(|e| panic!("{body}: {e:?}"));
    }
    // And the checks reject what they should (so the round below reaches them).
    let e = server::check_request(false, br#"{"prompt": "hi", "model": "other"}"#, tok, 256);
    assert!(e.is_err());
    let e = server::check_request(false, br#"{"prompt": "hi", "top_p": 2}"#, tok, 256);
    assert!(e.is_err());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]
    #[test]
    fn mutated_bodies_are_ok_or_a_request_error(
        seed in 0..SEEDS.len(),
        edits in proptest::collection::vec(edit(), 1..8),
        context in 1usize..64,
    ) {
        let tok = tokenizer();
        let (chat, body) = SEEDS[seed];
        let mut body = body.as_bytes().to_vec();
        for e in &edits {
            apply(&mut body, e);
        }
        if let Err(e) = server::check_request(chat, &body, tok, context) {
            let status = e.status.as_u16();
            prop_assert!((400..500).contains(&status), "{status}: {e:?}");
        }
    }
}
