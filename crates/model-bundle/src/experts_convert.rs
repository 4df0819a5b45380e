//! `sparrow convert` of a Mixture-of-Experts model: one transaction that writes the expert store
//! (`neuron_store::expert`: every routed expert one aligned blob), the routing profile measured on
//! calibration text ([`RoutingProfile`]), the manifest, and the resident file (the model without its
//! routed experts: attention, norms, routers, shared experts), which names them and is renamed into
//! place last, as the dense [`super::convert()`] does.

use std::path::{Path, PathBuf};

use neuron_store::expert::{ExpertLayerInput, ExpertShape, ExpertStore, ExpertStoreWriter};
use neuron_store::Formats;
use ufs_io::{IoConfig, IoEngine, OpenOptions};

use super::convert::{fault, replace_bundle, resident_file, ConvertOptions, CONVERT};
use super::generation::{ConvertStep, Generation};
use crate::bundle_parts::BundleParts;
use crate::error::{BundleError, Result};
use crate::manifest::{Manifest, PartRole};
use crate::neuron_experts::{self, ReluExperts};
use transformer::fingerprint::model_fingerprint;
use transformer::model::{Model, ModelFile};
use transformer::moe::RoutingProfile;

/// What [`convert_moe`] wrote.
#[derive(Debug, Clone)]
pub struct MoeConvertReport {
    /// The resident GGUF (everything but the routed experts).
    pub resident: PathBuf,
    /// The expert store.
    pub store: PathBuf,
    /// Bytes of the resident file.
    pub resident_bytes: u64,
    /// Bytes of the expert store.
    pub store_bytes: u64,
    /// Bytes of the routed experts in the source file.
    pub source_expert_bytes: u64,
    /// Experts per layer (0: a layer without them).
    pub experts: Vec<usize>,
    /// Bytes of one expert's blob (one read), per layer.
    pub blob_bytes: Vec<usize>,
    /// Whether the experts were written neuron-major (ReLU experts: one neuron-store layer each).
    pub neuron_major: bool,
    /// Fingerprint of the source model.
    pub source_fingerprint: u64,
    /// Every part of the new bundle.
    pub parts: BundleParts,
    /// The parts of the bundle it replaced that were removed.
    pub removed: Vec<PathBuf>,
}

/// Converts `file` (a GGUF MoE model) and its `routing` profile into `resident` and its expert store
/// (see the module docs); `progress(layer, layers)` is called as layers are written. A failure (or a
/// kill) before the final rename leaves an earlier bundle at `resident` as it was.
pub fn convert_moe(
    file: &ModelFile,
    routing: &RoutingProfile,
    resident: &Path,
    opts: &ConvertOptions,
    progress: impl FnMut(usize, usize),
) -> Result<MoeConvertReport> {
    convert_moe_with(
        file,
        routing,
        &ReluExperts::default(),
        resident,
        opts,
        progress,
    )
}

/// [`convert_moe`], with the neuron profile and recall of a ReLU model's neuron-major experts
/// (ignored for SiLU experts).
pub fn convert_moe_with(
    file: &ModelFile,
    routing: &RoutingProfile,
    relu: &ReluExperts<'_>,
    resident: &Path,
    opts: &ConvertOptions,
    mut progress: impl FnMut(usize, usize),
) -> Result<MoeConvertReport> {
    let ModelFile::Gguf(gguf) = file else {
        return Err(BundleError::Request(format!(
            "{}: sparrow convert reads GGUF files (convert the HF directory to GGUF first)",
            file.path().display()
        )));
    };
    let model = Model::load(file)?;
    if model.config.moe.is_none() || model.config.ffn_store.is_some() {
        return Err(BundleError::Request(format!(
            "{}: {CONVERT} of experts needs a Mixture-of-Experts model that is not a resident file",
            file.path().display()
        )));
    }
    let fingerprint = model_fingerprint(&model);
    if routing.model_fingerprint != fingerprint || routing.counts.len() != model.layers.len() {
        return Err(BundleError::BadModel {
            path: file.path().to_path_buf(),
            detail: "the routing profile was measured on another model".into(),
        });
    }
    let (report, removed) = replace_bundle(
        resident,
        opts,
        |g| {
            write_moe_bundle(
                &model,
                file,
                gguf,
                routing,
                relu,
                resident,
                opts,
                g,
                &mut progress,
            )
        },
        |r: &MoeConvertReport| &r.parts,
    )?;
    Ok(MoeConvertReport { removed, ..report })
}

/// The expert shape of every layer of `model` and the three 3-D tensors of each MoE layer.
type LayerTensors<'f> = Option<[model_format::TensorView<'f>; 3]>;

