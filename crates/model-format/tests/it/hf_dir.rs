//! Hugging Face directories: config.json + (sharded) safetensors.

use crate::common;

use std::collections::HashMap;
use std::path::Path;

use common::TempDir;
use model_format::{DType, FormatError, HfDir};
use safetensors::tensor::TensorView as StView;
use safetensors::Dtype;

const CONFIG: &str = r#"{
  "architectures": ["LlamaForCausalLM"],
  "model_type": "llama",
  "hidden_size": 64,
  "intermediate_size": 128,
  "num_hidden_layers": 2,
  "num_attention_heads": 4,
  "num_key_value_heads": 2,
  "rms_norm_eps": 1e-05,
  "rope_theta": 100000.0,
  "vocab_size": 100,
  "tie_word_embeddings": true,
  "hidden_act": "silu",
  "max_position_embeddings": 2048,
  "bos_token_id": 1,
  "eos_token_id": [2, 3],
  "torch_dtype": "bfloat16",
  "some_unknown_field": {"nested": [1, 2, 3]},
  "rope_scaling": null
}"#;

struct Spec {
    name: &'static str,
    st: Dtype,
    dtype: DType,
    shape: Vec<usize>,
    data: Vec<u8>,
}

fn specs() -> Vec<Spec> {
    let f32s: Vec<u8> = (0..6)
        .flat_map(|i| (i as f32 * 0.5).to_le_bytes())
        .collect();
    let f16s: Vec<u8> = (0..24)
        .flat_map(|i| half::f16::from_f32(i as f32).to_le_bytes())
        .collect();
    let bf16s: Vec<u8> = (0..5)
        .flat_map(|i| half::bf16::from_f32(-(i as f32)).to_le_bytes())
        .collect();
    vec![
        Spec {
            name: "model.embed_tokens.weight",
            st: Dtype::F32,
            dtype: DType::F32,
            shape: vec![2, 3],
            data: f32s,
        },
        Spec {
            name: "model.layers.0.mlp.up_proj.weight",
            st: Dtype::F16,
            dtype: DType::F16,
            shape: vec![2, 3, 4],
            data: f16s,
        },
        Spec {
            name: "model.norm.weight",
            st: Dtype::BF16,
            dtype: DType::BF16,
            shape: vec![5],
            data: bf16s,
        },
    ]
}

