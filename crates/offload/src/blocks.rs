//! Hybrid decode over the neuron store: an accelerator's blocks made of each layer's leading units
//! (the store keeps neurons hottest first, so these are the layer's hottest neurons), read from
//! flash once at start-up. The accelerator then holds them in its own form, and the neuron cache
//! ([`super::CacheControl::reserve_with`]) gives up that memory and starts its pinned hot prefix
//! after them: the CPU only computes the other neurons, cached or read on demand.

use kernels_neon::{QMatrix, WeightFormat};

use super::chunk::Chunk;
use super::runtime::Offload;
use crate::accel::{FfnBlock, FileRows, StreamedRows};
use crate::error::{kernel, Result};
use transformer::config::Activation;

impl Offload {
    /// `share` of each layer's units (rounded, at least one when `share > 0`): what
    /// [`Offload::accel_units`] is asked for under `--accel-hot`.
    pub fn share_units(&self, share: f64) -> Vec<usize> {
        let ix = self.store.index();
        let units = ix.units_per_layer();
        let want = ((share.clamp(0.0, 1.0) * units as f64).round() as usize)
            .max(usize::from(share > 0.0))
            .min(units);
        vec![want; ix.layers.len()]
    }

    /// The leading units of each layer that hold its hottest `neurons[l]` neurons (rounded to the
    /// nearest whole unit, at least one where any neuron is asked for): what
    /// [`Offload::accel_units`] is asked for under a planned split. One entry per layer of the
    /// store (missing entries are 0).
    pub fn units_for_neurons(&self, neurons: &[u32]) -> Vec<usize> {
        let ix = self.store.index();
        let per_unit = ix.layout.neurons.max(1);
        (0..ix.layers.len())
            .map(|l| {
                let n = neurons.get(l).copied().unwrap_or(0) as usize;
                ((n + per_unit / 2) / per_unit)
                    .max(usize::from(n > 0))
                    .min(ix.units_per_layer())
            })
            .collect()
    }

    /// How many leading units of each layer an accelerator takes: `want[l]`, and no more than an
    /// even split of `budget` bytes over the layers, a block of `k` neurons costing `bytes(k)` (the
    /// backend's [`crate::Accelerator::block_bytes`]). One entry per layer of the store (`want`'s
    /// entries past them are ignored, missing ones are 0).
    pub fn accel_units(
        &self,
        want: &[usize],
        budget: u64,
        bytes: impl Fn(usize) -> u64,
    ) -> Vec<usize> {
        let ix = self.store.index();
        let per_layer = budget / ix.layers.len().max(1) as u64;
        (0..ix.layers.len())
            .map(|l| (l, want.get(l).copied().unwrap_or(0)))
            .map(|(l, w)| {
                let mut neurons = 0;
                let mut take = 0;
                while take < w.min(ix.units_per_layer()) {
                    let k = neurons + ix.neurons_of(l, take).len();
                    if bytes(k) > per_layer {
                        break;
                    }
                    neurons = k;
                    take += 1;
                }
                take
            })
            .collect()
    }

    /// The neurons of units `0..units[l]` of every layer `l`, in store order (hottest first): the
    /// accelerator's block of each layer, in the order [`Offload::accel_blocks`] gives them.
    pub fn leading_neurons(&self, units: &[usize]) -> Vec<Vec<u32>> {
        let ix = self.store.index();
        units
            .iter()
            .enumerate()
            .map(|(l, &u)| {
                (0..u)
                    .flat_map(|i| ix.neurons_of(l, i).iter().copied())
                    .collect()
            })
            .collect()
    }

    /// The block of every layer `l` over units `0..units[l]`, read from the store (checked against
    /// its checksums) and dequantized as the iterator is advanced, so that one layer's f32 block
    /// exists at a time. Gate and up rows also come in the store's format when both share one.
    pub fn accel_blocks<'a>(
        &'a self,
        units: &'a [usize],
        activation: Activation,
    ) -> impl Iterator<Item = Result<FfnBlock>> + 'a {
        units
            .iter()
            .enumerate()
            .map(move |(l, &u)| self.accel_block(l, u, activation))
    }

    fn accel_block(&self, layer: usize, units: usize, activation: Activation) -> Result<FfnBlock> {
        let ix = self.store.index();
        let (d, ub, f) = (ix.d_model, ix.layout.unit_bytes(), ix.formats);
        let buf = self.store.read_units(&self.io, layer, 0..units)?;
        let parts: Vec<(usize, &[u8])> = (0..units)
            .map(|i| (i, &buf[i * ub..(i + 1) * ub]))
            .collect();
        let mut c = Chunk::default();
        c.gather(ix, layer, &parts);
        drop(parts);
        drop(buf);
        let k = c.ids.len();
        fn m(format: WeightFormat, k: usize, d: usize, bytes: &[u8]) -> Result<QMatrix<'_>> {
            QMatrix::new(format, k, d, bytes).map_err(kernel("accelerator block (store)"))
        }
        let (gate, up, down) = StreamedRows {
            gate: m(f.gate, k, d, &c.gate)?,
            up: m(f.up, k, d, &c.up)?,
            down: m(f.down, k, d, &c.down)?,
            activation,
        }
        .dequantized("accelerator block (store)")?;
        let file_rows = if f.gate == f.up {
            FileRows {
                format: f.gate,
                gate: std::mem::take(&mut c.gate),
                up: std::mem::take(&mut c.up),
            }
        } else {
            // No one format for both: a backend takes them from the f32 rows.
            FileRows {
                format: WeightFormat::F32,
                gate: Vec::new(),
                up: Vec::new(),
            }
        };
        Ok(FfnBlock {
            neurons: k,
            d_model: d,
            gate,
            up,
            down,
            activation,
            file_rows,
            prefixes: false,
        })
    }
}
