//! The offline side of flash offload: [`convert`] writes a resident GGUF (the model without its FFN
//! tensors, naming its store) and the neuron store next to it; [`verify`] reads a store back.

use std::path::{Path, PathBuf};

use kernels_neon::WeightFormat;
use model_format::{GgufWriter, MetaValue};
use neuron_store::{BundleLayout, Formats, LayerInput, NeuronStore, Packing, StoreWriter};
use ufs_io::{IoConfig, IoEngine, OpenOptions};

use super::generation::{name_of, remove_replaced, ConvertStep, Generation};
use crate::bundle_parts::BundleParts;
use crate::error::{BundleError, Result};
use crate::manifest::{Manifest, PartRole};
use transformer::config::{
    BUNDLE_MANIFEST_KEY, BUNDLE_PREDICTOR_KEY, BUNDLE_PROFILE_KEY, FFN_STORE_FILE_KEY,
    FFN_STORE_FINGERPRINT_KEY,
};
use transformer::fingerprint::model_fingerprint;
use transformer::model::{Model, ModelFile};
use transformer::transpose::TransposedDown;

/// Settings of [`convert`].
#[derive(Debug, Clone)]
pub struct ConvertOptions {
    /// Format of the stored down rows (the down matrix transposed); `None`: [`auto_down_format`].
    pub down_format: Option<WeightFormat>,
    /// How bundles fill units (default: as many as fit a page); `None`: [`auto_packing`].
    pub packing: Option<Packing>,
    /// Whether predictors will select the neurons read (for [`auto_packing`]: without them every
    /// gate and up row is read each token).
    pub with_predictors: bool,
    /// Neurons whose batch-1 activation frequency is at least this are marked hot in the store.
    pub hot_frequency: f32,
    /// Predictors to carry into the bundle (copied under the bundle's name for them).
    pub predictor: Option<PathBuf>,
    /// Read back every unit of the new store and check it before the bundle is switched to it.
    pub verify: bool,
    /// Files the convert must never remove when it clears the parts of the bundle it replaces (its
    /// inputs: the source model, profile and predictor files).
    pub keep: Vec<PathBuf>,
    /// Fault injection for tests: called after each step ([`ConvertStep`]); an error there fails the
    /// convert at that point as a full disk would. `None` in real use.
    pub fault: Option<fn(ConvertStep) -> std::io::Result<()>>,
}

impl Default for ConvertOptions {
    fn default() -> Self {
        ConvertOptions {
            down_format: Some(transformer::transpose::DEFAULT_DOWN_FORMAT),
            packing: Some(Packing::Page),
            with_predictors: false,
            hot_frequency: 0.5,
            predictor: None,
            verify: false,
            keep: Vec::new(),
            fault: None,
        }
    }
}

/// Of page and full packing ([`Packing`]), the one that reads fewer bytes per token: units hold
/// neurons in descending profiled frequency, a unit is read when any of its neurons is needed (the
/// neurons taken as independent, each needed at its batch-1 frequency with predictors, always
/// without), and the expected bytes of all layers are compared (ties: page). Without predictors
/// that is the smaller store; with them, fewer neighbours read per neuron tends to win.
pub fn auto_packing(
    d_model: usize,
    formats: Formats,
    profile: &predictor::Profile,
    with_predictors: bool,
) -> Result<Packing> {
    // Each layer's batch-1 frequencies in store order (hottest first), sorted once for both.
    let sorted: Vec<Vec<f32>> = profile
        .layers
        .iter()
        .map(|layer| {
            let mut f = layer.freq.first().cloned().unwrap_or_default();
            f.sort_by(|a, b| b.total_cmp(a));
            f
        })
        .collect();
    let cost = |p: Packing| -> Result<f64> {
        let l = BundleLayout::for_packing(d_model, formats, p)?;
        let mut bytes = 0.0;
        for f in &sorted {
            for unit in f.chunks(l.neurons.max(1)) {
                let idle: f64 = if with_predictors {
                    unit.iter()
                        .map(|&x| 1.0 - f64::from(x.clamp(0.0, 1.0)))
                        .product()
                } else {
                    0.0
                };
                bytes += (1.0 - idle) * l.unit_bytes() as f64;
            }
        }
        Ok(bytes)
    };
    let (page, full) = (cost(Packing::Page)?, cost(Packing::Full)?);
    Ok(if full < page {
        Packing::Full
    } else {
        Packing::Page
    })
}

