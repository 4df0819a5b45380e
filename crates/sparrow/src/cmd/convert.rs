//! `sparrow convert`: split a model into a resident file and a neuron store for flash offload.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use engine::offload::Packing;
use engine::{ModelBundle, ModelFile, WeightFormat};

use crate::ui::{bar, mib};

/// `--pack`.
#[derive(Clone, Copy, clap::ValueEnum)]
pub enum Pack {
    /// Page or full, whichever reads fewer bytes per token.
    Auto,
    /// As many neurons as fit one 4 KiB page.
    Page,
    /// Units of several pages, at least 95% used.
    Full,
    /// One neuron per unit.
    None,
}

/// `--down-format`: a format, or `None` for `auto`.
#[derive(Clone, Copy)]
pub struct DownFormat(Option<WeightFormat>);

fn parse_down_format(s: &str) -> std::result::Result<DownFormat, String> {
    use WeightFormat::*;
    if s.eq_ignore_ascii_case("auto") {
        return Ok(DownFormat(None));
    }
    [Q8_0, Q5_0, Q5_1, Q4_0, Q4_1, F16]
        .into_iter()
        .find(|f| f.name().eq_ignore_ascii_case(s))
        .map(|f| DownFormat(Some(f)))
        .ok_or_else(|| format!("`{s}` is not one of auto, q8_0, q5_0, q5_1, q4_0, q4_1, f16"))
}

#[derive(Args)]
pub struct ConvertArgs {
    /// The GGUF model (default: SmolLM2-135M-Instruct, fetched if absent).
    #[arg(long, short = 'm')]
    pub model: Option<PathBuf>,
    /// Its profile (default: `<model>.sparrow-profile`, made first with `sparrow profile`'s defaults
    /// when it does not exist).
    #[arg(long)]
    pub profile: Option<PathBuf>,
    /// Its predictors, copied next to the resident file (default: `<model>.sparrow-predictor` if it exists).
    #[arg(long)]
    pub predictor: Option<PathBuf>,
    /// Output resident file (default: `<model stem>.resident.gguf` next to the model); the store is
    /// written next to it with the extension `.neurons`.
    #[arg(long, short = 'o')]
    pub out: Option<PathBuf>,
    /// One neuron per 4 KiB page instead of packing neighbours by activation frequency (`--pack none`).
    #[arg(long, conflicts_with = "pack")]
    pub no_pack: bool,
    /// How neurons fill the store's units: `page` (as many as fit a 4 KiB page), `full` (units of
    /// several pages, at least 95% used: the smallest store, more neighbours read per neuron), `none`,
    /// or `auto`: page or full, whichever reads fewer bytes per token by the profile (with the
    /// model's predictors, or every neuron without them).
    #[arg(long, value_enum, default_value = "auto")]
    pub pack: Pack,
    /// Format of the stored down columns: `auto` (Q5_0 for files whose down matrices average under 6
    /// bits per weight, which costs about 0.4% perplexity on SmolLM2 and Qwen2.5-0.5B; else Q8_0), or
    /// q8_0, q5_0, q5_1, q4_0, q4_1, f16.
    #[arg(long, default_value = "auto", value_parser = parse_down_format)]
    pub down_format: DownFormat,
    /// Read back every page of the store and check it.
    #[arg(long)]
    pub verify: bool,
    /// Mixture-of-Experts models: the text whose routing is measured for the bundle's routing
    /// profile (calibrate on a validation split, never a test split) [default: the built-in
    /// calibration text].
    #[arg(long)]
    pub corpus: Option<PathBuf>,
    /// Mixture-of-Experts models: tokens of that text routed.
    #[arg(long, default_value_t = 2048)]
    pub routing_tokens: usize,
    /// ReLU Mixture-of-Experts models: share of each expert's activations (counted on the routed
    /// tokens) that its computed neurons carry; the others are never read. 1 (the default): every
    /// neuron, exact; below 1 reads less and changes the output (docs/benchmarks/moe.md).
    #[arg(long, default_value_t = 1.0, value_parser = recall_in_range)]
    pub expert_recall: f64,
}

fn recall_in_range(s: &str) -> std::result::Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 1.0 => Ok(v),
        _ => Err(format!("{s:?} is not a share in (0, 1]")),
    }
}

