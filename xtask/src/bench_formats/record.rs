//! `bench-formats --record DIR`: result files for `cargo xtask bench-report`, in the group of the
//! instruction sets compared (`--isa`).

use std::path::Path;

use anyhow::Result;

use super::{median, FormatRatios, Isa, Opts, FORMATS};
use crate::bench_report::{record_value, Measurement, Plot, PlotKind, Series, AVX2_GROUP};

/// The table group, the ids of the two format-set results and the plot file of `isa`.
fn names(isa: Isa) -> (&'static str, [&'static str; 2], &'static str) {
    match isa {
        Isa::Native => (
            "In memory against llama.cpp",
            ["mem8-formats-decode", "mem9-formats-prefill"],
            "formats.svg",
        ),
        Isa::Avx2 => (
            AVX2_GROUP,
            ["avx2-formats-decode", "avx2-formats-prefill"],
            "formats-avx2.svg",
        ),
    }
}

/// The command as run, without `--record DIR` (and its id).
fn command(args: &[String]) -> String {
    let mut kept = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--record" || a == "--record-id" {
            it.next();
        } else {
            kept.push(a.as_str());
        }
    }
    format!("cargo xtask bench-formats {}", kept.join(" "))
        .trim_end()
        .to_string()
}

/// A result of this run (the fields every one shares filled in).
fn measurement(o: &Opts, args: &[String], id: &str, measures: String) -> Measurement {
    Measurement {
        id: id.into(),
        group: names(o.isa).0.into(),
        measures,
        model: String::new(),
        synthetic: true,
        value: None,
        unit: "x".into(),
        target: None,
        date: crate::bench_report::today(),
        machine: crate::bench_report::this_machine(),
        command: command(args),
        source: "recorded by `cargo xtask bench-formats --record`".into(),
        history: "benchmarks/dense-vs-llama.md".into(),
        note: None,
        plot: None,
    }
}

/// `--record DIR` of a run of every format: the median prefill and decode ratios over the
/// formats, and the plot of every format's ratios.
pub(super) fn record(dir: &Path, o: &Opts, args: &[String], ratios: &[FormatRatios]) -> Result<()> {
    if ratios.len() != FORMATS.len() || ratios.iter().any(|(_, p, t)| p.is_none() || t.is_none()) {
        eprintln!("bench-formats: not recording: the run did not measure every format");
        return Ok(());
    }
    let (_, ids, plot_file) = names(o.isa);
    let [layers, d, ..] = o.shape;
    let model = format!(
        "{layers}-layer d {d} model in {} weight formats (llama-quantize)",
        FORMATS.len()
    );
    let categories: Vec<String> = ratios.iter().map(|(f, ..)| f.clone()).collect();
    let series = |name: &str, get: fn(&FormatRatios) -> Option<f64>| Series {
        name: name.into(),
        points: ratios
            .iter()
            .enumerate()
            .map(|(i, r)| [i as f64, get(r).unwrap_or(0.0)])
            .collect(),
    };
    let (p, n) = (o.n_prompt, o.n_gen);
    let title = match o.isa {
        Isa::Native => "Speed per weight format against llama.cpp",
        Isa::Avx2 => "Speed per weight format against llama.cpp, AVX2 only",
    };
    let plot = Plot {
        file: plot_file.into(),
        title: title.into(),
        kind: PlotKind::Bars,
        x_label: "weight format".into(),
        y_label: "sparrow / llama.cpp".into(),
        log_y: false,
        reference_y: Some(1.0),
        reference_label: "parity with llama.cpp".into(),
        legend: String::new(),
        categories,
        series: vec![
            series(&format!("prefill pp{p}"), |r| r.1),
            series(&format!("decode tg{n}"), |r| r.2),
        ],
    };
    let k = FORMATS.len();
    for (id, what, get, with_plot) in [
        (
            ids[0],
            format!("decode tg{n} vs llama.cpp, median of {k} weight formats"),
            (|r| r.2) as fn(&FormatRatios) -> Option<f64>,
            true,
        ),
        (
            ids[1],
            format!("prefill pp{p} vs llama.cpp, median of {k} weight formats"),
            |r| r.1,
            false,
        ),
    ] {
        let mut v: Vec<(f64, &str)> = ratios
            .iter()
            .map(|r| (get(r).unwrap_or(0.0), r.0.as_str()))
            .collect();
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (lo, hi) = (v[0], v[v.len() - 1]);
        let m = Measurement {
            model: model.clone(),
            value: median(v.iter().map(|x| x.0).collect()),
            note: Some(format!(
                "{}x ({}) to {}x ({}); medians of {} round(s)",
                lo.0, lo.1, hi.0, hi.1, o.rounds
            )),
            plot: with_plot.then(|| plot.clone()),
            ..measurement(o, args, id, what)
        };
        record_value(dir, m)?;
    }
    Ok(())
}

/// `--record DIR --record-id ID` of a `--model` run (one file): `ID-decode` and, with a prompt,
/// `ID-prefill`, the ratios of its medians.
pub(super) fn record_model(
    dir: &Path,
    o: &Opts,
    args: &[String],
    ratios: &FormatRatios,
) -> Result<()> {
    let id = o.record_id.as_deref().unwrap_or("model");
    let (name, pp, tg) = ratios;
    let (p, n) = (o.n_prompt, o.n_gen);
    for (suffix, what, value) in [
        ("decode", format!("decode tg{n} vs llama.cpp"), *tg),
        ("prefill", format!("prefill pp{p} vs llama.cpp"), *pp),
    ] {
        let Some(value) = value else {
            eprintln!("bench-formats: not recording {id}-{suffix}: no ratio measured");
            continue;
        };
        let m = Measurement {
            model: name.clone(),
            synthetic: name.starts_with("synth"),
            value: Some(value),
            note: Some(format!("medians of {} round(s)", o.rounds)),
            ..measurement(o, args, &format!("{id}-{suffix}"), what)
        };
        record_value(dir, m)?;
    }
    Ok(())
}
