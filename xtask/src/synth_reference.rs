//! `cargo xtask synth-reference --model GGUF --out DIR [--text FILE] [--ctx N] [--chunks K] [-n N]`:
//! llama.cpp's outputs on a model, written as a reference fixture that tests compare the engine
//! with, so that CI never builds llama.cpp. The programs are llama.cpp's as docs/BENCHMARKS.md says
//! (`target/llama.cpp/build/bin`, built there by `llama.rs` when absent).
//!
//! DIR receives
//! * `text.txt`: the first `ctx × chunks` bytes (`ctx` 256 and `chunks` 4 by default) (cut back to a character boundary, plus the rest of
//!   that character) of `--text` (default `../shared/data/wikitext-2/test.txt` beside the workspace);
//! * `reference.json`: the model's file name and FNV-1a 64 hash (a test regenerating the model checks
//!   it has the same file), `ctx`, `chunks`, the token ids `llama-tokenize --ids` gives for the text,
//!   the `Final estimate: PPL` that `llama-perplexity -c ctx --chunks chunks` prints for it, and for
//!   each of [`PROMPTS`] its token ids and the bytes `llama-completion` prints as its greedy
//!   continuation of `n` tokens (`--temp 0 --special --no-display-prompt`, hex; none with `-n 0`), and `top1`: per
//!   window, llama.cpp's most probable token at each scored position (from the logits file
//!   `llama-perplexity --kl-divergence-base` writes, [`top1_of_logits_file`]).
//!
//! `llama-perplexity` scores, in each window of `ctx` tokens, the predictions of the second half's
//! tokens (positions `ctx/2 + 1 .. ctx`), each window on its own (BOS first where the vocabulary adds
//! one). Tests reproduce exactly that.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, ensure, Context, Result};

/// The four prompts whose greedy continuations the fixture holds.
pub const PROMPTS: [&str; 4] = [
    "The capital of France is",
    "Once upon a time, there was",
    "def fibonacci(n):",
    "In 1905, Albert Einstein",
];

/// FNV-1a 64 of `bytes` (the hash the fixture names its model by; the tests check a regenerated
/// model with it).
#[allow(dead_code)]
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    fnv1a64_from(0xcbf2_9ce4_8422_2325, bytes)
}

/// FNV-1a 64 continued from `h` over `bytes`.
fn fnv1a64_from(h: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(h, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// [`fnv1a64`] of the file at `path`, read in pieces (full-shape models exceed memory).
pub fn fnv1a64_file(path: &Path) -> Result<u64> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut buf = vec![0u8; 8 << 20];
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    loop {
        let n = f
            .read(&mut buf)
            .with_context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            return Ok(h);
        }
        h = fnv1a64_from(h, &buf[..n]);
    }
}

struct Args {
    model: PathBuf,
    out: PathBuf,
    text: PathBuf,
    ctx: usize,
    chunks: usize,
    n: usize,
}

fn parse(root: &Path, args: &[String]) -> Result<Args> {
    const USAGE: &str = "usage: cargo xtask synth-reference --model GGUF --out DIR [--text FILE] [--ctx N] [--chunks K] [-n N]";
    let mut a = Args {
        model: PathBuf::new(),
        out: PathBuf::new(),
        text: root.join("..").join("shared/data/wikitext-2/test.txt"),
        ctx: 256,
        chunks: 4,
        n: 32,
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let value = it
            .next()
            .with_context(|| format!("{flag} needs a value\n{USAGE}"))?;
        let int = || -> Result<usize> {
            value
                .parse()
                .with_context(|| format!("{flag} takes a whole number, not `{value}`"))
        };
        match flag.as_str() {
            "--model" => a.model = value.into(),
            "--out" => a.out = value.into(),
            "--text" => a.text = value.into(),
            "--ctx" => a.ctx = int()?,
            "--chunks" => a.chunks = int()?,
            "-n" => a.n = int()?,
            _ => bail!("unknown option `{flag}`\n{USAGE}"),
        }
    }
    ensure!(
        !a.model.as_os_str().is_empty() && !a.out.as_os_str().is_empty(),
        "{USAGE}"
    );
    ensure!(
        a.ctx >= 256 && a.ctx % 256 == 0 && a.chunks >= 1,
        "--ctx must be a multiple of 256 (llama.cpp pads a context to one), --chunks at least 1"
    );
    Ok(a)
}