/// Runs the subcommand and prints its result.
pub fn run(a: ConvertArgs) -> Result<()> {
    let path = crate::load::model_path(a.model.as_deref(), false)?;
    let file = ModelFile::open(&path)?;
    let bundle = ModelBundle::new(&path);
    if file.config()?.moe.is_some() {
        // A bundle of experts: no neuron profile, the routing is measured instead.
        let out = a.out.clone().unwrap_or_else(|| bundle.resident());
        return crate::cmd::convert_moe::run(&a, &path, &file, &out);
    }
    if a.profile.is_none() && !bundle.profile().exists() {
        // One step from a GGUF to a bundle: the profile `sparrow profile` would make with its
        // defaults (the built-in calibration text, the sparsity that keeps +3% perplexity).
        eprintln!(
            "sparrow: no profile at {}: profiling the model first (`sparrow profile` with its defaults; give --profile to use another)",
            bundle.profile().display()
        );
        #[derive(clap::Parser)]
        struct Defaults {
            #[command(flatten)]
            a: crate::cmd::profile::ProfileArgs,
        }
        let model = path.to_string_lossy().into_owned();
        let d = <Defaults as clap::Parser>::try_parse_from(["profile", "-m", model.as_str()])
            .context("setting up the profile step")?;
        crate::cmd::profile::run(d.a).context("profiling before the conversion")?;
    }
    let profile_path = bundle.existing_profile(
        a.profile.as_deref(),
        "convert orders neurons by the model's profile",
    )?;
    let profile = engine::Profile::load(&profile_path)?;
    let out = a.out.clone().unwrap_or_else(|| bundle.resident());
    // Nothing convert writes may be one of its inputs (`-o m.gguf` once replaced the model and
    // truncated its profile): checked before any work starts. Its new parts get new names; the
    // resident file is the output that replaces a file.
    let pred = bundle.predictor_or(a.predictor.as_deref());
    let mut inputs = vec![path.clone(), profile_path.clone()];
    inputs.extend(pred.clone());
    engine::outputs::guard(&[(&out, engine::outputs::OutputKind::Gguf)], &inputs)?;
    let opts = engine::ConvertOptions {
        packing: match (a.no_pack, a.pack) {
            (true, _) | (_, Pack::None) => Some(Packing::None),
            (_, Pack::Page) => Some(Packing::Page),
            (_, Pack::Full) => Some(Packing::Full),
            (_, Pack::Auto) => None,
        },
        with_predictors: pred.is_some(),
        down_format: a.down_format.0,
        predictor: pred.clone(),
        verify: a.verify,
        keep: inputs,
        ..Default::default()
    };
    let t = Instant::now();
    let b = bar(profile.layers.len() as u64, "layers");
    let r = engine::offload::convert(&file, &profile, &out, &opts, |done, _| {
        b.set_position(done as u64)
    })
    .with_context(|| format!("converting {}", path.display()))?;
    b.finish_and_clear();
    let copied_pred = pred.is_some();
    let l = r.layout;
    let hot: usize = r.hot_neurons.iter().sum();
    println!(
        "resident file {} ({:.1} MiB): embeddings, attention, norms, output{}",
        r.resident.display(),
        mib(r.resident_bytes),
        if r.proxy_bytes > 0 {
            format!(
                ", the output's 2-bit proxy ({:.1} MiB, read instead of the output where it stays on flash)",
                mib(r.proxy_bytes)
            )
        } else {
            String::new()
        }
    );
    println!(
        "neuron store  {} ({:.1} MiB, {:.2}x the {:.1} MiB of FFN matrices in the model): {} neuron(s) of {} bytes (down columns {}) per {}-page unit ({:.0}% of each unit used, {:?} packing), {} hot neurons (batch-1 frequency ≥ {}) first in their layers",
        r.store.display(),
        mib(r.store_bytes),
        r.store_bytes as f64 / r.source_ffn_bytes.max(1) as f64,
        mib(r.source_ffn_bytes),
        l.neurons,
        l.bundle_bytes(),
        r.down_format,
        l.pages,
        100.0 * l.fill(),
        r.packing,
        hot,
        opts.hot_frequency
    );
    for p in &r.removed {
        println!("removed {} (part of the bundle it replaced)", p.display());
    }
    println!(
        "profile{} copied next to it, manifest {}; converted in {:.1} s{}",
        if copied_pred { " and predictors" } else { "" },
        r.parts.manifest.display(),
        t.elapsed().as_secs_f64(),
        if a.verify {
            ", every page verified"
        } else {
            ""
        }
    );
    Ok(())
}
