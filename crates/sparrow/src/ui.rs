//! Terminal helpers shared by the subcommands: progress bars, Ctrl-C handling, units and names.

use std::io::IsTerminal;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::Result;
use engine::Precision;

/// The name of a precision in reports and JSON (`exact`, `fast`, `int8`, `ggml`).
pub fn precision_name(p: Precision) -> &'static str {
    match p {
        Precision::Exact => "exact",
        Precision::Fast => "fast",
        Precision::Int8 => "int8",
        Precision::Ggml => "ggml",
    }
}

/// Bytes in MiB.
pub fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// A progress bar on stderr (`{pos}/{len} <what>`), hidden when stderr is not a terminal.
pub fn bar(len: u64, what: &str) -> indicatif::ProgressBar {
    let b = indicatif::ProgressBar::new(len);
    b.set_style(
        indicatif::ProgressStyle::with_template(&format!(
            "{{bar:30}} {{pos}}/{{len}} {what}, {{elapsed}} elapsed, ETA {{eta}}"
        ))
        .expect("static template"),
    );
    if !std::io::stderr().is_terminal() {
        b.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    b
}

/// A flag set by the first Ctrl-C (the second quits at once), for long jobs that write at the end.
pub fn stop_flag() -> Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    ctrlc::set_handler(move || {
        if s.swap(true, std::sync::atomic::Ordering::SeqCst) {
            std::process::exit(130);
        }
        eprintln!("\nsparrow: stopping after this window (Ctrl-C again to quit at once); nothing will be written");
    })?;
    Ok(stop)
}
