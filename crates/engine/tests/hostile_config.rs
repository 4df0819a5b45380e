//! Hostile hyper-parameters in an otherwise valid GGUF (issue "Reliability"): each is refused at load
//! with an error naming the file and the value, before anything is allocated from it.

use std::path::{Path, PathBuf};

use engine::{Engine, EngineOptions, ModelFile};
use model_format::{GgufFile, GgufWriter, MetaValue};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tiny-llama-silu-q4_0.gguf")
}

/// The fixture rewritten with `key` set to `value` (`None`: the key removed) and only the tensors
/// `keep` accepts.
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
    match ModelFile::open(path).and_then(|f| Engine::new(&f, EngineOptions::default()).map(|_| ()))
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
