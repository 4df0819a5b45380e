//! Model files: the same weights as GGUF and as an HF safetensors directory give the same numbers,
//! and broken files give clear errors that name the file.

use crate::common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use common::*;
use engine::{Engine, EngineError, EngineOptions, Logits, ModelFile, Precision};
use model_format::GgufFile;

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("sparrow-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn dequantize(t: &model_format::TensorView<'_>) -> Vec<f32> {
    let fmt = t.dtype;
    let cols = t.cols();
    let row_bytes = fmt.row_bytes(cols).unwrap();
    let mut out = vec![0.0f32; t.n_elements()];
    for (r, dst) in out.chunks_mut(cols).enumerate() {
        kernels_neon::dequantize_row(fmt, &t.data[r * row_bytes..(r + 1) * row_bytes], dst)
            .unwrap();
    }
    out
}

/// Undoes llama.cpp's Q/K row permutation: HF row h*hd + a*hd/2 + b = GGUF row h*hd + 2b + a.
fn unpermute(w: &[f32], n_heads: usize, cols: usize) -> Vec<f32> {
    let rows = w.len() / cols;
    let hd = rows / n_heads;
    let mut out = vec![0.0f32; w.len()];
    for h in 0..n_heads {
        for a in 0..2 {
            for b in 0..hd / 2 {
                let src = h * hd + 2 * b + a;
                let dst = h * hd + a * hd / 2 + b;
                out[dst * cols..(dst + 1) * cols].copy_from_slice(&w[src * cols..(src + 1) * cols]);
            }
        }
    }
    out
}

fn hf_name(gguf: &str) -> String {
    if let Some(rest) = gguf.strip_prefix("blk.") {
        let (i, t) = rest.split_once('.').unwrap();
        let t = match t {
            "attn_norm.weight" => "input_layernorm.weight",
            "attn_q.weight" => "self_attn.q_proj.weight",
            "attn_k.weight" => "self_attn.k_proj.weight",
            "attn_v.weight" => "self_attn.v_proj.weight",
            "attn_output.weight" => "self_attn.o_proj.weight",
            "ffn_norm.weight" => "post_attention_layernorm.weight",
            "ffn_gate.weight" => "mlp.gate_proj.weight",
            "ffn_up.weight" => "mlp.up_proj.weight",
            "ffn_down.weight" => "mlp.down_proj.weight",
            other => panic!("unexpected tensor {other}"),
        };
        return format!("model.layers.{i}.{t}");
    }
    match gguf {
        "token_embd.weight" => "model.embed_tokens.weight".into(),
        "output_norm.weight" => "model.norm.weight".into(),
        other => panic!("unexpected tensor {other}"),
    }
}

/// Writes the GGUF's weights, dequantized to f32 and in HF row order, as a sharded HF directory.
fn write_hf_dir(gguf: &GgufFile, dir: &Path) {
    let cfg = engine::ModelConfig::from_gguf(gguf).unwrap();
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for t in gguf.tensors() {
        let mut w = dequantize(&t);
        if t.name.ends_with("attn_q.weight") {
            w = unpermute(&w, cfg.n_heads, t.cols());
        } else if t.name.ends_with("attn_k.weight") {
            w = unpermute(&w, cfg.n_kv_heads, t.cols());
        }
        let bytes = w.iter().flat_map(|x| x.to_le_bytes()).collect();
        tensors.push((hf_name(t.name), t.shape.to_vec(), bytes));
    }
    let mut weight_map = serde_json::Map::new();
    let half = tensors.len() / 2;
    for (shard, part) in [&tensors[..half], &tensors[half..]].into_iter().enumerate() {
        let file = format!("model-{:05}-of-00002.safetensors", shard + 1);
        let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = part
            .iter()
            .map(|(n, s, b)| {
                (
                    n.clone(),
                    safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), b)
                        .unwrap(),
                )
            })
            .collect();
        safetensors::serialize_to_file(views, None::<HashMap<String, String>>, &dir.join(&file))
            .unwrap();
        for (n, _, _) in part {
            weight_map.insert(n.clone(), file.clone().into());
        }
    }
    let index = serde_json::json!({ "metadata": {}, "weight_map": weight_map });
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    let config = serde_json::json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": cfg.d_model, "intermediate_size": cfg.d_ff, "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.n_kv_heads,
        "rms_norm_eps": cfg.rms_eps, "rope_theta": cfg.rope_base, "vocab_size": cfg.vocab_size,
        "tie_word_embeddings": true, "hidden_act": "silu", "max_position_embeddings": cfg.context_length,
        "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32"
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let file = ModelFile::Gguf(GgufFile::open(gguf.path()).unwrap());
    let tok = engine::load_tokenizer(&file).unwrap();
    std::fs::write(dir.join("tokenizer.json"), tok.to_json(false).unwrap()).unwrap();
}

