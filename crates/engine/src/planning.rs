//! The planner's view of a loaded model ([`model_summary`]) and of where its plan lands
//! ([`PlanSettings`]): the seam between `planner` (which knows nothing of models) and the engine.
//!
//! What a model summary holds: the weights outside the FFN (attention as one group, the output
//! matrix, the embedding, whose decode step reads one row), per layer the FFN's neurons with their
//! bytes and firing frequencies (from the activation profile, in the order the neuron cache fills:
//! the store's order for a resident file, hottest first otherwise), the predictors' size, the KV
//! cache per position and what the process holds before any weight. An MoE model's layers are its
//! routed experts instead (one expert-store blob each, hottest first by the routing profile).
//!
//! Over a resident file (an offloaded model) the embedding and the output projection are offered to
//! the planner as one offloadable tensor ([`STREAMED`]): the engine leaves both on flash together
//! (`transformer::stream`: a step reads one embedding row and the whole output projection, in sequential
//! chunks), and the planner keeps them in memory only where that buys the most time per byte.

use std::path::Path;

use kernels_neon::QMatrix;
use planner::{FfnLayer, FormatMacs, ModelSummary, Plan, StepBytes, TensorInfo};
use predictor::Profile;

use crate::bundle::{ffn_store_path, ModelBundle, SparseSidecars};
use crate::error::{EngineError, Result};
use crate::generate::Engine;
use transformer::model::Model;

/// Where `sparrow calibrate` saves this machine's profile and `sparrow plan` looks for it: the model
/// cache folder (the flash the models are read from), `device.sparrow-device`.
pub fn default_device_path() -> std::path::PathBuf {
    model_fetch::model_cache_dir().join("device.sparrow-device")
}

/// Grid steps of the hit curves (the planner sizes each layer's cache in 1/64ths).
pub const GRID: u32 = 64;

/// The planner's name for the embedding and output projection of an offloaded model, which stay on
/// flash together or in memory together.
pub const STREAMED: &str = "token_embd.weight+output.weight";

/// Batch sizes the planner plans for (those the profile has frequencies for, among these).
pub const BATCH_SIZES: [u32; 4] = [1, 2, 4, 8];

fn bytes(m: &tensor_types::QMatrix<'_>) -> u64 {
    m.data().len() as u64
}