/// The down format of a store no larger per neuron than the file's down matrices: `Q5_0` when the file
/// stores its down matrices in fewer than 6 bits per weight on average (4- and 5-bit files, mixes of
/// Q4_K and Q6_K), `Q8_0` otherwise. Transposing re-quantizes across the other axis, so the format
/// keeps at least a bit more than 4-bit sources (re-quantizing SmolLM2's Q4_1 down to Q4_1 moved top
/// logits by about 7).
pub fn auto_down_format(model: &Model<'_>) -> WeightFormat {
    let (bytes, weights) = model.layers.iter().fold((0usize, 0usize), |(b, w), l| {
        // (convert refuses an MoE model before choosing a format.)
        match l.ffn.gated() {
            Some(f) => (b + f.down.data().len(), w + f.down.rows() * f.down.cols()),
            None => (b, w),
        }
    });
    let bits = 8.0 * bytes as f64 / weights.max(1) as f64;
    if bits < 6.0 && WeightFormat::Q5_0.row_bytes(model.config.d_model).is_some() {
        WeightFormat::Q5_0
    } else {
        WeightFormat::Q8_0
    }
}

/// What [`convert`] wrote.
#[derive(Debug, Clone)]
pub struct ConvertReport {
    /// The resident GGUF (everything but the FFN).
    pub resident: PathBuf,
    /// The neuron store (the FFN).
    pub store: PathBuf,
    /// Bytes of the resident file.
    pub resident_bytes: u64,
    /// Bytes of the store.
    pub store_bytes: u64,
    /// Neurons per unit, pages per unit.
    pub layout: neuron_store::BundleLayout,
    /// The packing used.
    pub packing: Packing,
    /// Format of the stored down rows.
    pub down_format: WeightFormat,
    /// Bytes of the FFN matrices (gate, up, down) in the source file, to set against the store's.
    pub source_ffn_bytes: u64,
    /// Hot neurons marked per layer.
    pub hot_neurons: Vec<usize>,
    /// Fingerprint of the source model (the resident file carries it).
    pub source_fingerprint: u64,
    /// Bytes of the output projection's proxy in the resident file (0: none, it would not pay;
    /// [`transformer::output_proxy`]).
    pub proxy_bytes: u64,
    /// Every part of the new bundle.
    pub parts: BundleParts,
    /// The parts of the bundle it replaced that were removed.
    pub removed: Vec<PathBuf>,
}

/// The neuron store of the resident file `resident`: the one it names when it can be read, else the
/// name an older convert gave it, `<resident stem>.neurons`.
pub fn store_path_for(resident: &Path) -> PathBuf {
    match BundleParts::read(resident) {
        Ok(Some(p)) => p.store,
        _ => resident.with_extension("neurons"),
    }
}

/// What convert calls itself in errors about the model.
pub(super) const CONVERT: &str = "convert (to a bundle)";

