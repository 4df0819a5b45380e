//! `cargo xtask arm-count --where K`: where a decoded token's guest instructions go, by function
//! (`--where-prompt K`: a prompt token's).
//!
//! The plugin's `tbs=FILE` mode (`xtask/qemu/insn_count.c`) writes each translated block's guest
//! address, instruction count and executions; the blocks are mapped to the binary's symbols (`nm
//! --defined-only -C`: a release or ci binary keeps its symbol table) and summed per function. A
//! static-pie binary (Rust's musl targets) is loaded at an address of qemu's choosing: the first block
//! translated is the ELF entry point, so the load bias is that address minus `e_entry`. As for the
//! totals, the per-token figure is the difference of a decode of N and of N/2 tokens over N - N/2, so
//! loading and start-up cancel.

use std::collections::HashMap;
use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

use crate::{have, root};

/// Guest instructions per function (demangled name) of one run.
type Profile = HashMap<String, f64>;

/// Runs `bin args` under the plugin with `tbs=` and sums executed instructions per symbol of `bin`.
pub fn profile(lib: &Path, cpu: &str, bin: &Path, args: &[String]) -> Result<Profile> {
    let dir = root().join("target").join("qemu-plugin");
    let pid = std::process::id();
    let out = dir.join(format!("where-count-{pid}.txt"));
    let tbs = dir.join(format!("where-tbs-{pid}.txt"));
    let _ = fs::remove_file(&tbs);
    let mut plugin = std::ffi::OsString::from(lib);
    plugin.push(",out=");
    plugin.push(&out);
    plugin.push(",tbs=");
    plugin.push(&tbs);
    eprintln!(
        "xtask: $ qemu-aarch64 -cpu {cpu} (tbs) ... {} {}",
        bin.display(),
        args.join(" ")
    );
    let o = Command::new("qemu-aarch64")
        .args(["-cpu", cpu])
        .arg("-plugin")
        .arg(plugin)
        .arg(bin)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .context("starting qemu-aarch64")?;
    if !o.status.success() {
        let err = String::from_utf8_lossy(&o.stderr);
        bail!("{} under qemu failed ({}): {err}", bin.display(), o.status);
    }
    let text = fs::read_to_string(&tbs).with_context(|| format!("reading {}", tbs.display()))?;
    let _ = fs::remove_file(&tbs);
    let syms = symbols(bin)?;
    let entry = elf_entry(bin)?;
    attribute(&text, &syms, entry).with_context(|| format!("{}", tbs.display()))
}

/// Sums the plugin's `PC INSNS EXECS` lines per symbol (the nearest symbol at or below the PC).
fn attribute(text: &str, syms: &[(u64, String)], entry: u64) -> Result<Profile> {
    let mut lines = text.lines();
    let first = lines.next().context("empty block file")?;
    let first = u64::from_str_radix(first.trim(), 16).context("first line: not an address")?;
    let bias = first.wrapping_sub(entry);
    let mut prof = Profile::new();
    for (i, l) in lines.enumerate() {
        let f: Vec<&str> = l.split_whitespace().collect();
        let [pc, n, e] = f[..] else {
            bail!("line {}: not `PC INSNS EXECS`: {l:?}", i + 2);
        };
        let pc = u64::from_str_radix(pc, 16).with_context(|| format!("line {}: {pc:?}", i + 2))?;
        let insns = n.parse::<u64>()? * e.parse::<u64>()?;
        let k = pc
            .checked_sub(bias)
            .map_or(0, |addr| syms.partition_point(|(a, _)| *a <= addr));
        let name = if k == 0 {
            "(outside the binary)".to_string()
        } else {
            syms[k - 1].1.clone()
        };
        *prof.entry(name).or_default() += insns as f64;
    }
    Ok(prof)
}

