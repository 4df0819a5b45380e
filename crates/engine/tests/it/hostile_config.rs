//! Hostile hyper-parameters in an otherwise valid GGUF (issue "Reliability"): each is refused at load
//! with an error naming the file and the value, before anything is allocated from it.

use std::path::{Path, PathBuf};

use engine::{Engine, EngineOptions, ModelFile};
use model_format::{GgufFile, GgufWriter, MetaValue};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tiny-llama-silu-q4_0.gguf")
}

/// The fixture rewritten with `key` set to `value` (`None`: the key removed) and only the tensors
/// `keep` accepts, in a folder the file's tests share (each removes its files when done; the
/// folder stays, as another test may be writing into it).
fn variant(
    name: &str,
    key: &str,
    value: Option<MetaValue>,
    keep: impl Fn(&str) -> bool,
) -> PathBuf {
    let src = GgufFile::open(fixture()).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in src.metadata() {
        if k != key {
            w.metadata(k, v.clone());
        }
    }
    if let Some(v) = value {
        w.metadata(key, v);
    }
    for t in src.tensors().filter(|t| keep(t.name)) {
        w.tensor(t.name, t.dtype, t.shape, t.data.to_vec()).unwrap();
    }
    let dir = std::env::temp_dir().join(format!("sparrow-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{name}.gguf"));
    w.write(&path).unwrap();
    path
}

fn load_error(path: &Path) -> String {
    match ModelFile::open(path)
        .map_err(engine::EngineError::from)
        .and_then(|f| Engine::new(&f, EngineOptions::default()).map(|_| ()))
    {
        Ok(()) => panic!("{} should not load", path.display()),
        Err(e) => e.to_string(),
    }
}