fn write_safetensors(path: &Path, specs: &[&Spec]) {
    let views: Vec<(&str, StView<'_>)> = specs
        .iter()
        .map(|s| (s.name, StView::new(s.st, s.shape.clone(), &s.data).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

fn check_tensors(hf: &HfDir) {
    let specs = specs();
    assert_eq!(hf.tensor_infos().len(), specs.len());
    for s in &specs {
        let t = hf
            .tensor(s.name)
            .unwrap_or_else(|| panic!("{} missing", s.name));
        assert_eq!(t.name, s.name);
        assert_eq!(t.dtype, s.dtype);
        assert_eq!(t.shape, &s.shape[..]);
        assert_eq!(t.data, &s.data[..]);
        let info = hf.tensor_infos().iter().find(|i| i.name == s.name).unwrap();
        assert_eq!(info.n_bytes, s.data.len() as u64);
        // The offset is absolute within the shard file.
        let file = std::fs::read(hf.tensor_file(s.name).unwrap()).unwrap();
        let off = info.offset as usize;
        assert_eq!(&file[off..off + s.data.len()], &s.data[..]);
    }
    assert_eq!(hf.tensors().count(), specs.len());
    assert!(hf.tensor("nope").is_none());
}

#[test]
fn single_file() {
    let dir = TempDir::new("hf1");
    std::fs::write(dir.join("config.json"), CONFIG).unwrap();
    let specs = specs();
    write_safetensors(
        &dir.join("model.safetensors"),
        &specs.iter().collect::<Vec<_>>(),
    );
    let hf = HfDir::open(dir.path()).unwrap();
    assert_eq!(hf.dir(), dir.path());
    let c = hf.config();
    assert_eq!(c.architectures, ["LlamaForCausalLM"]);
    assert_eq!(c.model_type.as_deref(), Some("llama"));
    assert_eq!(
        (c.hidden_size, c.intermediate_size, c.num_hidden_layers),
        (64, 128, 2)
    );
    assert_eq!(
        (c.num_attention_heads, c.num_key_value_heads, c.head_dim),
        (4, Some(2), None)
    );
    assert_eq!(c.rms_norm_eps, 1e-5);
    assert_eq!(c.rope_theta, Some(100000.0));
    assert_eq!(c.vocab_size, 100);
    assert_eq!(c.tie_word_embeddings, Some(true));
    assert_eq!(c.hidden_act.as_deref(), Some("silu"));
    assert_eq!(c.max_position_embeddings, Some(2048));
    assert_eq!(c.bos_token_id, Some(serde_json::json!(1)));
    assert_eq!(c.eos_token_id, Some(serde_json::json!([2, 3])));
    assert_eq!(c.attention_bias, None);
    assert_eq!(c.torch_dtype.as_deref(), Some("bfloat16"));
    check_tensors(&hf);
    assert_eq!(hf.tokenizer_json(), None);
    assert_eq!(hf.tokenizer_config_json(), None);
    std::fs::write(dir.join("tokenizer.json"), "{}").unwrap();
    std::fs::write(dir.join("tokenizer_config.json"), "{}").unwrap();
    assert_eq!(hf.tokenizer_json(), Some(dir.join("tokenizer.json")));
    assert_eq!(
        hf.tokenizer_config_json(),
        Some(dir.join("tokenizer_config.json"))
    );
}

fn write_sharded(dir: &TempDir) {
    std::fs::write(dir.join("config.json"), CONFIG).unwrap();
    let specs = specs();
    let s1 = "model-00001-of-00002.safetensors";
    let s2 = "model-00002-of-00002.safetensors";
    write_safetensors(&dir.join(s1), &[&specs[0], &specs[2]]);
    write_safetensors(&dir.join(s2), &[&specs[1]]);
    let mut map = HashMap::new();
    map.insert(specs[0].name, s1);
    map.insert(specs[2].name, s1);
    map.insert(specs[1].name, s2);
    let index = serde_json::json!({"metadata": {"total_size": 100}, "weight_map": map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
}

#[test]
fn sharded() {
    let dir = TempDir::new("hf2");
    write_sharded(&dir);
    let hf = HfDir::open(dir.path()).unwrap();
    check_tensors(&hf);
    assert_eq!(
        hf.tensor_file("model.layers.0.mlp.up_proj.weight"),
        Some(dir.join("model-00002-of-00002.safetensors").as_path())
    );
}

#[test]
fn missing_shard() {
    let dir = TempDir::new("hf3");
    write_sharded(&dir);
    let shard = dir.join("model-00002-of-00002.safetensors");
    std::fs::remove_file(&shard).unwrap();
    let e = HfDir::open(dir.path()).unwrap_err();
    assert!(
        matches!(e, FormatError::MissingFile { ref path } if *path == shard),
        "{e}"
    );
    assert!(e.to_string().contains(&shard.display().to_string()), "{e}");
}

#[test]
fn weight_map_pointing_at_wrong_shard() {
    let dir = TempDir::new("hf3b");
    write_sharded(&dir);
    let idx = dir.join("model.safetensors.index.json");
    let text = std::fs::read_to_string(&idx).unwrap().replace(
        r#""model.norm.weight":"model-00001-of-00002.safetensors""#,
        r#""model.norm.weight":"model-00002-of-00002.safetensors""#,
    );
    std::fs::write(&idx, text).unwrap();
    let e = HfDir::open(dir.path()).unwrap_err();
    assert!(matches!(e, FormatError::Invalid { .. }), "{e}");
    assert!(e.to_string().contains("model.norm.weight"), "{e}");
}

#[test]
fn shard_path_traversal_is_rejected() {
    let dir = TempDir::new("hf3c");
    std::fs::write(dir.join("config.json"), CONFIG).unwrap();
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        r#"{"weight_map": {"a": "../elsewhere.safetensors"}}"#,
    )
    .unwrap();
    let e = HfDir::open(dir.path()).unwrap_err();
    assert!(matches!(e, FormatError::Invalid { .. }), "{e}");
}

#[test]
fn missing_config_and_weights() {
    let dir = TempDir::new("hf4");
    let e = HfDir::open(dir.path()).unwrap_err();
    assert!(
        matches!(e, FormatError::MissingFile { ref path } if *path == dir.join("config.json")),
        "{e}"
    );
    assert!(e.to_string().contains("config.json"), "{e}");
    std::fs::write(dir.join("config.json"), CONFIG).unwrap();
    let e = HfDir::open(dir.path()).unwrap_err();
    assert!(
        matches!(e, FormatError::MissingFile { ref path } if *path == dir.join("model.safetensors")),
        "{e}"
    );
}

#[test]
fn bad_json() {
    let dir = TempDir::new("hf5");
    std::fs::write(dir.join("config.json"), "{ not json").unwrap();
    let e = HfDir::open(dir.path()).unwrap_err();
    assert!(matches!(e, FormatError::Json { .. }), "{e}");
    assert!(e.to_string().contains("config.json"), "{e}");
    // Valid JSON, but a required field missing.
    std::fs::write(dir.join("config.json"), r#"{"hidden_size": 1}"#).unwrap();
    let e = HfDir::open(dir.path()).unwrap_err();
    assert!(matches!(e, FormatError::Json { .. }), "{e}");
    std::fs::write(dir.join("config.json"), CONFIG).unwrap();
    std::fs::write(dir.join("model.safetensors.index.json"), r#"{"nope": 1}"#).unwrap();
    let e = HfDir::open(dir.path()).unwrap_err();
    assert!(matches!(e, FormatError::Json { .. }), "{e}");
    assert!(e.to_string().contains("index.json"), "{e}");
}

#[test]
fn unsupported_dtype_names_the_tensor() {
    let dir = TempDir::new("hf6");
    std::fs::write(dir.join("config.json"), CONFIG).unwrap();
    let data = vec![0u8; 16];
    let views = vec![("ids", StView::new(Dtype::I32, vec![4], &data).unwrap())];
    let path = dir.join("model.safetensors");
    safetensors::serialize_to_file(views, None, &path).unwrap();
    let e = HfDir::open(dir.path()).unwrap_err();
    assert!(
        matches!(e, FormatError::UnsupportedType { ref tensor, .. } if tensor == "ids"),
        "{e}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains("I32") && msg.contains("'ids'") && msg.contains("model.safetensors"),
        "{msg}"
    );
}

#[test]
fn corrupt_safetensors() {
    let dir = TempDir::new("hf7");
    std::fs::write(dir.join("config.json"), CONFIG).unwrap();
    let specs = specs();
    let path = dir.join("model.safetensors");
    write_safetensors(&path, &specs.iter().collect::<Vec<_>>());
    let good = std::fs::read(&path).unwrap();
    for cut in [0, 4, 8, 20, good.len() - 1] {
        std::fs::write(&path, &good[..cut]).unwrap();
        let e = HfDir::open(dir.path()).unwrap_err();
        assert!(
            matches!(
                e,
                FormatError::Truncated { .. } | FormatError::Invalid { .. }
            ),
            "{cut}: {e}"
        );
        assert!(e.to_string().contains("model.safetensors"), "{e}");
    }
    let mut bad = good.clone();
    bad[8] = b'x'; // header no longer JSON
    std::fs::write(&path, &bad).unwrap();
    let e = HfDir::open(dir.path()).unwrap_err();
    assert!(matches!(e, FormatError::Invalid { .. }), "{e}");
}

mod prop {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn truncated_or_corrupted_safetensors_never_panic(cut in 0usize..400, pos in 0usize..400, val: u8) {
            let dir = TempDir::new("hf-prop");
            std::fs::write(dir.join("config.json"), CONFIG).unwrap();
            let specs = specs();
            let path = dir.join("model.safetensors");
            write_safetensors(&path, &specs.iter().collect::<Vec<_>>());
            let mut b = std::fs::read(&path).unwrap();
            let p = pos % b.len();
            b[p] = val;
            b.truncate(cut.min(b.len()));
            std::fs::write(&path, &b).unwrap();
            if let Ok(hf) = HfDir::open(dir.path()) {
                for t in hf.tensors() {
                    prop_assert_eq!(t.data.len(), t.n_elements() * t.dtype.block_bytes());
                }
            }
        }
    }
}
