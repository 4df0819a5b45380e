//! docs/CLI.md is what `sparrow __cli-markdown` prints from the clap definitions (`cargo xtask cli-docs`
//! writes it), so the reference cannot drift from the options.

use std::path::Path;
use std::process::Command;

#[test]
fn committed_cli_md_equals_the_generated_text() {
    let out = Command::new(env!("CARGO_BIN_EXE_sparrow"))
        .arg("__cli-markdown")
        .output()
        .expect("running sparrow __cli-markdown");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let generated = String::from_utf8(out.stdout).expect("UTF-8 markdown");
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/CLI.md");
    let committed = std::fs::read_to_string(&path).expect("docs/CLI.md exists");
    // Every visible subcommand has its section.
    for sub in [
        "run",
        "perplexity",
        "bench",
        "serve",
        "convert",
        "plan",
        "calibrate",
    ] {
        assert!(
            generated.contains(&format!("## `sparrow {sub}`")),
            "no section for {sub}"
        );
    }
    assert!(
        !generated.contains("`sparrow __cli-markdown`]")
            && !generated.contains("## `sparrow __cli-markdown`"),
        "the hidden subcommand is listed"
    );
    if committed != generated {
        let line = committed
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(committed.lines().count().min(generated.lines().count()));
        panic!(
            "docs/CLI.md differs from `sparrow __cli-markdown` from line {}: run `cargo xtask cli-docs`\n committed: {:?}\n generated: {:?}",
            line + 1,
            committed.lines().nth(line),
            generated.lines().nth(line)
        );
    }
}
