//! Architecture invariants, checked on the real workspace (see docs/ARCHITECTURE.md):
//! the layering of crates (from `cargo metadata`) and which crates may do what (from their sources).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Layer of each workspace crate. A crate may depend (normal or build dependency) only on crates of a
/// strictly lower layer, and its tests (dev-dependencies) on none of a higher layer; layer 0 (foundations every crate may use: `tensor-types`, the shared
/// vocabulary, and `atomic-out`, whole-or-nothing output files) depends on no workspace crate.
fn layer(name: &str) -> Option<u32> {
    Some(match name {
        "tensor-types" | "atomic-out" => 0,
        "ufs-io" | "kernels-neon" | "npu-qnn-sys" | "model-format" | "model-tokenizer"
        | "sampling" | "model-fetch" => 1,
        "neuron-cache" | "neuron-store" | "predictor" | "planner" | "npu-qnn" | "qnn-double"
        | "accel" => 2,
        "accel-qnn" | "transformer" => 3,
        "offload" => 4,
        "model-bundle" | "calibrate" => 5,
        "engine" => 6,
        "server" => 7,
        "sparrow" | "xtask" => 8,
        _ => return None,
    })
}

/// Which dependencies [`workspace_deps`] lists.
#[derive(Clone, Copy, PartialEq)]
enum Kinds {
    /// Normal and build dependencies: what the crate's library or binary is built from.
    Built,
    /// The dev-dependencies of its tests, examples and benches.
    Dev,
}

fn workspace_deps(kinds: Kinds) -> BTreeMap<String, BTreeSet<String>> {
    let out = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(root())
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("cargo metadata prints JSON");
    let packages = meta["packages"].as_array().expect("packages array");
    let names: BTreeSet<String> = packages
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_string())
        .collect();
    packages
        .iter()
        .map(|p| {
            let deps = p["dependencies"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|d| (d["kind"].as_str() == Some("dev")) == (kinds == Kinds::Dev))
                .map(|d| d["name"].as_str().unwrap().to_string())
                .filter(|d| names.contains(d))
                .collect();
            (p["name"].as_str().unwrap().to_string(), deps)
        })
        .collect()
}

#[test]
fn every_crate_has_a_layer_and_depends_only_downwards() {
    let deps = workspace_deps(Kinds::Built);
    assert!(
        deps.contains_key("engine") && deps.contains_key("kernels-neon"),
        "metadata lists the workspace: {deps:?}"
    );
    let mut errors = Vec::new();
    for (krate, ds) in &deps {
        let Some(l) = layer(krate) else {
            errors.push(format!(
                "crate `{krate}` has no layer: add it to layer() and docs/ARCHITECTURE.md"
            ));
            continue;
        };
        for d in ds {
            match layer(d) {
                Some(dl) if dl < l => {}
                _ => errors.push(format!(
                    "`{krate}` (layer {l}) depends on `{d}` (layer {:?})",
                    layer(d)
                )),
            }
        }
    }
    // Tests too: a test of a lower crate that reached up would hide an upward arrow (a test may
    // use a crate of its own layer: `npu-qnn`'s load the QNN test double, `qnn-double`).
    for (krate, ds) in &workspace_deps(Kinds::Dev) {
        let l = layer(krate);
        for d in ds {
            if layer(d).is_none() || layer(d) > l {
                errors.push(format!(
                    "the tests of `{krate}` (layer {l:?}) depend on `{d}` (layer {:?})",
                    layer(d)
                ));
            }
        }
    }
    assert!(
        errors.is_empty(),
        "layering violations:\n{}",
        errors.join("\n")
    );
}

#[test]
fn crates_above_engine_reach_layers_below_it_only_through_engine() {
    // What the library or binary is built from; their tests may write a lower crate's files
    // directly (a device profile, the QNN test double), which the downward rule still checks.
    for (krate, ds) in &workspace_deps(Kinds::Built) {
        let engine = layer("engine").unwrap();
        if layer(krate).is_some_and(|l| l > engine) {
            let direct: Vec<_> = ds
                .iter()
                .filter(|d| layer(d).is_some_and(|l| (2..engine).contains(&l)))
                .collect();
            assert!(
                direct.is_empty(),
                "`{krate}` uses crates between layer 2 and the engine directly (go through engine): {direct:?}"
            );
        }
    }
}

fn rust_sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Crates (by directory under crates/) whose `src/` mentions `needle`.
fn crates_using(needle: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for e in std::fs::read_dir(root().join("crates")).unwrap().flatten() {
        let src = e.path().join("src");
        if !src.is_dir() {
            continue;
        }
        let mut files = Vec::new();
        rust_sources(&src, &mut files);
        if files
            .iter()
            .any(|f| std::fs::read_to_string(f).unwrap().contains(needle))
        {
            found.insert(e.file_name().to_string_lossy().into_owned());
        }
    }
    found
}

