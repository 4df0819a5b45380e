//! The offline side of flash offload: [`convert`] writes a resident GGUF (the model without its FFN
//! tensors, naming its store) and the neuron store next to it; [`verify`] reads a store back.

use std::path::{Path, PathBuf};

use kernels_neon::WeightFormat;
use model_format::{GgufWriter, MetaValue};
use neuron_store::{BundleLayout, Formats, LayerInput, NeuronStore, Packing, StoreWriter};
use ufs_io::{IoConfig, IoEngine, OpenOptions};

use crate::config::{FFN_STORE_FILE_KEY, FFN_STORE_FINGERPRINT_KEY};
use crate::error::{EngineError, Result};
use crate::fingerprint::model_fingerprint;
use crate::model::{Model, ModelFile};
use crate::transpose::TransposedDown;

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
}

impl Default for ConvertOptions {
    fn default() -> Self {
        ConvertOptions {
            down_format: Some(crate::transpose::DEFAULT_DOWN_FORMAT),
            packing: Some(Packing::Page),
            with_predictors: false,
            hot_frequency: 0.5,
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
        (b + l.down.data().len(), w + l.down.rows() * l.down.cols())
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
    /// [`crate::output_proxy`]).
    pub proxy_bytes: u64,
}

/// The store file written next to `resident`: `<resident stem>.neurons`.
pub fn store_path_for(resident: &Path) -> PathBuf {
    resident.with_extension("neurons")
}

/// Converts `file` (a GGUF model) and its `profile` into `resident` (a GGUF without the FFN tensors,
/// pointing at its store) and the neuron store next to it ([`store_path_for`]). Neurons are stored in
/// descending batch-1 activation frequency (ties by id), so a unit packs neurons of similar firing rate
/// and a layer's hot set is its first units. Both files are written to temporary names and renamed when
/// complete. `progress(layer, layers)` is called as layers are written.
pub fn convert(
    file: &ModelFile,
    profile: &predictor::Profile,
    resident: &Path,
    opts: &ConvertOptions,
    mut progress: impl FnMut(usize, usize),
) -> Result<ConvertReport> {
    let ModelFile::Gguf(gguf) = file else {
        return Err(EngineError::Request(format!(
            "{}: sparrow convert reads GGUF files (convert the HF directory to GGUF first)",
            file.path().display()
        )));
    };
    let model = Model::load(file)?;
    if model.config.ffn_store.is_some() {
        return Err(EngineError::Request(format!(
            "{} is already a resident file (converted)",
            file.path().display()
        )));
    }
    let cfg = &model.config;
    let fingerprint = model_fingerprint(&model);
    let bad_profile = |detail: String| EngineError::BadModel {
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
    let Some(first) = model.layers.first() else {
        return Err(bad_profile("the model has no layers".into()));
    };
    let (gate_f, up_f) = (first.gate.format(), first.up.format());
    if model
        .layers
        .iter()
        .any(|l| l.gate.format() != gate_f || l.up.format() != up_f)
    {
        return Err(EngineError::BadModel {
            path: file.path().to_path_buf(),
            detail:
                "gate/up formats differ between layers; a neuron store needs one format per part"
                    .into(),
        });
    }
    // The transposed down rows and their norms, exactly as in-memory sparse decode has them.
    let down_format = opts.down_format.unwrap_or_else(|| auto_down_format(&model));
    let down = TransposedDown::of(&model, down_format)?;
    let store_path = store_path_for(resident);
    let formats = Formats {
        gate: gate_f,
        up: up_f,
        down: down_format,
    };
    let source_ffn_bytes = crate::budget::ffn_weight_bytes(&model) as u64;
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
    let mut hot_neurons = Vec::with_capacity(cfg.n_layers);
    for (li, layer) in model.layers.iter().enumerate() {
        let freq = &profile.layers[li].freq[0];
        let mut order: Vec<u32> = (0..cfg.d_ff as u32).collect();
        order.sort_by(|&a, &b| {
            freq[b as usize]
                .total_cmp(&freq[a as usize])
                .then(a.cmp(&b))
        });
        let hot = freq.iter().filter(|&&f| f >= opts.hot_frequency).count();
        hot_neurons.push(hot);
        w.add_layer(LayerInput {
            gate: layer.gate.data(),
            up: layer.up.data(),
            down_t: &down.rows[li],
            order,
            hot_neurons: hot,
            down_norms: down.norms[li].clone(),
        })?;
        progress(li + 1, cfg.n_layers);
    }
    w.finish()?;

    // The resident file: all metadata, every tensor but the FFN matrices, the output's proxy.
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
    let ffn = |name: &str| {
        [".ffn_gate.weight", ".ffn_up.weight", ".ffn_down.weight"]
            .iter()
            .any(|s| name.ends_with(s))
    };
    for t in gguf.tensors().filter(|t| !ffn(t.name)) {
        out.tensor(t.name, t.dtype, t.shape, t.data.to_vec())?;
    }
    // The output projection's 2-bit proxy, which a step streaming the output reads instead of it.
    let mut proxy_bytes = 0;
    if crate::output_proxy::proxy_pays(&model.output) {
        let proxy = crate::output_proxy::build_proxy(&model.output)?;
        proxy_bytes = proxy.len() as u64;
        out.tensor(
            crate::output_proxy::OUTPUT_PROXY_TENSOR,
            crate::output_proxy::PROXY_FORMAT,
            &[cfg.vocab_size, crate::output_proxy::proxy_cols(cfg.d_model)],
            proxy,
        )?;
    }
    out.write(resident)?;
    let len = |p: &Path| {
        std::fs::metadata(p)
            .map(|m| m.len())
            .map_err(|source| EngineError::Io {
                path: p.to_path_buf(),
                source,
            })
    };
    Ok(ConvertReport {
        resident: resident.to_path_buf(),
        resident_bytes: len(resident)?,
        store_bytes: len(&store_path)?,
        store: store_path,
        layout,
        packing,
        down_format,
        source_ffn_bytes,
        hot_neurons,
        source_fingerprint: fingerprint,
        proxy_bytes,
    })
}

/// Opens the store next to `resident` and reads and checks every unit (`sparrow convert --verify`).
pub fn verify(resident: &Path) -> Result<()> {
    let io = IoEngine::new(IoConfig::default())?;
    let store = NeuronStore::open(&io, store_path_for(resident), OpenOptions::default())?;
    store.verify_all(&io)?;
    Ok(())
}

/// Bytes of the FFN units in the store at `path` (from the file length; validated on open).
pub fn store_ffn_bytes(path: &Path) -> Result<u64> {
    std::fs::metadata(path)
        .map(|m| m.len())
        .map_err(|source| EngineError::Io {
            path: path.to_path_buf(),
            source,
        })
}