/// The planner's summary of `engine`'s model, with the profile and predictors `sidecars` name (a
/// dense model without a profile is summarized with every neuron firing).
pub fn model_summary(engine: &Engine<'_>, sidecars: &SparseSidecars) -> Result<ModelSummary> {
    let model = engine.model();
    if model.config.moe.is_some() {
        return moe_summary(engine);
    }
    let cfg = &model.config;
    // A resident file's own profile and predictors are the ones it names.
    let bundle = ModelBundle::of_model(model)?;
    let profile_path = bundle.profile_or(sidecars.profile.as_deref());
    let profile = if profile_path.is_file() {
        Some(Profile::load(&profile_path)?)
    } else {
        None
    };
    let predictor = if sidecars.no_predictor {
        None
    } else {
        bundle.predictor_or(sidecars.predictor.as_deref())
    };
    let predictor_bytes = predictor
        .as_deref()
        .and_then(|p| std::fs::metadata(p).ok())
        .map_or(0, |m| m.len());
    let store = ffn_store_path(model)?;
    let tensors = tensors(model, store.is_some());
    let batch_sizes: Vec<u32> = match &profile {
        Some(p) => BATCH_SIZES
            .iter()
            .copied()
            .filter(|b| p.batch_sizes.contains(b))
            .collect(),
        // Every neuron fires at every batch size: batched (verification) steps priced dense.
        None => BATCH_SIZES.to_vec(),
    };
    if batch_sizes.first() != Some(&1) {
        return Err(EngineError::Request(format!(
            "{}: the profile has no batch size 1",
            profile_path.display()
        )));
    }
    let freq_of = |layer: usize, order: &[u32]| -> Vec<Vec<f32>> {
        batch_sizes
            .iter()
            .map(|b| match &profile {
                Some(p) => {
                    let bi = p.batch_sizes.iter().position(|x| x == b).unwrap_or(0);
                    let f = &p.layers[layer].freq[bi];
                    order.iter().map(|&n| f[n as usize]).collect()
                }
                None => vec![1.0; order.len()],
            })
            .collect()
    };
    if let Some(p) = &profile {
        if p.layers.len() != cfg.n_layers {
            return Err(EngineError::Request(format!(
                "{}: {} layers, the model has {}",
                profile_path.display(),
                p.layers.len(),
                cfg.n_layers
            )));
        }
    }
    // The store's index, read once (its layers and the prompt step's memory both need it).
    let store_ix = match &store {
        Some(path) => Some(store_index(path)?),
        None => None,
    };
    let layers = match &store_ix {
        Some(ix) => store_layers(ix, &freq_of)?,
        None => memory_layers(model, profile.as_ref(), &freq_of)?,
    };
    Ok(ModelSummary {
        name: model.path().file_name().map_or_else(
            || model.path().display().to_string(),
            |n| n.to_string_lossy().into(),
        ),
        fingerprint: crate::profile::model_fingerprint(model),
        tensors: tensors.clone(),
        predictor_bytes,
        predicted: predictor.is_some() && predictor_bytes > 0,
        // The output-norm score (the default) computes every up row beside the gate rows.
        select_up: profile
            .as_ref()
            .is_none_or(|p| p.score == predictor::ScoreKind::OutputNorm),
        kv_bytes_per_position: cfg.kv_cache_bytes(1, engine.cache_type()),
        process_bytes: process_bytes(model, &tensors, store.is_some()),
        batch_sizes,
        grid: GRID,
        offloaded: store.is_some(),
        // The engine reads ahead where no predictor selects the neurons (its default).
        reads_ahead: store.is_some() && !(predictor.is_some() && predictor_bytes > 0),
        prompt_macs_per_token: cfg.n_layers as f64
            * (cfg.d_model * (2 * cfg.q_dim() + 2 * cfg.kv_dim() + 3 * cfg.d_ff)) as f64,
        down_macs_per_token: (cfg.n_layers * cfg.d_model * cfg.d_ff) as f64,
        attn_macs_per_pair: (cfg.n_layers * 2 * cfg.q_dim()) as f64,
        output_macs: (cfg.d_model * cfg.vocab_size) as f64,
        output_bytes: if model.output_proxy_enabled() {
            transformer::output_proxy::proxy_step_bytes(&model.output)
        } else {
            bytes(&model.output)
        },
        prompt_step_tokens: if store.is_some() {
            offload::budget::OFFLOAD_PROMPT_STEP as u32
        } else {
            0
        },
        prompt_macs: prompt_macs(model, &layers, store.is_some()),
        prompt_step_bytes: match &store_ix {
            Some(ix) => step_bytes(engine, ix),
            None => Vec::new(),
        },
        layers,
    })
}

/// Bytes the accelerator `kind` holds in memory per neuron of a hybrid block over the neuron store
/// of `engine`'s model (what the planner's `Constraints::accel_neuron_bytes` asks); `None` when
/// the FFN is not in a store. The backend is opened without blocks (for QNN: its library loaded).
pub fn accel_neuron_bytes(engine: &Engine<'_>, kind: &crate::AccelKind) -> Result<Option<u64>> {
    let Some(path) = ffn_store_path(engine.model())? else {
        return Ok(None);
    };
    let ix = store_index(&path)?;
    let backend = offload::accel::open(kind, std::iter::empty())?;
    const NEURONS: usize = 1024;
    Ok(Some(
        backend
            .block_bytes(NEURONS, ix.d_model, ix.formats.gate)
            .div_ceil(NEURONS as u64),
    ))
}

/// The index of the neuron store at `path`.
fn store_index(path: &Path) -> Result<neuron_store::StoreIndex> {
    let io = ufs_io::IoEngine::new(ufs_io::IoConfig::default())?;
    let store = neuron_store::NeuronStore::open(&io, path, ufs_io::OpenOptions::default())?;
    Ok(store.index().clone())
}

