//! The Mixture-of-Experts families against llama.cpp: for each of `qwen3moe`, `mixtral` (GGUF
//! `llama` with experts), `olmoe` and `qwen2moe`, a small synthetic model (`synth-model --arch`,
//! [`ci_options`]) is regenerated and run by the engine in memory, and compared with llama.cpp's
//! outputs on the same file, committed in `fixtures/reference/<arch>-synth/` (made by
//! `cargo xtask synth-reference`; the README there gives the commands). CI never builds
//! llama.cpp.
//!
//! Checked, per family: the regenerated file is the one llama.cpp ran (FNV-1a 64); the engine's
//! tokenizer gives llama-tokenize's ids; the perplexity over llama-perplexity's windows, scored as
//! it scores them (second half of each window), is within 0.1% of its `Final estimate` (the target
//! is 0.5%); the
//! engine's most probable token agrees with llama.cpp's (from its logits file) at >= 98% of those
//! positions; and the greedy continuation of each prompt prints the bytes llama-completion printed,
//! up to a step where the engine's top two logits are a near tie (the synthetic models flip between
//! a few bytes, and there the two may part: [`NEAR_TIE`]).

use crate::src::{synth_moe, synth_reference};
use std::path::{Path, PathBuf};

use engine::{Engine, EngineOptions, Logits, ModelFile, Precision};
use model_format::DType;
use synth_moe::{Arch, Options};

/// The CI shape of `arch`: 2 layers, d 256, 4 query heads of 64, 8 experts of 128 neurons (top-2
/// for mixtral, top-4 for the others), qwen2moe's shared expert 256 wide, the 258-token byte
/// vocabulary, Q8_0, the default (measured) router and seed. olmoe and qwen2moe have as many
/// key/value heads as query heads (llama.cpp sizes their k by d); the others 2.
pub fn ci_options(arch: Arch) -> Options {
    let kv_heads = match arch {
        Arch::Olmoe | Arch::Qwen2Moe => 4,
        Arch::Qwen3Moe | Arch::Mixtral => 2,
    };
    Options {
        layers: 2,
        d: 256,
        expert_ff: 128,
        shared_ff: if arch == Arch::Qwen2Moe { 256 } else { 0 },
        heads: 4,
        kv_heads,
        head_dim: 64,
        vocab: 258,
        experts: 8,
        used: if arch == Arch::Mixtral { 2 } else { 4 },
        format: DType::Q8_0,
        ..Options::defaults(arch)
    }
}

fn fixture_dir(arch: Arch) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/reference")
        .join(format!("{}-synth", arch.name()))
}

fn reference(arch: Arch) -> serde_json::Value {
    let p = fixture_dir(arch).join("reference.json");
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).unwrap()
}

pub(crate) fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("an array of token ids")
        .iter()
        .map(|x| x.as_u64().expect("a token id") as u32)
        .collect()
}

struct Gone(PathBuf);

