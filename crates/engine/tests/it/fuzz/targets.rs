//! The fuzz targets: each parser of untrusted files, its seeds (fixtures, or small valid files
//! written here) and what is done with an input it accepts (so the code behind the parser runs too).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use engine::{load_tokenizer, Model, ModelFile};
use model_format::GgufFile;
use model_tokenizer::{ChatMessage, ChatTemplate, Tokenizer, VocabSpec};
use neuron_store::{BundleLayout, Formats, LayerInput, NeuronStore, StoreWriter};
use predictor::{ActivationKind, LayerProfile, Predictor, PredictorSet, Profile, ScoreKind};
use tensor_types::WeightFormat;
use ufs_io::{IoConfig, IoEngine, OpenOptions};

use super::runner::{Case, Target};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

/// JSON syntax, boundary numbers and the keys the JSON readers look at.
const JSON_DICT: &[&[u8]] = &[
    b"\"",
    b"{",
    b"}",
    b"[",
    b"]",
    b":",
    b",",
    b"null",
    b"true",
    b"-1",
    b"1e308",
    b"-0.0",
    b"4294967296",
    b"18446744073709551615",
    b"9223372036854775808",
    b"\"\\u0000\"",
    b"\"\\ud800\"",
    b"[[[[[[[[[[[[[[[[",
    b"\"type\"",
    b"\"BPE\"",
    b"\"ByteLevel\"",
    b"\"Sequence\"",
    b"\"merges\"",
    b"\"vocab\"",
    b"\"added_tokens\"",
    b"\"id\"",
    b"\"content\"",
    b"\"special\"",
    b"\"dtype\"",
    b"\"shape\"",
    b"\"data_offsets\"",
    b"\"F16\"",
    b"\"BF16\"",
    b"\"I64\"",
    b"\"U8\"",
    b"\"F8_E4M3\"",
    b"\"hidden_size\"",
    b"\"num_hidden_layers\"",
    b"\"num_attention_heads\"",
    b"\"num_key_value_heads\"",
    b"\"intermediate_size\"",
    b"\"vocab_size\"",
    b"\"weight_map\"",
    b"\"model.safetensors\"",
    b"\"../config.json\"",
    b"\"/etc/passwd\"",
    b"\"__metadata__\"",
    b"\"chat_template\"",
    b"\"eos_token_id\"",
    b"\"bos_token\"",
];

/// Jinja syntax and the functions chat templates use.
const JINJA_DICT: &[&[u8]] = &[
    b"{{",
    b"}}",
    b"{%",
    b"%}",
    b"{#",
    b"#}",
    b"{%- for m in messages %}",
    b"{% endfor %}",
    b"{% if ",
    b"{% else %}",
    b"{% endif %}",
    b"loop.index",
    b"loop.last",
    b"|tojson",
    b"|length",
    b"|trim",
    b"|upper",
    b"raise_exception('no')",
    b"strftime_now('%Y-%m-%d %%')",
    b"range(",
    b"* 99999999",
    b"'ab' * 100000",
    b"namespace(x=1)",
    b"recursive",
    b"loop(",
    b"{% macro m() %}",
    b"{% endmacro %}",
    b"{% call ",
    b"{% set x = ",
    b"~",
    b"[",
    b"]",
    b"(",
    b")",
    b".",
    b"|",
    b",",
    b"9223372036854775807",
    b"-1",
    b"messages[0]['content']",
    b"message.role",
    b"bos_token",
    b"add_generation_prompt",
    b"[::-1]",
    b"[1:-1]",
    b".split(",
    b".startswith(",
    b"{% raw %}",
    b"{% endraw %}",
    b"{% include 'x' %}",
    b"{% extends 'x' %}",
    b"{% filter upper %}",
];

/// Binary targets: strings a GGUF reader looks up.
const GGUF_DICT: &[&[u8]] = &[
    b"general.architecture",
    b"llama",
    b"qwen2",
    b"tokenizer.chat_template",
    b"tokenizer.ggml.tokens",
    b"general.alignment",
    b"{{ messages }}",
];