/// The memory of an offloaded prompt step at each step the engine may take over the store of index
/// `ix` (`budget::offload_prompt_step`'s halvings), as `budget::prompt_step_bytes` counts it with
/// `engine`'s threads and precision and the default chunks.
fn step_bytes(engine: &Engine<'_>, ix: &neuron_store::StoreIndex) -> Vec<StepBytes> {
    let o = engine.options();
    let neurons = offload::OffloadOptions::default().prefill_neurons;
    let mut steps = Vec::new();
    let mut tokens = offload::budget::OFFLOAD_PROMPT_STEP;
    loop {
        steps.push(StepBytes {
            tokens: tokens as u32,
            bytes: offload::budget::prompt_step_bytes(
                &engine.model().config,
                tokens,
                neurons,
                ix.layout.bundle_bytes() as u64,
                ix.formats.down,
                engine.threads(),
                o.precision,
            ),
        });
        if tokens <= offload::budget::OFFLOAD_PROMPT_STEP_MIN {
            return steps;
        }
        tokens /= 2;
    }
}

/// Multiply-adds per prompt token by weight format ([`ModelSummary::prompt_macs`]): every layer's
/// attention matrices and FFN gate and up rows, and apart its FFN down projection (`down`); over a
/// store, the FFN in the store's formats (`layers`).
fn prompt_macs(model: &Model<'_>, layers: &[FfnLayer], offloaded: bool) -> Vec<FormatMacs> {
    let mut by: Vec<FormatMacs> = Vec::new();
    let mut add = |format: &str, macs: f64, down: bool| match by
        .iter_mut()
        .find(|f| f.format == format && f.down == down)
    {
        Some(f) => f.macs += macs,
        None => by.push(FormatMacs {
            format: format.into(),
            macs,
            down,
        }),
    };
    let size = |m: &QMatrix<'_>| (m.rows() * m.cols()) as f64;
    let d = model.config.d_model as f64;
    for (l, fl) in model.layers.iter().zip(layers) {
        for m in [&l.wq, &l.wk, &l.wv, &l.wo] {
            add(m.format().name(), size(m), false);
        }
        if offloaded {
            let ff = f64::from(fl.neurons);
            add(&fl.format, 2.0 * d * ff, false);
            add(fl.sparse_down_format(), d * ff, true);
        } else if let Some(l) = l.ffn.gated() {
            // (memory_layers refused an MoE model before this runs.)
            add(l.gate.format().name(), size(&l.gate), false);
            add(l.up.format().name(), size(&l.up), false);
            add(l.down.format().name(), size(&l.down), true);
        }
    }
    by
}

/// What stays resident whatever the plan, as a budget counts it at load (`SparsePlan`'s
/// `Resident`): the process now, set up but before decoding, besides the model file's pages; the
/// tensor data that none of `tensors` nor the FFN covers (norms, biases), which the budget counts
/// with the file (the header's pages are handed back after loading); and, for an offloaded model, the
/// buffers the embedding and output are streamed through when they stay on flash.
fn process_bytes(model: &Model<'_>, tensors: &[TensorInfo], offloaded: bool) -> u64 {
    let process = crate::sys::rss_besides(model.path())
        .or_else(crate::sys::rss_bytes)
        .unwrap_or(0);
    let file = std::fs::metadata(model.path())
        .map_or(0, |m| m.len())
        .saturating_sub(model.header_bytes());
    // The output's proxy is read from flash or not at all, never held.
    let covered = tensors.iter().map(|t| t.bytes).sum::<u64>()
        + offload::budget::ffn_weight_bytes(model) as u64
        + model.output_proxy().map_or(0, |p| p.data().len() as u64);
    let streaming = if offloaded {
        transformer::stream::STREAM_RESIDENT_BYTES
    } else {
        0
    };
    process + file.saturating_sub(covered) + streaming
}