#[test]
fn gguf_and_hf_directory_give_the_same_logits() {
    let gguf_path = model_path();
    let dir = temp_dir("hf");
    write_hf_dir(&GgufFile::open(&gguf_path).unwrap(), &dir);

    let opts = EngineOptions {
        threads: 0,
        precision: Precision::Exact,
        context: 256,
        ..Default::default()
    };
    let gguf = ModelFile::open(&gguf_path).unwrap();
    let hf = ModelFile::open(&dir).unwrap();
    assert!(matches!(hf, ModelFile::Hf(_)));
    let (a, b) = (
        Engine::new(&gguf, opts.clone()).unwrap(),
        Engine::new(&hf, opts).unwrap(),
    );
    let prompt = "The capital of France is";
    let ids = a.tokenizer().encode(prompt, false).unwrap();
    assert_eq!(
        ids,
        b.tokenizer().encode(prompt, false).unwrap(),
        "tokenizer.json written from the GGUF agrees"
    );
    let la = a.forward(&mut a.new_cache(), &ids, Logits::All).unwrap();
    let lb = b.forward(&mut b.new_cache(), &ids, Logits::All).unwrap();
    let worst = la
        .iter()
        .zip(&lb)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max);
    eprintln!("GGUF vs HF directory: max |logit difference| = {worst:.2e}");
    assert!(worst < 1e-3, "GGUF and HF logits differ by {worst}");
    drop((a, b));
    drop(hf);

    // Garbage that used to load silently: an untied model without its output matrix, and a stop id
    // outside the vocabulary.
    let config_path = dir.join("config.json");
    let config = std::fs::read_to_string(&config_path).unwrap();
    let untied = config.replace(
        "\"tie_word_embeddings\":true",
        "\"tie_word_embeddings\":false",
    );
    assert_ne!(untied, config);
    std::fs::write(&config_path, untied).unwrap();
    let msg = err_of(&dir);
    assert!(
        msg.contains("lm_head.weight"),
        "names the missing output: {msg}"
    );
    std::fs::write(&config_path, &config).unwrap();
    std::fs::write(
        dir.join("generation_config.json"),
        r#"{"eos_token_id": [2, 1000000000]}"#,
    )
    .unwrap();
    let msg = err_of(&dir);
    assert!(
        msg.contains("generation_config.json") && msg.contains("1000000000"),
        "names the file and the id: {msg}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

fn err_of(path: &Path) -> String {
    match ModelFile::open(path)
        .map_err(engine::EngineError::from)
        .and_then(|f| Engine::new(&f, EngineOptions::default()).map(|_| ()))
    {
        Ok(()) => panic!("{} should not load", path.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn broken_model_files_give_clear_errors() {
    let real = std::fs::read(model_path()).unwrap();
    let dir = temp_dir("broken");

    let truncated = dir.join("truncated.gguf");
    std::fs::write(&truncated, &real[..real.len() / 2]).unwrap();
    let msg = err_of(&truncated);
    assert!(msg.contains("truncated.gguf"), "names the file: {msg}");

    let bad_magic = dir.join("magic.gguf");
    let mut b = real[..4096].to_vec();
    b[..4].copy_from_slice(b"GGML");
    std::fs::write(&bad_magic, &b).unwrap();
    let msg = err_of(&bad_magic);
    assert!(
        msg.contains("magic.gguf") && msg.to_lowercase().contains("magic"),
        "says the magic is wrong: {msg}"
    );

    let missing = dir.join("does-not-exist.gguf");
    assert!(err_of(&missing).contains("does-not-exist.gguf"));

    // A valid GGUF whose metadata promises a model its tensors do not provide.
    let src = GgufFile::open(model_path()).unwrap();
    let mut w = model_format::GgufWriter::new();
    for (k, v) in src.metadata() {
        w.metadata(k, v.clone());
    }
    let emb = src.tensor("token_embd.weight").unwrap();
    w.tensor(emb.name, emb.dtype, emb.shape, emb.data.to_vec())
        .unwrap();
    let partial = dir.join("partial.gguf");
    w.write(&partial).unwrap();
    let msg = err_of(&partial);
    assert!(
        msg.contains("partial.gguf") && msg.contains("output_norm.weight"),
        "names the missing tensor: {msg}"
    );

    let empty_dir = dir.join("empty-hf");
    std::fs::create_dir_all(&empty_dir).unwrap();
    let msg = err_of(&empty_dir);
    assert!(
        msg.contains("config.json"),
        "an HF directory without config.json says so: {msg}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn context_overflow_is_an_error_and_keeps_the_cache() {
    let file = ModelFile::open(model_path()).unwrap();
    let e = Engine::new(
        &file,
        EngineOptions {
            threads: 1,
            precision: Precision::Fast,
            context: 8,
            ..Default::default()
        },
    )
    .unwrap();
    let mut cache = e.new_cache();
    e.forward(&mut cache, &[504, 3575, 282], Logits::Last)
        .unwrap();
    let err = e.forward(&mut cache, &[1; 6], Logits::Last).unwrap_err();
    assert!(
        matches!(err, EngineError::Model(engine::ModelError::Request(_))),
        "{err}"
    );
    assert_eq!(cache.len(), 3, "a refused step keeps the cache as it was");
    let bad = e
        .forward(&mut cache, &[u32::MAX], Logits::Last)
        .unwrap_err();
    assert!(bad.to_string().contains("outside the vocabulary"), "{bad}");
    assert_eq!(cache.len(), 3);
}
