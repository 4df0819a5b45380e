//! SentencePiece ("llama") vocabularies on a tiny hand-made vocabulary. The real Gemma 3 vocabulary
//! is checked against `llama-tokenize`'s ids by `crates/engine/tests/it/tokenize_gemma.rs`.

use crate::*;

/// Gemma's layout in miniature: specials, user-defined whitespace runs, the 256 byte tokens, then
/// normal tokens with scores.
fn spm_spec(add_space_prefix: Option<bool>) -> VocabSpec {
    let mut tokens: Vec<String> = vec![];
    let mut types = vec![];
    let mut scores = vec![];
    let mut push = |t: &str, ty: i32, score: f32| {
        tokens.push(t.to_string());
        types.push(ty);
        scores.push(score);
    };
    push("<pad>", 3, -1000.0); // 0
    push("<eos>", 3, -1000.0); // 1
    push("<bos>", 3, -1000.0); // 2
    push("<unk>", 2, -1000.0); // 3
    push("<start_of_turn>", 3, -1000.0); // 4
    push("<end_of_turn>", 3, -1000.0); // 5
    push("\n", 4, -1000.0); // 6
    push("\n\n", 4, -1000.0); // 7
    push("  ", 4, -1000.0); // 8
    push("<unused0>", 5, -1000.0); // 9: unused type, decodes to nothing
    for b in 0..=255u32 {
        push(&format!("<0x{b:02X}>"), 6, 0.0); // 10..266
    }
    for (t, s) in [
        ("▁", -1.0),    // 266
        ("a", -2.0),    // 267
        ("b", -2.0),    // 268
        ("c", -2.0),    // 269
        ("ab", -5.0),   // 270
        ("bc", -3.0),   // 271
        ("aa", -4.0),   // 272
        ("▁a", -6.0),   // 273
        ("h", -2.0),    // 274
        ("i", -2.0),    // 275
        ("hi", -3.0),   // 276
        ("▁hi", -3.5),  // 277
        ("é", -2.0),    // 278
        ("abc", -20.0), // 279: only reachable through ab+c or a+bc
    ] {
        push(t, 1, s);
    }
    VocabSpec {
        model: "llama".into(),
        pre: Some("default".into()),
        tokens,
        token_types: types,
        scores,
        add_space_prefix,
        bos_id: Some(2),
        eos_id: Some(1),
        unk_id: Some(3),
        pad_id: Some(0),
        add_bos: true,
        ..VocabSpec::default()
    }
}

fn spm() -> Tokenizer {
    Tokenizer::from_vocab(&spm_spec(Some(false))).expect("the tiny SentencePiece vocabulary builds")
}

fn byte(b: u8) -> u32 {
    10 + b as u32
}

#[test]
fn the_highest_score_merges_first_and_ties_go_left() {
    let t = spm();
    // "bc" (-3) beats "ab" (-5); then "a"+"bc" = "abc" is a token.
    assert_eq!(t.encode("abc", false).unwrap(), vec![279]);
    assert_eq!(t.encode("ab", false).unwrap(), vec![270]);
    // Equal scores: "aa" at 0 merges before "aa" at 1; the third "a" stays.
    assert_eq!(t.encode("aaa", false).unwrap(), vec![272, 267]);
    assert_eq!(t.encode("aaaa", false).unwrap(), vec![272, 272]);
}

#[test]
fn spaces_become_the_marker_and_the_prefix_follows_the_metadata() {
    let t = spm();
    assert_eq!(t.encode("hi hi", false).unwrap(), vec![276, 277]);
    assert_eq!(t.encode(" a", false).unwrap(), vec![273]);
    let prefixed = Tokenizer::from_vocab(&spm_spec(None)).unwrap();
    // Absent add_space_prefix means true, as in llama.cpp: a space before the text and after
    // each special token.
    assert_eq!(prefixed.encode("hi", false).unwrap(), vec![277]);
    assert_eq!(
        prefixed.encode("hi<eos>hi", false).unwrap(),
        vec![277, 1, 277]
    );
    // After a user-defined token, no prefix either (it is cut out like a special token).
    assert_eq!(prefixed.encode("\nhi", false).unwrap(), vec![6, 277]);
}

#[test]
fn characters_outside_the_vocabulary_fall_back_to_bytes() {
    let t = spm();
    assert_eq!(t.encode("é", false).unwrap(), vec![278]);
    // "ü" is no token: its two UTF-8 bytes.
    assert_eq!(t.encode("ü", false).unwrap(), vec![byte(0xC3), byte(0xBC)]);
    assert_eq!(
        t.encode("a😀", false).unwrap(),
        vec![267, byte(0xF0), byte(0x9F), byte(0x98), byte(0x80)]
    );
    let ids = t.encode("üa😀 hi", false).unwrap();
    assert_eq!(t.decode(&ids, false).unwrap(), "üa😀 hi");
}