impl Drop for Gone {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The regenerated model, checked to be the file llama.cpp ran.
fn model(arch: Arch, r: &serde_json::Value) -> Gone {
    let path = std::env::temp_dir().join(format!(
        "sparrow-{}-ref-{}-{:?}.gguf",
        arch.name(),
        std::process::id(),
        std::thread::current().id()
    ));
    synth_moe::write_model(&ci_options(arch), &path, |_, _| {}).unwrap();
    let gone = Gone(path.clone());
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(
        format!("{:016x}", synth_reference::fnv1a64(&bytes)),
        r["model_fnv1a64"].as_str().unwrap(),
        "{arch:?}: the regenerated model is not the file the reference was made from: regenerate \
         fixtures/reference/{}-synth (its README)",
        arch.name()
    );
    gone
}

fn engine_options() -> EngineOptions {
    EngineOptions {
        threads: 2,
        precision: Precision::Exact,
        ..Default::default()
    }
}

fn argmax(row: &[f32]) -> u32 {
    row.iter()
        .enumerate()
        .fold(
            (0, f32::NEG_INFINITY),
            |b, (i, &x)| if x > b.1 { (i, x) } else { b },
        )
        .0 as u32
}

/// The engine's perplexity over llama-perplexity's windows (scored as it scores them) and the share
/// of scored positions whose top-1 token is llama.cpp's.
fn perplexity_and_top1(arch: Arch, eng: &Engine<'_>, r: &serde_json::Value) -> (f64, f64) {
    scored_against(&fixture_dir(arch), eng, r)
}

/// [`perplexity_and_top1`] against the fixture in `dir` (its `text.txt` and `reference.json`
/// `r`): the synthetic-reference format every `*-synth` fixture shares.
pub(crate) fn scored_against(
    dir: &std::path::Path,
    eng: &Engine<'_>,
    r: &serde_json::Value,
) -> (f64, f64) {
    let (ppl, top1, _) = scored_with_gaps(dir, eng, r);
    (ppl, top1)
}

/// [`scored_against`], plus, at each position where the top-1 tokens differ, how far below the
/// engine's top logit the engine puts llama.cpp's top-1 token.
pub(crate) fn scored_with_gaps(
    dir: &std::path::Path,
    eng: &Engine<'_>,
    r: &serde_json::Value,
) -> (f64, f64, Vec<f32>) {
    let text = std::fs::read_to_string(dir.join("text.txt")).unwrap();
    let tokens = ids(&r["text_tokens"]);
    assert_eq!(eng.tokenizer().encode(&text, false).unwrap(), tokens);
    let (ctx, chunks) = (
        r["ctx"].as_u64().unwrap() as usize,
        r["chunks"].as_u64().unwrap() as usize,
    );
    assert!(tokens.len() >= ctx * chunks, "the text holds every window");
    let top1 = r["top1"]
        .as_array()
        .expect("the fixture records top-1 tokens");
    assert_eq!(top1.len(), chunks);
    let vocab = eng.model().config.vocab_size;
    let first = ctx / 2;
    let (mut nll, mut count, mut agree) = (0.0f64, 0usize, 0usize);
    let mut gaps = Vec::new();
    for c in 0..chunks {
        let theirs = ids(&top1[c]);
        assert_eq!(
            theirs.len(),
            ctx - 1 - first,
            "scored positions of window {c}"
        );
        let window = &tokens[c * ctx..(c + 1) * ctx];
        let mut cache = eng.new_cache();
        let logits = eng.forward(&mut cache, window, Logits::All).unwrap();
        for (j, &want) in (first..ctx - 1).zip(&theirs) {
            let row = &logits[j * vocab..(j + 1) * vocab];
            let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) as f64;
            let sum: f64 = row.iter().map(|&x| (x as f64 - max).exp()).sum();
            nll += max + sum.ln() - row[window[j + 1] as usize] as f64;
            count += 1;
            let top = argmax(row);
            agree += usize::from(top == want);
            if top != want {
                gaps.push(row[top as usize] - row[want as usize]);
            }
        }
    }
    (
        (nll / count as f64).exp(),
        agree as f64 / count.max(1) as f64,
        gaps,
    )
}

/// The bytes a token prints as in llama-completion with `--special`: a byte token's byte, a control
/// token's text (the synthetic vocabulary has no others at 258 tokens).
fn piece(eng: &Engine<'_>, t: u32) -> Vec<u8> {
    if t < 256 {
        vec![t as u8]
    } else {
        eng.tokenizer().decode(&[t], false).unwrap().into_bytes()
    }
}

/// Two logits closer than this are a near tie: llama.cpp (which quantizes activations to 8 bits in
/// its products) and the engine (f32 activations, `Precision::Exact`) may pick either.
const NEAR_TIE: f32 = 0.01;