/// No crate re-exports a whole workspace crate (`pub use planner;`): a crate above would reach it
/// through the re-export, around the layering rules.
#[test]
fn no_crate_re_exports_a_workspace_crate_whole() {
    let crates: Vec<String> = workspace_deps(Kinds::Built)
        .into_keys()
        .map(|c| c.replace('-', "_"))
        .collect();
    let mut files = Vec::new();
    rust_sources(&root().join("crates"), &mut files);
    let mut found = Vec::new();
    for f in files {
        for line in std::fs::read_to_string(&f).unwrap().lines() {
            let t = line.trim();
            let Some(rest) = t.strip_prefix("pub use ") else {
                continue;
            };
            let path = rest.trim_end_matches(';');
            let path = path.split(" as ").next().unwrap_or(path).trim();
            if crates.iter().any(|c| path == c || path == format!("::{c}")) {
                found.push(format!("{}: {t}", f.display()));
            }
        }
    }
    assert!(found.is_empty(), "whole-crate re-exports: {found:?}");
}

/// No crate re-exports a module of a workspace crate whole (`pub use transformer::forward;`,
/// `pub use offload::{budget, sparse};`) or all of one (`pub use offload::sparse::*;`): an upper
/// crate re-exports chosen items, so what a crate above reaches through it is a list someone chose.
#[test]
fn no_crate_re_exports_a_module_of_a_workspace_crate() {
    let crates: Vec<String> = workspace_deps(Kinds::Built)
        .into_keys()
        .map(|c| c.replace('-', "_"))
        .collect();
    // A public module of the crate: `pub mod name;` or `pub mod name {` in its lib.rs.
    let is_module = |krate: &str, name: &str| {
        let lib = root()
            .join("crates")
            .join(krate.replace('_', "-"))
            .join("src/lib.rs");
        let lib = std::fs::read_to_string(lib).unwrap_or_default();
        lib.lines().any(|l| {
            let l = l.trim();
            l == format!("pub mod {name};") || l == format!("pub mod {name} {{")
        })
    };
    let mut files = Vec::new();
    rust_sources(&root().join("crates"), &mut files);
    let mut found = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        for (at, _) in text.match_indices("pub use ") {
            let stmt = &text[at + 8..];
            let stmt: String = stmt[..stmt.find(';').unwrap_or(stmt.len())]
                .split_whitespace()
                .collect();
            let stmt = stmt.trim_start_matches("::");
            let Some((krate, rest)) = stmt.split_once("::") else {
                continue;
            };
            if !crates.iter().any(|c| c == krate) {
                continue;
            }
            let names: Vec<&str> = match rest.strip_prefix('{') {
                Some(list) => list.trim_end_matches('}').split(',').collect(),
                None => vec![rest],
            };
            for n in names {
                let n = n.split("as").next().unwrap_or(n);
                if n.ends_with('*') || is_module(krate, n) {
                    found.push(format!("{}: pub use {krate}::{n}", f.display()));
                }
            }
        }
    }
    assert!(found.is_empty(), "modules re-exported whole: {found:?}");
}

#[test]
fn only_npu_qnn_sys_loads_libraries() {
    for needle in ["libloading", "dlopen"] {
        let users = crates_using(needle);
        assert!(
            users.iter().all(|c| c == "npu-qnn-sys"),
            "`{needle}` used outside npu-qnn-sys: {users:?}"
        );
    }
}

/// Calls into C (`libc::name(`, `extern "C"` blocks) sit in `-sys` crates or in `sys` modules: a
/// file named `sys.rs`, a folder `sys/`, or after a `mod sys {` line. `qnn-double` is exempt: it is a
/// C library itself (the QNN test double's exported ABI).
#[test]
fn ffi_calls_sit_in_sys_modules() {
    let mut files = Vec::new();
    for e in std::fs::read_dir(root().join("crates")).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.ends_with("-sys") || name == "qnn-double" {
            continue;
        }
        if e.path().join("src").is_dir() {
            rust_sources(&e.path().join("src"), &mut files);
        }
    }
    rust_sources(&root().join("xtask").join("src"), &mut files);
    let mut outside = Vec::new();
    for f in files {
        if f.file_name().is_some_and(|n| n == "sys.rs")
            || f.components().any(|c| c.as_os_str() == "sys")
        {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap();
        let before_sys = text.split("mod sys {").next().unwrap_or("");
        for (i, line) in before_sys.lines().enumerate() {
            let call = line.match_indices("libc::").any(|(k, _)| {
                let rest = &line[k + 6..];
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                name.starts_with(|c: char| c.is_ascii_lowercase())
                    && rest[name.len()..].trim_start().starts_with('(')
            });
            if call || line.contains("extern \"C\" {") {
                outside.push(format!("{}:{}: {}", f.display(), i + 1, line.trim()));
            }
        }
    }
    assert!(
        outside.is_empty(),
        "FFI outside sys modules:\n{}",
        outside.join("\n")
    );
}

#[test]
fn only_the_io_crates_map_or_read_weight_files() {
    // model-format memory-maps model files; ufs-io (flash offload) does direct reads. Nobody else.
    for needle in ["memmap2", "Mmap", "O_DIRECT"] {
        let users = crates_using(needle);
        assert!(
            users.iter().all(|c| c == "model-format" || c == "ufs-io"),
            "`{needle}` used outside model-format/ufs-io: {users:?}"
        );
    }
}

#[test]
fn every_lib_rs_opens_with_crate_docs() {
    for e in std::fs::read_dir(root().join("crates")).unwrap().flatten() {
        let lib = e.path().join("src/lib.rs");
        if let Ok(text) = std::fs::read_to_string(&lib) {
            assert!(
                text.trim_start().starts_with("//!"),
                "{} must open with //! docs",
                lib.display()
            );
        }
    }
}
