//! llama.cpp as this project compares against it (docs/BENCHMARKS.md): built from the source vendored
//! in the PyPI sdist `llama-cpp-python==0.3.36` (`cmake` from a venv when absent) into
//! `target/llama.cpp/build` (`GGML_NATIVE=ON`, AMX off) or, for [`Isa::Avx2`], `target/llama.cpp/build-avx2`
//! (AVX2, FMA, F16C and BMI2 without any AVX-512, as on a Haswell or a Zen 2/3), and the speeds its
//! `llama-bench -o json` and `sparrow bench --json` print.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

/// The llama.cpp source this project compares against (docs/BENCHMARKS.md).
const LLAMA_CPP_PYTHON: &str = "0.3.36";

/// What a run measured: decode and prompt tok/s, and for a speculative `sparrow bench` (`--lookup`,
/// `--self-draft`, `--draft`) the decode tok/s of the same run without speculation.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Speeds {
    /// Decode tok/s (a speculative bench's: with speculation).
    pub tg: Option<f64>,
    pub pp: Option<f64>,
    /// A speculative bench's decode tok/s without speculation, the same prompts in the same process.
    pub plain: Option<f64>,
}

/// Decode and prompt tok/s from llama-bench's `-o json` (its text-generation and prompt entries).
pub fn llama_speeds(stdout: &str) -> Speeds {
    let Ok(v) = serde_json::from_str::<serde_json::Value>(stdout.trim()) else {
        return Speeds::default();
    };
    let entries = v.as_array().map(|a| a.as_slice()).unwrap_or_default();
    let find = |gen: bool| {
        entries
            .iter()
            .find(|e| {
                let (g, p) = (
                    e["n_gen"].as_u64().unwrap_or(0),
                    e["n_prompt"].as_u64().unwrap_or(0),
                );
                if gen {
                    g > 0 && p == 0
                } else {
                    p > 0 && g == 0
                }
            })
            .and_then(|e| e["avg_ts"].as_f64())
    };
    Speeds {
        tg: find(true),
        pp: find(false),
        plain: None,
    }
}

/// Decode and prompt tok/s from `sparrow bench --json`; from a speculative bench's report (its
/// `lookup` object) the means of its repetitions with speculation (`tg`) and without (`plain`).
pub fn sparrow_speeds(stdout: &str) -> Speeds {
    let v = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .and_then(|l| serde_json::from_str::<serde_json::Value>(l).ok());
    let Some(v) = v else {
        return Speeds::default();
    };
    let spec = &v["lookup"];
    if spec.is_object() {
        let mean = |key: &str| {
            let r: Vec<f64> = spec[key]
                .as_array()?
                .iter()
                .filter_map(|x| x.as_f64())
                .collect();
            (!r.is_empty()).then(|| r.iter().sum::<f64>() / r.len() as f64)
        };
        return Speeds {
            tg: mean("lookup_tok_s"),
            pp: None,
            plain: mean("plain_tok_s"),
        };
    }
    Speeds {
        tg: v["tg_tok_s"].as_f64(),
        pp: v["pp_tok_s"].as_f64(),
        plain: None,
    }
}

/// The median of the finite values of `v` (the upper one of an even count); `None` when there are
/// none.
pub fn median(mut v: Vec<f64>) -> Option<f64> {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    Some(v[v.len() / 2])
}

/// The instruction sets a comparison runs on: both sides on the same ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// Whatever this machine has: llama.cpp built with `GGML_NATIVE=ON` less AMX ([`NATIVE_FLAGS`]),
    /// sparrow's own detection.
    Native,
    /// AVX2 only on any x86_64 machine that has it: llama.cpp built with AVX-512 off
    /// ([`AVX2_FLAGS`]), sparrow with `SPARROW_KERNELS=avx2`.
    Avx2,
}

/// llama.cpp's cmake flags for [`Isa::Avx2`]: the x86 features of a Haswell or a Zen 2/3 on, every
/// AVX-512, AVX-VNNI and AMX one off, no `-march=native`.
pub const AVX2_FLAGS: [&str; 15] = [
    "-DGGML_NATIVE=OFF",
    "-DGGML_SSE42=ON",
    "-DGGML_AVX=ON",
    "-DGGML_AVX2=ON",
    "-DGGML_FMA=ON",
    "-DGGML_F16C=ON",
    "-DGGML_BMI2=ON",
    "-DGGML_AVX_VNNI=OFF",
    "-DGGML_AVX512=OFF",
    "-DGGML_AVX512_VBMI=OFF",
    "-DGGML_AVX512_VNNI=OFF",
    "-DGGML_AVX512_BF16=OFF",
    "-DGGML_AMX_TILE=OFF",
    "-DGGML_AMX_INT8=OFF",
    "-DGGML_AMX_BF16=OFF",
];