#[test]
fn special_and_user_defined_tokens_are_cut_first_longest_first() {
    let t = spm();
    assert_eq!(
        t.encode("<start_of_turn>hi\n\n\nab<end_of_turn>", false)
            .unwrap(),
        // "\n\n" (longer) is cut before "\n".
        vec![4, 276, 7, 6, 270, 5]
    );
    assert_eq!(t.encode("hi  hi", false).unwrap(), vec![276, 8, 276]);
    // With BOS.
    assert_eq!(t.encode("hi", true).unwrap(), vec![2, 276]);
    assert!(t.add_bos_default());
}

#[test]
fn encode_text_reads_control_tokens_as_text_but_keeps_user_defined_ones() {
    let t = spm();
    let ids = t.encode_text("<eos>\n").unwrap();
    assert!(!ids.contains(&1), "{ids:?}");
    assert_eq!(*ids.last().unwrap(), 6, "{ids:?}");
    assert_eq!(t.decode(&ids, false).unwrap(), "<eos>\n");
}

#[test]
fn decoding_follows_the_token_types() {
    let t = spm();
    // Normal with the marker as a space, byte, control, user-defined, unused.
    let ids = [277, byte(b'!'), 1, 8, 9, 6];
    assert_eq!(t.decode(&ids, false).unwrap(), " hi!<eos>  \n");
    assert_eq!(t.decode(&ids, true).unwrap(), " hi!  \n");
    assert!(t.is_special(1) && t.is_special(3) && !t.is_special(6));
    let mut s = t.stream_decoder(false);
    let mut text = String::new();
    for id in t.encode("é ü😀\n", false).unwrap() {
        text += &s.push(id).unwrap();
    }
    text += &s.finish();
    assert_eq!(text, "é ü😀\n");
    assert_eq!(t.piece_to_id("▁hi"), Some(277));
    assert!(t.to_json(false).is_err());
    assert!(t.hf_tokenizer().is_none());
}

#[test]
fn end_of_turn_stops_generation() {
    let t = spm();
    assert_eq!(t.stop_ids(), vec![1, 5]);
}

#[test]
fn bad_sentencepiece_vocabularies_are_errors() {
    let mut spec = spm_spec(Some(false));
    spec.scores.pop();
    let e = Tokenizer::from_vocab(&spec).unwrap_err();
    assert!(e.to_string().contains("tokenizer.ggml.scores"), "{e}");
    // No byte tokens: a character outside the vocabulary cannot be encoded, and says so.
    let mut spec = spm_spec(Some(false));
    for t in spec.tokens.iter_mut().filter(|t| t.starts_with("<0x")) {
        t.insert(0, '#');
    }
    let t = Tokenizer::from_vocab(&spec).unwrap();
    let e = t.encode("ü", false).unwrap_err();
    assert!(e.to_string().contains("0xC3"), "{e}");
    // Hostile scores (NaN) do not panic.
    let mut spec = spm_spec(Some(false));
    spec.scores.iter_mut().for_each(|s| *s = f32::NAN);
    let t = Tokenizer::from_vocab(&spec).unwrap();
    let ids = t.encode("abcabc hi", false).unwrap();
    assert_eq!(t.decode(&ids, false).unwrap(), "abcabc hi");
}

#[test]
fn gemma_vocabularies_without_a_template_get_gemmas() {
    let t = spm();
    assert_eq!(
        t.chat_template().map(|c| c.source()),
        Some(ChatTemplate::gemma().source())
    );
    let msgs = [
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", " Hi <eos> "),
        ChatMessage::new("assistant", "hi"),
        ChatMessage::new("user", "ab"),
    ];
    let text = ChatTemplate::gemma()
        .render(&msgs, true, "<bos>", "<eos>")
        .unwrap();
    assert_eq!(
        text,
        "<bos><start_of_turn>user\nBe brief.\n\nHi <eos><end_of_turn>\n<start_of_turn>model\nhi<end_of_turn>\n<start_of_turn>user\nab<end_of_turn>\n<start_of_turn>model\n"
    );
    let ids = t.encode_chat(&msgs[2..], false).unwrap_err();
    assert!(ids.to_string().contains("alternate"), "{ids}");
    let ids = t.encode_chat(&msgs[..2], true).unwrap();
    // BOS and the turn markers come from the template; the user's "<eos>" stays text.
    assert_eq!(&ids[..2], &[2, 4]);
    assert_eq!(ids.iter().filter(|&&i| i == 1).count(), 0, "{ids:?}");
    assert_eq!(ids.iter().filter(|&&i| i == 5).count(), 1, "{ids:?}");
    assert_eq!(&ids[ids.len() - 1..], &[6]);
}
