//! The repacked Q4_0 copies of one-token decode ([`Engine::pack_q40x8`]: the AVX2 and AVX-512 paths
//! in `Fast`): a prompt and then decode steps give bit for bit the logits of an engine without
//! them. Repacks only where the active path is one of those (on an AVX-512 machine both, as under
//! `SPARROW_KERNELS=avx2 cargo test -p engine --test it -- q40x8`); elsewhere it checks that
//! nothing is repacked.

use engine::{Engine, EngineOptions, Logits, ModelFile, Precision};
use kernels_neon::{active_path, KernelPath};

/// The bits of the logits of a 3-token prompt and then 5 decode steps.
fn logit_bits(eng: &Engine<'_>) -> Vec<u32> {
    let mut cache = eng.new_cache();
    let mut out = eng.forward(&mut cache, &[1, 2, 3], Logits::Last).unwrap();
    for t in [4, 5, 6, 7, 8] {
        out.extend(eng.forward(&mut cache, &[t], Logits::Last).unwrap());
    }
    out.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn q40x8_repacked_decode_gives_the_same_logits() {
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/tiny-llama-silu-q4_0.gguf");
    let file = ModelFile::open(&path).unwrap();
    let opts = EngineOptions {
        threads: 2,
        precision: Precision::Fast,
        context: 16,
        ..Default::default()
    };
    let plain = Engine::new(&file, opts.clone()).unwrap();
    let want = logit_bits(&plain);
    let mut packed = Engine::new(&file, opts).unwrap();
    let (n, bytes) = packed.pack_q40x8(true);
    assert_eq!(bytes, packed.model().packed_bytes());
    let x86 = matches!(active_path(), KernelPath::Avx2Fma | KernelPath::Avx512);
    if x86 && std::env::var("SPARROW_Q40X8").is_err() {
        // q, k, v, o, gate, up and down of every layer (the fixture's output projection has a
        // vocabulary of rows not a multiple of 8).
        let layers = packed.model().config.n_layers;
        assert_eq!(n, 7 * layers, "matrices repacked");
        assert!(bytes > 0);
    } else {
        assert_eq!((n, bytes), (0, 0));
    }
    assert!(
        logit_bits(&packed) == want,
        "repacked decode changed the logits"
    );
}
