#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(t) = model_tokenizer::ChatTemplate::new(&String::from_utf8_lossy(data)) {
        sparrow_fuzz::render(&t);
    }
});
