//! Vocabularies and chat templates.

use super::*;

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

pub(super) fn tokenizer() -> Target {
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

pub(super) fn chat() -> Target {
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