/// The tensors outside the FFN as the planner sees them: the attention matrices (read whole each
/// step), then the output projection and the embedding, as one offloadable tensor ([`STREAMED`])
/// for an offloaded model, else as two that stay in memory.
fn tensors(model: &Model<'_>, offloaded: bool) -> Vec<TensorInfo> {
    let attention: u64 = model
        .layers
        .iter()
        .map(|l| bytes(&l.wq) + bytes(&l.wk) + bytes(&l.wv) + bytes(&l.wo))
        .sum();
    let mut tensors = vec![TensorInfo {
        name: "attention".into(),
        format: model.layers[0].wq.format().name().into(),
        bytes: attention,
        touched_bytes: attention,
        offloadable: false,
        computed: true,
    }];
    let (embed, output) = (bytes(&model.embed), bytes(&model.output));
    let row = embed / model.embed.rows().max(1) as u64;
    let untied = if model.tied_embeddings { 0 } else { output };
    if offloaded {
        // Both on flash or both in memory: a step reads the output whole (sequential chunks) and
        // one embedding row; in memory they hold the embedding and, untied, the output.
        // Through the proxy a step reads the proxy and its candidate rows, not the whole output.
        let (format, touched) = match model
            .output_proxy()
            .filter(|_| model.output_proxy_enabled())
        {
            Some(p) => (
                p.format(),
                transformer::output_proxy::proxy_step_bytes(&model.output),
            ),
            None => (model.output.format(), output),
        };
        tensors.push(TensorInfo {
            name: STREAMED.into(),
            format: format.name().into(),
            bytes: embed + untied,
            touched_bytes: touched + row,
            offloadable: true,
            computed: true,
        });
        return tensors;
    }
    tensors.push(TensorInfo {
        name: "output.weight".into(),
        format: model.output.format().name().into(),
        bytes: untied,
        touched_bytes: output,
        offloadable: false,
        computed: true,
    });
    tensors.push(TensorInfo {
        name: "token_embd.weight".into(),
        format: model.embed.format().name().into(),
        bytes: embed,
        touched_bytes: row,
        offloadable: false,
        computed: false,
    });
    tensors
}

type FreqOf<'f> = dyn Fn(usize, &[u32]) -> Vec<Vec<f32>> + 'f;

/// Layers of a resident file: sizes from its neuron store's index, neurons in the store's order.
fn store_layers(ix: &neuron_store::StoreIndex, freq_of: &FreqOf<'_>) -> Result<Vec<FfnLayer>> {
    let unit = ix.layout.unit_bytes() as u64;
    let per_unit = ix.layout.neurons.max(1) as u64;
    ix.layers
        .iter()
        .enumerate()
        .map(|(l, li)| {
            FfnLayer::from_frequencies(
                unit.div_ceil(per_unit),
                ix.formats.gate.name(),
                unit,
                per_unit as u32,
                &freq_of(l, &li.order),
                GRID,
            )
            .map(|f| {
                f.with_parts(
                    (ix.layout.gate_row + ix.layout.up_row) as u64,
                    ix.layout.down_row as u64,
                    ix.formats.down.name(),
                )
            })
            .map_err(|e| EngineError::Request(e.to_string()))
        })
        .collect()
}

/// Layers of a model whose FFN is in memory: neurons hottest first (by the profile at batch size 1).
fn memory_layers(
    model: &Model<'_>,
    profile: Option<&Profile>,
    freq_of: &FreqOf<'_>,
) -> Result<Vec<FfnLayer>> {
    model
        .layers
        .iter()
        .enumerate()
        .map(|(l, _)| {
            let layer = model.gated_ffn(l, "the planner (plan, --memory-budget)")?;
            let n = layer.gate.rows();
            let order: Vec<u32> = profile
                .and_then(|p| p.layers[l].hot_order(0))
                .unwrap_or_else(|| (0..n as u32).collect());
            let neuron =
                (bytes(&layer.gate) + bytes(&layer.up) + bytes(&layer.down)) / n.max(1) as u64;
            // In-memory sparse decode reads the down columns transposed into its own format.
            let down_format = transformer::transpose::DEFAULT_DOWN_FORMAT;
            let down = down_format.row_bytes(layer.down.rows()).unwrap_or(0) as u64;
            FfnLayer::from_frequencies(
                neuron.max(1),
                layer.gate.format().name(),
                neuron.max(1),
                1,
                &freq_of(l, &order),
                GRID,
            )
            .map(|f| {
                f.with_parts(
                    (bytes(&layer.gate) + bytes(&layer.up)) / n.max(1) as u64,
                    down,
                    down_format.name(),
                )
                .with_dense_down(layer.down.format().name())
            })
            .map_err(|e| EngineError::Request(e.to_string()))
        })
        .collect()
}

/// Expert reads the engine's budget reserves beside an expert cache at most (its queue of reads
/// in flight, `builder/experts.rs`): [`expert_reads_reserved`].
pub const EXPERT_READS_RESERVED: u64 = 32;

/// Bytes of expert reads in flight the budget reserves before it takes fewer than
/// [`EXPERT_READS_RESERVED`] reads (Mixtral-width experts are about 100 MB each).
pub const EXPERT_READ_BYTES_RESERVED: u64 = 96 << 20;

