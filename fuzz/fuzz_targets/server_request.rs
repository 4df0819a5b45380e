#![no_main]
use std::sync::OnceLock;

static TOKENIZER: OnceLock<engine::Tokenizer> = OnceLock::new();

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let tok = TOKENIZER.get_or_init(|| {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/tiny-llama-silu-q4_0.gguf");
        let file = engine::ModelFile::open(path).expect("the fixture opens");
        engine::load_tokenizer(&file).expect("the fixture has a tokenizer")
    });
    // The first byte picks the endpoint, the rest is the body.
    if let Some((&which, body)) = data.split_first() {
        if let Err(e) = server::check_request(which & 1 == 1, body, tok, 256) {
            assert!(e.status.is_client_error(), "{e:?}");
        }
    }
});
