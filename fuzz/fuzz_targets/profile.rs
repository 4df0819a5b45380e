#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = predictor::Profile::load(sparrow_fuzz::file("p.prof", data));
});
