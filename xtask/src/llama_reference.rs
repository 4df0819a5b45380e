//! `cargo xtask llama-reference [--model gemma3-270m] [--gguf PATH] [--only tokenize]`: what llama.cpp
//! (built as docs/BENCHMARKS.md says, found in `target/llama.cpp/build/bin/`; this command never
//! builds it) says about a named model, written under `fixtures/<model>/` for tests that must not
//! need llama.cpp:
//!
//! - `tokenize.json`: `llama-tokenize --ids --no-bos --no-escape` (special tokens parsed, as the tool
//!   does by default) and again with `--no-parse-special`, on every case of [`tokenizer_cases`]: lines and
//!   paragraphs of the WikiText-2 test split and Tiny Shakespeare (`/work/shared/data`, or
//!   `$SPARROW_DATA_DIR`) and hand-written text (unicode, whitespace runs, digits, code, special tokens),
//!   in one run per mode with the cases joined by a user-defined token (see [`SEPARATOR`]).
//! - `perplexity.json`: `llama-perplexity -c 512 -b 512 --chunks 16` on the WikiText-2 test split: its
//!   method, not `sparrow perplexity`'s: the whole file tokenized with BOS and special tokens read as
//!   text, cut into 512-token chunks, each chunk's first token replaced by BOS, and only the predictions
//!   of the second half scored (positions 256..510 predicting 257..511); the final PPL and the running
//!   value after each chunk.
//! - `completion.json`: `llama-completion` greedy (`--temp 0 --ignore-eos`, 33 tokens) on four prompts,
//!   the first 32 generated ids read back from its `--prompt-cache-all` session file (the prompt's ids,
//!   BOS first, then every token it decoded).
//!
//! Both model runs pass `-fa off`: llama.cpp's CPU flash attention (on by default) rounds the queries
//! to f16 and sums the weighted values in an f16 accumulator, which moves Gemma 3 270M's perplexity by
//! 0.66% on the first window (7.0189 with it, 7.0651 without); without it the attention is f32 math
//! over the f16 cache, as the engine's.
//!
//! Each file records the model's SHA-256 and size, so a test knows the file it holds is the one the
//! reference was made from.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

/// A named model the command knows: its name, cache file name, size and SHA-256 (as
/// `engine::fetch::KNOWN_MODELS` has them; the engine is not a dependency of xtask).
struct Model {
    name: &'static str,
    file: &'static str,
    bytes: u64,
    sha256: &'static str,
}

const MODELS: &[Model] = &[Model {
    name: "gemma3-270m",
    file: "gemma-3-270m-q4_k_m.gguf",
    bytes: 253_113_024,
    sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
}];

/// The model cache folder, as `engine::fetch::model_cache_dir` finds it.
fn model_cache_dir() -> PathBuf {
    let var = |k: &str| std::env::var_os(k).filter(|d| !d.is_empty());
    if let Some(d) = var("SPARROW_MODEL_DIR") {
        return PathBuf::from(d);
    }
    if let Some(d) = var("XDG_CACHE_HOME") {
        return PathBuf::from(d).join("sparrow/models");
    }
    if let Some(h) = var("HOME") {
        return PathBuf::from(h).join(".cache/sparrow/models");
    }
    PathBuf::from("models")
}

fn data_dir() -> PathBuf {
    std::env::var_os("SPARROW_DATA_DIR")
        .filter(|d| !d.is_empty())
        .map_or_else(|| PathBuf::from("/work/shared/data"), PathBuf::from)
}

/// llama.cpp's program `name`, already built (this command never builds llama.cpp).
fn tool(root: &Path, name: &str) -> Result<PathBuf> {
    let bin = root.join("target/llama.cpp/build/bin").join(name);
    if !bin.is_file() {
        bail!(
            "{} is missing: build llama.cpp as docs/BENCHMARKS.md says (or link a build there); \
             this command does not build it",
            bin.display()
        );
    }
    Ok(bin)
}

/// The SHA-256 of `path` (`sha256sum`).
fn sha256(path: &Path) -> Result<String> {
    let out = Command::new("sha256sum")
        .arg(path)
        .output()
        .context("running sha256sum")?;
    if !out.status.success() {
        bail!("sha256sum {} failed", path.display());
    }
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string())
}

