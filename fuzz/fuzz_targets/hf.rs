#![no_main]
//! The input, split at the first NUL: `config.json`, then `model.safetensors`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let cut = data.iter().position(|&b| b == 0).unwrap_or(data.len());
    let dir = sparrow_fuzz::scratch().join("hf");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.json"), &data[..cut]).unwrap();
    std::fs::write(
        dir.join("model.safetensors"),
        data.get(cut + 1..).unwrap_or(&[]),
    )
    .unwrap();
    sparrow_fuzz::open_model(&dir);
});