/// Each prompt's greedy continuation (prompt tokens checked) against the bytes llama-completion
/// printed: equal token by token, up to the first step where the engine's top two logits are a
/// near tie ([`NEAR_TIE`]) and the continuations part (the synthetic models flip between a few
/// bytes); equal to the end, with llama-completion's exit newlines, when they do not part. Returns
/// the tokens compared equal over all prompts.
fn greedy_continuations(arch: Arch, eng: &Engine<'_>, r: &serde_json::Value) -> usize {
    let n = r["n_predict"].as_u64().unwrap() as usize;
    let eos = 257u32;
    let prompts = r["prompts"].as_array().unwrap();
    assert_eq!(prompts.len(), 4);
    let mut compared = 0;
    for p in prompts {
        let prompt = p["prompt"].as_str().unwrap();
        let tokens = ids(&p["tokens"]);
        assert_eq!(eng.tokenizer().encode(prompt, false).unwrap(), tokens);
        let theirs: Vec<u8> = (0..p["continuation_hex"].as_str().unwrap().len() / 2)
            .map(|i| {
                u8::from_str_radix(
                    &p["continuation_hex"].as_str().unwrap()[2 * i..2 * i + 2],
                    16,
                )
                .unwrap()
            })
            .collect();
        let mut cache = eng.new_cache();
        let mut logits = eng.forward(&mut cache, &tokens, Logits::Last).unwrap();
        let mut out = Vec::new();
        let mut parted = false;
        for step in 0..n {
            let next = argmax(&logits);
            let second = logits
                .iter()
                .enumerate()
                .filter(|&(i, _)| i as u32 != next)
                .fold(f32::NEG_INFINITY, |m, (_, &x)| m.max(x));
            let mut piece = piece(eng, next);
            if next == eos {
                // llama-completion prints the end-of-generation token, then this.
                piece.extend(b" [end of text]\n");
            }
            if !theirs[out.len()..].starts_with(&piece) {
                let margin = logits[next as usize] - second;
                assert!(
                    margin < NEAR_TIE,
                    "{arch:?}: greedy continuation of {prompt:?} parts from llama.cpp's at step \
                     {step} where the top two logits are {margin} apart (engine so far {:?}, \
                     llama.cpp {:?})",
                    String::from_utf8_lossy(&out),
                    String::from_utf8_lossy(&theirs)
                );
                eprintln!("{arch:?}: {prompt:?} parts from llama.cpp at step {step}, a near tie ({margin})");
                parted = true;
                break;
            }
            out.extend(&piece);
            compared += 1;
            if next == eos {
                break;
            }
            logits = eng.forward(&mut cache, &[next], Logits::Last).unwrap();
        }
        if !parted {
            // And two newlines as it exits.
            out.extend(b"\n\n");
            assert_eq!(out, theirs, "{arch:?}: greedy continuation of {prompt:?}");
        }
    }
    compared
}

fn check(arch: Arch, gguf_arch: &str) {
    let r = reference(arch);
    let gone = model(arch, &r);
    let file = ModelFile::open(&gone.0).unwrap();
    let cfg = file.config().unwrap();
    assert_eq!(cfg.arch.name(), gguf_arch);
    assert!(
        cfg.moe.is_some(),
        "{arch:?} loads as a Mixture-of-Experts model"
    );
    let eng = Engine::new(&file, engine_options()).unwrap();
    let (ppl, top1) = perplexity_and_top1(arch, &eng, &r);
    let want = r["ppl"].as_f64().unwrap();
    let rel = (ppl - want).abs() / want;
    eprintln!(
        "{arch:?}: engine PPL {ppl:.4}, llama-perplexity {want:.4}: {:.3}%; top-1 agreement {:.2}%",
        100.0 * rel,
        100.0 * top1
    );
    // The target is 0.5%; the engine measured 0.002% to 0.023% when these fixtures were made, and
    // swapping each family's top-k normalisation (renormalised / raw) moved it 0.16% to 0.50%:
    // 0.1% keeps the check able to see that.
    assert!(
        rel < 0.001,
        "{arch:?}: engine PPL {ppl} vs llama.cpp {want}"
    );
    assert!(top1 >= 0.98, "{arch:?}: top-1 agreement {top1}");
    let compared = greedy_continuations(arch, &eng, &r);
    // 4 prompts of 32 tokens: a check that parted at once everywhere would check nothing. Since the
    // routing law of generator version 3 (routing that follows recent tokens), qwen3moe's
    // continuations meet near ties sooner (38 tokens compared when its fixture was made).
    assert!(
        compared >= 32,
        "{arch:?}: only {compared} greedy tokens compared equal"
    );
}

