//! Where [`crate::ExpertOffload`] reads an expert from and how it computes it: an expert store
//! (`neuron_store::expert`, every expert one blob, computed whole), or, for ReLU experts, a neuron
//! store of one pseudo-layer `l·E + e` per expert (`sparrow convert` of a ReLU MoE model), of which
//! the read and computed part is the expert's hot prefix: the units the store marks hot, its most
//! often active neurons by the calibration profile (all of them when it was converted for recall
//! 1). Of those neurons only the ones whose ReLU gate fires get their up row and down column
//! computed; the neurons after the prefix are predicted inactive (the profile is the predictor).

use kernels_neon::{Precision, QMatrix};
use neuron_store::expert::ExpertStore;
use neuron_store::NeuronStore;
use ufs_io::{IoEngine, OpenOptions, ReadRequest};

use crate::error::{kernel, OffloadError, Result};
use transformer::moe::{ExpertFfn, MoeBlock};
use transformer::ops::StepKind;

/// The store an expert offload reads.
pub(crate) enum Source {
    /// Whole experts.
    Whole(ExpertStore),
    /// ReLU experts, neuron-major.
    Neurons(NeuronExperts),
}

/// A neuron store holding one pseudo-layer per expert.
pub(crate) struct NeuronExperts {
    store: NeuronStore,
    /// Per layer: its experts' first pseudo-layer.
    first: Vec<usize>,
    /// Per layer: its experts.
    experts: Vec<usize>,
    /// Per pseudo-layer: units read and computed (the store's hot units; all when none).
    units: Vec<usize>,
}

/// Buffers of [`Source::compute`].
#[derive(Default)]
pub(crate) struct Rows {
    slots: Vec<u32>,
    g: Vec<f32>,
    fired: Vec<u32>,
    u: Vec<f32>,
    coeffs: Vec<f32>,
}

impl Source {
    /// Opens the store at `path`: an expert store, else a neuron store of `experts_per_layer`
    /// pseudo-layers.
    pub(crate) fn open(
        io: &IoEngine,
        path: &std::path::Path,
        experts_per_layer: &[usize],
    ) -> Result<Self> {
        let first_err = match ExpertStore::open(io, path, OpenOptions::default()) {
            Ok(s) => return Ok(Source::Whole(s)),
            Err(e) => e,
        };
        let Ok(store) = NeuronStore::open(io, path, OpenOptions::default()) else {
            return Err(first_err.into());
        };
        let total: usize = experts_per_layer.iter().sum();
        if store.index().layers.len() != total {
            return Err(OffloadError::BadModel {
                path: path.to_path_buf(),
                detail: format!(
                    "the neuron store of experts holds {} experts, the model has {experts_per_layer:?} per layer",
                    store.index().layers.len()
                ),
            });
        }
        let mut first = Vec::with_capacity(experts_per_layer.len());
        let mut at = 0;
        for &n in experts_per_layer {
            first.push(at);
            at += n;
        }
        let all = store.index().units_per_layer();
        let units = store
            .index()
            .layers
            .iter()
            .map(|l| {
                if l.hot_units == 0 {
                    all
                } else {
                    l.hot_units.min(all)
                }
            })
            .collect();
        Ok(Source::Neurons(NeuronExperts {
            store,
            first,
            experts: experts_per_layer.to_vec(),
            units,
        }))
    }

    /// Experts per layer.
    pub(crate) fn shape(&self) -> Vec<usize> {
        match self {
            Source::Whole(s) => {
                let ix = s.index();
                (0..ix.layers.len()).map(|l| ix.experts(l)).collect()
            }
            Source::Neurons(n) => n.experts.clone(),
        }
    }

    /// Bytes of the read of expert `e` of layer `l` (what the cache holds of it).
    pub(crate) fn bytes(&self, l: usize, e: usize) -> usize {
        match self {
            Source::Whole(s) => s.index().blob_bytes(l),
            Source::Neurons(n) => n.units[n.first[l] + e] * n.store.index().layout.unit_bytes(),
        }
    }

    /// Mean bytes of a read of layer `l`'s experts (0 for a layer without experts).
    pub(crate) fn mean_bytes(&self, l: usize) -> usize {
        match self {
            Source::Whole(s) => s.index().blob_bytes(l),
            Source::Neurons(n) => {
                let k = n.experts.get(l).copied().unwrap_or(0);
                let sum: usize = (0..k).map(|e| self.bytes(l, e)).sum();
                sum / k.max(1)
            }
        }
    }

    /// The neurons a step computes of ReLU expert `e` of layer `l` (its hot prefix, by id, in
    /// store order); `None` for whole experts.
    pub(crate) fn computed(&self, l: usize, e: usize) -> Option<&[u32]> {
        let Source::Neurons(n) = self else {
            return None;
        };
        let p = n.pseudo(l, e).ok()?;
        let ix = n.store.index();
        let order = &ix.layers[p].order;
        Some(&order[..(n.units[p] * ix.layout.neurons).min(order.len())])
    }