/// Converts `file` (a GGUF model) and its `profile` into `resident` (a GGUF without the FFN tensors,
/// pointing at its store) and the neuron store next to it ([`store_path_for`]). Neurons are stored in
/// descending batch-1 activation frequency (ties by id), so a unit packs neurons of similar firing rate
/// and a layer's hot set is its first units. `progress(layer, layers)` is called as layers are written.
///
/// The bundle changes as one transaction: the store, the profile, the predictors
/// ([`ConvertOptions::predictor`]) and the manifest are written under new names
/// (`<stem>.g<pid>-<time>.neurons`, `<resident>.g<pid>-<time>.sparrow-profile`, ...), each synced
/// with its folder; the resident file, which names them, is written to a temporary and renamed over
/// `resident` last: that one rename switches the bundle. Only then are the parts of the bundle it
/// replaced removed. A failure (or a kill) at any step before the rename leaves the earlier bundle
/// as it was (a failure also removes the new parts); after it, the new bundle is complete.
pub fn convert(
    file: &ModelFile,
    profile: &predictor::Profile,
    resident: &Path,
    opts: &ConvertOptions,
    mut progress: impl FnMut(usize, usize),
) -> Result<ConvertReport> {
    let ModelFile::Gguf(gguf) = file else {
        return Err(BundleError::Request(format!(
            "{}: sparrow convert reads GGUF files (convert the HF directory to GGUF first)",
            file.path().display()
        )));
    };
    let model = Model::load(file)?;
    model.refuse_moe(CONVERT)?;
    if model.config.ffn_store.is_some() {
        return Err(BundleError::Request(format!(
            "{} is already a resident file (converted)",
            file.path().display()
        )));
    }
    let cfg = &model.config;
    let fingerprint = model_fingerprint(&model);
    let bad_profile = |detail: String| BundleError::BadModel {
        path: file.path().to_path_buf(),
        detail,
    };
    if profile.model_fingerprint != fingerprint {
        return Err(bad_profile(format!(
            "the profile was made for another model ({}), not this one",
            profile.model
        )));
    }
    if profile.layers.len() != cfg.n_layers
        || profile.layers.iter().any(|l| {
            l.n_neurons as usize != cfg.d_ff || l.freq.first().is_none_or(|f| f.len() != cfg.d_ff)
        })
    {
        return Err(bad_profile(
            "the profile's layer or neuron counts do not match the model".into(),
        ));
    }
    if model.layers.is_empty() {
        return Err(bad_profile("the model has no layers".into()));
    }
    let first = model.gated_ffn(0, CONVERT)?;
    let (gate_f, up_f) = (first.gate.format(), first.up.format());
    if model.layers.iter().any(|l| {
        l.ffn
            .gated()
            .is_none_or(|f| f.gate.format() != gate_f || f.up.format() != up_f)
    }) {
        return Err(BundleError::BadModel {
            path: file.path().to_path_buf(),
            detail:
                "gate/up formats differ between layers; a neuron store needs one format per part"
                    .into(),
        });
    }
    let (report, removed) = replace_bundle(
        resident,
        opts,
        |g| {
            write_bundle(
                &model,
                gguf,
                profile,
                resident,
                opts,
                g,
                fingerprint,
                &mut progress,
            )
        },
        |r: &ConvertReport| &r.parts,
    )?;
    Ok(ConvertReport { removed, ..report })
}

/// A convert as one transaction: `write` makes every new part under a new generation's names and
/// returns the resident file not yet renamed (on failure the generation's parts are removed), the
/// rename of the resident file is the switch (it names every new part), and then the parts of the
/// bundle `resident` was, if it was one, are removed. Returns `write`'s report and what was removed.
pub(super) fn replace_bundle<R>(
    resident: &Path,
    opts: &ConvertOptions,
    write: impl FnOnce(&Generation) -> Result<(R, atomic_out::AtomicFile)>,
    parts: impl FnOnce(&R) -> &BundleParts,
) -> Result<(R, Vec<PathBuf>)> {
    let old = BundleParts::read(resident).ok().flatten();
    let generation = Generation::new(resident)?;
    let (report, pending) = match write(&generation) {
        Ok(w) => w,
        Err(e) => {
            generation.remove();
            return Err(e);
        }
    };
    pending.commit()?;
    fault(opts, ConvertStep::Switched)?;
    let removed = match &old {
        Some(old) => remove_replaced(old, parts(&report), &opts.keep),
        None => Vec::new(),
    };
    Ok((report, removed))
}

/// Runs the test's fault hook after `step`.
pub(super) fn fault(opts: &ConvertOptions, step: ConvertStep) -> Result<()> {
    match opts.fault {
        None => Ok(()),
        Some(f) => f(step).map_err(|source| BundleError::Io {
            path: PathBuf::from(format!("<injected fault after {step:?}>")),
            source,
        }),
    }
}

