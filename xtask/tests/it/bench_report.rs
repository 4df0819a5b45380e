//! `cargo xtask bench-report` (xtask/src/bench_report.rs): the committed table at the top of
//! docs/BENCHMARKS.md and the plots it embeds are what the committed result files generate, so they
//! cannot drift; bad result files and documents are refused without losing anything.

use crate::src::bench_report;

use std::path::{Path, PathBuf};

use bench_report::{Measurement, BEGIN, END};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

#[test]
fn committed_table_and_plots_equal_the_generated_ones() {
    let files = bench_report::generate(&root()).expect("the committed result files generate");
    assert!(
        files.len() >= 4,
        "BENCHMARKS.md and three plots: {:?}",
        files.keys()
    );
    for (rel, text) in &files {
        let committed = std::fs::read_to_string(root().join(rel))
            .unwrap_or_else(|e| panic!("{}: {e}", rel.display()));
        assert!(
            committed == *text,
            "{} differs from what `cargo xtask bench-report` generates: run it",
            rel.display()
        );
    }
    let doc = &files[Path::new("docs/BENCHMARKS.md")];
    // The table comes first, before any hand-written text.
    let begin = doc.find(BEGIN).unwrap();
    assert!(
        doc[..begin].trim() == "# Benchmarks",
        "the table is not the first thing"
    );
    for plot in ["budget-curve.svg", "formats.svg", "hit-rate.svg"] {
        assert!(
            doc.contains(&format!("(plots/{plot})")),
            "{plot} is not embedded"
        );
        assert!(files.contains_key(&PathBuf::from("docs/plots").join(plot)));
    }
}

fn sample() -> Measurement {
    serde_json::from_str(
        r#"{"id": "x", "group": "Batched decode", "measures": "best-of-4", "model": "M", "value": 1.5,
            "unit": "x", "target": {"at_least": 2}, "date": "2026-01-02", "machine": "VM",
            "command": "sparrow bench | head", "source": "test", "history": "benchmarks/best-of-n.md"}"#,
    )
    .unwrap()
}

#[test]
fn a_row_shows_value_target_and_whether_it_is_met() {
    let mut m = sample();
    let block = bench_report::render_block(std::slice::from_ref(&m));
    let row = block.lines().find(|l| l.contains("best-of-4")).unwrap();
    assert!(row.contains("**1.5x**"), "{row}");
    assert!(row.contains("≥ 2x: **not met**"), "{row}");
    // A `|` inside a cell must not split the row.
    assert!(row.contains(r"sparrow bench \| head"), "{row}");
    m.value = Some(2.0);
    assert_eq!(m.met(), Some(true));
    let block = bench_report::render_block(&[m]);
    assert!(block.contains("≥ 2x: met"), "{block}");
}

