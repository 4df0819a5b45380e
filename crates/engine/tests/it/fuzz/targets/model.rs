//! Model files: GGUF and HF (config + safetensors) directories.

use super::*;

pub(super) fn gguf() -> Target {
    let mut seeds = Vec::new();
    let mut names: Vec<_> = std::fs::read_dir(fixtures())
        .expect("fixtures/")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "gguf"))
        .collect();
    names.sort();
    for p in names {
        seeds.push(one("model.gguf", std::fs::read(&p).unwrap()));
    }
    assert!(!seeds.is_empty(), "fixtures/*.gguf");
    Target {
        name: "gguf",
        seeds,
        dict: GGUF_DICT,
        fixup: None,
        run: Box::new(|dir| open_model(&dir.join("model.gguf"))),
    }
}

const HF_CONFIG: &str = r#"{
  "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8,
  "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
  "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "vocab_size": 4, "tie_word_embeddings": true,
  "hidden_act": "silu", "max_position_embeddings": 64, "bos_token_id": 1, "eos_token_id": [2, 3],
  "torch_dtype": "bfloat16", "rope_scaling": null
}"#;

fn safetensors_file(tensors: &[(&str, safetensors::Dtype, Vec<usize>)]) -> Vec<u8> {
    let data: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(_, dt, shape)| vec![0x3c; shape.iter().product::<usize>() * dt.bitsize() / 8])
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .zip(&data)
        .map(|((n, dt, shape), d)| {
            let v = safetensors::tensor::TensorView::new(*dt, shape.clone(), d).unwrap();
            (n.to_string(), v)
        })
        .collect();
    safetensors::serialize(views, None).unwrap()
}

pub(super) fn hf() -> Target {
    use safetensors::Dtype::{BF16, F16, F32};
    let mut layer: Vec<(String, safetensors::Dtype, Vec<usize>)> = vec![
        ("model.embed_tokens.weight".into(), BF16, vec![4, 8]),
        ("model.norm.weight".into(), F32, vec![8]),
    ];
    let pre = "model.layers.0.";
    for (n, shape) in [
        ("input_layernorm.weight", vec![8]),
        ("post_attention_layernorm.weight", vec![8]),
        ("self_attn.q_proj.weight", vec![8, 8]),
        ("self_attn.k_proj.weight", vec![4, 8]),
        ("self_attn.v_proj.weight", vec![4, 8]),
        ("self_attn.o_proj.weight", vec![8, 8]),
        ("mlp.gate_proj.weight", vec![16, 8]),
        ("mlp.up_proj.weight", vec![16, 8]),
        ("mlp.down_proj.weight", vec![8, 16]),
    ] {
        layer.push((format!("{pre}{n}"), F16, shape));
    }
    let all: Vec<(&str, safetensors::Dtype, Vec<usize>)> = layer
        .iter()
        .map(|(n, d, s)| (n.as_str(), *d, s.clone()))
        .collect();
    let single = vec![
        ("config.json".to_string(), HF_CONFIG.as_bytes().to_vec()),
        ("model.safetensors".to_string(), safetensors_file(&all)),
    ];
    let (a, b) = all.split_at(3);
    let map: HashMap<&str, &str> = a
        .iter()
        .map(|t| (t.0, "model-00001-of-00002.safetensors"))
        .chain(b.iter().map(|t| (t.0, "model-00002-of-00002.safetensors")))
        .collect();
    let index = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": map});
    let sharded = vec![
        ("config.json".to_string(), HF_CONFIG.as_bytes().to_vec()),
        (
            "model.safetensors.index.json".to_string(),
            index.to_string().into_bytes(),
        ),
        (
            "model-00001-of-00002.safetensors".to_string(),
            safetensors_file(a),
        ),
        (
            "model-00002-of-00002.safetensors".to_string(),
            safetensors_file(b),
        ),
    ];
    Target {
        name: "hf",
        seeds: vec![single, sharded],
        dict: JSON_DICT,
        fixup: None,
        run: Box::new(open_model),
    }
}
