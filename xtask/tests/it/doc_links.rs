//! Every relative link of README.md and docs/ (docs/benchmarks/ included) points at a file that
//! exists, and a `#fragment` into a markdown file at one of its headings (GitHub's anchors), so
//! moving text between docs cannot leave a link behind.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// GitHub's anchor of a heading: lower case, punctuation but `-` and `_` dropped, spaces to `-`.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    let mut fenced = false;
    let mut out = BTreeSet::new();
    for l in text.lines() {
        if l.starts_with("```") {
            fenced = !fenced;
        } else if !fenced && l.starts_with('#') {
            out.insert(anchor(l.trim_start_matches('#')));
        }
    }
    out
}

/// `](target)` links outside code fences.
fn links(text: &str) -> Vec<String> {
    let mut fenced = false;
    let mut out = Vec::new();
    for l in text.lines() {
        if l.starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut rest = l;
        while let Some(i) = rest.find("](") {
            rest = &rest[i + 2..];
            if let Some(j) = rest.find(')') {
                out.push(rest[..j].to_string());
                rest = &rest[j..];
            }
        }
    }
    out
}

/// `p` with `.` and `..` resolved lexically.
fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

fn markdown_files() -> Vec<PathBuf> {
    let mut files = vec![root().join("README.md")];
    for dir in ["docs", "docs/benchmarks"] {
        for e in std::fs::read_dir(root().join(dir)).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "md") {
                files.push(p);
            }
        }
    }
    files
}

#[test]
fn every_relative_link_resolves() {
    let mut bad = Vec::new();
    let mut checked = 0;
    for file in markdown_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        for link in links(&text) {
            if link.contains("://") || link.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (path, fragment) = link.split_once('#').unwrap_or((&link, ""));
            let target = if path.is_empty() {
                file.clone()
            } else {
                normalize(&file.parent().unwrap().join(path))
            };
            // Links out of the repository (the papers beside it) are not the repository's to keep.
            if !target.starts_with(root()) {
                continue;
            }
            if !target.exists() {
                bad.push(format!("{}: {link}: no such file", file.display()));
            } else if !fragment.is_empty() && target.extension().is_some_and(|x| x == "md") {
                let headings = anchors(&std::fs::read_to_string(&target).unwrap());
                if !headings.contains(fragment) {
                    bad.push(format!("{}: {link}: no such heading", file.display()));
                }
            }
        }
    }
    assert!(
        checked > 50,
        "only {checked} links found: the scan is broken"
    );
    assert!(bad.is_empty(), "broken links:\n{}", bad.join("\n"));
}

#[test]
fn anchors_follow_github() {
    assert_eq!(
        anchor(" KV cache types: memory and perplexity (2026-11-25 to 2026-11-28)"),
        "kv-cache-types-memory-and-perplexity-2026-11-25-to-2026-11-28"
    );
    assert_eq!(
        anchor(" `sparrow train-predictor`"),
        "sparrow-train-predictor"
    );
    assert_eq!(links("see [a](b.md#c) and [d](e)"), ["b.md#c", "e"]);
}