#[test]
fn bad_results_are_refused_with_their_name() {
    let mut m = sample();
    m.group = "Nowhere".into();
    let e = m.validate("r.json").unwrap_err().to_string();
    assert!(e.starts_with("r.json: group `Nowhere`"), "{e}");
    let mut m = sample();
    m.date = "yesterday".into();
    assert!(m.validate("r.json").is_err());
    let mut m = sample();
    m.history = "../../etc/passwd".into();
    assert!(m.validate("r.json").is_err());
    let mut m = sample();
    m.value = Some(f64::NAN);
    assert!(m.validate("r.json").is_err());
    assert!(serde_json::from_str::<Measurement>(r#"{"id": "x", "surprise": 1}"#).is_err());
}

#[test]
fn splice_keeps_everything_outside_the_markers_and_refuses_without_them() {
    let doc = format!("# T\n\n{BEGIN}\nold table\n{END}\n\nhand-written history\n");
    let out = bench_report::splice(&doc, "new table\n", "doc").unwrap();
    assert_eq!(
        out,
        format!("# T\n\n{BEGIN}\nnew table\n{END}\n\nhand-written history\n")
    );
    assert!(bench_report::splice("# T\nno markers\n", "x", "doc").is_err());
    let twice = format!("{BEGIN}\n{END}\n{BEGIN}\n{END}\n");
    assert!(bench_report::splice(&twice, "x", "doc").is_err());
    let reversed = format!("{END}\n{BEGIN}\n");
    assert!(bench_report::splice(&reversed, "x", "doc").is_err());
}

#[test]
fn a_recorded_result_loads_back_equal() {
    let dir = std::env::temp_dir().join(format!("bench-report-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let m = sample();
    let path = m.record(&dir).unwrap();
    assert_eq!(path, dir.join("x.json"));
    let back = bench_report::load(&dir).unwrap();
    assert_eq!(back, vec![m]);
    // A file whose id is not its name is refused, naming the file.
    std::fs::write(dir.join("y.json"), std::fs::read(&path).unwrap()).unwrap();
    let e = bench_report::load(&dir).unwrap_err().to_string();
    assert!(
        e.contains("y.json") && e.contains("not the file's name"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn recorded_dates_are_calendar_dates() {
    assert_eq!(bench_report::civil_date(0), "1970-01-01");
    assert_eq!(bench_report::civil_date(11_016), "2000-02-29");
    assert_eq!(bench_report::civil_date(20_789), "2026-12-02");
    assert_eq!(bench_report::today().len(), 10);
}

#[test]
fn a_new_value_keeps_the_row_it_replaces() {
    let dir = std::env::temp_dir().join(format!("bench-report-value-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let old = sample();
    old.record(&dir).unwrap();
    let mut fresh = sample();
    fresh.value = Some(2.5);
    fresh.date = "2027-03-04".into();
    fresh.measures = "something a command calls it".into();
    fresh.target = None;
    bench_report::record_value(&dir, fresh).unwrap();
    let back = bench_report::load(&dir).unwrap();
    assert_eq!(back.len(), 1);
    assert_eq!(back[0].value, Some(2.5));
    assert_eq!(back[0].date, "2027-03-04");
    // What the row is stays as the committed file says.
    assert_eq!(back[0].measures, old.measures);
    assert_eq!(back[0].target, old.target);
    assert_eq!(back[0].met(), Some(true));
    // A file that does not parse is not replaced.
    std::fs::write(dir.join("x.json"), "{not json").unwrap();
    assert!(bench_report::record_value(&dir, sample()).is_err());
    assert_eq!(
        std::fs::read_to_string(dir.join("x.json")).unwrap(),
        "{not json"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn each_instruction_set_has_its_own_table_and_neon_says_it_has_no_run() {
    let mut avx2 = sample();
    avx2.id = "a".into();
    avx2.group = bench_report::AVX2_GROUP.into();
    avx2.measures = "decode on AVX2".into();
    let mut avx512 = sample();
    avx512.id = "b".into();
    avx512.group = "In memory against llama.cpp".into();
    avx512.measures = "decode on AVX-512".into();
    let block = bench_report::render_block(&[sample(), avx2, avx512]);
    let at = |s: &str| {
        block
            .find(s)
            .unwrap_or_else(|| panic!("`{s}` missing:\n{block}"))
    };
    // AVX-512, AVX2, NEON, then the other groups, each row in its own table.
    let (t512, t2, tneon, rest) = (
        at("**AVX-512**"),
        at("**AVX2**"),
        at("**NEON proxy**"),
        at("Everything else"),
    );
    assert!(t512 < t2 && t2 < tneon && tneon < rest, "{block}");
    let (r512, r2, rbest) = (
        at("decode on AVX-512"),
        at("decode on AVX2]"),
        at("best-of-4"),
    );
    assert!(t512 < r512 && r512 < t2, "{block}");
    assert!(t2 < r2 && r2 < tneon, "{block}");
    assert!(rest < rbest, "{block}");
    // The NEON table has no row: it says that no device run exists.
    assert!(
        block[tneon..rest].contains("No device run exists yet"),
        "{block}"
    );
    // Each table names its command.
    assert!(block[t2..r2].contains("cargo xtask bench-formats --isa avx2"));
    // An empty table of a measured instruction set says so, not the NEON text.
    let block = bench_report::render_block(&[sample()]);
    let t2 = block.find("**AVX2**").unwrap();
    let tneon = block.find("**NEON proxy**").unwrap();
    assert!(
        block[t2..tneon].contains("No result recorded yet."),
        "{block}"
    );
}