fn arch() -> String {
    let src = GgufFile::open(fixture()).unwrap();
    src.get("general.architecture")
        .unwrap()
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn absurd_or_inconsistent_hyper_parameters_are_refused() {
    let a = arch();
    let layers = GgufFile::open(fixture())
        .unwrap()
        .get(&format!("{a}.block_count"))
        .unwrap()
        .as_u64()
        .unwrap();
    assert!(layers >= 2, "the fixture has several layers");
    let all = |_: &str| true;
    for (name, key, value, expect) in [
        (
            "blocks-u32max",
            "block_count",
            MetaValue::U32(u32::MAX),
            "block count 4294967295 is out of range",
        ),
        (
            "eps-negative",
            "attention.layer_norm_rms_epsilon",
            MetaValue::F32(-1e-5),
            "rms epsilon -0.00001 is not a finite number above 0",
        ),
        (
            "eps-nan",
            "attention.layer_norm_rms_epsilon",
            MetaValue::F32(f32::NAN),
            "rms epsilon NaN",
        ),
        (
            "fewer-layers",
            "block_count",
            MetaValue::U32(layers as u32 - 1),
            "belongs to layer",
        ),
        (
            "context-huge",
            "context_length",
            MetaValue::U64(1 << 40),
            "context length",
        ),
        (
            "vocab-huge",
            "vocab_size",
            MetaValue::U64(u64::MAX),
            "vocabulary size",
        ),
    ] {
        let p = variant(name, &format!("{a}.{key}"), Some(value), all);
        let msg = load_error(&p);
        let _ = std::fs::remove_file(&p);
        assert!(
            msg.contains(p.to_str().unwrap()) && msg.contains(expect),
            "{name}: {msg}"
        );
    }
    // More layers declared than present: the missing layer is named.
    let last = format!("blk.{}.", layers - 1);
    let p = variant(
        "missing-layer",
        &format!("{a}.block_count"),
        Some(MetaValue::U32(layers as u32)),
        |n: &str| !n.starts_with(&last),
    );
    let msg = load_error(&p);
    let _ = std::fs::remove_file(&p);
    assert!(msg.contains(&last), "{msg}");
}

#[test]
fn a_resident_file_names_its_store_only_inside_its_folder() {
    for name in [
        "/proc/self/environ",
        "/dev/zero",
        "../outside.neurons",
        "sub/x.neurons",
        "..",
    ] {
        let src = GgufFile::open(fixture()).unwrap();
        let mut w = GgufWriter::new();
        for (k, v) in src.metadata() {
            w.metadata(k, v.clone());
        }
        w.metadata(
            "sparrow.ffn_store.file",
            MetaValue::String(name.to_string()),
        );
        w.metadata("sparrow.ffn_store.fingerprint", MetaValue::U64(1));
        for t in src.tensors() {
            w.tensor(t.name, t.dtype, t.shape, t.data.to_vec()).unwrap();
        }
        let dir =
            std::env::temp_dir().join(format!("sparrow-hostile-store-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("r.resident.gguf");
        w.write(&path).unwrap();
        let msg = load_error(&path);
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            msg.contains("is not a plain file name") && msg.contains(name),
            "{name}: {msg}"
        );
    }

    // A plain name that is a symbolic link out of the folder is refused before it is opened; one
    // to a file in the same folder is fine.
    let dir = std::env::temp_dir().join(format!("sparrow-hostile-link-{}", std::process::id()));
    let inner = dir.join("bundle");
    std::fs::create_dir_all(&inner).unwrap();
    std::fs::write(dir.join("outside.neurons"), b"x").unwrap();
    std::fs::write(inner.join("real.neurons"), b"x").unwrap();
    std::os::unix::fs::symlink("../outside.neurons", inner.join("out.neurons")).unwrap();
    std::os::unix::fs::symlink("real.neurons", inner.join("in.neurons")).unwrap();
    let model = inner.join("m.resident.gguf");
    let r = |file: &str| engine::config::FfnStoreRef {
        file: file.into(),
        fingerprint: 0,
        parts: None,
    };
    let e = r("out.neurons")
        .path_next_to(&model)
        .unwrap_err()
        .to_string();
    assert!(e.contains("symbolic link leading out"), "{e}");
    assert_eq!(
        r("in.neurons").path_next_to(&model).unwrap(),
        inner.join("in.neurons")
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Loads `path` as the CLI does and generates from a short prompt (and renders the chat template):
/// `Ok`, or the error's text. A panic is returned as `Err("PANIC: ...")`.
fn load_and_generate(path: &Path) -> Result<(), String> {
    let run = || -> Result<(), engine::EngineError> {
        let file = ModelFile::open(path)?;
        let eng = Engine::new(
            &file,
            EngineOptions {
                threads: 1,
                context: 32,
                ..Default::default()
            },
        )?;
        let tok = eng.tokenizer();
        let mut ids = tok.encode("hello world 12 <|im_start|>", true)?;
        let _ = tok.decode(&ids, false)?;
        // A template that does not compile is kept as an error for `--chat` (raw runs still work).
        if let Some(e) = tok.chat_template_error() {
            return Err(engine::EngineError::BadModel {
                path: path.to_path_buf(),
                detail: format!("chat template: {e}"),
            });
        }
        if let Some(t) = tok.chat_template() {
            let m = [engine::ChatMessage::new("user", "hi")];
            // A render error is the template's (the CLI names it as such), not the file's.
            if let Err(e) = t.render(&m, true, "<s>", "</s>") {
                return Err(engine::EngineError::BadModel {
                    path: path.to_path_buf(),
                    detail: format!("chat template: {e}"),
                });
            }
        }
        ids.truncate(8);
        if ids.is_empty() {
            ids.push(0);
        }
        let req = engine::GenerateRequest {
            max_tokens: 2,
            ..Default::default()
        };
        eng.generate(&ids, &req, |_| engine::Flow::Continue)?;
        Ok(())
    };
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)) {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(p) => Err(format!(
            "PANIC: {}",
            p.downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default()
        )),
    }
}

/// The class "hostile metadata in an otherwise valid GGUF" beyond the hyper-parameters above: special
/// token ids outside the vocabulary, heads that do not divide the width, a vocabulary that
/// disagrees with the embedding, merges naming unknown tokens, bad token types, odd RoPE settings.
/// Each loads and generates, or is an error naming the file; none panics. Those that cannot describe
/// a runnable model must be errors.
#[test]
fn hostile_metadata_is_an_error_naming_the_file_or_harmless() {
    let a = arch();
    let src = GgufFile::open(fixture()).unwrap();
    let u = |k: &str| src.get(&format!("{a}.{k}")).and_then(|v| v.as_u64());
    let d_model = u("embedding_length").unwrap();
    let heads = u("attention.head_count").unwrap();
    let n_tokens = src
        .get("tokenizer.ggml.tokens")
        .and_then(|v| v.as_array())
        .unwrap()
        .len() as u64;
    let all = |_: &str| true;
    let s = |v: &str| MetaValue::String(v.into());
    let strs =
        |v: &[&str]| MetaValue::Array(v.iter().map(|x| MetaValue::String(x.to_string())).collect());
    // (name, key, value, must fail with this text)
    let cases: Vec<(&str, String, Option<MetaValue>, Option<&str>)> = vec![
        (
            "heads-7",
            format!("{a}.attention.head_count"),
            Some(MetaValue::U32(7)),
            Some(""),
        ),
        (
            "heads-width",
            format!("{a}.attention.head_count"),
            Some(MetaValue::U64(d_model + 1)),
            Some(""),
        ),
        (
            "kv-heads-more",
            format!("{a}.attention.head_count_kv"),
            Some(MetaValue::U64(heads * 2)),
            Some(""),
        ),
        (
            "key-length-odd",
            format!("{a}.attention.key_length"),
            Some(MetaValue::U32(3)),
            Some(""),
        ),
        (
            "key-length-huge",
            format!("{a}.attention.key_length"),
            Some(MetaValue::U64(u64::MAX)),
            Some(""),
        ),
        (
            "rope-dim-big",
            format!("{a}.rope.dimension_count"),
            Some(MetaValue::U64(1 << 40)),
            Some(""),
        ),
        (
            "rope-base-zero",
            format!("{a}.rope.freq_base"),
            Some(MetaValue::F32(0.0)),
            Some(""),
        ),
        (
            "rope-base-inf",
            format!("{a}.rope.freq_base"),
            Some(MetaValue::F32(f32::INFINITY)),
            Some(""),
        ),
        (
            "ctx-zero",
            format!("{a}.context_length"),
            Some(MetaValue::U32(0)),
            Some("zero"),
        ),
        (
            "vocab-small",
            format!("{a}.vocab_size"),
            Some(MetaValue::U64(5)),
            Some(""),
        ),
        (
            "vocab-big",
            format!("{a}.vocab_size"),
            Some(MetaValue::U64(n_tokens + 1000)),
            Some(""),
        ),
        (
            "ffn-other",
            format!("{a}.feed_forward_length"),
            Some(MetaValue::U64(7)),
            Some(""),
        ),
        (
            "bos-out",
            "tokenizer.ggml.bos_token_id".into(),
            Some(MetaValue::U32(u32::MAX)),
            Some(""),
        ),
        (
            "bos-past-u32",
            "tokenizer.ggml.bos_token_id".into(),
            Some(MetaValue::U64((1 << 32) + 1)),
            Some("out of range"),
        ),
        (
            "eos-out",
            "tokenizer.ggml.eos_token_id".into(),
            Some(MetaValue::U64(n_tokens)),
            Some(""),
        ),
        (
            "unk-out",
            "tokenizer.ggml.unknown_token_id".into(),
            Some(MetaValue::I32(-1)),
            None,
        ),
        (
            "pad-out",
            "tokenizer.ggml.padding_token_id".into(),
            Some(MetaValue::U32(n_tokens as u32 + 7)),
            Some(""),
        ),
        (
            "eot-out",
            "tokenizer.ggml.eot_token_id".into(),
            Some(MetaValue::U32(n_tokens as u32)),
            Some(""),
        ),
        (
            "tokens-empty",
            "tokenizer.ggml.tokens".into(),
            Some(strs(&[])),
            Some(""),
        ),
        (
            "tokens-few",
            "tokenizer.ggml.tokens".into(),
            Some(strs(&["a", "b", "c"])),
            None,
        ),
        (
            "tokens-dup",
            "tokenizer.ggml.tokens".into(),
            Some(strs(&["a", "a", "a"])),
            None,
        ),
        (
            "tokens-not-strings",
            "tokenizer.ggml.tokens".into(),
            Some(MetaValue::Array(vec![MetaValue::U8(1)])),
            Some(""),
        ),
        (
            "merges-unknown",
            "tokenizer.ggml.merges".into(),
            Some(strs(&["zz qq", "q q", "\u{0} \u{0}"])),
            None,
        ),
        (
            "merges-malformed",
            "tokenizer.ggml.merges".into(),
            Some(strs(&["abc", "", " ", "a  b"])),
            None,
        ),
        (
            "merges-not-strings",
            "tokenizer.ggml.merges".into(),
            Some(MetaValue::U32(3)),
            Some(""),
        ),
        (
            "types-short",
            "tokenizer.ggml.token_type".into(),
            Some(MetaValue::Array(vec![MetaValue::I32(1)])),
            None,
        ),
        (
            "types-odd",
            "tokenizer.ggml.token_type".into(),
            Some(MetaValue::Array(vec![
                MetaValue::I32(i32::MIN);
                n_tokens as usize
            ])),
            None,
        ),
        (
            "model-unknown",
            "tokenizer.ggml.model".into(),
            Some(s("wordpiece-xyz")),
            Some(""),
        ),
        (
            "model-missing",
            "tokenizer.ggml.model".into(),
            None,
            Some(""),
        ),
        (
            "pre-unknown",
            "tokenizer.ggml.pre".into(),
            Some(s("\u{0}weird")),
            None,
        ),
        (
            "template-bad",
            "tokenizer.chat_template".into(),
            Some(s("{% for %}")),
            Some(""),
        ),
        (
            "template-raise",
            "tokenizer.chat_template".into(),
            Some(s("{{ raise_exception('no') }}")),
            Some(""),
        ),
        (
            "add-bos-int",
            "tokenizer.ggml.add_bos_token".into(),
            Some(MetaValue::U32(7)),
            None,
        ),
        (
            "activation-odd",
            "sparrow.ffn_activation".into(),
            Some(s("gelu")),
            Some(""),
        ),
    ];
    let mut report = Vec::new();
    for (name, key, value, must_fail) in cases {
        let p = variant(name, &key, value, all);
        let r = load_and_generate(&p);
        let _ = std::fs::remove_file(&p);
        match (&r, must_fail) {
            (Err(e), _) if e.starts_with("PANIC") => report.push(format!("{name}: {e}")),
            (Err(e), _) if !e.contains(p.to_str().unwrap()) => {
                report.push(format!("{name}: the error does not name the file: {e}"))
            }
            (Ok(()), Some(_)) => report.push(format!("{name}: loaded and ran, should be refused")),
            (Err(e), Some(want)) if !e.contains(want) => {
                report.push(format!("{name}: {e} (expected `{want}`)"))
            }
            _ => {}
        }
        println!("{name}: {r:?}");
    }
    assert!(report.is_empty(), "{}", report.join("\n"));
}