#[test]
fn qwen3moe_synth_matches_llama_cpp() {
    check(Arch::Qwen3Moe, "qwen3moe");
}

#[test]
fn mixtral_synth_matches_llama_cpp() {
    check(Arch::Mixtral, "llama");
}

#[test]
fn olmoe_synth_matches_llama_cpp() {
    check(Arch::Olmoe, "olmoe");
}

#[test]
fn qwen2moe_synth_matches_llama_cpp() {
    check(Arch::Qwen2Moe, "qwen2moe");
}

/// A full-shape synthetic model against llama.cpp's outputs on it (docs/benchmarks/moe.md):
/// `SPARROW_FULL_SHAPE=MODEL.gguf:DIR`, DIR made by `cargo xtask synth-reference --model MODEL.gguf
/// --out DIR --ctx 512 --chunks 2`. Perplexity within 0.5% of llama-perplexity's over its windows,
/// top-1 agreement >= 98%; `SPARROW_FULL_SHAPE_PRECISION=ggml` runs the engine with llama.cpp's
/// roundings (`Precision::Ggml`) instead of exact f32. Ignored: the models are gigabytes and llama.cpp's outputs on them are not
/// committed.
#[test]
#[ignore = "needs SPARROW_FULL_SHAPE=MODEL.gguf:DIR (a full-shape synthetic and synth-reference's outputs on it)"]
fn full_shape_synth_matches_llama_cpp() {
    let spec = std::env::var("SPARROW_FULL_SHAPE").expect("SPARROW_FULL_SHAPE=MODEL.gguf:DIR");
    let (model, dir) = spec.rsplit_once(':').expect("MODEL.gguf:DIR");
    let dir = Path::new(dir);
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    let file = ModelFile::open(model).unwrap();
    assert!(
        file.config().unwrap().moe.is_some(),
        "{model} is an MoE model"
    );
    // `SPARROW_FULL_SHAPE_PRECISION=ggml`: llama.cpp's roundings (`Precision::Ggml`), else exact.
    let precision = match std::env::var("SPARROW_FULL_SHAPE_PRECISION").as_deref() {
        Ok("ggml") => Precision::Ggml,
        Ok("exact") | Err(_) => Precision::Exact,
        Ok(other) => panic!("SPARROW_FULL_SHAPE_PRECISION={other}: exact or ggml"),
    };
    let eng = Engine::new(
        &file,
        EngineOptions {
            precision,
            ..engine_options()
        },
    )
    .unwrap();
    let (ppl, top1, mut gaps) = scored_with_gaps(dir, &eng, &r);
    gaps.sort_by(f32::total_cmp);
    eprintln!("{model}: where the top-1 tokens differ, llama.cpp's is this far below sparrow's top logit: {gaps:?}");
    let want = r["ppl"].as_f64().unwrap();
    let rel = (ppl - want).abs() / want;
    eprintln!(
        "{model} ({precision:?}): {} windows of {} tokens: engine PPL {ppl:.4}, llama-perplexity \
         {want:.4}: {:.3}%; top-1 agreement {:.2}%",
        r["chunks"],
        r["ctx"],
        100.0 * rel,
        100.0 * top1
    );
    assert!(rel < 0.005, "engine PPL {ppl} vs llama.cpp {want}");
    assert!(top1 >= 0.98, "top-1 agreement {top1}");
}
