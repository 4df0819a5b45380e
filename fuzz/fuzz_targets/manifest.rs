#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let p = std::path::Path::new("fuzz.sparrow-manifest");
    if let Ok(m) = engine::manifest::Manifest::parse(p, data) {
        // Whatever parses writes back to a text that parses to the same manifest.
        let back = engine::manifest::Manifest::parse(p, m.to_text().as_bytes());
        assert_eq!(back.ok(), Some(m));
    }
});
