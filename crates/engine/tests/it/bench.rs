//! `engine::bench::run` on a tiny fixture: which modes it measures, one figure per repetition, and the
//! engine's sparse FFN back in place afterwards.

use crate::common;

use engine::bench::{self, BenchMode, BenchOptions};
use engine::sparse::DEFAULT_DOWN_FORMAT;
use engine::{Engine, EngineOptions, ModelFile, SparseFfn};

fn fixture(name: &str) -> ModelFile {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(name);
    ModelFile::open(&path).unwrap()
}

fn options(teacher_forced: bool) -> BenchOptions {
    BenchOptions {
        n_prompt: 8,
        n_gen: 4,
        reps: 3,
        teacher_forced,
    }
}

#[test]
fn dense_bench_measures_every_repetition() {
    let file = fixture("tiny-llama-silu-q4_0.gguf");
    let mut eng = Engine::new(&file, EngineOptions::default()).unwrap();
    let vocab = eng.model().config.vocab_size as u32;
    let tokens = bench::synthetic_tokens(options(false).tokens_needed(), vocab);
    let r = bench::run(&mut eng, None, &tokens, &options(false)).unwrap();
    assert_eq!(r.modes, [BenchMode::Dense]);
    let m = &r.runs[0];
    assert_eq!((m.pp.len(), m.tg.len(), m.ffn_share.len()), (3, 3, 3));
    assert_eq!(m.token_s.len(), 3 * 4, "every decode step is timed");
    assert!(m.pp.iter().chain(&m.tg).all(|&x| x > 0.0 && x.is_finite()));
    assert!(m.stats.is_none() && m.offload.is_none() && m.prompt_offload.is_none());
    assert_eq!(r.tg_ratio(), None);
}

#[test]
fn sparse_bench_pairs_dense_and_sparse_and_puts_the_sparse_ffn_back() {
    let file = fixture("tiny-llama-relu-q8_0.gguf");
    let mut eng = Engine::new(&file, EngineOptions::default()).unwrap();
    let n_layers = eng.model().config.n_layers;
    let sp = SparseFfn::new(eng.model(), vec![0.0; n_layers], DEFAULT_DOWN_FORMAT).unwrap();
    eng.set_sparse(Some(sp));
    let tokens = bench::synthetic_tokens(8, eng.model().config.vocab_size as u32);
    let r = bench::run(&mut eng, None, &tokens, &options(true)).unwrap();
    assert_eq!(r.modes, [BenchMode::Dense, BenchMode::Sparse]);
    assert_eq!(r.runs[0].tg.len(), 3);
    assert_eq!(r.runs[1].tg.len(), 3);
    assert!(r.runs[0].stats.is_none() && r.runs[1].stats.is_some());
    let (mean, _) = r.tg_ratio().unwrap();
    assert!(mean > 0.0 && mean.is_finite());
    assert!(
        eng.sparse().is_some(),
        "the sparse FFN is back in the engine"
    );

    let e = bench::run(&mut eng, None, &tokens[..2], &options(true)).unwrap_err();
    assert!(e.to_string().contains("needs 8 tokens"), "{e}");
    assert!(eng.sparse().is_some());
}

#[test]
fn text_tokens_are_the_whole_texts_first_tokens() {
    // A prefix of the text is tokenized, cut before a whitespace: the tokens must be those of the
    // whole text, for short and long needs, and a text too short is an error.
    let file = ModelFile::open(common::model_path()).unwrap();
    let eng = Engine::new(&file, EngineOptions::default()).unwrap();
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../sparrow/data/eval.txt");
    let text = std::fs::read_to_string(&src).unwrap();
    let all = eng.tokenizer().encode(&text, false).unwrap();
    assert!(all.len() > 5000, "{} tokens", all.len());
    for need in [1, 17, 33, 500, 3000, all.len()] {
        assert_eq!(
            bench::text_tokens(&eng, &text, &src, need).unwrap(),
            all[..need],
            "need {need}"
        );
    }
    let err = bench::text_tokens(&eng, &text, &src, all.len() + 1).unwrap_err();
    assert!(err.to_string().contains("eval.txt"), "{err}");
}