/// FNV-1a 64 (the predictor crate's file checksum).
fn fnv(d: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &x in d {
        h ^= x as u64;
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}

/// CRC-32 (IEEE, reflected), bit by bit: the neuron store's checksum.
fn crc32(d: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in d {
        c ^= b as u32;
        for _ in 0..8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ 0xEDB8_8320
            } else {
                c >> 1
            };
        }
    }
    !c
}

/// Profile and predictor files: re-seal the trailing checksum.
fn reseal_fnv(_: &str, b: &mut [u8]) {
    if b.len() >= 8 {
        let n = b.len() - 8;
        let h = fnv(&b[..n]);
        b[n..].copy_from_slice(&h.to_le_bytes());
    }
}

/// Neuron stores: index CRC, file length and header CRC made to agree with the bytes.
fn reseal_store(_: &str, b: &mut [u8]) {
    if b.len() < 48 {
        return;
    }
    let index_len = u64::from_le_bytes(b[16..24].try_into().unwrap());
    if let Some(end) = index_len.checked_add(48).filter(|&e| e <= b.len() as u64) {
        let c = crc32(&b[48..end as usize]);
        b[12..16].copy_from_slice(&c.to_le_bytes());
    }
    let len = b.len() as u64;
    b[32..40].copy_from_slice(&len.to_le_bytes());
    let c = crc32(&b[..40]);
    b[40..44].copy_from_slice(&c.to_le_bytes());
}

fn one(name: &str, bytes: Vec<u8>) -> Case {
    vec![(name.to_string(), bytes)]
}

fn e(x: impl std::fmt::Display) -> String {
    x.to_string()
}

/// Opens a model file the way the CLI does, then its configuration, tokenizer (and chat template)
/// and weights.
fn open_model(path: &Path) -> Result<(), String> {
    let file = ModelFile::open(path).map_err(e)?;
    if let ModelFile::Gguf(g) = &file {
        for (_, v) in g.metadata() {
            let _ = (v.as_str(), v.as_u64(), v.to_string_vec());
        }
        for t in g.tensors() {
            let _ = (
                t.rows(),
                t.cols(),
                t.n_elements(),
                t.data.first(),
                t.data.last(),
            );
        }
    }
    if let ModelFile::Hf(h) = &file {
        for t in h.tensors() {
            let _ = (
                t.rows(),
                t.cols(),
                t.n_elements(),
                t.data.first(),
                t.data.last(),
            );
        }
    }
    let config = file.config();
    if let Ok(tok) = load_tokenizer(&file) {
        use_tokenizer(&tok)?;
    }
    config.map_err(e)?;
    Model::load(&file).map_err(e)?;
    Ok(())
}

/// Encodes, decodes and streams a text with special tokens; renders the chat template if any.
fn use_tokenizer(tok: &Tokenizer) -> Result<(), String> {
    let ids = tok
        .encode("<|im_start|>hello 12 wörld 😀<|im_end|>", true)
        .map_err(e)?;
    let _ = tok.decode(&ids, false);
    let _ = tok.decode(&ids, true);
    let _ = tok.decode(&[0, u32::MAX, tok.vocab_size() as u32], false);
    let mut s = tok.stream_decoder(true);
    for &id in &ids {
        let _ = s.push(id);
    }
    let _ = s.finish();
    for id in [0, tok.vocab_size() as u32, u32::MAX] {
        let _ = (tok.id_to_piece(id), tok.is_special(id));
    }
    if let Some(t) = tok.chat_template() {
        render(t).map_err(e)?;
    }
    Ok(())
}

fn render(t: &ChatTemplate) -> Result<String, model_tokenizer::TokenizerError> {
    let messages = [
        ChatMessage::new("system", "You are terse."),
        ChatMessage::new("user", "Hi {{ 1 }} <|im_end|>"),
        ChatMessage::new("assistant", ""),
        ChatMessage::new("user", "x"),
    ];
    t.render(&messages, true, "<s>", "</s>")
}

