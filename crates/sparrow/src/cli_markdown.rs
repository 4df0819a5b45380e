//! docs/CLI.md, generated from the clap definitions (`sparrow __cli-markdown`, written by `cargo xtask
//! cli-docs`): every visible subcommand with its usage, help, and each argument with its value, default
//! and possible values. Hidden subcommands and arguments are left out, as `--help` leaves them out.

use std::fmt::Write as _;

use clap::{Arg, Command};

/// The markdown of `cmd` (the built `sparrow` command) and its visible subcommands, in their order.
pub fn render(cmd: &mut Command) -> String {
    cmd.build();
    let mut s = String::new();
    let name = cmd.get_name().to_string();
    let _ = writeln!(s, "# `{name}` command line\n");
    s.push_str(
        "Generated from the clap definitions by `cargo xtask cli-docs` (`sparrow __cli-markdown`); do not edit:\n\
         `crates/sparrow/tests/it/cli_docs.rs` fails when this file and the definitions differ.\n\n",
    );
    if let Some(a) = cmd.get_long_about().or(cmd.get_about()) {
        let _ = writeln!(s, "{}\n", one_paragraph(&a.to_string()));
    }
    let _ = writeln!(s, "```text\n{}\n```\n", usage(cmd));
    let _ = writeln!(
        s,
        "Every subcommand takes `-h, --help` (`{name} help SUBCOMMAND` prints the same); `{name} --version` prints the version.\n"
    );
    let subs: Vec<&Command> = cmd
        .get_subcommands()
        .filter(|c| !c.is_hide_set() && c.get_name() != "help")
        .collect();
    for c in &subs {
        let about = c
            .get_about()
            .map(|a| first_sentence(&a.to_string()))
            .unwrap_or_default();
        let _ = writeln!(
            s,
            "- [`{name} {}`](#{name}-{}): {about}",
            c.get_name(),
            c.get_name()
        );
    }
    s.push('\n');
    options(&mut s, cmd);
    for c in subs {
        let _ = writeln!(s, "## `{name} {}`\n", c.get_name());
        if let Some(a) = c.get_long_about().or(c.get_about()) {
            let _ = writeln!(s, "{}\n", one_paragraph(&a.to_string()));
        }
        let _ = writeln!(s, "```text\n{}\n```\n", usage(c));
        options(&mut s, c);
    }
    while s.ends_with("\n\n") {
        s.pop();
    }
    s
}

fn usage(c: &Command) -> String {
    let u = c.clone().render_usage().to_string();
    u.trim().to_string()
}

fn options(s: &mut String, c: &Command) {
    // `--help` and `--version` are said once at the top.
    let args: Vec<&Arg> = c
        .get_arguments()
        .filter(|a| !a.is_hide_set() && !["help", "version"].contains(&a.get_id().as_str()))
        .collect();
    if args.is_empty() {
        return;
    }
    for a in args {
        let _ = writeln!(s, "- {}", describe(a));
    }
    s.push('\n');
}

/// `` `-m, --model <MODEL>`: help. Default: `x`. One of: `a`, `b`. ``
fn describe(a: &Arg) -> String {
    let takes = a.get_action().takes_values();
    let values = a
        .get_value_names()
        .map(|v| {
            v.iter()
                .map(|n| format!("<{n}>"))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|| format!("<{}>", a.get_id().as_str().to_uppercase()));
    let mut flag = String::new();
    if a.is_positional() {
        flag.push_str(&values);
    } else {
        let mut names = Vec::new();
        if let Some(c) = a.get_short() {
            names.push(format!("-{c}"));
        }
        if let Some(l) = a.get_long() {
            names.push(format!("--{l}"));
        }
        flag.push_str(&names.join(", "));
        if takes {
            flag.push(' ');
            flag.push_str(&values);
        }
    }
    let mut line = format!("`{flag}`");
    let help = a
        .get_long_help()
        .or(a.get_help())
        .map(|h| one_paragraph(&h.to_string()))
        .unwrap_or_default();
    if !help.is_empty() {
        let _ = write!(line, ": {help}");
        if !help.ends_with(['.', '!', '?']) {
            line.push('.');
        }
    }
    if a.is_required_set() {
        line.push_str(" Required.");
    }
    let defaults: Vec<String> = a
        .get_default_values()
        .iter()
        .map(|v| format!("`{}`", v.to_string_lossy()))
        .collect();
    if takes && !defaults.is_empty() {
        let _ = write!(line, " Default: {}.", defaults.join(", "));
    }
    let possible: Vec<String> = a
        .get_possible_values()
        .iter()
        .filter(|p| !p.is_hide_set())
        .map(|p| format!("`{}`", p.get_name()))
        .collect();
    if takes && !possible.is_empty() {
        let _ = write!(line, " One of: {}.", possible.join(", "));
    }
    line
}

/// Help text on one line (clap's help keeps the doc comment's line breaks).
fn one_paragraph(t: &str) -> String {
    t.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn first_sentence(t: &str) -> String {
    let t = one_paragraph(t);
    match t.find(". ") {
        Some(i) => t[..=i].to_string(),
        None => t,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_show_their_names_defaults_and_values() {
        let mut c = Command::new("tool").about("A tool.").subcommand(
            Command::new("go")
                .about("Go somewhere. Then stop.")
                .arg(
                    Arg::new("speed")
                        .long("speed")
                        .short('s')
                        .default_value("3")
                        .help("How fast"),
                )
                .arg(Arg::new("secret").long("secret").hide(true))
                .arg(
                    Arg::new("mode")
                        .long("mode")
                        .value_parser(["a", "b"])
                        .help("The mode"),
                ),
        );
        let md = render(&mut c);
        assert!(
            md.contains("- [`tool go`](#tool-go): Go somewhere."),
            "{md}"
        );
        assert!(md.contains("## `tool go`"), "{md}");
        assert!(
            md.contains("- `-s, --speed <SPEED>`: How fast. Default: `3`."),
            "{md}"
        );
        assert!(
            md.contains("- `--mode <MODE>`: The mode. One of: `a`, `b`."),
            "{md}"
        );
        assert!(!md.contains("secret"), "{md}");
    }
}
