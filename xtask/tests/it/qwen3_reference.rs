//! The qwen3 family against llama.cpp: a small synthetic qwen3 model (`synth-model --arch qwen3`,
//! [`ci_options`]) is regenerated and run by the engine, and compared with llama.cpp's outputs on the
//! same file, committed in `fixtures/reference/qwen3-synth/` (made by `cargo xtask synth-reference`;
//! the README there gives the commands). CI never builds llama.cpp.
//!
//! Checked: the regenerated file is the one llama.cpp ran (FNV-1a 64); the engine's tokenizer gives
//! llama-tokenize's ids for the text and the prompts; the perplexity over llama-perplexity's windows,
//! scored as it scores them (second half of each window), is within 0.1% of its `Final estimate`
//! (the target is 0.5%); the
//! greedy continuation of each prompt prints the bytes llama-completion printed (its stdout: the
//! generated tokens' text, ` [end of text]` after an end-of-generation token, two newlines at exit).

use crate::src::{synth, synth_reference};
use std::path::{Path, PathBuf};

use engine::{Engine, EngineOptions, Logits, ModelFile, Precision};
use model_format::DType;
use synth::{Options, SynthArch};

/// The CI shape: 2 layers, d 128, ff 256, 4 query heads and 2 key/value heads of 64 (so the query
/// width, 256, is not d), the 258-token byte vocabulary, Q8_0.
fn ci_options() -> Options {
    Options {
        layers: 2,
        d: 128,
        ff: 256,
        heads: 4,
        kv_heads: 2,
        head_dim: Some(64),
        vocab: 258,
        format: DType::Q8_0,
        ..SynthArch::Qwen3.defaults()
    }
}

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/reference/qwen3-synth")
}

fn reference() -> serde_json::Value {
    let p = fixture_dir().join("reference.json");
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).unwrap()
}

use crate::moe_reference::ids;

/// The regenerated model, checked to be the file llama.cpp ran.
fn model(r: &serde_json::Value) -> (PathBuf, impl Drop) {
    struct Gone(PathBuf);
    impl Drop for Gone {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    let path = std::env::temp_dir().join(format!(
        "sparrow-qwen3-ref-{}-{:?}.gguf",
        std::process::id(),
        std::thread::current().id()
    ));
    synth::write_model(&ci_options(), &path, |_, _| {}).unwrap();
    let gone = Gone(path.clone());
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(
        format!("{:016x}", synth_reference::fnv1a64(&bytes)),
        r["model_fnv1a64"].as_str().unwrap(),
        "the regenerated model is not the file the reference was made from: regenerate \
         fixtures/reference/qwen3-synth (its README)"
    );
    (path, gone)
}

fn engine_options() -> EngineOptions {
    EngineOptions {
        threads: 2,
        precision: Precision::Exact,
        ..Default::default()
    }
}

#[test]
fn qwen3_synth_perplexity_is_llama_cpps_within_a_tenth_of_a_percent_and_top1_agrees() {
    let r = reference();
    let (path, _gone) = model(&r);
    let file = ModelFile::open(&path).unwrap();
    assert_eq!(file.config().unwrap().arch.name(), "qwen3");
    let eng = Engine::new(&file, engine_options()).unwrap();
    let (ppl, top1) = crate::moe_reference::scored_against(&fixture_dir(), &eng, &r);
    eprintln!("top-1 agreement with llama.cpp {:.1}%", 100.0 * top1);
    assert!(top1 >= 0.98, "top-1 agreement {top1}");
    let want = r["ppl"].as_f64().unwrap();
    let rel = (ppl - want).abs() / want;
    eprintln!(
        "engine PPL {ppl:.4}, llama-perplexity {want:.4}: {:.3}%",
        100.0 * rel
    );
    // The target is 0.5%; the engine measured 0.021% when this fixture was made, and leaving out
    // the key heads' norm moved it to 0.25%: 0.1% keeps the check able to see that.
    assert!(rel < 0.001, "engine PPL {ppl} vs llama.cpp {want}");
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

#[test]
fn qwen3_synth_greedy_continuations_are_llama_cpps() {
    let r = reference();
    let (path, _gone) = model(&r);
    let file = ModelFile::open(&path).unwrap();
    let eng = Engine::new(&file, engine_options()).unwrap();
    let n = r["n_predict"].as_u64().unwrap() as usize;
    let eos = 257u32;
    let prompts = r["prompts"].as_array().unwrap();
    assert_eq!(prompts.len(), 4);
    for p in prompts {
        let prompt = p["prompt"].as_str().unwrap();
        let tokens = ids(&p["tokens"]);
        assert_eq!(eng.tokenizer().encode(prompt, false).unwrap(), tokens);
        let mut cache = eng.new_cache();
        let mut logits = eng.forward(&mut cache, &tokens, Logits::Last).unwrap();
        let mut out = Vec::new();
        for _ in 0..n {
            let next = logits
                .iter()
                .enumerate()
                .fold(
                    (0, f32::NEG_INFINITY),
                    |b, (i, &x)| if x > b.1 { (i, x) } else { b },
                )
                .0 as u32;
            out.extend(piece(&eng, next));
            if next == eos {
                // llama-completion prints the end-of-generation token, then this.
                out.extend(b" [end of text]\n");
                break;
            }
            logits = eng.forward(&mut cache, &[next], Logits::Last).unwrap();
        }
        // And two newlines as it exits.
        out.extend(b"\n\n");
        let hex: String = out.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            p["continuation_hex"].as_str().unwrap(),
            "greedy continuation of {prompt:?}: engine {:?}",
            String::from_utf8_lossy(&out)
        );
    }
}
