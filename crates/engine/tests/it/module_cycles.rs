//! No import cycles between the engine's modules.
//!
//! Reads every `src/**/*.rs`, strips comments, strings and character literals, collects the
//! `crate::…` and `super::…` paths (in `use` trees and inline), and builds the module graph:
//!
//! * between top-level modules (a folder module such as `offload/` is one node: it depends on what
//!   any of its files depends on), and
//! * between the files of one folder that are not each other's ancestors (a child using items its
//!   `mod.rs` defines, or `mod.rs` re-exporting a child, is the facade pattern, not a cycle).
//!
//! Paths into the crate root (`crate::Result`, re-exports of `lib.rs`) are ignored: `lib.rs` only
//! declares modules and re-exports. The test fails with the cycle it found.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

type Graph = BTreeMap<String, BTreeSet<String>>;

/// `src/a/b.rs` → `a::b`, `src/a/mod.rs` → `a`, `src/lib.rs` → `` (the root).
fn module_of(rel: &Path) -> String {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap_or_default();
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" && stem != "lib" {
        parts.push(stem.to_string());
    }
    parts.join("::")
}

/// The source without comments, string literals and character literals (replaced by spaces).
fn strip(src: &str) -> String {
    let b: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < b.len() && b[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == '/' && b.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == '*' && b.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
        } else if c == 'r'
            && (next == Some('"') || next == Some('#'))
            && !b[..i]
                .last()
                .is_some_and(|p| p.is_alphanumeric() || *p == '_')
        {
            // Raw string r"…" / r#"…"#.
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= b.len() {
                    break;
                }
                if b[j] == '"' && (0..hashes).all(|h| b.get(j + 1 + h) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            i = j;
            out.push(' ');
        } else if c == '"' {
            i += 1;
            while i < b.len() && b[i] != '"' {
                i += if b[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push(' ');
        } else if c == '\'' {
            // A character literal ('x', '\n', '\u{..}'), or a lifetime ('a), which is kept.
            if next == Some('\\') {
                i += 2;
                while i < b.len() && b[i] != '\'' {
                    i += 1;
                }
                i += 1;
                out.push(' ');
            } else if b.get(i + 2) == Some(&'\'') {
                i += 3;
                out.push(' ');
            } else {
                out.push(c);
                i += 1;
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// Every path starting with `crate::` or `super::` in stripped source, `use` groups expanded:
/// `crate::a::{b::C, d}` gives `crate::a::b::C` and `crate::a::d`.
fn paths(src: &str) -> Vec<String> {
    let toks = tokens(src);
    let mut out = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        let t = &toks[i];
        let starts = (t == "crate" || t == "super")
            && toks.get(i + 1).map(String::as_str) == Some("::")
            && !(i > 0 && toks[i - 1] == "::");
        if starts {
            i = tree(&toks, i, String::new(), &mut out);
        } else {
            i += 1;
        }
    }
    out
}

/// Parses a use tree from `toks[i]` with `prefix`, pushing full paths; returns the index after it.
fn tree(toks: &[String], mut i: usize, prefix: String, out: &mut Vec<String>) -> usize {
    let mut path = prefix;
    loop {
        match toks.get(i).map(String::as_str) {
            Some("{") => {
                i += 1;
                loop {
                    match toks.get(i).map(String::as_str) {
                        Some("}") => return i + 1,
                        Some(",") => i += 1,
                        None => return i,
                        Some(_) => i = tree(toks, i, path.clone(), out),
                    }
                }
            }
            Some(t) if is_ident(t) => {
                if !path.is_empty() {
                    path.push_str("::");
                }
                path.push_str(t);
                i += 1;
                if toks.get(i).map(String::as_str) == Some("::") {
                    i += 1;
                    continue;
                }
                out.push(path);
                return i;
            }
            _ => {
                if !path.is_empty() {
                    out.push(path);
                }
                return i;
            }
        }
    }
}

fn is_ident(t: &str) -> bool {
    t.chars()
        .next()
        .is_some_and(|c| c.is_alphabetic() || c == '_')
        && t.chars().all(|c| c.is_alphanumeric() || c == '_')
}

/// Identifiers, `::`, and every other character as its own token.
fn tokens(src: &str) -> Vec<String> {
    let b: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_alphanumeric() || c == '_' {
            let s = i;
            while i < b.len() && (b[i].is_alphanumeric() || b[i] == '_') {
                i += 1;
            }
            out.push(b[s..i].iter().collect());
        } else if c == ':' && b.get(i + 1) == Some(&':') {
            out.push("::".into());
            i += 2;
        } else {
            if !c.is_whitespace() {
                out.push(c.to_string());
            }
            i += 1;
        }
    }
    out
}

/// The module a path names: its longest prefix that is a module of `modules` (`None`: the root or
/// outside the crate). `from` resolves `super::`.
fn target(path: &str, from: &str, modules: &BTreeSet<String>) -> Option<String> {
    let mut segs: Vec<&str> = path.split("::").collect();
    let mut base: Vec<&str> = if from.is_empty() {
        Vec::new()
    } else {
        from.split("::").collect()
    };
    match segs.first() {
        Some(&"crate") => {
            base.clear();
            segs.remove(0);
        }
        Some(&"super") => {
            while segs.first() == Some(&"super") {
                segs.remove(0);
                base.pop();
            }
        }
        _ => return None,
    }
    base.extend(segs);
    (1..=base.len())
        .rev()
        .map(|k| base[..k].join("::"))
        .find(|m| modules.contains(m))
}

fn top(m: &str) -> &str {
    m.split("::").next().unwrap_or(m)
}

fn is_ancestor(a: &str, b: &str) -> bool {
    b.starts_with(a) && b[a.len()..].starts_with("::")
}

/// The graph described in the module docs, from `(module, stripped source)` pairs.
fn graph(files: &[(String, String)]) -> Graph {
    let modules: BTreeSet<String> = files
        .iter()
        .map(|(m, _)| m.clone())
        .filter(|m| !m.is_empty())
        .collect();
    let mut g = Graph::new();
    for (from, src) in files.iter().filter(|(m, _)| !m.is_empty()) {
        for p in paths(src) {
            let Some(to) = target(&p, from, &modules) else {
                continue;
            };
            if top(from) != top(&to) {
                g.entry(top(from).to_string())
                    .or_default()
                    .insert(top(&to).to_string());
            } else if from != &to && !is_ancestor(from, &to) && !is_ancestor(&to, from) {
                g.entry(from.clone()).or_default().insert(to);
            }
        }
    }
    g
}

/// A cycle of `g` (first node repeated at the end), if any.
fn find_cycle(g: &Graph) -> Option<Vec<String>> {
    // 0: unvisited, 1: on the stack, 2: done.
    fn visit(
        n: &str,
        g: &Graph,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(n.to_string(), 1);
        stack.push(n.to_string());
        for m in g.get(n).into_iter().flatten() {
            match state.get(m.as_str()).copied().unwrap_or(0) {
                1 => {
                    let at = stack.iter().position(|s| s == m).unwrap_or(0);
                    let mut c = stack[at..].to_vec();
                    c.push(m.clone());
                    return Some(c);
                }
                0 => {
                    if let Some(c) = visit(m, g, state, stack) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(n.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in g.keys() {
        if state.get(n.as_str()).copied().unwrap_or(0) == 0 {
            let mut stack = Vec::new();
            if let Some(c) = visit(n, g, &mut state, &mut stack) {
                return Some(c);
            }
        }
    }
    None
}

fn rs_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).expect("readable src dir") {
        let p = e.expect("dir entry").path();
        if p.is_dir() {
            rs_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

fn sources(src: &[(&str, &str)]) -> Vec<(String, String)> {
    src.iter().map(|(m, s)| (m.to_string(), strip(s))).collect()
}

/// The crates that came out of the engine, checked like it.
const SPLIT_CRATES: &[&str] = &[
    "accel",
    "accel-qnn",
    "sampling",
    "model-fetch",
    "transformer",
    "offload",
    "model-bundle",
    "calibrate",
];

/// The module graph of crate `name`'s `src/` (a sibling of this crate's folder).
fn crate_graph(name: &str) -> Graph {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("crates folder")
        .join(name)
        .join("src");
    let mut files = Vec::new();
    rs_files(&root, &mut files);
    let files: Vec<(String, String)> = files
        .iter()
        .map(|p| {
            let src = std::fs::read_to_string(p).expect("readable source");
            (module_of(p.strip_prefix(&root).unwrap()), strip(&src))
        })
        .collect();
    graph(&files)
}

#[test]
fn engine_modules_import_no_cycle() {
    let g = crate_graph("engine");
    // The graph is not empty (the scan works): the builder sets up the engine of `generate`.
    assert!(
        g.get("builder").is_some_and(|s| s.contains("generate")),
        "builder -> generate missing: {g:?}"
    );
    if let Some(c) = find_cycle(&g) {
        panic!("module import cycle: {}", c.join(" -> "));
    }
}

#[test]
fn the_crates_split_from_the_engine_import_no_cycle() {
    for name in SPLIT_CRATES {
        let g = crate_graph(name);
        if let Some(c) = find_cycle(&g) {
            panic!("module import cycle in {name}: {}", c.join(" -> "));
        }
    }
    // The scan sees their modules: accel's registry uses the CPU backend.
    let g = crate_graph("accel");
    assert!(
        g.get("registry").is_some_and(|s| s.contains("cpu")),
        "accel registry -> cpu missing: {g:?}"
    );
    // And the forward pass uses the model.
    let g = crate_graph("transformer");
    assert!(
        g.get("forward").is_some_and(|s| s.contains("model")),
        "transformer forward -> model missing: {g:?}"
    );
}

#[test]
fn a_planted_cycle_is_found() {
    // a -> b -> c -> a across top-level modules, written in several path forms.
    let files = sources(&[
        ("", "mod a; mod b; mod c; pub use a::X;"),
        ("a", "use crate::b::{Y, z::W};\n// use crate::c::Nothing;"),
        ("b", "fn f() { let s = \"crate::a::Fake\"; crate::c::g(); }"),
        ("b::z", "pub struct W;"),
        ("c", "use crate::{a::X as _};"),
    ]);
    let g = graph(&files);
    let c = find_cycle(&g).expect("the planted cycle");
    assert_eq!(c.first(), c.last());
    assert_eq!(c.len(), 4, "{c:?}");
    // Without the closing edge there is none: comments and strings do not count.
    let files = sources(&[
        ("a", "use crate::b::{Y, z::W};\n// use crate::c::Nothing;"),
        ("b", "fn f() { let s = \"crate::a::Fake\"; crate::c::g(); }"),
        ("b::z", "pub struct W;"),
        ("c", "fn h<'a>(c: char) -> bool { c == '\"' } // crate::a"),
    ]);
    assert_eq!(find_cycle(&graph(&files)), None);
}

#[test]
fn sibling_cycles_inside_a_folder_are_found_but_the_facade_is_not_one() {
    // offload/mod.rs re-exports its children and they use what it defines: no cycle.
    let files = sources(&[
        ("o", "mod x; mod y; pub use x::A; pub struct Opts;"),
        ("o::x", "use crate::o::Opts; use super::y::B;"),
        ("o::y", "use crate::o::Opts; pub struct B;"),
    ]);
    assert_eq!(find_cycle(&graph(&files)), None);
    // Two siblings using each other are.
    let files = sources(&[
        ("o", "mod x; mod y;"),
        ("o::x", "use super::y::B; pub struct A;"),
        ("o::y", "use crate::o::x::A; pub struct B;"),
    ]);
    assert!(find_cycle(&graph(&files)).is_some());
}
