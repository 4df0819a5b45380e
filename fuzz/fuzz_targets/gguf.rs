#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    sparrow_fuzz::open_model(&sparrow_fuzz::file("model.gguf", data));
});