pub fn run(root: &Path, args: &[String]) -> Result<()> {
    let mut name = "gemma3-270m".to_string();
    let mut gguf = None;
    let mut only: Option<String> = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || {
            it.next()
                .with_context(|| format!("{a} needs a value"))
                .cloned()
        };
        match a.as_str() {
            "--model" => name = value()?,
            "--gguf" => gguf = Some(PathBuf::from(value()?)),
            "--only" => only = Some(value()?),
            "-h" | "--help" => {
                eprintln!("usage: cargo xtask llama-reference [--model gemma3-270m] [--gguf PATH] [--only tokenize|perplexity|completion]");
                return Ok(());
            }
            _ => bail!("llama-reference: unknown option `{a}` (try --help)"),
        }
    }
    let model = MODELS.iter().find(|m| m.name == name).with_context(|| {
        format!("llama-reference: no model named `{name}` (known: gemma3-270m)")
    })?;
    let gguf = gguf.unwrap_or_else(|| model_cache_dir().join(model.file));
    let meta = std::fs::metadata(&gguf).with_context(|| {
        format!(
            "{}: not found (fetch it with `sparrow models` / `sparrow run -m {name}`, or pass --gguf)",
            gguf.display()
        )
    })?;
    if meta.len() != model.bytes || sha256(&gguf)? != model.sha256 {
        bail!(
            "{}: not {name}'s file (size or SHA-256 differ)",
            gguf.display()
        );
    }
    let out_dir = root.join("fixtures").join(name.as_str());
    std::fs::create_dir_all(&out_dir)?;
    let header = serde_json::json!({
        "model": {"name": model.name, "bytes": model.bytes, "sha256": model.sha256},
        "llama_cpp": "llama-cpp-python==0.3.36 (vendor/llama.cpp), as docs/BENCHMARKS.md builds it",
        "generated_by": "cargo xtask llama-reference",
    });
    let want = |part: &str| only.as_deref().is_none_or(|o| o == part);
    if want("tokenize") {
        let path = out_dir.join("tokenize.json");
        write_json(&path, &tokenize(root, &gguf, header.clone())?)?;
        eprintln!("xtask: wrote {}", path.display());
    }
    if want("perplexity") {
        let path = out_dir.join("perplexity.json");
        write_json(&path, &perplexity(root, &gguf, header.clone())?)?;
        eprintln!("xtask: wrote {}", path.display());
    }
    if want("completion") {
        let path = out_dir.join("completion.json");
        write_json(&path, &completion(root, &gguf, header.clone())?)?;
        eprintln!("xtask: wrote {}", path.display());
    }
    Ok(())
}

/// Threads llama.cpp runs with (the figures do not depend on it beyond rounding).
const THREADS: &str = "2";
/// Perplexity: context per chunk and chunks.
const PPL_CTX: usize = 512;
const PPL_CHUNKS: usize = 16;

fn perplexity(
    root: &Path,
    gguf: &Path,
    mut header: serde_json::Value,
) -> Result<serde_json::Value> {
    let bin = tool(root, "llama-perplexity")?;
    let text = data_dir().join("wikitext-2/test.txt");
    let (ctx, chunks) = (PPL_CTX.to_string(), PPL_CHUNKS.to_string());
    let args = [
        "-c", &ctx, "-b", &ctx, "--chunks", &chunks, "-t", THREADS, "--seed", "1", "-fa", "off",
    ];
    eprintln!(
        "xtask: llama-perplexity {} (a minute or two)",
        args.join(" ")
    );
    let out = Command::new(&bin)
        .arg("-m")
        .arg(gguf)
        .arg("-f")
        .arg(&text)
        .args(args)
        .output()
        .with_context(|| format!("starting {}", bin.display()))?;
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() {
        bail!("llama-perplexity failed ({}):\n{log}", out.status);
    }
    let (running, ppl) = parse_perplexity(&log)?;
    if running.len() != PPL_CHUNKS {
        bail!(
            "llama-perplexity printed {} chunk values, expected {PPL_CHUNKS}:\n{log}",
            running.len()
        );
    }
    header["command"] = format!(
        "llama-perplexity -m GGUF -f wikitext-2/test.txt {}",
        args.join(" ")
    )
    .into();
    header["text"] = "wikitext-2/test.txt".into();
    header["method"] = "tokens = BOS + the file's ids (special tokens read as text); chunk c = tokens[512c..512c+512] \
        with its first token replaced by BOS, evaluated on its own; NLL of the tokens at positions 257..511 given \
        the logits at 256..510; PPL = exp(mean NLL over all chunks so far)"
        .into();
    header["n_ctx"] = PPL_CTX.into();
    header["chunks"] = PPL_CHUNKS.into();
    header["ppl"] = ppl.into();
    header["running_ppl"] = running.into();
    Ok(header)
}