    /// The read of expert `e` of layer `l`, tagged `tag`.
    pub(crate) fn request(&self, l: usize, e: usize, tag: u64) -> Result<ReadRequest> {
        match self {
            Source::Whole(s) => Ok(s.request(l, e, tag)?),
            Source::Neurons(n) => {
                let p = n.pseudo(l, e)?;
                Ok(ReadRequest {
                    file: n.store.file(),
                    offset: n.store.index().unit_offset(p, 0),
                    len: self.bytes(l, e),
                    tag,
                })
            }
        }
    }

    /// Reads expert `e` of layer `l` (blocking) and checks it.
    pub(crate) fn read(&self, io: &IoEngine, l: usize, e: usize) -> Result<ufs_io::AlignedBuf> {
        let r = self.request(l, e, 0)?;
        let buf = io.read_at(r.file, r.offset, r.len)?;
        self.verify(l, e, &buf)?;
        Ok(buf)
    }

    /// Checks the bytes `b` read for expert `e` of layer `l`.
    pub(crate) fn verify(&self, l: usize, e: usize, b: &[u8]) -> Result<()> {
        match self {
            Source::Whole(s) => Ok(s.verify(l, e, b)?),
            Source::Neurons(n) => {
                let p = n.pseudo(l, e)?;
                let ub = n.store.index().layout.unit_bytes();
                if b.len() != n.units[p] * ub {
                    return Err(OffloadError::Request(format!(
                        "expert {e} of layer {l}: read {} bytes, expected {}",
                        b.len(),
                        n.units[p] * ub
                    )));
                }
                for (u, bytes) in b.chunks(ub).enumerate() {
                    n.store.verify_unit(p, u, bytes)?;
                }
                Ok(())
            }
        }
    }

    /// `ys` (`m × d`) = expert `e` of layer `l`, read as `b`, of the `m` tokens `xs`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn compute(
        &self,
        block: &MoeBlock,
        (l, e): (usize, usize),
        b: &[u8],
        xs: &[f32],
        m: usize,
        (precision, kind): (Precision, StepKind),
        (g, u, ys): (&mut Vec<f32>, &mut Vec<f32>, &mut Vec<f32>),
        rows: &mut Rows,
    ) -> Result<()> {
        match self {
            Source::Whole(s) => {
                let ix = s.index();
                let lx = &ix.layers[l];
                let (ff, d) = (lx.shape.ff, ix.d_model);
                let f = lx.shape.formats;
                let mx = |fmt, rows, cols, r: std::ops::Range<usize>| {
                    QMatrix::new(fmt, rows, cols, &b[r]).map_err(kernel("expert from the store"))
                };
                let ffn = ExpertFfn {
                    gate: mx(f.gate, ff, d, lx.layout.gate_range())?,
                    up: mx(f.up, ff, d, lx.layout.up_range())?,
                    down: mx(f.down, d, ff, lx.layout.down_range())?,
                };
                Ok(block.gated(&ffn, xs, m, precision, kind, g, u, ys)?)
            }
            Source::Neurons(n) => n.compute(n.pseudo(l, e)?, b, xs, m, precision, ys, rows),
        }
    }
}

/// Mean bytes of one expert read from the store at `path` of a model with `experts_per_layer`
/// (a whole expert's blob, or a ReLU expert's hot prefix): what a read in flight holds.
pub fn expert_read_bytes(path: &std::path::Path, experts_per_layer: &[usize]) -> Result<u64> {
    let io = IoEngine::new(ufs_io::IoConfig::default())?;
    let s = Source::open(&io, path, experts_per_layer)?;
    let (mut sum, mut n) = (0u64, 0u64);
    for (l, &k) in experts_per_layer.iter().enumerate() {
        sum += (0..k).map(|e| s.bytes(l, e) as u64).sum::<u64>();
        n += k as u64;
    }
    Ok(sum / n.max(1))
}

/// What the planner needs of one layer's routed experts in a store: the mean bytes of an expert's
/// read, how they divide between gate and up rows and down rows, and the formats of gate and down.
#[derive(Debug, Clone, PartialEq)]
pub struct ExpertLayerShape {
    /// Mean bytes of one expert's read (a whole blob, or a ReLU expert's hot prefix of units).
    pub read_bytes: u64,
    /// Of a read, the bytes of gate and up rows.
    pub gate_up_bytes: u64,
    /// Of a read, the bytes of down rows (down columns, for a neuron store).
    pub down_bytes: u64,
    /// Formats of the gate and the down rows.
    pub formats: [kernels_neon::WeightFormat; 2],
}