fn gguf() -> Target {
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

fn hf() -> Target {
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

fn tiny_vocab() -> VocabSpec {
    let mut tokens: Vec<String> = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let mut token_types = vec![3, 3, 3];
    // The GPT-2 byte-level alphabet: printable bytes stand for themselves, others shift to U+0100...
    let mut shifted = 0u32;
    for b in 0..=255u8 {
        let printable = (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
        let c = if printable {
            char::from(b)
        } else {
            shifted += 1;
            char::from_u32(255 + shifted).unwrap()
        };
        tokens.push(c.to_string());
        token_types.push(1);
    }
    let merges = ["h e", "l l", "he ll", "hell o", "Ġ w", "o r", "1 2"];
    for m in merges {
        tokens.push(m.split(' ').collect());
        token_types.push(1);
    }
    VocabSpec {
        model: "gpt2".into(),
        pre: Some("smollm".into()),
        tokens,
        token_types,
        merges: merges.iter().map(|s| s.to_string()).collect(),
        scores: Vec::new(),
        add_space_prefix: None,
        bos_id: Some(1),
        eos_id: Some(2),
        unk_id: Some(0),
        pad_id: Some(2),
        eot_id: None,
        add_bos: false,
        chat_template: None,
    }
}

fn tokenizer() -> Target {
    let tok = Tokenizer::from_vocab(&tiny_vocab()).expect("tiny vocabulary");
    let config = serde_json::json!({
        "bos_token": "<|im_start|>",
        "eos_token": {"content": "<|im_end|>", "special": true},
        "add_bos_token": false,
        "chat_template": ChatTemplate::chatml().source(),
    });
    let seed = vec![
        (
            "tokenizer.json".to_string(),
            tok.to_json(false).unwrap().into_bytes(),
        ),
        (
            "tokenizer_config.json".to_string(),
            config.to_string().into_bytes(),
        ),
        (
            "generation_config.json".to_string(),
            br#"{"eos_token_id": [2, 0]}"#.to_vec(),
        ),
    ];
    Target {
        name: "tokenizer",
        seeds: vec![seed],
        dict: JSON_DICT,
        fixup: None,
        run: Box::new(|dir| {
            let tok = Tokenizer::from_tokenizer_json(&dir.join("tokenizer.json")).map_err(e)?;
            use_tokenizer(&tok)
        }),
    }
}

const LLAMA3_LIKE: &str = "{{- bos_token }}{%- if messages[0]['role'] == 'system' %}{%- set sys = messages[0]['content']|trim %}{%- set messages = messages[1:] %}{%- else %}{%- set sys = '' %}{%- endif %}<|start_header_id|>system<|end_header_id|>\n\nToday: {{ strftime_now('%d %b %Y') }}\n{{ sys }}<|eot_id|>{%- for m in messages %}{%- if (m.role == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('roles must alternate') }}{%- endif %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n{{ m['content'] | trim }}<|eot_id|>{%- endfor %}{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{%- endif %}";

const MACRO_LIKE: &str = "{% macro show(m) %}[{{ m.role|upper }}] {{ m.content|tojson }}{% endmacro %}{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + m.content|length %}{{ show(m) }}{% if not loop.last %}\n{% endif %}{% endfor %} total={{ ns.n }}{{ eos_token if add_generation_prompt else '' }}";

fn chat() -> Target {
    let mut seeds = vec![
        one(
            "template.jinja",
            ChatTemplate::chatml().source().as_bytes().to_vec(),
        ),
        one("template.jinja", LLAMA3_LIKE.as_bytes().to_vec()),
        one("template.jinja", MACRO_LIKE.as_bytes().to_vec()),
    ];
    for p in ["tiny-llama-f16.gguf", "tiny-qwen2-q4_1.gguf"] {
        if let Some(t) = GgufFile::open(fixtures().join(p)).ok().and_then(|f| {
            f.get("tokenizer.chat_template")
                .and_then(|v| v.as_str())
                .map(str::to_owned)
        }) {
            seeds.push(one("template.jinja", t.into_bytes()));
        }
    }
    Target {
        name: "chat_template",
        seeds,
        dict: JINJA_DICT,
        fixup: None,
        run: Box::new(|dir| {
            let src = std::fs::read(dir.join("template.jinja")).map_err(e)?;
            let t = ChatTemplate::new(&String::from_utf8_lossy(&src)).map_err(e)?;
            render(&t).map(|_| ()).map_err(e)
        }),
    }
}

/// Saves `save` to a scratch file and returns its bytes.
fn saved(save: impl FnOnce(&Path)) -> Vec<u8> {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("sparrow-fuzz-seed-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("seed");
    save(&path);
    let bytes = std::fs::read(&path).unwrap();
    std::fs::remove_dir_all(&dir).ok();
    bytes
}

fn profile() -> Target {
    let layer = |n: u32| LayerProfile {
        n_neurons: n,
        threshold: 0.01,
        freq: (0..2)
            .map(|b| (0..n).map(|j| (j + b) as f32 * 0.1).collect())
            .collect(),
        mean_abs: (0..n).map(|j| j as f32).collect(),
        max_abs: (0..n).map(|j| j as f32 * 2.0).collect(),
        coact_gate_up: (0..n).map(|j| 1.0 / (1.0 + j as f32)).collect(),
        coact_gate_down: (0..n).map(|j| 0.5 / (1.0 + j as f32)).collect(),
    };
    let p = Profile {
        model: "tiny.gguf".into(),
        model_fingerprint: 0xdead_beef,
        corpus: "corpus.txt".into(),
        tokens: 1234,
        activation: ActivationKind::Silu,
        score: ScoreKind::OutputNorm,
        batch_sizes: vec![1, 4],
        layers: vec![layer(5), layer(0), layer(3)],
    };
    Target {
        name: "profile",
        seeds: vec![one("p.prof", saved(|path| p.save(path).unwrap()))],
        dict: &[],
        fixup: Some(reseal_fnv),
        run: Box::new(|dir| Profile::load(dir.join("p.prof")).map(|_| ()).map_err(e)),
    }
}

fn predictor() -> Target {
    let (d, h, o) = (9, 32, 7);
    let w = |n: usize, k: f32| {
        (0..n)
            .map(|i| ((i as f32) * k).sin() * 0.3)
            .collect::<Vec<f32>>()
    };
    let p = Predictor::from_f32(
        d,
        h,
        o,
        &w(h * d, 0.7),
        &w(h, 1.1),
        &w(o * h, 0.3),
        &w(o, 0.9),
        0.1,
    )
    .unwrap();
    let set = PredictorSet {
        model_fingerprint: 7,
        layers: vec![p.clone(), p],
    };
    Target {
        name: "predictor",
        seeds: vec![one("p.pred", saved(|path| set.save(path).unwrap()))],
        dict: &[],
        fixup: Some(reseal_fnv),
        run: Box::new(|dir| {
            let set = PredictorSet::load(dir.join("p.pred")).map_err(e)?;
            for p in &set.layers {
                let x = vec![0.5; p.d_in()];
                let mut out = vec![0.0; p.n_out()];
                p.scores(&x, &mut out).map_err(e)?;
                let mut ids = Vec::new();
                p.predict(&x, &mut ids).map_err(e)?;
            }
            Ok(())
        }),
    }
}

fn store() -> Target {
    let (layers, d, ff) = (2, 64, 12);
    let q8 = Formats {
        gate: WeightFormat::Q8_0,
        up: WeightFormat::Q8_0,
        down: WeightFormat::Q8_0,
    };
    let mut seeds = Vec::new();
    for max_k in [usize::MAX, 1] {
        let l = BundleLayout::with_neurons(d, q8, max_k).unwrap();
        seeds.push(one(
            "m.neurons",
            saved(|path| {
                let mut w = StoreWriter::create_with(path, layers, d, ff, q8, max_k).unwrap();
                for li in 0..layers {
                    let order: Vec<u32> = (0..ff as u32)
                        .map(|i| (i * 5 + li as u32) % ff as u32)
                        .collect();
                    w.add_layer(LayerInput {
                        gate: &vec![1; ff * l.gate_row],
                        up: &vec![2; ff * l.up_row],
                        down_t: &vec![3; ff * l.down_row],
                        order,
                        hot_neurons: ff / 4,
                        down_norms: (0..ff).map(|i| i as f32).collect(),
                    })
                    .unwrap();
                }
                w.finish().unwrap();
            }),
        ));
    }
    // The engine keeps every file it opened: a fresh one now and then bounds the open descriptors.
    let io = std::cell::RefCell::new((IoEngine::new(IoConfig::default()).unwrap(), 0u32));
    Target {
        name: "store",
        seeds,
        dict: &[],
        fixup: Some(reseal_store),
        run: Box::new(move |dir| {
            let mut io = io.borrow_mut();
            io.1 += 1;
            if io.1 % 256 == 0 {
                // Dropping an engine joins its I/O thread, which took ~1.8 s here: not on the clock.
                let old =
                    std::mem::replace(&mut io.0, IoEngine::new(IoConfig::default()).map_err(e)?);
                std::thread::spawn(move || drop(old));
            }
            let store = NeuronStore::open(&io.0, dir.join("m.neurons"), OpenOptions::default())
                .map_err(e)?;
            store.verify_all(&io.0).map_err(e)
        }),
    }
}

/// Bundle manifests: re-seal the checksum line (the hash of everything before it).
fn reseal_manifest(_: &str, b: &mut [u8]) {
    let Ok(text) = std::str::from_utf8(b) else {
        return;
    };
    let Some(i) = text.rfind("checksum fnv1a64:") else {
        return;
    };
    let start = i + "checksum fnv1a64:".len();
    if b.len() >= start + 16 {
        let h = format!("{:016x}", fnv(&b[..i]));
        b[start..start + 16].copy_from_slice(h.as_bytes());
    }
}

fn manifest() -> Target {
    use engine::manifest::{Manifest, Part, PartRole};
    let part = |role, file: &str, size| Part {
        role,
        file: file.into(),
        size,
        hash: size.wrapping_mul(0x9e37_79b9_7f4a_7c15),
    };
    let m = Manifest {
        source_fingerprint: 0xdead_beef,
        parts: vec![
            part(PartRole::Resident, "m.resident.gguf", 48_234_496),
            part(PartRole::Store, "m.resident.neurons", 106_954_752),
            part(PartRole::Profile, "m.resident.gguf.sparrow-profile", 41_216),
            part(
                PartRole::Predictor,
                "m.resident.gguf.sparrow-predictor",
                9_000,
            ),
        ],
    };
    Target {
        name: "manifest",
        seeds: vec![one("m.sparrow-manifest", m.to_text().into_bytes())],
        dict: &[
            b"part ",
            b"store ",
            b"checksum ",
            b"fnv1a64:",
            b"\n",
            b"../",
            b" ",
        ],
        fixup: Some(reseal_manifest),
        run: Box::new(|dir| {
            let p = dir.join("m.sparrow-manifest");
            let bytes = std::fs::read(&p).map_err(e)?;
            let m = Manifest::parse(&p, &bytes).map_err(e)?;
            let back = Manifest::parse(&p, m.to_text().as_bytes()).map_err(e)?;
            if back != m {
                panic!("the manifest does not round-trip: {m:?} -> {back:?}");
            }
            Ok(())
        }),
    }
}

/// Planner files (`kind vN len=L fnv1a64=H` then JSON): re-seal the length and hash of the payload.
fn reseal_planner(_: &str, b: &mut [u8]) {
    let Some(nl) = b.iter().take(256).position(|&c| c == b'\n') else {
        return;
    };
    let Ok(header) = std::str::from_utf8(&b[..nl]) else {
        return;
    };
    let mut words = header.split(' ');
    let (Some(kind), Some(version)) = (words.next(), words.next()) else {
        return;
    };
    let body = &b[nl + 1..];
    let payload = body.strip_suffix(b"\n").unwrap_or(body);
    // The length is zero-padded to the header's old width (the reader accepts leading zeros), so the
    // header keeps its size; a payload whose length needs more digits stays unsealed.
    let Some(width) =
        (nl + 1).checked_sub(format!("{kind} {version} len= fnv1a64={:016x}\n", 0).len())
    else {
        return;
    };
    let fixed = format!(
        "{kind} {version} len={:0width$} fnv1a64={:016x}\n",
        payload.len(),
        planner::fnv1a64(payload)
    );
    if fixed.len() == nl + 1 {
        b[..=nl].copy_from_slice(fixed.as_bytes());
    }
}

/// A small device profile and a plan made for it (the seeds of the `plan` target).
fn planner_seeds() -> (Vec<u8>, Vec<u8>) {
    use planner::{
        make_plan, Constraints, DeviceProfile, FfnLayer, IoRate, KernelRate, ModelSummary, Solver,
        TensorInfo,
    };
    let kernels = (1..=2)
        .map(|t| KernelRate {
            format: "q4_0".into(),
            threads: t,
            dense_bps: 4e9 * t as f64,
            sparse_bps: 2e9 * t as f64,
            axpy_bps: 0.0,
            batch_cost: 0.0,
            dram_dense_bps: 0.0,
            unit_rows_bps: 0.0,
            unit_axpy_bps: 0.0,
        })
        .collect();
    let device = DeviceProfile {
        name: "fuzz".into(),
        fingerprint: 7,
        cores: 2,
        dram_bps: 12e9,
        kernels,
        flash_random: vec![IoRate {
            read_bytes: 4096,
            queue_depth: 32,
            bps: 0.6e9,
        }],
        batch_cost: 0.3,
        flash_seq_bps: 2e9,
        flash_path: "/tmp".into(),
        ..Default::default()
    };
    let freq: Vec<f32> = (0..16).map(|i| 1.0 / (1.0 + i as f32)).collect();
    let freq2: Vec<f32> = freq.iter().map(|p| 1.0 - (1.0 - p) * (1.0 - p)).collect();
    let layer = FfnLayer::from_frequencies(1536, "q4_0", 4096, 2, &[freq, freq2], 4).unwrap();
    let model = ModelSummary {
        name: "fuzz-model".into(),
        fingerprint: 99,
        tensors: vec![TensorInfo {
            name: "attention".into(),
            format: "q4_0".into(),
            bytes: 1 << 20,
            touched_bytes: 1 << 20,
            offloadable: false,
            computed: true,
        }],
        layers: vec![layer.clone(), layer],
        kv_bytes_per_position: 1024,
        process_bytes: 1 << 20,
        batch_sizes: vec![1, 2],
        grid: 4,
        offloaded: true,
        ..Default::default()
    };
    let c = Constraints {
        memory_budget: Some(8 << 20),
        context: 64,
        attended: 64,
        min_tok_s: None,
        max_threads: None,
        accelerator: None,
        accel_neuron_bytes: None,
    };
    let plan = make_plan(&device, &model, &c, Solver::Search).unwrap();
    (
        saved(|path| device.save(path).unwrap()),
        saved(|path| plan.save(path).unwrap()),
    )
}

fn plan() -> Target {
    use planner::{DeviceProfile, Plan};
    let (device, plan) = planner_seeds();
    Target {
        name: "plan",
        seeds: vec![one("d.sparrow-device", device), one("p.sparrow-plan", plan)],
        dict: JSON_DICT,
        fixup: Some(reseal_planner),
        run: Box::new(|dir| {
            // Whichever of the two files the case holds is read, used as the engine would use it,
            // and written back.
            let d = dir.join("d.sparrow-device");
            if d.exists() {
                let d = DeviceProfile::load(d).map_err(e)?;
                for t in d.thread_counts() {
                    let _ = d.kernel_rate("q4_0", t);
                }
                for q in d.queue_depths() {
                    let _ = d.io_rate(4096, q);
                }
                d.save(dir.join("back")).map_err(e)?;
            }
            let p = dir.join("p.sparrow-plan");
            if p.exists() {
                let plan = Plan::load(&p).map_err(e)?;
                let _ = plan.describe();
                let _ = plan.check_for(&p, 99, 2, Some(7));
                let _ = engine::PlanSettings::of(&plan);
                plan.save(dir.join("back")).map_err(e)?;
            }
            Ok(())
        }),
    }
}

/// Every target, in a fixed order.
pub fn all() -> Vec<Target> {
    vec![
        gguf(),
        hf(),
        tokenizer(),
        chat(),
        profile(),
        predictor(),
        store(),
        manifest(),
        plan(),
    ]
}
