//! Helpers shared by the libFuzzer targets: the parsers read files, so each input is written to a
//! scratch file of this process first.

use std::path::{Path, PathBuf};

/// This process's scratch folder (created once).
pub fn scratch() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sparrow-libfuzzer-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch folder");
    dir
}

/// Writes `data` to `name` in the scratch folder and returns its path.
pub fn file(name: &str, data: &[u8]) -> PathBuf {
    let p = scratch().join(name);
    std::fs::write(&p, data).expect("scratch file");
    p
}

/// Opens a model file (GGUF file or HF folder) as the CLI does: configuration, tokenizer, weights.
pub fn open_model(path: &Path) {
    let Ok(file) = engine::ModelFile::open(path) else {
        return;
    };
    let _ = file.config();
    if let Ok(tok) = engine::load_tokenizer(&file) {
        use_tokenizer(&tok);
    }
    let _ = engine::Model::load(&file);
}

/// Encodes and decodes a text with special tokens, renders the chat template if any.
pub fn use_tokenizer(tok: &model_tokenizer::Tokenizer) {
    if let Ok(ids) = tok.encode("<|im_start|>hello 12 wörld 😀<|im_end|>", true) {
        let _ = tok.decode(&ids, false);
        let _ = tok.decode(&ids, true);
    }
    let _ = tok.decode(&[0, u32::MAX], false);
    if let Some(t) = tok.chat_template() {
        render(t);
    }
}

/// Renders a four-message conversation.
pub fn render(t: &model_tokenizer::ChatTemplate) {
    let m = [
        model_tokenizer::ChatMessage::new("system", "You are terse."),
        model_tokenizer::ChatMessage::new("user", "Hi"),
        model_tokenizer::ChatMessage::new("assistant", ""),
        model_tokenizer::ChatMessage::new("user", "x"),
    ];
    let _ = t.render(&m, true, "<s>", "</s>");
}