/// Runs `cmd`, returning its stdout and stderr; fails with its stderr's tail.
fn output(cmd: &mut Command) -> Result<(Vec<u8>, Vec<u8>)> {
    eprintln!("xtask: $ {cmd:?}");
    let out = cmd
        .output()
        .with_context(|| format!("starting {:?}", cmd.get_program()))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: String = err
            .chars()
            .rev()
            .take(2000)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        bail!("{:?} failed: {}\n{tail}", cmd.get_program(), out.status);
    }
    Ok((out.stdout, out.stderr))
}

/// The ids `llama-tokenize --ids` prints (`[1, 2, 3]`) for the contents of `file`.
fn tokenize(root: &Path, model: &Path, file: &Path) -> Result<Vec<u32>> {
    let bin = super::llama::tool(root, "llama-tokenize")?;
    let (out, _) = output(
        Command::new(bin)
            .arg("-m")
            .arg(model)
            .arg("-f")
            .arg(file)
            .args(["--ids", "--log-disable"]),
    )?;
    let text = String::from_utf8_lossy(&out);
    let line = text
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('['))
        .context("llama-tokenize printed no [ids] line")?;
    line.trim()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.trim().parse::<u32>().context("a token id"))
        .collect()
}

/// Runs the task.
pub fn run(root: &Path, args: &[String]) -> Result<()> {
    let a = parse(root, args)?;
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let model_hash = fnv1a64_file(&a.model)?;
    let corpus = std::fs::read(&a.text).with_context(|| format!("reading {}", a.text.display()))?;
    let mut end = (a.ctx * a.chunks).min(corpus.len());
    while end < corpus.len() && (corpus[end] & 0xC0) == 0x80 {
        end += 1;
    }
    let text_path = a.out.join("text.txt");
    std::fs::write(&text_path, &corpus[..end])?;
    let text_tokens = tokenize(root, &a.model, &text_path)?;
    let logits_path = a.out.join(".logits.bin");
    // llama.cpp logs from a thread of its own: on a loaded machine a run was seen to exit 0 before
    // its last lines (the `Final estimate`) were written. Such a run is retried (10 times), then refused.
    let mut tries = 0;
    let (ppl, chunk_ppl, top1) = loop {
        tries += 1;
        let ppl_run = output(
            Command::new(super::llama::tool(root, "llama-perplexity")?)
                .arg("-m")
                .arg(&a.model)
                .arg("-f")
                .arg(&text_path)
                .args(["-c", &a.ctx.to_string(), "--chunks", &a.chunks.to_string()])
                .args(["-b", &a.ctx.to_string(), "-t", "2"])
                .arg("--kl-divergence-base")
                .arg(&logits_path),
        );
        let logits = std::fs::read(&logits_path);
        let _ = std::fs::remove_file(&logits_path);
        let (ppl_out, ppl_err) = ppl_run?;
        let ppl_text = String::from_utf8_lossy(&ppl_err).into_owned();
        let Some(ppl) = final_ppl(&ppl_text) else {
            ensure!(
                tries < 10,
                "llama-perplexity printed no `Final estimate: PPL = ` 10 times:\n{ppl_text}"
            );
            continue;
        };
        let top1 = top1_of_logits_file(&logits.context("reading llama-perplexity's logits file")?)?;
        let chunk_ppl = String::from_utf8_lossy(&ppl_out).trim().to_string();
        break (ppl, chunk_ppl, top1);
    };
    let mut prompts = Vec::new();
    // `-n 0`: no continuations (the full-shape checks compare perplexity and top-1 only).
    for (i, p) in PROMPTS.iter().enumerate().filter(|_| a.n > 0) {
        let file = a.out.join(format!(".prompt-{i}.txt"));
        std::fs::write(&file, p)?;
        let ids = tokenize(root, &a.model, &file);
        let _ = std::fs::remove_file(&file);
        // llama-completion ends its output with two newlines at exit; on a loaded machine a run was
        // seen to print half its bytes and exit 0 (its log thread not flushed): such a run is retried (10
        // times), then refused.
        let mut tries = 0;
        let cont = loop {
            tries += 1;
            let (cont, _) = output(
                Command::new(super::llama::tool(root, "llama-completion")?)
                    .arg("-m")
                    .arg(&a.model)
                    .args([
                        "-p",
                        p,
                        "-n",
                        &a.n.to_string(),
                        "--temp",
                        "0",
                        "--top-k",
                        "1",
                    ])
                    .args(["--special", "--no-display-prompt", "-no-cnv", "--seed", "1"])
                    .args(["-c", "512", "-t", "2"]),
            )?;
            if cont.ends_with(b"\n\n") {
                break cont;
            }
            ensure!(
                tries < 10,
                "llama-completion printed an incomplete continuation of {p:?} 10 times: {}",
                hex(&cont)
            );
        };
        prompts.push(serde_json::json!({
            "prompt": p,
            "tokens": ids?,
            "continuation_hex": hex(&cont),
        }));
    }
    let json = serde_json::json!({
        "generated_by": "cargo xtask synth-reference (xtask/src/synth_reference.rs)",
        "llama_cpp": "llama-cpp-python 0.3.36 sdist, vendor/llama.cpp",
        "model": a.model.file_name().map(|n| n.to_string_lossy().into_owned()),
        "model_fnv1a64": format!("{model_hash:016x}"),
        "ctx": a.ctx,
        "chunks": a.chunks,
        "n_predict": a.n,
        "ppl": ppl,
        "chunk_ppl": chunk_ppl,
        "top1": top1,
        "text_tokens": text_tokens,
        "prompts": prompts,
    });
    let out = a.out.join("reference.json");
    std::fs::write(&out, serde_json::to_string_pretty(&json)? + "\n")?;
    eprintln!("xtask synth-reference: PPL {ppl} -> {}", out.display());
    Ok(())
}