/// llama.cpp's cmake flags for [`Isa::Native`]: `-march=native` with AMX's tiles off (GCC's explicit
/// `-mno-*` win over `-march`'s). A VM may list AMX and the kernel grant its tile state while the
/// hypervisor traps the instructions: on the 2026-12-05 Intel Xeon VM llama.cpp's AMX kernels died
/// (SIGILL at `tilezero`, or SIGSEGV) on every model. Sparrow has no AMX kernel either.
pub const NATIVE_FLAGS: [&str; 3] = [
    "-DGGML_NATIVE=ON",
    "-DCMAKE_C_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16",
    "-DCMAKE_CXX_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16",
];

impl Isa {
    /// `native` or `avx2` (the `--isa` values).
    pub fn parse(s: &str) -> Option<Isa> {
        match s.to_ascii_lowercase().as_str() {
            "native" => Some(Isa::Native),
            "avx2" => Some(Isa::Avx2),
            _ => None,
        }
    }

    /// llama.cpp's build directory under `target/llama.cpp/`.
    fn build_dir(self) -> &'static str {
        match self {
            Isa::Native => "build",
            Isa::Avx2 => "build-avx2",
        }
    }

    /// The cmake flags that choose the instruction sets.
    fn cmake_flags(self) -> &'static [&'static str] {
        match self {
            Isa::Native => &NATIVE_FLAGS,
            Isa::Avx2 => &AVX2_FLAGS,
        }
    }
}

/// llama.cpp's program `target` (`llama-bench`, `llama-quantize`), built from the PyPI sdist when
/// absent.
pub fn tool(root: &Path, target: &str) -> Result<PathBuf> {
    tool_for(root, Isa::Native, target)
}

/// [`tool`] from the build for `isa` (its own directory, built only when that program is absent).
pub fn tool_for(root: &Path, isa: Isa, target: &str) -> Result<PathBuf> {
    let dir = root.join("target").join("llama.cpp");
    let build = dir.join(isa.build_dir());
    let bin = build.join("bin").join(target);
    if bin.is_file() {
        return Ok(bin);
    }
    std::fs::create_dir_all(&dir)?;
    let src = dir.join(format!("llama_cpp_python-{LLAMA_CPP_PYTHON}"));
    if !src.is_dir() {
        // The sdist's URL and hash from PyPI's simple index, JSON form (pip download would build
        // the sdist's metadata first, installing its build backend).
        let script = format!(
            r#"import hashlib, json, sys, urllib.request
name = "llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz"
req = urllib.request.Request("https://pypi.org/simple/llama-cpp-python/", headers={{"Accept": "application/vnd.pypi.simple.v1+json"}})
sdist = next(f for f in json.load(urllib.request.urlopen(req))["files"] if f["filename"] == name)
data = urllib.request.urlopen(sdist["url"]).read()
if hashlib.sha256(data).hexdigest() != sdist["hashes"]["sha256"]:
    sys.exit("sha256 mismatch for " + name)
open(sys.argv[1], "wb").write(data)"#
        );
        let tarball = dir.join("llama-cpp-python.tar.gz");
        super::run(Command::new("python3").arg("-c").arg(script).arg(&tarball))
            .context("downloading the llama-cpp-python sdist from PyPI")?;
        super::run(
            Command::new("tar")
                .arg("xzf")
                .arg(&tarball)
                .arg("-C")
                .arg(&dir),
        )?;
    }
    let cmake = if super::have("cmake") {
        PathBuf::from("cmake")
    } else {
        let venv = dir.join("venv");
        if !venv.join("bin").join("cmake").is_file() {
            super::run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
            super::run(
                Command::new(venv.join("bin").join("pip")).args(["install", "-q", "cmake"]),
            )?;
        }
        venv.join("bin").join("cmake")
    };
    let llama = src.join("vendor").join("llama.cpp");
    super::run(
        Command::new(&cmake)
            .arg("-S")
            .arg(&llama)
            .arg("-B")
            .arg(&build)
            .args(["-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF"])
            .args(isa.cmake_flags()),
    )?;
    super::run(
        Command::new(&cmake)
            .arg("--build")
            .arg(&build)
            .args(["--target", target, "-j2"]),
    )?;
    Ok(bin)
}

/// Whether this llama-bench can turn repacking off (`--repack <0|1>`, builds since mid-2025).
pub fn has_no_repack(bin: &Path) -> bool {
    Command::new(bin)
        .arg("--help")
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout).contains("--repack")
                || String::from_utf8_lossy(&o.stderr).contains("--repack")
        })
        .unwrap_or(false)
}
