//! The embedding and output projection left on flash (`engine::stream`): logits are bit for bit those
//! of the resident path, batched and step by step, on the tiny fixtures (one output chunk) and on the
//! real default model (its output projection is several chunks).

mod common;

use std::path::PathBuf;

use engine::{Engine, EngineOptions, ModelFile, Precision};

fn engine(file: &ModelFile) -> Engine<'_> {
    Engine::new(
        file,
        EngineOptions {
            threads: 2,
            precision: Precision::Fast,
            context: 64,
            ..Default::default()
        },
    )
    .unwrap()
}

/// Batched and one-by-one logits of `tokens`, resident and streamed, must be equal.
fn check(file: &ModelFile, tokens: &[u32], min_chunks: usize) {
    let mut eng = engine(file);
    let out = &eng.model().output;
    let chunks = (out.rows() * out.row_bytes()).div_ceil(engine::stream::OUTPUT_CHUNK);
    assert!(chunks >= min_chunks, "{chunks} chunks");
    let want = [true, false].map(|b| common::logits(&eng, tokens, b));
    eng.set_streamed(true);
    assert!(eng.model().streamed());
    // Where the file's filesystem takes direct I/O, the output is read so (not paged in the map).
    let direct = ufs_io::IoFile::open(file.path(), ufs_io::OpenOptions::default())
        .is_ok_and(|f| f.is_direct());
    assert_eq!(
        eng.model().output_direct(),
        direct,
        "{}",
        file.path().display()
    );
    let got = [true, false].map(|b| common::logits(&eng, tokens, b));
    for (batched, (w, g)) in [true, false].iter().zip(want.iter().zip(&got)) {
        assert!(w == g, "{}: batched {batched}", file.path().display());
    }
    eng.set_streamed(false);
    assert!(!eng.model().output_direct());
    assert_eq!(common::logits(&eng, tokens, true), want[0]);
}

#[test]
fn streamed_output_equals_resident_output_on_the_fixtures() {
    for name in [
        "tiny-llama-silu-q4_0.gguf",
        "tiny-llama-relu-q8_0.gguf",
        "tiny-qwen2-q4_1.gguf",
        "tiny-llama-f16.gguf",
    ] {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../fixtures")
            .join(name);
        check(&ModelFile::open(&path).unwrap(), &[1, 40, 77, 200, 5], 1);
    }
}

#[test]
fn streamed_output_equals_resident_output_on_the_real_model() {
    let file = ModelFile::open(common::model_path()).unwrap();
    let prompt = common::ids(&common::reference()["prompts"][0]["ids"]);
    // SmolLM2's 49,152-row output projection is several 4 MiB chunks.
    check(&file, &prompt[..prompt.len().min(12)], 3);
}