/// Expert reads in flight (and reserved in the budget) for experts of `blob` bytes: 32, fewer
/// where 32 would pass [`EXPERT_READ_BYTES_RESERVED`], at least one.
pub fn expert_reads_reserved(blob: u64) -> u64 {
    (EXPERT_READ_BYTES_RESERVED / blob.max(1)).clamp(1, EXPERT_READS_RESERVED)
}

/// The planner's summary of an MoE model: per layer its routed experts (units of one blob of the
/// expert store each, hottest first by the bundle's routing profile; uniform where there is
/// none), and the routers and shared experts as one resident tensor. Over a resident file the
/// experts are on flash and the plan sizes each layer's expert cache; in memory every expert is
/// resident and only the threads are planned. Every layer must be an MoE layer.
fn moe_summary(engine: &Engine<'_>) -> Result<ModelSummary> {
    let model = engine.model();
    let cfg = &model.config;
    let refuse = |what: &str| {
        EngineError::Request(format!("{}: the planner: {what}", model.path().display()))
    };
    let moes: Vec<_> = model.layers.iter().filter_map(|l| l.ffn.moe()).collect();
    if moes.len() != model.layers.len() {
        return Err(refuse("an MoE model with dense FFN layers is not planned"));
    }
    let parts = match &cfg.ffn_store {
        Some(r) => Some(model_bundle::bundle_parts::BundleParts::of(
            model.path(),
            r,
        )?),
        None => None,
    };
    let to_parts = |gu: usize, down: usize, blob: usize, f: [tensor_types::WeightFormat; 2]| {
        planner::ExpertParts {
            blob_bytes: blob as u64,
            gate_up_bytes: gu as u64,
            down_bytes: down as u64,
            format: f[0].name().into(),
            down_format: f[1].name().into(),
        }
    };
    let (experts, reserve): (Vec<planner::ExpertParts>, u64) = match &parts {
        Some(p) => {
            // An expert store, or a neuron store of ReLU experts: the reads the run makes and the
            // reserve its builder takes (`builder/experts.rs`) come from the same functions.
            let per_layer: Vec<usize> = moes.iter().map(|m| m.weights.n_experts()).collect();
            let shapes = offload::expert_layer_shapes(&p.store, &per_layer)?;
            let blob = offload::expert_read_bytes(&p.store, &per_layer)?;
            let reserve = blob * expert_reads_reserved(blob);
            let layers = shapes.iter().map(|x| {
                let (gu, down) = (x.gate_up_bytes as usize, x.down_bytes as usize);
                to_parts(gu, down, x.read_bytes as usize, x.formats)
            });
            (layers.collect(), reserve)
        }
        None => {
            let layers = moes.iter().map(|m| {
                let e = &m.weights.experts[0];
                let (gu, down) = (bytes(&e.gate) + bytes(&e.up), bytes(&e.down));
                let f = [e.gate.format(), e.down.format()];
                to_parts(gu as usize, down as usize, (gu + down) as usize, f)
            });
            (layers.collect(), 0)
        }
    };
    if experts.len() != moes.len() {
        return Err(refuse("the expert store's layers are not the model's"));
    }
    let routing = parts
        .as_ref()
        .and_then(|p| transformer::moe::RoutingProfile::load(&p.profile).ok())
        .filter(|r| r.counts.len() == moes.len() && r.tokens > 0);
    let batch_sizes = BATCH_SIZES.to_vec();
    let layers = moes
        .iter()
        .zip(&experts)
        .enumerate()
        .map(|(l, (m, x))| {
            let n = m.weights.n_experts();
            let (counts, tokens) = match &routing {
                Some(r) if r.counts[l].len() == n => (r.counts[l].clone(), r.tokens),
                // Uniform: each expert picked by `n_used` of every `n` tokens.
                _ => (vec![m.block.n_used as u64; n], n as u64),
            };
            FfnLayer::from_expert_counts(x, &counts, tokens, &batch_sizes, GRID)
                .map_err(|e| refuse(&e.to_string()))
        })
        .collect::<Result<Vec<_>>>()?;
    let mut tensors = tensors(model, false);
    let process = process_bytes(model, &tensors, false) + reserve;
    let moe_bytes = |m: &&transformer::moe::MoeFfn<'_>| {
        let shared = m.weights.shared.as_ref().map_or(0, |s| {
            bytes(&s.ffn.gate) + bytes(&s.ffn.up) + bytes(&s.ffn.down)
        });
        bytes(&m.weights.router) + shared
    };
    let routers: u64 = moes.iter().map(moe_bytes).sum();
    tensors.push(TensorInfo {
        name: "routers+shared experts".into(),
        format: moes[0].weights.router.format().name().into(),
        bytes: routers,
        touched_bytes: routers,
        offloadable: false,
        computed: true,
    });
    Ok(ModelSummary {
        name: model.path().file_name().map_or_else(
            || model.path().display().to_string(),
            |n| n.to_string_lossy().into(),
        ),
        fingerprint: crate::profile::model_fingerprint(model),
        tensors,
        layers,
        kv_bytes_per_position: cfg.kv_cache_bytes(1, engine.cache_type()),
        process_bytes: process,
        batch_sizes,
        grid: GRID,
        offloaded: parts.is_some(),
        ..ModelSummary::default()
    })
}

