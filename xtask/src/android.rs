//! `cargo xtask android` and `cargo xtask deploy`: a static `sparrow` for Android phones and running its
//! bench on one.
//!
//! - `android`: builds `sparrow` for `aarch64-unknown-linux-musl`, statically linked (rustc's
//!   self-contained musl C library and start files, linked by Debian's `aarch64-linux-gnu-gcc`, set in
//!   `.cargo/config.toml`), so it runs from `adb shell` on any aarch64 Android without the NDK; checks that
//!   the ELF file is AArch64 and asks for no program interpreter (no dynamic loader); then `cargo check`s
//!   the library crates for `aarch64-linux-android`.
//! - `deploy [--serial S] --model M [--emulate [DIR]] [--out FILE] [-- BENCH-ARGS]`: builds that binary,
//!   pushes it and the model bundle (`M` and, where they exist, `M.sparrow-profile`,
//!   `M.sparrow-predictor`; for a resident file, the parts it names: store, manifest, profile,
//!   predictors; an older resident file's store `M` with extension `.neurons`) to
//!   `/data/local/tmp/sparrow` with `adb`, runs `sparrow bench --json -m M BENCH-ARGS` there (default
//!   bench arguments `-p 64 -n 32 -r 3`) with its standard output into `bench.json` on the device, pulls
//!   that file (to `target/deploy/bench-<serial or emulate>.json`, or `--out`) and prints its speeds.
//!   `--emulate` runs the same steps against a local directory (default `target/deploy/emulate/`) that
//!   stands for the device's folder, with the binary under `qemu-aarch64`: one code path, the
//!   [`Transport`] decides how each step is carried out.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

use crate::{cargo, root, run};

/// The target of the static binary.
pub const MUSL_TARGET: &str = "aarch64-unknown-linux-musl";
/// Where the binary and the model go on a phone (writable by `adb shell`, executable).
const DEVICE_DIR: &str = "/data/local/tmp/sparrow";
/// Bench arguments when none are given after `--`.
const DEFAULT_BENCH_ARGS: &[&str] = &["-p", "64", "-n", "32", "-r", "3"];

/// The cargo profile of the binary a phone gets.
pub const RELEASE: &str = "release";

/// The static binary's path (after [`build_static`] in `profile`), under `$CARGO_TARGET_DIR` when set
/// (CI builds its cross targets in a folder of their own), else the workspace's `target/`.
pub fn static_binary(profile: &str) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(|d| root().join(d))
        .unwrap_or_else(|| root().join("target"))
        .join(MUSL_TARGET)
        .join(profile)
        .join("sparrow")
}

/// Builds `sparrow` for [`MUSL_TARGET`] in the cargo profile `profile` ([`RELEASE`] for a phone; CI
/// builds its own `ci` profile, which skips LTO) and checks that it is a static AArch64 executable.
pub fn build_static(profile: &str) -> Result<PathBuf> {
    run(cargo().args([
        "build",
        "--profile",
        profile,
        "-p",
        "sparrow",
        "--target",
        MUSL_TARGET,
    ]))?;
    let bin = static_binary(profile);
    let elf = fs::read(&bin).with_context(|| format!("reading {}", bin.display()))?;
    check_static_aarch64(&elf).with_context(|| format!("{}", bin.display()))?;
    eprintln!(
        "xtask: {} is a static aarch64 executable ({:.1} MiB)",
        bin.display(),
        elf.len() as f64 / (1u64 << 20) as f64
    );
    Ok(bin)
}

