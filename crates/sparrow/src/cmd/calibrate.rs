//! `sparrow calibrate`: measures this machine for the planner (kernels per format and thread count,
//! DRAM, flash by read size and queue depth, an accelerator when asked) and saves the device
//! profile (`engine::calibrate`).

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use engine::{CalibrateOptions, WeightFormat};

use crate::ui::bar;

#[derive(Args)]
pub struct CalibrateArgs {
    /// Folder for the flash scratch file: on the storage the models are read from [default: the
    /// model cache folder].
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Where to save the profile [default: `device.sparrow-device` in the model cache folder, where
    /// `sparrow plan` looks for it].
    #[arg(long, short = 'o')]
    pub output: Option<PathBuf>,
    /// A few seconds instead of about a minute: small scratch file, short points, two formats (for
    /// trying the commands; plans from it are rough).
    #[arg(long)]
    pub quick: bool,
    /// Print the profile as JSON on stdout as well.
    #[arg(long)]
    pub json: bool,
    /// Weight formats to measure, by name (`q4_0,q5_k,...`), or `all` for every ggml format
    /// [default: Q4_0, Q4_1, Q8_0, Q4_K, Q6_K and Q5_0, or Q4_0 and Q8_0 with --quick].
    #[arg(long, value_delimiter = ',')]
    pub formats: Vec<String>,
    /// Also measure an accelerator for hybrid decode's split (`sparrow plan --sparse --accel`):
    /// `qnn` (libQnnHtp.so then libQnnCpu.so, INT8 weights), `qnn:LIBRARY`, `qnn-f32[:LIBRARY]`.
    /// Measured first: a library that does not load ends the run with its error. The CPU stand-in
    /// (`cpu`) needs no measurement.
    #[arg(long, value_name = "KIND")]
    pub accel: Option<engine::AccelKind>,
}

/// The formats `--formats` names (`None`: the default set).
fn parse_formats(names: &[String]) -> Result<Option<Vec<WeightFormat>>> {
    if names.is_empty() {
        return Ok(None);
    }
    if names.iter().any(|n| n.eq_ignore_ascii_case("all")) {
        return Ok(Some(WeightFormat::GGML.to_vec()));
    }
    let mut out = Vec::new();
    for n in names {
        match WeightFormat::GGML
            .iter()
            .find(|f| f.name().eq_ignore_ascii_case(n.trim()))
        {
            Some(&f) if !out.contains(&f) => out.push(f),
            Some(_) => {}
            None => bail!(
                "--formats: unknown weight format `{n}` (one of {}, or all)",
                WeightFormat::GGML
                    .iter()
                    .map(|f| f.name().to_ascii_lowercase())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
    Ok(Some(out))
}

/// Runs the subcommand and prints its result.
pub fn run(a: CalibrateArgs) -> Result<()> {
    let dir = a.dir.unwrap_or_else(engine::fetch::model_cache_dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let out = a.output.unwrap_or_else(engine::default_device_path);
    engine::outputs::guard::<&std::path::Path>(
        &[(&out, engine::outputs::OutputKind::Device)],
        &[],
    )?;
    let formats = parse_formats(&a.formats)?;
    let mut opts = if a.quick {
        CalibrateOptions::quick(&dir)
    } else {
        CalibrateOptions::new(&dir)
    };
    if let Some(f) = formats {
        opts.formats = f;
    }
    opts.accel = a.accel;
    let b = bar(opts.steps(), "points measured");
    let profile = engine::calibrate(&opts, |line| {
        b.inc(1);
        if b.is_hidden() {
            eprintln!("sparrow: {line}");
        } else {
            b.println(format!("sparrow: {line}"));
        }
    })?;
    b.finish_and_clear();
    profile.save(&out)?;
    eprintln!(
        "sparrow: device profile of {} saved to {}",
        profile.name,
        out.display()
    );
    if a.json {
        println!("{}", serde_json::to_string_pretty(&profile)?);
    }
    Ok(())
}
