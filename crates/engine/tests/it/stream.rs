//! The embedding and output projection left on flash (`engine::stream`): logits are bit for bit those
//! of the resident path, batched and step by step, on the tiny fixtures (one output chunk) and on the
//! real default model (its output projection is several chunks).

use crate::common;

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

/// `src` rewritten to `dst` with the output projection's proxy added, as `sparrow convert` adds it
/// to a resident file.
fn with_proxy(src: &std::path::Path, dst: &std::path::Path) {
    use engine::output_proxy::{build_proxy, proxy_cols, OUTPUT_PROXY_TENSOR, PROXY_FORMAT};
    let file = ModelFile::open(src).unwrap();
    let model = engine::model::Model::load(&file).unwrap();
    let gguf = model_format::GgufFile::open(src).unwrap();
    let mut out = model_format::GgufWriter::new();
    for (k, v) in gguf.metadata() {
        if k != "general.alignment" {
            out.metadata(k, v.clone());
        }
    }
    out.alignment(gguf.alignment());
    for t in gguf.tensors() {
        out.tensor(t.name, t.dtype, t.shape, t.data.to_vec())
            .unwrap();
    }
    let (v, d) = (model.output.rows(), model.output.cols());
    out.tensor(
        OUTPUT_PROXY_TENSOR,
        PROXY_FORMAT,
        &[v, proxy_cols(d)],
        build_proxy(&model.output).unwrap(),
    )
    .unwrap();
    out.write(dst).unwrap();
}

/// With the proxy, a streamed one-token step's logits are the whole projection's at the proxy's
/// candidates (bit for bit) and its argmax is theirs; without it (or batched) they are equal.
fn check_proxy(src: &std::path::Path, tokens: &[u32]) {
    let dir = std::env::temp_dir().join(format!(
        "sparrow-proxy-{}-{}",
        std::process::id(),
        src.file_stem().unwrap().to_string_lossy()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let dst = dir.join(src.file_name().unwrap());
    with_proxy(src, &dst);
    let file = ModelFile::open(&dst).unwrap();
    let mut eng = engine(&file);
    assert!(eng.model().output_proxy().is_some());
    let want = common::logits(&eng, tokens, false);
    eng.set_streamed(true);
    assert!(eng.model().output_proxy_used());
    let got = common::logits(&eng, tokens, false);
    let vocab = eng.model().config.vocab_size;
    let k = engine::output_proxy::PROXY_CANDIDATES.min(vocab);
    let argmax = |l: &[f32]| {
        l.iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .unwrap()
            .0
    };
    for (t, (w, g)) in want.chunks(vocab).zip(got.chunks(vocab)).enumerate() {
        let exact = w.iter().zip(g).filter(|(a, b)| a == b).count();
        assert!(
            exact >= k,
            "token {t}: {exact} logits exact, {k} candidates"
        );
        assert_eq!(argmax(w), argmax(g), "token {t}");
        assert!(w != g || vocab <= k, "token {t}: the proxy was not used");
    }
    // Where the filesystem refuses direct I/O, the candidate rows come from the mapping: the same.
    eng.set_streamed_mapped();
    assert!(eng.model().output_proxy_used() && !eng.model().output_direct());
    assert!(
        common::logits(&eng, tokens, false) == got,
        "the proxy's step through the mapping differs from the direct one"
    );
    // Batched (a prompt scored whole) and with the proxy off, the whole projection.
    assert_eq!(
        common::logits(&eng, tokens, true),
        common::logits(&engine(&file), tokens, true)
    );
    eng.set_output_proxy(false);
    assert_eq!(common::logits(&eng, tokens, false), want);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_output_proxy_keeps_the_candidates_exact_on_the_real_model() {
    let prompt = common::ids(&common::reference()["prompts"][0]["ids"]);
    check_proxy(&common::model_path(), &prompt[..prompt.len().min(12)]);
}

#[test]
fn the_output_proxy_keeps_the_candidates_exact_on_qwen() {
    // Qwen2.5-Coder-0.5B's 151,936-row Q8_0 output: the case the proxy is for.
    let m = engine::fetch::known_model("qwen2.5-coder-0.5b").expect("a known model");
    let path = engine::fetch::ensure_model(m, |line| eprintln!("test setup: {line}"))
        .expect("qwen2.5-coder-0.5b can be fetched");
    let reference =
        common::shared_dir().join("reference/qwen2.5-coder-0.5b-instruct/reference.json");
    let reference: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(reference).unwrap()).unwrap();
    let ids: Vec<u32> = reference["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| common::ids(&p["ids"]))
        .take(48)
        .collect();
    check_proxy(&path, &ids);
}

#[test]
fn a_batch_of_sequences_through_the_output_proxy_keeps_each_rows_candidates_exact() {
    // Five sequences' next tokens in one step (under the proxy's limit of 8).
    let src = common::model_path();
    let dir = std::env::temp_dir().join(format!("sparrow-proxy-batch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let dst = dir.join("batch.gguf");
    with_proxy(&src, &dst);
    let file = ModelFile::open(&dst).unwrap();
    let mut eng = engine(&file);
    eng.set_streamed(true);
    let tokens = [1u32, 40, 77, 200, 5];
    let step = |eng: &Engine<'_>| {
        let mut caches: Vec<_> = tokens.iter().map(|_| eng.new_cache()).collect();
        let mut refs: Vec<&mut _> = caches.iter_mut().collect();
        eng.forward_batch(&mut refs, &tokens).unwrap()
    };
    let got = step(&eng);
    eng.set_output_proxy(false);
    let want = step(&eng);
    let vocab = eng.model().config.vocab_size;
    for (t, (w, g)) in want.chunks(vocab).zip(got.chunks(vocab)).enumerate() {
        let exact = w.iter().zip(g).filter(|(a, b)| a == b).count();
        assert!(
            exact >= engine::output_proxy::PROXY_CANDIDATES && exact < vocab,
            "row {t}: {exact} of {vocab} logits exact"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