/// Per layer, [`ExpertLayerShape`] of the store at `path` of a model with `experts_per_layer`:
/// an expert store, or a neuron store of ReLU experts (whose reads are the experts' hot prefixes).
pub fn expert_layer_shapes(
    path: &std::path::Path,
    experts_per_layer: &[usize],
) -> Result<Vec<ExpertLayerShape>> {
    let io = IoEngine::new(ufs_io::IoConfig::default())?;
    let s = Source::open(&io, path, experts_per_layer)?;
    if s.shape() != experts_per_layer {
        return Err(OffloadError::BadModel {
            path: path.to_path_buf(),
            detail: format!(
                "the expert store holds {:?} experts per layer, the model has {experts_per_layer:?}",
                s.shape()
            ),
        });
    }
    let shapes = (0..experts_per_layer.len()).map(|l| match &s {
        Source::Whole(w) => {
            let lx = &w.index().layers[l];
            let y = &lx.layout;
            ExpertLayerShape {
                read_bytes: y.blob_bytes as u64,
                gate_up_bytes: (y.gate_bytes + y.up_bytes) as u64,
                down_bytes: y.down_bytes as u64,
                formats: [lx.shape.formats.gate, lx.shape.formats.down],
            }
        }
        Source::Neurons(n) => {
            let ix = n.store.index();
            let lay = &ix.layout;
            let read = s.mean_bytes(l) as u64;
            // A unit's bytes are its bundles and padding: the read divides as the bundles do.
            let share = |part: usize| read * part as u64 / lay.unit_bytes().max(1) as u64;
            let (gu, down) = (
                lay.gate_range().len() + lay.up_range().len(),
                lay.down_range().len(),
            );
            ExpertLayerShape {
                read_bytes: read,
                gate_up_bytes: share(gu),
                down_bytes: share(down),
                formats: [ix.formats.gate, ix.formats.down],
            }
        }
    });
    Ok(shapes.collect())
}

impl NeuronExperts {
    fn pseudo(&self, l: usize, e: usize) -> Result<usize> {
        match self.experts.get(l) {
            Some(&k) if e < k => Ok(self.first[l] + e),
            _ => Err(OffloadError::Request(format!(
                "layer {l} has no expert {e} in the neuron store of experts"
            ))),
        }
    }

    /// The prefix `b` of pseudo-layer `p` over the `m` tokens `xs` into `ys`: per unit, the gate
    /// rows of its neurons, then up rows and down columns of those whose ReLU gate fired.
    #[allow(clippy::too_many_arguments)]
    fn compute(
        &self,
        p: usize,
        b: &[u8],
        xs: &[f32],
        m: usize,
        precision: Precision,
        ys: &mut Vec<f32>,
        r: &mut Rows,
    ) -> Result<()> {
        let ix = self.store.index();
        let (lay, f, d) = (&ix.layout, ix.formats, ix.d_model);
        let (ub, k) = (lay.unit_bytes(), lay.neurons);
        if ys.len() < m * d {
            ys.resize(m * d, 0.0);
        }
        ys[..m * d].fill(0.0);
        fn mx(
            fmt: kernels_neon::WeightFormat,
            k: usize,
            d: usize,
            b: &[u8],
        ) -> Result<QMatrix<'_>> {
            QMatrix::new(fmt, k, d, b).map_err(kernel("ReLU expert from the neuron store"))
        }
        for t in 0..m {
            let x = &xs[t * d..(t + 1) * d];
            let y = &mut ys[t * d..(t + 1) * d];
            let acts_g = kernels_neon::prepare_acts(f.gate, x, precision);
            let acts_u = kernels_neon::prepare_acts(f.up, x, precision);
            for (u, unit) in b.chunks(ub).enumerate() {
                let members = ix.neurons_of(p, u).len();
                r.slots.clear();
                r.slots.extend(0..members as u32);
                r.g.resize(members, 0.0);
                let gate = mx(f.gate, k, d, &unit[lay.gate_range()])?;
                kernels_neon::matvec_rows_prepared(&acts_g, &gate, &r.slots, &mut r.g)
                    .map_err(kernel("ReLU expert gate"))?;
                r.fired.clear();
                r.fired.extend(
                    r.slots
                        .iter()
                        .zip(&r.g)
                        .filter(|(_, &v)| v > 0.0)
                        .map(|(&s, _)| s),
                );
                if r.fired.is_empty() {
                    continue;
                }
                r.u.resize(r.fired.len(), 0.0);
                let up = mx(f.up, k, d, &unit[lay.up_range()])?;
                kernels_neon::matvec_rows_prepared(&acts_u, &up, &r.fired, &mut r.u)
                    .map_err(kernel("ReLU expert up"))?;
                r.coeffs.clear();
                r.coeffs.extend(
                    r.fired
                        .iter()
                        .zip(&r.u)
                        .map(|(&s, &uv)| r.g[s as usize] * uv),
                );
                let down = mx(f.down, k, d, &unit[lay.down_range()])?;
                kernels_neon::axpy_rows(&down, &r.fired, &r.coeffs, y)
                    .map_err(kernel("ReLU expert down"))?;
            }
        }
        Ok(())
    }
}