/// The settings a plan gives the engine and the offload.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanSettings {
    /// Compute threads.
    pub threads: usize,
    /// Sparse FFN (else dense; a resident file is always sparse).
    pub sparse: bool,
    /// Bytes of the neuron cache.
    pub ffn_cache_bytes: u64,
    /// Reads in flight.
    pub queue_depth: usize,
    /// Core of the I/O thread.
    pub io_core: Option<usize>,
    /// Weight rows per parallel work item (0: automatic).
    pub chunk_rows: usize,
    /// The layers a partly sparse plan keeps dense (`dense_layers[l]`; empty where every layer is
    /// alike), for [`crate::SparseFfn::with_dense_layers`].
    pub dense_layers: Vec<bool>,
    /// Per further batch size of a sparse plan, whether its decode steps run every layer dense
    /// (for [`crate::SparseFfn::with_dense_batches`]; empty for a dense plan).
    pub dense_batches: Vec<(usize, bool)>,
    /// The embedding and the output projection stay on flash ([`STREAMED`] planned not resident).
    pub stream_weights: bool,
}

/// Loads the plan at `path`, checks it was made for `model` (and for this device, when
/// `device_fingerprint` is given), and returns it with the settings it gives.
pub fn load_plan(
    path: &Path,
    model: &Model<'_>,
    device_fingerprint: Option<u64>,
) -> Result<(Plan, PlanSettings)> {
    let plan = Plan::load(path)?;
    plan.check_for(
        path,
        crate::profile::model_fingerprint(model),
        model.config.n_layers,
        device_fingerprint,
    )?;
    let settings = PlanSettings::of(&plan);
    Ok((plan, settings))
}

impl PlanSettings {
    /// The settings `plan` gives (sparse when any layer is, its dense layers kept dense).
    pub fn of(plan: &Plan) -> PlanSettings {
        let sparse = plan.sparse.iter().any(|&s| s);
        PlanSettings {
            threads: plan.threads as usize,
            sparse,
            dense_layers: match sparse && plan.sparse.iter().any(|&s| !s) {
                true => plan.sparse.iter().map(|&s| !s).collect(),
                false => Vec::new(),
            },
            dense_batches: match sparse {
                true => plan
                    .predicted
                    .iter()
                    .skip(1)
                    .map(|p| (p.batch as usize, !p.sparse))
                    .collect(),
                false => Vec::new(),
            },
            ffn_cache_bytes: plan.ffn_cache_bytes,
            queue_depth: plan.queue_depth as usize,
            io_core: plan.io_core.map(|c| c as usize),
            chunk_rows: plan.chunk_rows as usize,
            stream_weights: plan.resident.iter().any(|(n, r)| n == STREAMED && !r),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_experts_reserve_fewer_reads_in_flight() {
        // Qwen3-30B-A3B width (2.53 MiB a read): the full queue.
        assert_eq!(expert_reads_reserved(2_654_208), EXPERT_READS_RESERVED);
        // Mixtral-8x7B width (99 MB a read): one, not 32 (3.1 GB).
        assert_eq!(expert_reads_reserved(99_090_432), 1);
        assert_eq!(expert_reads_reserved(40 << 20), 2);
        assert_eq!(expert_reads_reserved(0), EXPERT_READS_RESERVED);
    }
}