/// An ELF64 little-endian AArch64 executable with no `PT_INTERP` program header (no dynamic loader
/// needed: static, or static-pie as Rust's musl targets link by default).
pub fn check_static_aarch64(elf: &[u8]) -> Result<()> {
    const EM_AARCH64: u16 = 183;
    const PT_INTERP: u32 = 3;
    let u16_at = |o: usize| elf.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    let u32_at = |o: usize| {
        elf.get(o..o + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let u64_at = |o: usize| {
        elf.get(o..o + 8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
    };
    if elf.get(..6) != Some(&[0x7f, b'E', b'L', b'F', 2, 1][..]) {
        bail!("not a 64-bit little-endian ELF file");
    }
    if u16_at(18) != Some(EM_AARCH64) {
        bail!("not an AArch64 executable (e_machine {:?})", u16_at(18));
    }
    let (Some(phoff), Some(phentsize), Some(phnum)) = (u64_at(32), u16_at(54), u16_at(56)) else {
        bail!("truncated ELF header");
    };
    for i in 0..usize::from(phnum) {
        let at = usize::try_from(phoff)? + i * usize::from(phentsize);
        let Some(kind) = u32_at(at) else {
            bail!("truncated program header {i}");
        };
        if kind == PT_INTERP {
            bail!("dynamically linked (has a program interpreter): it would not run on Android");
        }
    }
    Ok(())
}

/// `cargo xtask android`.
pub fn android() -> Result<()> {
    build_static(RELEASE)?;
    crate::ci::check_android()
}

/// How the steps of a deployment reach the device.
pub enum Transport {
    /// A phone over `adb` (`-s SERIAL` when given).
    Adb {
        /// `adb -s` serial; none: the only device attached.
        serial: Option<String>,
    },
    /// A local folder standing for the device's, the binary run under `qemu-aarch64`.
    Emulate {
        /// The folder.
        dir: PathBuf,
    },
}

impl Transport {
    /// The folder on the device where everything goes.
    fn device_dir(&self) -> String {
        match self {
            Transport::Adb { .. } => DEVICE_DIR.to_string(),
            Transport::Emulate { dir } => dir.display().to_string(),
        }
    }

    /// A name for the result file.
    fn label(&self) -> String {
        match self {
            Transport::Adb { serial } => serial.clone().unwrap_or_else(|| "device".into()),
            Transport::Emulate { .. } => "emulate".into(),
        }
    }

    fn adb(serial: &Option<String>) -> Command {
        let mut c = Command::new("adb");
        if let Some(s) = serial {
            c.args(["-s", s]);
        }
        c
    }

    /// Makes the device folder.
    fn mkdir(&self, dir: &str) -> Result<()> {
        match self {
            Transport::Adb { serial } => run(Self::adb(serial).args(["shell", "mkdir", "-p", dir])),
            Transport::Emulate { .. } => {
                fs::create_dir_all(dir).with_context(|| format!("creating {dir}"))
            }
        }
    }

    /// Copies the local file `from` to `to` on the device (executable bits kept).
    fn push(&self, from: &Path, to: &str) -> Result<()> {
        eprintln!("xtask: push {} -> {to}", from.display());
        match self {
            Transport::Adb { serial } => run(Self::adb(serial).arg("push").arg(from).arg(to)),
            Transport::Emulate { .. } => fs::copy(from, to)
                .map(drop)
                .with_context(|| format!("copying {} to {to}", from.display())),
        }
    }

    /// Runs `./sparrow ARGS` in `dir` on the device, its standard output into `dir/stdout_to`.
    fn run_sparrow(&self, dir: &str, args: &[String], stdout_to: &str) -> Result<()> {
        match self {
            Transport::Adb { serial } => {
                let line = format!(
                    "cd {} && ./sparrow {} > {}",
                    sh_quote(dir),
                    args.iter()
                        .map(|a| sh_quote(a))
                        .collect::<Vec<_>>()
                        .join(" "),
                    sh_quote(stdout_to)
                );
                run(Self::adb(serial).args(["shell", &line]))
            }
            Transport::Emulate { .. } => {
                let out = fs::File::create(Path::new(dir).join(stdout_to))
                    .with_context(|| format!("creating {dir}/{stdout_to}"))?;
                run(Command::new("qemu-aarch64")
                    .arg("./sparrow")
                    .args(args)
                    .current_dir(dir)
                    .stdout(Stdio::from(out)))
            }
        }
    }

    /// Copies `from` on the device to the local file `to`.
    fn pull(&self, from: &str, to: &Path) -> Result<()> {
        eprintln!("xtask: pull {from} -> {}", to.display());
        match self {
            Transport::Adb { serial } => run(Self::adb(serial).arg("pull").arg(from).arg(to)),
            Transport::Emulate { .. } => fs::copy(from, to)
                .map(drop)
                .with_context(|| format!("copying {from} to {}", to.display())),
        }
    }
}

/// `s` quoted for a POSIX shell (Android's `sh` on the device).
fn sh_quote(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:%,+".contains(&b))
    {
        return s.to_string();
    }
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The files of the model bundle at `model`: the model and those of its sidecars that exist.
pub fn bundle_files(model: &Path) -> Result<Vec<PathBuf>> {
    if !model.is_file() {
        bail!("--model {}: not a model file", model.display());
    }
    let mut files = vec![model.to_path_buf()];
    // A resident file names its parts (the store, manifest, profile and predictors of its convert;
    // an older one only its store), plain names in its folder.
    if let Ok(gguf) = model_format::GgufFile::open(model) {
        let named: Vec<String> = [
            "sparrow.ffn_store.file",
            "sparrow.bundle.manifest",
            "sparrow.bundle.profile",
            "sparrow.bundle.predictor",
        ]
        .iter()
        .filter_map(|k| gguf.get(k).and_then(|v| v.as_str()).map(str::to_string))
        .collect();
        if named.len() > 1 {
            for n in named
                .iter()
                .filter(|n| !n.contains(['/', '\\']) && *n != "..")
            {
                let p = model.with_file_name(n);
                if p.is_file() {
                    files.push(p);
                }
            }
            return Ok(files);
        }
    }
    let mut sidecar = |p: PathBuf| {
        if p.is_file() {
            files.push(p);
        }
    };
    for suffix in [".sparrow-profile", ".sparrow-predictor"] {
        let mut name = model.as_os_str().to_owned();
        name.push(suffix);
        sidecar(PathBuf::from(name));
    }
    sidecar(model.with_extension("neurons"));
    Ok(files)
}

/// What `deploy` was asked.
pub struct DeployOptions {
    /// How to reach the device.
    pub transport: Transport,
    /// The model file.
    pub model: PathBuf,
    /// Where the result goes (default `target/deploy/bench-<label>.json`).
    pub out: Option<PathBuf>,
    /// Arguments for `sparrow bench` after `--json -m MODEL`.
    pub bench_args: Vec<String>,
    /// The cargo profile the binary is built in (`--profile`, default [`RELEASE`]).
    pub profile: String,
}

impl DeployOptions {
    /// Parses `deploy`'s command line.
    pub fn parse(args: &[String]) -> Result<Self> {
        let (mut serial, mut model, mut out, mut emulate) = (None, None, None, None);
        let mut profile = RELEASE.to_string();
        let mut bench_args = Vec::new();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let mut value = || {
                it.next()
                    .with_context(|| format!("{a} needs a value"))
                    .cloned()
            };
            match a.as_str() {
                "--serial" | "-s" => serial = Some(value()?),
                "--model" | "-m" => model = Some(PathBuf::from(value()?)),
                "--out" | "-o" => out = Some(PathBuf::from(value()?)),
                "--profile" => profile = value()?,
                "--emulate" => emulate = Some(root().join("target/deploy/emulate")),
                s if s.starts_with("--emulate=") => {
                    emulate = Some(PathBuf::from(&s["--emulate=".len()..]))
                }
                "--" => {
                    bench_args.extend(it.by_ref().cloned());
                }
                "-h" | "--help" => bail!("usage: cargo xtask deploy [--serial S] --model M [--emulate[=DIR]] [--out FILE] [--profile P] [-- BENCH-ARGS]"),
                _ => bail!("deploy: unknown option `{a}` (try --help)"),
            }
        }
        let model = model.context("deploy needs --model M (a GGUF or resident file)")?;
        let transport = match (emulate, serial) {
            (Some(_), Some(_)) => bail!("--serial and --emulate exclude each other"),
            (Some(dir), None) => Transport::Emulate {
                dir: std::path::absolute(dir)?,
            },
            (None, serial) => Transport::Adb { serial },
        };
        if bench_args.is_empty() {
            bench_args = DEFAULT_BENCH_ARGS.iter().map(|s| s.to_string()).collect();
        }
        Ok(DeployOptions {
            transport,
            model,
            out,
            bench_args,
            profile,
        })
    }
}

/// `cargo xtask deploy`: build, push, bench on the device, pull; returns the bench's JSON.
pub fn deploy(o: &DeployOptions) -> Result<serde_json::Value> {
    let files = bundle_files(&o.model)?;
    let t = &o.transport;
    let (tool, package) = match t {
        Transport::Adb { .. } => ("adb", "adb"),
        Transport::Emulate { .. } => ("qemu-aarch64", "qemu-user"),
    };
    if !crate::have(tool) {
        bail!("deploy needs `{tool}` (Debian's {package} package; `cargo xtask setup` installs qemu-user)");
    }
    let bin = build_static(&o.profile)?;
    let dir = t.device_dir();
    t.mkdir(&dir)?;
    t.push(&bin, &format!("{dir}/sparrow"))?;
    for f in &files {
        let name = f.file_name().context("a file name")?.to_string_lossy();
        t.push(f, &format!("{dir}/{name}"))?;
    }
    let model_name = files[0]
        .file_name()
        .context("a file name")?
        .to_string_lossy()
        .into_owned();
    let mut args: Vec<String> = ["bench", "--json", "-m", &model_name]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.extend(o.bench_args.iter().cloned());
    t.run_sparrow(&dir, &args, "bench.json")?;
    let out = o.out.clone().unwrap_or_else(|| {
        root()
            .join("target/deploy")
            .join(format!("bench-{}.json", t.label()))
    });
    if let Some(parent) = out.parent() {
        fs::create_dir_all(parent)?;
    }
    t.pull(&format!("{dir}/bench.json"), &out)?;
    let text = fs::read_to_string(&out).with_context(|| format!("reading {}", out.display()))?;
    let v: serde_json::Value = serde_json::from_str(text.trim())
        .with_context(|| format!("{}: not the JSON of `sparrow bench --json`", out.display()))?;
    let (Some(pp), Some(tg)) = (v["pp_tok_s"].as_f64(), v["tg_tok_s"].as_f64()) else {
        bail!("{}: no pp_tok_s/tg_tok_s in {text}", out.display());
    };
    eprintln!(
        "xtask: on {}: prefill {pp:.1} tok/s, decode {tg:.1} tok/s -> {}",
        t.label(),
        out.display()
    );
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal ELF64 header for `machine` with one program header of type `kind`.
    fn elf(machine: u16, kind: u32) -> Vec<u8> {
        let mut e = vec![0u8; 64 + 56];
        e[..6].copy_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1]);
        e[18..20].copy_from_slice(&machine.to_le_bytes());
        e[32..40].copy_from_slice(&64u64.to_le_bytes());
        e[54..56].copy_from_slice(&56u16.to_le_bytes());
        e[56..58].copy_from_slice(&1u16.to_le_bytes());
        e[64..68].copy_from_slice(&kind.to_le_bytes());
        e
    }

    #[test]
    fn static_aarch64_check() {
        const PT_LOAD: u32 = 1;
        const PT_INTERP: u32 = 3;
        assert!(check_static_aarch64(&elf(183, PT_LOAD)).is_ok());
        let dynamic = check_static_aarch64(&elf(183, PT_INTERP)).unwrap_err();
        assert!(dynamic.to_string().contains("interpreter"), "{dynamic}");
        let x86 = check_static_aarch64(&elf(62, PT_LOAD)).unwrap_err();
        assert!(x86.to_string().contains("AArch64"), "{x86}");
        assert!(check_static_aarch64(b"#!/bin/sh\n").is_err());
        let mut cut = elf(183, PT_LOAD);
        cut.truncate(66); // inside the program header's type
        assert!(check_static_aarch64(&cut).is_err());
    }

    #[test]
    fn shell_quoting() {
        assert_eq!(sh_quote("-p"), "-p");
        assert_eq!(sh_quote("m.resident.gguf"), "m.resident.gguf");
        assert_eq!(sh_quote("a b"), "'a b'");
        assert_eq!(sh_quote("it's"), r"'it'\''s'");
        assert_eq!(sh_quote(""), "''");
        assert_eq!(sh_quote("$(rm -rf /)"), "'$(rm -rf /)'");
    }

    #[test]
    fn deploy_options() {
        let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let o = DeployOptions::parse(&args(&["--model", "m.gguf", "--serial", "X1"])).unwrap();
        assert!(matches!(&o.transport, Transport::Adb { serial: Some(s) } if s == "X1"));
        assert_eq!(o.bench_args, DEFAULT_BENCH_ARGS);
        let o = DeployOptions::parse(&args(&[
            "--emulate=/tmp/d",
            "-m",
            "m.gguf",
            "--",
            "-n",
            "4",
        ]))
        .unwrap();
        assert!(matches!(&o.transport, Transport::Emulate { dir } if dir == Path::new("/tmp/d")));
        assert_eq!(o.bench_args, ["-n", "4"]);
        assert!(
            DeployOptions::parse(&args(&["--emulate"])).is_err(),
            "needs --model"
        );
        assert!(DeployOptions::parse(&args(&["-m", "m", "--emulate", "-s", "X"])).is_err());
        assert!(DeployOptions::parse(&args(&["-m", "m", "--bogus"])).is_err());
    }

    #[test]
    fn bundle_has_the_model_and_its_sidecars() {
        let d = std::env::temp_dir().join(format!("xtask-bundle-{}", std::process::id()));
        fs::create_dir_all(&d).unwrap();
        let m = d.join("m.resident.gguf");
        for f in [
            "m.resident.gguf",
            "m.resident.gguf.sparrow-profile",
            "m.resident.neurons",
        ] {
            fs::write(d.join(f), b"x").unwrap();
        }
        let names: Vec<_> = bundle_files(&m)
            .unwrap()
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            [
                "m.resident.gguf",
                "m.resident.gguf.sparrow-profile",
                "m.resident.neurons"
            ]
        );
        assert!(bundle_files(&d.join("absent.gguf")).is_err());
        fs::remove_dir_all(&d).unwrap();
    }
}