/// Everything of [`convert`] before the switch: the new parts under `g`'s names and the resident file
/// complete under its temporary name (returned, to be renamed into place).
#[allow(clippy::too_many_arguments)]
fn write_bundle(
    model: &Model<'_>,
    gguf: &model_format::GgufFile,
    profile: &predictor::Profile,
    resident: &Path,
    opts: &ConvertOptions,
    g: &Generation,
    fingerprint: u64,
    progress: &mut impl FnMut(usize, usize),
) -> Result<(ConvertReport, atomic_out::AtomicFile)> {
    let cfg = &model.config;
    let first = model.gated_ffn(0, CONVERT)?;
    let (gate_f, up_f) = (first.gate.format(), first.up.format());
    // The transposed down rows and their norms, exactly as in-memory sparse decode has them.
    let down_format = opts.down_format.unwrap_or_else(|| auto_down_format(model));
    let down = TransposedDown::of(model, down_format)?;
    let store_path = g.store.clone();
    let formats = Formats {
        gate: gate_f,
        up: up_f,
        down: down_format,
    };
    let source_ffn_bytes = offload::budget::ffn_weight_bytes(model) as u64;
    let packing = match opts.packing {
        Some(p) => p,
        None => auto_packing(cfg.d_model, formats, profile, opts.with_predictors)?,
    };
    let mut w = StoreWriter::create_packed(
        &store_path,
        cfg.n_layers,
        cfg.d_model,
        cfg.d_ff,
        formats,
        packing,
    )?;
    let layout = w.layout();
    let hot_neurons = add_layers(model, profile, opts, &down, &mut w, progress)?;
    w.finish()?;
    fault(opts, ConvertStep::Store)?;
    profile.save(&g.profile)?;
    fault(opts, ConvertStep::Profile)?;
    let predictor = match &opts.predictor {
        None => None,
        Some(from) => {
            crate::outputs::copy_file(from, &g.predictor, predictor::MAX_PREDICTOR_BYTES)?;
            fault(opts, ConvertStep::Predictor)?;
            Some(g.predictor.clone())
        }
    };
    if opts.verify {
        let io = IoEngine::new(IoConfig::default())?;
        let store = NeuronStore::open(&io, &store_path, OpenOptions::default())?;
        store.verify_all(&io)?;
    }

    let (out, proxy_bytes) = resident_file(
        model,
        gguf,
        g,
        &store_path,
        fingerprint,
        predictor.as_deref(),
    )?;
    let pending = out.write_pending(resident)?;
    fault(opts, ConvertStep::Resident)?;
    // The manifest describes the resident file under its final name, hashed from its temporary.
    let mut listed = vec![
        (PartRole::Resident, pending.temp_path().to_path_buf()),
        (PartRole::Store, store_path.clone()),
        (PartRole::Profile, g.profile.clone()),
    ];
    listed.extend(predictor.iter().map(|p| (PartRole::Predictor, p.clone())));
    let manifest = Manifest::of_files_named(resident, fingerprint, &listed)?;
    manifest.write_to(&g.manifest)?;
    fault(opts, ConvertStep::Manifest)?;
    let size = |role: PartRole| {
        manifest
            .parts
            .iter()
            .find(|p| p.role == role)
            .map_or(0, |p| p.size)
    };
    let report = ConvertReport {
        resident: resident.to_path_buf(),
        resident_bytes: size(PartRole::Resident),
        store_bytes: size(PartRole::Store),
        store: store_path.clone(),
        layout,
        packing,
        down_format,
        source_ffn_bytes,
        hot_neurons,
        source_fingerprint: fingerprint,
        proxy_bytes,
        parts: BundleParts {
            resident: resident.to_path_buf(),
            store: store_path,
            manifest: g.manifest.clone(),
            profile: g.profile.clone(),
            predictor,
            recorded: true,
        },
        removed: Vec::new(),
    };
    Ok((report, pending))
}

