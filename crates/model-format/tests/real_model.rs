//! Opens the real SmolLM2 GGUF if it is present (skipped otherwise).

use model_format::{DType, GgufFile, MetaValue};

#[test]
fn smollm2_q4_1() {
    let Some(home) = std::env::var_os("HOME") else {
        eprintln!("skipping: HOME not set");
        return;
    };
    let path =
        std::path::Path::new(&home).join(".cache/sparrow/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !path.exists() {
        eprintln!("skipping: {} not present", path.display());
        return;
    }
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