/// The running values `[1]12.3456,[2]...` and the final PPL (`Final estimate: PPL = X +/- Y`).
fn parse_perplexity(log: &str) -> Result<(Vec<f64>, f64)> {
    let mut running = Vec::new();
    for part in log.split('[').skip(1) {
        let Some((n, rest)) = part.split_once(']') else {
            continue;
        };
        let Ok(n) = n.parse::<usize>() else { continue };
        let value: String = rest
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '.')
            .collect();
        if let (true, Ok(v)) = (n == running.len() + 1, value.parse::<f64>()) {
            running.push(v);
        }
    }
    let ppl = log
        .split("Final estimate: PPL = ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|v| v.parse::<f64>().ok())
        .with_context(|| {
            format!("no `Final estimate: PPL = ` in llama-perplexity's output:\n{log}")
        })?;
    Ok((running, ppl))
}

/// The prompts of the greedy continuations: prose, a story, code and a Gemma chat turn.
const PROMPTS: &[&str] = &[
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "<start_of_turn>user\nWhat is the boiling point of water at sea level?<end_of_turn>\n<start_of_turn>model\n",
];
/// Greedy tokens recorded per prompt.
const GREEDY: usize = 32;

fn completion(
    root: &Path,
    gguf: &Path,
    mut header: serde_json::Value,
) -> Result<serde_json::Value> {
    let bin = tool(root, "llama-completion")?;
    let tokenize = tool(root, "llama-tokenize")?;
    let tmp = root
        .join("target/tmp")
        .join(format!("llama-reference-{}", std::process::id()));
    std::fs::create_dir_all(&tmp)?;
    let mut out = Vec::new();
    for (i, prompt) in PROMPTS.iter().enumerate() {
        let ids = llama_tokenize_bos(&tokenize, gguf, prompt)?;
        let session = tmp.join(format!("session-{i}.bin"));
        let _ = std::fs::remove_file(&session);
        let n = (GREEDY + 1).to_string();
        let args = [
            "-n",
            &n,
            "--temp",
            "0",
            "--ignore-eos",
            "-no-cnv",
            "-c",
            "512",
            "-t",
            THREADS,
            "--seed",
            "1",
            "--no-escape",
            "-fa",
            "off",
            "--prompt-cache-all",
        ];
        eprintln!("xtask: llama-completion prompt {}/{}", i + 1, PROMPTS.len());
        let run = Command::new(&bin)
            .arg("-m")
            .arg(gguf)
            .arg("-p")
            .arg(prompt)
            .args(args)
            .arg("--prompt-cache")
            .arg(&session)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("starting {}", bin.display()))?;
        if !run.status.success() {
            bail!(
                "llama-completion failed on {prompt:?} ({}): {}",
                run.status,
                String::from_utf8_lossy(&run.stderr)
            );
        }
        let tokens = session_tokens(&session)?;
        if tokens.len() < ids.len() + GREEDY || tokens[..ids.len()] != ids[..] {
            bail!(
                "{}: {} tokens, not the prompt's {} ids and {GREEDY} more",
                session.display(),
                tokens.len(),
                ids.len()
            );
        }
        let greedy = &tokens[ids.len()..ids.len() + GREEDY];
        out.push(serde_json::json!({
            "text": prompt,
            "ids": ids,
            "greedy32_ids": greedy,
            "completion_stdout": String::from_utf8_lossy(&run.stdout),
        }));
    }
    let _ = std::fs::remove_dir_all(&tmp);
    header["command"] =
        "llama-completion -m GGUF -p PROMPT -n 33 --temp 0 --ignore-eos -no-cnv -c 512 -t 2 \
        --seed 1 --no-escape --prompt-cache-all --prompt-cache SESSION"
            .into();
    header["prompts"] = out.into();
    Ok(header)
}