/// Writes every layer's FFN into the store, its neurons ordered by profiled frequency (hottest
/// first); returns each layer's count of hot neurons.
fn add_layers(
    model: &Model<'_>,
    profile: &predictor::Profile,
    opts: &ConvertOptions,
    down: &TransposedDown,
    w: &mut StoreWriter,
    progress: &mut impl FnMut(usize, usize),
) -> Result<Vec<usize>> {
    let cfg = &model.config;
    let mut hot_neurons = Vec::with_capacity(cfg.n_layers);
    for li in 0..model.layers.len() {
        let freq = &profile.layers[li].freq[0];
        let mut order: Vec<u32> = (0..cfg.d_ff as u32).collect();
        order.sort_by(|&a, &b| {
            freq[b as usize]
                .total_cmp(&freq[a as usize])
                .then(a.cmp(&b))
        });
        let hot = freq.iter().filter(|&&f| f >= opts.hot_frequency).count();
        hot_neurons.push(hot);
        let f = model.gated_ffn(li, CONVERT)?;
        w.add_layer(LayerInput {
            gate: f.gate.data(),
            up: f.up.data(),
            down_t: &down.rows[li],
            order,
            hot_neurons: hot,
            down_norms: down.norms[li].clone(),
        })?;
        progress(li + 1, cfg.n_layers);
    }
    Ok(hot_neurons)
}

/// The resident file of a bundle, unwritten: all metadata (plus the names of the bundle's parts
/// and the source's fingerprint), every tensor but the FFN matrices, and the output projection's
/// proxy where it pays; with the proxy's bytes.
pub(super) fn resident_file(
    model: &Model<'_>,
    gguf: &model_format::GgufFile,
    g: &Generation,
    store_path: &Path,
    fingerprint: u64,
    predictor: Option<&Path>,
) -> Result<(GgufWriter, u64)> {
    let cfg = &model.config;
    let mut out = GgufWriter::new();
    for (k, v) in gguf.metadata() {
        if k != "general.alignment" {
            out.metadata(k, v.clone());
        }
    }
    out.alignment(gguf.alignment());
    let store_name = store_path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    out.metadata(FFN_STORE_FILE_KEY, MetaValue::String(store_name));
    out.metadata(FFN_STORE_FINGERPRINT_KEY, MetaValue::U64(fingerprint));
    out.metadata(BUNDLE_MANIFEST_KEY, MetaValue::String(name_of(&g.manifest)));
    out.metadata(BUNDLE_PROFILE_KEY, MetaValue::String(name_of(&g.profile)));
    if let Some(p) = predictor {
        out.metadata(BUNDLE_PREDICTOR_KEY, MetaValue::String(name_of(p)));
    }
    // The FFN matrices of a dense model, the routed experts of an MoE model (its routers and
    // shared experts stay).
    let ffn = |name: &str| {
        [
            ".ffn_gate.weight",
            ".ffn_up.weight",
            ".ffn_down.weight",
            ".ffn_gate_exps.weight",
            ".ffn_up_exps.weight",
            ".ffn_down_exps.weight",
        ]
        .iter()
        .any(|s| name.ends_with(s))
    };
    for t in gguf.tensors().filter(|t| !ffn(t.name)) {
        out.tensor(t.name, t.dtype, t.shape, t.data.to_vec())?;
    }
    // The output projection's 2-bit proxy, which a step streaming the output reads instead of it.
    let mut proxy_bytes = 0;
    if transformer::output_proxy::proxy_pays(&model.output) {
        let proxy = transformer::output_proxy::build_proxy(&model.output)?;
        proxy_bytes = proxy.len() as u64;
        out.tensor(
            transformer::output_proxy::OUTPUT_PROXY_TENSOR,
            transformer::output_proxy::PROXY_FORMAT,
            &[
                cfg.vocab_size,
                transformer::output_proxy::proxy_cols(cfg.d_model),
            ],
            proxy,
        )?;
    }
    Ok((out, proxy_bytes))
}

/// Opens the store next to `resident` (a neuron store, or an expert store) and reads and checks every
/// unit or expert (`sparrow convert --verify`).
pub fn verify(resident: &Path) -> Result<()> {
    let io = IoEngine::new(IoConfig::default())?;
    let path = store_path_for(resident);
    match NeuronStore::open(&io, &path, OpenOptions::default()) {
        Ok(store) => store.verify_all(&io)?,
        // A bundle of experts (an MoE model's convert) has an expert store in the store's place.
        Err(e) => match neuron_store::expert::ExpertStore::open(&io, &path, OpenOptions::default())
        {
            Ok(store) => store.verify_all(&io)?,
            Err(_) => return Err(e.into()),
        },
    }
    Ok(())
}