fn expert_tensors<'f>(
    model: &Model<'_>,
    file: &'f ModelFile,
) -> Result<(Vec<ExpertShape>, Vec<LayerTensors<'f>>)> {
    let (mut shapes, mut tensors) = (Vec::new(), Vec::new());
    for (l, layer) in model.layers.iter().enumerate() {
        let Some(moe) = layer.ffn.moe() else {
            shapes.push(ExpertShape {
                n_experts: 0,
                ff: 0,
                formats: Formats {
                    gate: kernels_neon::WeightFormat::F32,
                    up: kernels_neon::WeightFormat::F32,
                    down: kernels_neon::WeightFormat::F32,
                },
            });
            tensors.push(None);
            continue;
        };
        let get = |part: &str| {
            let name = format!("blk.{l}.ffn_{part}_exps.weight");
            file.tensor(&name)
                .ok_or_else(|| BundleError::MissingTensor {
                    path: file.path().to_path_buf(),
                    name,
                })
        };
        let [gate, up, down] = [get("gate")?, get("up")?, get("down")?];
        let first = moe
            .weights
            .experts
            .first()
            .ok_or_else(|| BundleError::BadModel {
                path: file.path().to_path_buf(),
                detail: format!("layer {l} has no experts"),
            })?;
        shapes.push(ExpertShape {
            n_experts: moe.weights.n_experts(),
            ff: first.gate.rows(),
            formats: Formats {
                gate: gate.dtype,
                up: up.dtype,
                down: down.dtype,
            },
        });
        tensors.push(Some([gate, up, down]));
    }
    Ok((shapes, tensors))
}

/// Everything of [`convert_moe`] before the switch.
#[allow(clippy::too_many_arguments)]
fn write_moe_bundle(
    model: &Model<'_>,
    file: &ModelFile,
    gguf: &model_format::GgufFile,
    routing: &RoutingProfile,
    relu: &ReluExperts<'_>,
    resident: &Path,
    opts: &ConvertOptions,
    g: &Generation,
    progress: &mut impl FnMut(usize, usize),
) -> Result<(MoeConvertReport, atomic_out::AtomicFile)> {
    let fingerprint = model_fingerprint(model);
    let (shapes, tensors) = expert_tensors(model, file)?;
    let source_expert_bytes: u64 = tensors
        .iter()
        .flatten()
        .map(|t| t.iter().map(|v| v.data.len() as u64).sum::<u64>())
        .sum();
    let neuron_major = neuron_experts::relu_shape(model).is_some();
    let blob_bytes: Vec<usize> = if neuron_major {
        let index = neuron_experts::write(model, &g.store, relu, progress)?;
        vec![index.layer_bytes(); shapes.len()]
    } else {
        let mut w = ExpertStoreWriter::create(&g.store, model.config.d_model, &shapes)?;
        for (l, t) in tensors.iter().enumerate() {
            let empty: &[u8] = &[];
            let (gate, up, down) = match t {
                Some([a, b, c]) => (a.data, b.data, c.data),
                None => (empty, empty, empty),
            };
            w.add_layer(ExpertLayerInput { gate, up, down })?;
            progress(l + 1, tensors.len());
        }
        let index = w.finish()?;
        (0..shapes.len()).map(|l| index.blob_bytes(l)).collect()
    };
    fault(opts, ConvertStep::Store)?;
    routing.save(&g.profile)?;
    fault(opts, ConvertStep::Profile)?;
    if opts.verify && neuron_major {
        neuron_experts::verify(&g.store)?;
    } else if opts.verify {
        let io = IoEngine::new(IoConfig::default())?;
        ExpertStore::open(&io, &g.store, OpenOptions::default())?.verify_all(&io)?;
    }
    let (out, _proxy) = resident_file(model, gguf, g, &g.store, fingerprint, None)?;
    let pending = out.write_pending(resident)?;
    fault(opts, ConvertStep::Resident)?;
    let listed = vec![
        (PartRole::Resident, pending.temp_path().to_path_buf()),
        (PartRole::Store, g.store.clone()),
        (PartRole::Profile, g.profile.clone()),
    ];
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
    let report = MoeConvertReport {
        resident: resident.to_path_buf(),
        store: g.store.clone(),
        resident_bytes: size(PartRole::Resident),
        store_bytes: size(PartRole::Store),
        source_expert_bytes,
        experts: shapes.iter().map(|s| s.n_experts).collect(),
        blob_bytes,
        neuron_major,
        source_fingerprint: fingerprint,
        parts: BundleParts {
            resident: resident.to_path_buf(),
            store: g.store.clone(),
            manifest: g.manifest.clone(),
            profile: g.profile.clone(),
            predictor: None,
            recorded: true,
        },
        removed: Vec::new(),
    };
    Ok((report, pending))
}