/// `llama-tokenize`'s ids of a prompt as `llama-completion` reads it: BOS first, special tokens parsed.
fn llama_tokenize_bos(bin: &Path, gguf: &Path, text: &str) -> Result<Vec<u32>> {
    let out = Command::new(bin)
        .arg("-m")
        .arg(gguf)
        .args(["-p", text, "--ids", "--no-escape", "--log-disable"])
        .output()
        .with_context(|| format!("starting {}", bin.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let list = stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('['))
        .with_context(|| format!("llama-tokenize printed no id list for {text:?}"))?;
    Ok(serde_json::from_str(list.trim())?)
}

/// The tokens of a llama.cpp session file: magic `ggsn`, version, count, then the ids (little-endian
/// 32-bit each).
fn session_tokens(path: &Path) -> Result<Vec<u32>> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let word = |i: usize| -> Result<u32> {
        let b = bytes
            .get(4 * i..4 * i + 4)
            .with_context(|| format!("{}: truncated", path.display()))?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    if word(0)? != 0x6767_736e {
        bail!("{}: not a llama.cpp session file", path.display());
    }
    let n = word(2)? as usize;
    (0..n).map(|i| word(3 + i)).collect()
}

/// Writes `value` to `path` through a temporary file and a rename.
fn write_json(path: &Path, value: &serde_json::Value) -> Result<()> {
    let mut text = serde_json::to_string_pretty(value)?;
    text.push('\n');
    atomic_out::write_atomic(path, text.as_bytes())
        .with_context(|| format!("writing {}", path.display()))
}

/// `llama-tokenize`'s ids of `text` (no BOS, escapes not processed), special tokens parsed or not.
fn llama_tokenize(bin: &Path, gguf: &Path, text: &str, parse_special: bool) -> Result<Vec<u32>> {
    let mut cmd = Command::new(bin);
    cmd.arg("-m").arg(gguf).args([
        "--stdin",
        "--ids",
        "--no-bos",
        "--no-escape",
        "--log-disable",
    ]);
    if !parse_special {
        cmd.arg("--no-parse-special");
    }
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    child
        .stdin
        .take()
        .context("llama-tokenize's stdin")?
        .write_all(text.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "llama-tokenize failed on {text:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let list = stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('['))
        .with_context(|| format!("llama-tokenize printed no id list for {text:?}: {stdout}"))?;
    serde_json::from_str(list.trim()).with_context(|| format!("llama-tokenize's ids {list:?}"))
}

/// Joins the cases in one `llama-tokenize` run per mode (a run loads the 262,144-token vocabulary:
/// seconds each on a busy machine). A user-defined token, cut out of the text before anything else in
/// both modes, separates them; no case contains it, and the run must give one separator fewer than
/// cases.
const SEPARATOR: &str = "</iframe>";

fn tokenize(root: &Path, gguf: &Path, mut header: serde_json::Value) -> Result<serde_json::Value> {
    let bin = tool(root, "llama-tokenize")?;
    let cases = tokenizer_cases(&data_dir())?;
    if let Some(c) = cases.iter().find(|c| c.contains(SEPARATOR)) {
        bail!("the case {c:?} contains the separator {SEPARATOR:?}");
    }
    let sep = match llama_tokenize(&bin, gguf, SEPARATOR, false)?[..] {
        [id] => id,
        ref other => bail!("{SEPARATOR:?} is not one token of this vocabulary: {other:?}"),
    };
    let joined = cases.join(SEPARATOR);
    let mut split = Vec::new();
    for parse_special in [true, false] {
        eprintln!(
            "xtask: llama-tokenize on {} cases (special tokens parsed: {parse_special})",
            cases.len()
        );
        let ids = llama_tokenize(&bin, gguf, &joined, parse_special)?;
        let per_case: Vec<Vec<u32>> = ids.split(|&i| i == sep).map(<[u32]>::to_vec).collect();
        if per_case.len() != cases.len() {
            bail!(
                "{} separators for {} cases",
                per_case.len() - 1,
                cases.len()
            );
        }
        split.push(per_case);
    }
    let out: Vec<serde_json::Value> = cases
        .iter()
        .zip(split[0].iter().zip(&split[1]))
        .map(|(text, (ids, ids_text))| serde_json::json!({"text": text, "ids": ids, "ids_text": ids_text}))
        .collect();
    header["command"] = format!(
        "llama-tokenize -m GGUF --stdin --ids --no-bos --no-escape [--no-parse-special], the cases joined by {SEPARATOR:?}"
    )
    .into();
    header["cases"] = out.into();
    Ok(header)
}

/// Hand-written cases: what corpora lines rarely hold.
const HAND_CASES: &[&str] = &[
    "",
    " ",
    "  ",
    "   leading spaces",
    "trailing spaces   ",
    "Hello, world!",
    "hello world",
    " Hello",
    "\n",
    "\n\n\n",
    "a\nb\n\nc\n\n\nd",
    "\t\ttabs\tand\t\tmore\t",
    "mixed \t \n \r\n whitespace \u{a0}nbsp",
    "1234567890 3.14159 -42 1e-9 0x1F 1,000,000",
    "2026-12-02T03:42:55Z",
    "Héllo wörld, ça va? naïve café Ångström",
    "日本語のテキストと漢字、中文字符。",
    "한국어 텍스트입니다",
    "Привет, мир! Ελληνικά",
    "مرحبا بالعالم",
    "emoji 😀🎉👍🏽 family 👨‍👩‍👧 flag 🇫🇷",
    "math ∑ ∫ √ ∞ ≠ ≤ ≥ π",
    "\u{1}\u{2}control\u{7f} bytes",
    "rare \u{10ffff} \u{e000} private use",
    "fn main() {\n    println!(\"Hello, {}!\", name);\n}\n",
    "def f(x):\n\treturn x ** 2  # square\n",
    "if (a && b || !c) { x += 1; } else { y -= 2; }",
    "<html><body><div class=\"x\">text</div></body></html>",
    "SELECT * FROM users WHERE id = 42;",
    "https://example.com/path?q=1&r=two#frag",
    "<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n",
    "<bos>text<eos> and <unk> and <pad>",
    "text with <unused0> inside and [multimodal] and <mask>",
    "<start_of_image> not closed <",
    "<<start_of_turn>>",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "ababababababababababab",
    "The quick brown fox jumps over the lazy dog.",
    "THE QUICK BROWN FOX",
    "don't can't won't it's we're they've",
    "@-@ @,@ @.@",
    "▁ already escaped ▁▁ markers",
];

/// The texts `llama-tokenize` is run on: [`HAND_CASES`], then every 25th non-empty line of the
/// WikiText-2 test split and every 400th of Tiny Shakespeare (at most 400 characters each), then
/// paragraphs of six consecutive lines (from every 400th line of WikiText-2, every 2000th of Tiny
/// Shakespeare), blank lines and newlines kept.
pub fn tokenizer_cases(data: &Path) -> Result<Vec<String>> {
    let mut cases: Vec<String> = HAND_CASES.iter().map(|s| s.to_string()).collect();
    for (file, line_step, para_step) in [
        ("wikitext-2/test.txt", 25, 400),
        ("tinyshakespeare/input.txt", 400, 2000),
    ] {
        let path = data.join(file);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let lines: Vec<&str> = text.lines().collect();
        let nonempty: Vec<&str> = lines
            .iter()
            .copied()
            .filter(|l| !l.trim().is_empty())
            .collect();
        for l in nonempty.iter().step_by(line_step) {
            cases.push(l.chars().take(400).collect());
        }
        for start in (0..lines.len()).step_by(para_step) {
            let end = (start + 6).min(lines.len());
            cases.push(lines[start..end].join("\n"));
        }
    }
    Ok(cases)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perplexity_output_is_read_in_chunk_order() {
        let log = "perplexity: calculating perplexity over 3 chunks, n_ctx=512, batch_size=512, n_seq=1\n\
                   perplexity: 1.02 seconds per pass - ETA 0.05 minutes\n\
                   [1]20.5012,[2]18.25,[3]19.0001,\n\
                   Final estimate: PPL = 19.0001 +/- 0.51234\n";
        let (running, ppl) = parse_perplexity(log).unwrap();
        assert_eq!(running, vec![20.5012, 18.25, 19.0001]);
        assert_eq!(ppl, 19.0001);
        assert!(parse_perplexity("[1]20.5,").is_err(), "no final estimate");
    }

    #[test]
    fn session_files_give_their_tokens() {
        let dir = std::env::temp_dir().join(format!("xtask-session-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.bin");
        let mut bytes = Vec::new();
        for w in [0x6767_736e_u32, 10, 3, 2, 106, 262_143, 77] {
            bytes.extend_from_slice(&w.to_le_bytes());
        }
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(session_tokens(&path).unwrap(), vec![2, 106, 262_143]);
        std::fs::write(&path, &bytes[..16]).unwrap();
        assert!(session_tokens(&path).is_err(), "truncated");
        bytes[0] = 0;
        std::fs::write(&path, &bytes).unwrap();
        assert!(session_tokens(&path).is_err(), "bad magic");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
