//! Opens the real SmolLM2 GGUF if it is present (skipped otherwise).

use model_format::{DType, GgufFile, MetaValue};

/// Ignored by default: this crate cannot fetch the model. After `sparrow run` has fetched it, run
/// `cargo test -p model-format -- --ignored`. The engine's tests open the same file on every run.
#[test]
#[ignore = "needs the real model in the cache (see the doc comment)"]
fn smollm2_q4_1() {
    let dir = std::env::var_os("SPARROW_MODEL_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::Path::new(&std::env::var_os("HOME").expect("HOME is set"))
                .join(".cache/sparrow/models")
        });
    let path = dir.join("SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        path.exists(),
        "{} is not present: fetch it with `sparrow run` first",
        path.display()
    );
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.version(), 3);
    assert_eq!(f.alignment(), 32);
    assert_eq!(
        f.get("general.architecture").and_then(MetaValue::as_str),
        Some("llama")
    );
    assert_eq!(f.tensor_infos().len(), 272);
    let n_f32 = f
        .tensor_infos()
        .iter()
        .filter(|t| t.dtype == DType::F32)
        .count();
    assert_eq!(n_f32, 61);

    let emb = f.tensor("token_embd.weight").unwrap();
    assert_eq!(emb.dtype, DType::Q8_0);
    assert_eq!(emb.shape, &[49152, 576]);
    assert_eq!((emb.rows(), emb.cols()), (49152, 576));
    assert_eq!(emb.data.len(), 49152 * 18 * 34);

    let gate = f.tensor("blk.0.ffn_gate.weight").unwrap();
    assert_eq!(gate.dtype, DType::Q4_1);
    assert_eq!(gate.shape, &[1536, 576]);
    assert_eq!(gate.data.len(), 1536 * 18 * 20);

    let down = f.tensor("blk.0.ffn_down.weight").unwrap();
    assert_eq!(down.shape, &[576, 1536]);

    let tokens = f
        .get("tokenizer.ggml.tokens")
        .and_then(MetaValue::to_string_vec)
        .unwrap();
    assert_eq!(tokens.len(), 49152);
    assert_eq!(
        f.get("llama.embedding_length").and_then(MetaValue::as_u64),
        Some(576)
    );
    assert_eq!(
        f.get("llama.block_count").and_then(MetaValue::as_u64),
        Some(30)
    );

    // Tensors lie inside the file, in order, without overlap.
    let mut infos: Vec<_> = f.tensor_infos().iter().collect();
    infos.sort_by_key(|t| t.offset);
    for w in infos.windows(2) {
        assert!(w[0].offset + w[0].n_bytes <= w[1].offset);
    }
    let last = infos.last().unwrap();
    assert!(last.offset + last.n_bytes <= f.file_bytes());
    assert_eq!(f.tensors().count(), 272);
}