/// The function symbols of `bin`, sorted by address, names demangled without their hashes.
fn symbols(bin: &Path) -> Result<Vec<(u64, String)>> {
    let nm = if have("aarch64-linux-gnu-nm") {
        "aarch64-linux-gnu-nm"
    } else {
        "nm"
    };
    let o = Command::new(nm)
        .args(["--defined-only", "-C", "-n"])
        .arg(bin)
        .output()
        .with_context(|| format!("running {nm}"))?;
    if !o.status.success() {
        bail!(
            "{nm} {}: {}",
            bin.display(),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let mut syms = Vec::new();
    for l in String::from_utf8_lossy(&o.stdout).lines() {
        let mut f = l.splitn(3, ' ');
        let (Some(a), Some(t), Some(name)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        if !matches!(t, "t" | "T" | "w" | "W") {
            continue;
        }
        let Ok(a) = u64::from_str_radix(a, 16) else {
            continue;
        };
        syms.push((a, short_name(name)));
    }
    if syms.is_empty() {
        bail!(
            "{}: no function symbols (a stripped binary?)",
            bin.display()
        );
    }
    syms.sort_by_key(|s| s.0);
    Ok(syms)
}

/// A demangled name without its `::h0123...` hash and without Rust's generic arguments' noise.
fn short_name(name: &str) -> String {
    let n = match name.rfind("::h") {
        Some(i) if name[i + 3..].chars().all(|c| c.is_ascii_hexdigit()) => &name[..i],
        _ => name,
    };
    if n.len() > 110 {
        format!("{}...", &n[..107])
    } else {
        n.to_string()
    }
}

/// The ELF64 entry point (`e_entry`) of `bin`.
fn elf_entry(bin: &Path) -> Result<u64> {
    let head = fs::read(bin).with_context(|| format!("reading {}", bin.display()))?;
    let b = head
        .get(24..32)
        .with_context(|| format!("{}: too short for an ELF header", bin.display()))?;
    Ok(u64::from_le_bytes(b.try_into().expect("8 bytes")))
}

/// Prints the `top` functions by instructions per token of one program: `long` and `short` are the
/// profiles of runs of `n` and `n_half` tokens, each a `unit` ("decoded token" or "prompt token").
pub fn print_top(
    what: &str,
    unit: &str,
    long: &Profile,
    short: &Profile,
    (n, n_half): (usize, usize),
    top: usize,
) {
    let tokens = (n - n_half) as f64;
    let mut rows: Vec<(String, f64)> = long
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                (v - short.get(k).copied().unwrap_or(0.0)) / tokens,
            )
        })
        .collect();
    rows.sort_by(|a, b| b.1.total_cmp(&a.1));
    let total: f64 = rows.iter().map(|r| r.1).sum();
    println!(
        "{what}: {:.2}M guest instructions per {unit} ({n} vs {n_half} tokens), top {top} functions:",
        total / 1e6
    );
    println!("| function | M insns/token | share |");
    println!("|---|---|---|");
    for (name, v) in rows.iter().take(top) {
        println!(
            "| `{}` | {:.2} | {:.1}% |",
            name.replace('|', "\\|"),
            v / 1e6,
            v / total * 100.0
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_go_to_the_symbol_at_or_below_them_with_the_load_bias() {
        let syms = vec![(0x100, "_start".to_string()), (0x200, "f".to_string())];
        // Loaded at 0x5500000000: the first block is the entry point 0x100.
        let text = "5500000100\n5500000100 3 1\n5500000204 4 10\n55000001f0 2 5\n10 1 7\n";
        let p = attribute(text, &syms, 0x100).unwrap();
        assert_eq!(p["_start"], 3.0 + 10.0);
        assert_eq!(p["f"], 40.0);
        assert_eq!(p["(outside the binary)"], 7.0);
    }

    #[test]
    fn hashes_are_dropped() {
        assert_eq!(short_name("a::b::h0123456789abcdef"), "a::b");
        assert_eq!(short_name("a::hello"), "a::hello");
    }
}
