//! Size limits of the sources (docs/ARCHITECTURE.md, "Invariants"): no Rust source file of the
//! workspace over [`MAX_FILE_LINES`] lines, and no function of a crate's `src/` (library and CLI code,
//! not tests, benches, examples or xtask) over [`MAX_FN_LINES`] lines.
//!
//! Functions are found the way rustfmt lays them out: a line opening with `fn` (after visibility and
//! qualifiers) and the first later line that is the same indentation followed by `}`.

use std::path::{Path, PathBuf};

const MAX_FILE_LINES: usize = 800;
const MAX_FN_LINES: usize = 120;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn rust_sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            if p.file_name().is_some_and(|n| n != "target") {
                rust_sources(&p, out);
            }
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The name and indentation of a function opened on `line`, if it opens one.
fn fn_start(line: &str) -> Option<(&str, &str)> {
    let body = line.trim_start();
    let indent = &line[..line.len() - body.len()];
    let mut rest = body;
    if let Some(r) = rest.strip_prefix("pub") {
        rest = r.trim_start();
        if rest.starts_with('(') {
            rest = rest[rest.find(')')? + 1..].trim_start();
        }
    }
    for q in ["const ", "async ", "unsafe ", "extern \"C\" "] {
        if let Some(r) = rest.strip_prefix(q) {
            rest = r.trim_start();
        }
    }
    let name = rest.strip_prefix("fn ")?;
    let end = name.find(|c: char| !(c.is_alphanumeric() || c == '_'))?;
    Some((&name[..end], indent))
}

/// Functions of `text` longer than `max` lines: (name, first line, length).
fn long_fns(text: &str, max: usize) -> Vec<(String, usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let Some((name, indent)) = fn_start(l) else {
            continue;
        };
        // A declaration without a body (trait method, extern item) ends with `;` first, a body
        // on one line with `}`.
        let Some(open) = (i..lines.len()).find(|&j| {
            let t = lines[j].trim_end();
            t.ends_with('{') || t.ends_with(';') || t.ends_with('}')
        }) else {
            continue;
        };
        if !lines[open].trim_end().ends_with('{') {
            continue;
        }
        let close = format!("{indent}}}");
        if let Some(end) = (open + 1..lines.len()).find(|&j| lines[j].trim_end() == close) {
            if end - i + 1 > max {
                out.push((name.to_string(), i + 1, end - i + 1));
            }
        }
    }
    out
}

#[test]
fn the_function_finder_measures_what_rustfmt_lays_out() {
    let long_body = "    let x = 1;\n".repeat(5);
    let text = format!(
        "pub(crate) fn a() {{\n{long_body}}}\n\nfn short() {{}}\n\nimpl T {{\n    pub unsafe fn b(\n        x: u8,\n    ) -> u8 {{\n{long_body}{long_body}    }}\n    fn decl(&self);\n}}\n"
    );
    let found = long_fns(&text, 6);
    assert_eq!(
        found,
        vec![("a".to_string(), 1, 7), ("b".to_string(), 12, 14)]
    );
    assert!(long_fns(&text, 14).is_empty());
}

#[test]
fn no_source_file_is_over_800_lines() {
    let mut files = Vec::new();
    rust_sources(&root().join("crates"), &mut files);
    rust_sources(&root().join("xtask"), &mut files);
    assert!(files.len() > 100, "found only {} sources", files.len());
    let mut over: Vec<String> = files
        .iter()
        .filter_map(|p| {
            let n = std::fs::read_to_string(p).unwrap().lines().count();
            (n > MAX_FILE_LINES).then(|| format!("{} ({n} lines)", p.display()))
        })
        .collect();
    over.sort();
    assert!(
        over.is_empty(),
        "over {MAX_FILE_LINES} lines: split them where they have seams:\n{}",
        over.join("\n")
    );
}

#[test]
fn no_function_of_crate_sources_is_over_120_lines() {
    let mut over = Vec::new();
    for e in std::fs::read_dir(root().join("crates")).unwrap().flatten() {
        let mut files = Vec::new();
        rust_sources(&e.path().join("src"), &mut files);
        for p in files {
            let text = std::fs::read_to_string(&p).unwrap();
            for (name, line, n) in long_fns(&text, MAX_FN_LINES) {
                over.push(format!("{}:{line} {name} ({n} lines)", p.display()));
            }
        }
    }
    over.sort();
    assert!(
        over.is_empty(),
        "functions over {MAX_FN_LINES} lines:\n{}",
        over.join("\n")
    );
}
