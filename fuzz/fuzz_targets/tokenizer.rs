#![no_main]
//! The input, split at NUL bytes: `tokenizer.json`, `tokenizer_config.json`, `generation_config.json`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let dir = sparrow_fuzz::scratch().join("tok");
    std::fs::create_dir_all(&dir).unwrap();
    let mut parts = data.split(|&b| b == 0);
    for name in [
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ] {
        let p = dir.join(name);
        match parts.next() {
            Some(bytes) => std::fs::write(&p, bytes).unwrap(),
            None => {
                let _ = std::fs::remove_file(&p);
            }
        }
    }
    if let Ok(tok) = model_tokenizer::Tokenizer::from_tokenizer_json(&dir.join("tokenizer.json")) {
        sparrow_fuzz::use_tokenizer(&tok);
    }
});