/// Per window, llama.cpp's top-1 token at each scored position (`ctx/2 .. ctx-1`, the prediction of
/// the next token) from the file `llama-perplexity --kl-divergence-base` writes
/// (`tools/perplexity/perplexity.cpp`): `_logits_`, `n_ctx`, `n_vocab`, `n_chunk` (i32 each), the
/// windows' tokens (`n_chunk × n_ctx` i32), then per scored position `nv = 2⌈n_vocab/2⌉ + 4` u16:
/// the scale and minimum (two f32) and each token's logit above the minimum in steps of the scale
/// (rounded; the largest logit is 65535). The top-1 is the first token of the largest value.
pub fn top1_of_logits_file(bytes: &[u8]) -> Result<Vec<Vec<u32>>> {
    let int = |at: usize| -> Result<usize> {
        let b = bytes
            .get(at..at + 4)
            .context("the logits file ends inside its header")?;
        let v = i32::from_le_bytes(b.try_into()?);
        usize::try_from(v).with_context(|| format!("a negative count {v} in the logits file"))
    };
    ensure!(
        bytes.starts_with(b"_logits_"),
        "not a llama-perplexity logits file"
    );
    let (n_ctx, n_vocab, n_chunk) = (int(8)?, int(12)?, int(16)?);
    ensure!(
        n_ctx >= 2 && n_vocab >= 1 && n_chunk >= 1,
        "the logits file's header is not a model's"
    );
    let nv = 2 * n_vocab.div_ceil(2) + 4;
    let scored = n_ctx - 1 - n_ctx / 2;
    let start = 20 + 4 * n_chunk * n_ctx;
    let rec = 2 * nv;
    ensure!(
        bytes.len() == start + n_chunk * scored * rec,
        "the logits file holds {} bytes, its header says {}",
        bytes.len(),
        start + n_chunk * scored * rec
    );
    Ok((0..n_chunk)
        .map(|c| {
            (0..scored)
                .map(|j| {
                    let r = &bytes[start + (c * scored + j) * rec..][..rec];
                    let vals = r[8..8 + 2 * n_vocab]
                        .chunks_exact(2)
                        .map(|b| u16::from_le_bytes([b[0], b[1]]));
                    // The first of the largest values.
                    vals.enumerate()
                        .fold((0usize, 0u16), |best, (i, v)| {
                            if v > best.1 || i == 0 {
                                (i, v)
                            } else {
                                best
                            }
                        })
                        .0 as u32
                })
                .collect()
        })
        .collect())
}

/// The number after `Final estimate: PPL = ` in llama-perplexity's output.
pub fn final_ppl(text: &str) -> Option<f64> {
    let at = text.find("Final estimate: PPL = ")? + "Final estimate: PPL = ".len();
    text[at..].split_whitespace().next()?.parse().ok()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
