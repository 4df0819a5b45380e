//! What a decode worker does with one unit of the neuron store: check a completed read, read the
//! rest of a two-phase unit only when a gate output can pass, compute the unit's wanted neurons
//! through the shared neuron selector ([`LayerRule::select`]), and keep the unit in the cold region.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use kernels_neon::{PreparedActs, QMatrix, WeightFormat};
use neuron_cache::NeuronId;

use super::runtime::Offload;
use crate::error::{kernel, OffloadError, Result};
use crate::neurons::{GateUpRows, LayerRule, RowCounts, SelectScratch};

/// A wanted neuron: `(unit, slot in the unit, neuron id)`.
pub(super) type Wanted = (u32, u32, u32);

/// Tag bit of a first-page read (two-phase loading).
pub(super) const TAG_HEAD: u64 = 1 << 63;
/// Tag bit of the read of the rest of a unit after its first page.
const TAG_REST: u64 = 1 << 62;
/// The phase bits of a tag.
pub(super) const TAG_PHASES: u64 = TAG_HEAD | TAG_REST;

/// The tag of a read of `unit` of `layer` (phase bits clear).
pub(super) fn tag_of(layer: usize, unit: usize) -> u64 {
    ((layer as u64) << 32) | unit as u64
}

/// A unit being read: its wanted entries and, between the phases of a two-phase read, its first page.
pub(super) struct Pending {
    pub(super) range: Range<usize>,
    pub(super) head: Option<ufs_io::AlignedBuf>,
}

pub(super) fn lock_pending(
    p: &Mutex<HashMap<usize, Pending>>,
) -> MutexGuard<'_, HashMap<usize, Pending>> {
    p.lock().unwrap_or_else(|e| e.into_inner())
}

/// A fixed-point sum ([`kernels_neon::add_fixed`]'s scale, 2^32) back in f32.
#[inline]
pub(super) fn from_fixed(a: i64) -> f32 {
    (a as f64 / kernels_neon::FIXED_SCALE) as f32
}

/// One compute thread's state in [`Offload::decode`].
pub(super) struct Worker {
    /// The sum of what this worker computed for each token of the step (`n × d`), in fixed point
    /// (2^32): each unit (hot,
    /// cached cold or read from flash alike) is summed alone in f32, then added here exactly
    /// ([`Job::compute`]), so the step's sum depends neither on which worker took what, nor on the
    /// order reads completed, nor on which units were cached (f32 sums in arrival order, and later
    /// f32 lanes of the hot units, made greedy text differ from run to run).
    pub(super) acc: Vec<i64>,
    /// The f32 sum of the unit being computed where the down kernel needs one (zero between units).
    unit_out: Vec<f32>,
    pub(super) counts: RowCounts,
    pub(super) wait_ns: u64,
    pub(super) err: Option<OffloadError>,
    scratch: Scratch,
    /// A unit's wanted entries of one token of a step of several.
    sub: Vec<Wanted>,
}

impl Worker {
    /// A worker of a step of `n` tokens of width `d`.
    pub(super) fn new(d: usize, n: usize) -> Self {
        Worker {
            acc: vec![0; d * n],
            unit_out: vec![0.0; d],
            counts: (0, 0, 0),
            wait_ns: 0,
            err: None,
            scratch: Scratch::default(),
            sub: Vec::new(),
        }
    }
}

/// A worker's reusable buffers.
#[derive(Default)]
struct Scratch {
    slots: Vec<u32>,
    g: Vec<f32>,
    keep: Vec<u32>,
    coeffs: Vec<f32>,
    select: SelectScratch,
    gate_up_rows: Vec<u32>,
    gate_up_out: Vec<f32>,
}

/// What every worker of one [`Offload::decode`] shares.
pub(super) struct Job<'a> {
    pub(super) off: &'a Offload,
    pub(super) rule: LayerRule<'a>,
    pub(super) layer: usize,
    /// Each token's activations prepared for the gate rows' format.
    pub(super) acts_g: &'a [PreparedActs<'a>],
    /// Each token's activations prepared for the up rows' format.
    pub(super) acts_u: &'a [PreparedActs<'a>],
    /// The neurons wanted by any token of the step, in store order.
    pub(super) wanted: &'a [Wanted],
    /// In a step of several tokens, whether token `t` wants neuron `j` (`wants[t × d_ff + j]`);
    /// empty for one token, which wants every entry of `wanted`.
    pub(super) wants: &'a [bool],
    pub(super) pending: &'a Mutex<HashMap<usize, Pending>>,
    pub(super) outstanding: &'a AtomicUsize,
    /// Whether units read from flash are kept in the cold region ([`Offload::keeps_cold`]).
    pub(super) keep_cold: bool,
}

impl Offload {
    /// Whether a decode step keeps the units it reads in the cold region: where
    /// [`super::OffloadOptions::cache_cold`] and the region holds at least a layer's units. A
    /// smaller one is a few units of LRU over a stream that comes back only a token later (without
    /// a predictor every unit is wanted every token: Qwen2.5-Coder-0.5B at a 211 MiB budget had a
    /// cold region of under 0.5 MiB, 0% cold hits), and each kept unit cost a copy.
    pub(super) fn keeps_cold(&self) -> bool {
        let ix = self.store.index();
        let layer = ix.layout.unit_bytes() * ix.units_per_layer();
        self.opts.cache_cold && self.cache.lock().cold_capacity() >= layer
    }
}

impl Job<'_> {
    /// Handles a completed read: checks it; for a whole unit (or the rest of a two-phase one) computes
    /// its neurons and keeps it in the cold region; for a first page, reads the rest only if a gate
    /// output survives.
    pub(super) fn completed(&self, done: ufs_io::Completion, w: &mut Worker) {
        let (off, layer) = (self.off, self.layer);
        let phase = done.tag & (TAG_HEAD | TAG_REST);
        let tag = done.tag & !(TAG_PHASES | super::ahead::TAG_AHEAD);
        let u = (tag & 0xffff_ffff) as usize;
        let entry = ((tag >> 32) as usize == layer)
            .then(|| lock_pending(self.pending).remove(&u))
            .flatten();
        let Some(mut entry) = entry.filter(|e| (phase == TAG_REST) == e.head.is_some()) else {
            w.err.get_or_insert(OffloadError::Request(format!(
                "offload: stray completion (tag {:#x})",
                done.tag
            )));
            return;
        };
        let bytes = match done.result {
            Ok(b) => b,
            Err(e) => {
                w.err.get_or_insert(e.into());
                return;
            }
        };
        off.counters
            .bytes_read
            .fetch_add(bytes.len() as u64, Ordering::Relaxed);
        let wanted = &self.wanted[entry.range.clone()];
        let unit: Vec<u8>;
        let full: &[u8] = match (phase, entry.head.take()) {
            (TAG_HEAD, _) => {
                let survives = off
                    .store
                    .verify_head(layer, u, &bytes)
                    .map_err(OffloadError::from)
                    .and_then(|()| self.gate_survives(&bytes, wanted, w));
                match survives {
                    Err(e) => {
                        w.err.get_or_insert(e);
                    }
                    Ok(false) => {
                        off.counters.rest_skipped.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(true) if w.err.is_none() => {
                        entry.head = Some(bytes);
                        self.read_rest(u, entry, w);
                    }
                    Ok(true) => {}
                }
                return;
            }
            (_, Some(head)) => {
                if let Err(e) = off.store.verify_parts(layer, u, &head, &bytes) {
                    w.err.get_or_insert(e.into());
                    return;
                }
                unit = [&head[..], &bytes[..]].concat();
                &unit
            }
            (_, None) => {
                if let Err(e) = off.store.verify_unit(layer, u, &bytes) {
                    w.err.get_or_insert(e.into());
                    return;
                }
                &bytes
            }
        };
        if w.err.is_none() {
            if let Err(e) = self.compute(full, wanted, w) {
                w.err = Some(e);
            }
        }
        if self.keep_cold {
            let data: Arc<[u8]> = Arc::from(full);
            // A full cold region (everything pinned) is not an error: the unit is just not kept.
            let _ = off.cache.insert_neuron(
                NeuronId {
                    layer: layer as u32,
                    neuron: u as u32,
                },
                data,
            );
        }
    }

    /// Phase two of a two-phase read: queues the rest of unit `u` (its first page kept in `entry`).
    fn read_rest(&self, u: usize, entry: Pending, w: &mut Worker) {
        let (off, layer) = (self.off, self.layer);
        let Some(req) = off
            .store
            .rest_request(layer, u, tag_of(layer, u) | TAG_REST)
        else {
            w.err.get_or_insert(OffloadError::Request(format!(
                "offload: unit {u} of layer {layer} has no second part"
            )));
            return;
        };
        lock_pending(self.pending).insert(u, entry);
        // Counted once queued (so nobody waits for a read that failed to queue); this worker goes on
        // claiming until nothing is outstanding, so the read is taken.
        match off.io.submit(req) {
            Ok(()) => {
                self.outstanding.fetch_add(1, Ordering::AcqRel);
            }
            Err(e) => {
                lock_pending(self.pending).remove(&u);
                w.err.get_or_insert(e.into());
            }
        }
    }

    /// Phase one of two-phase loading: the gate rows of the wanted neurons from a unit's first page.
    /// True when any of them can pass the threshold, by the same test [`Job::compute`] applies (so a
    /// unit skipped here would have contributed nothing: [`LayerRule::may_pass`]). Gate rows computed
    /// for a skipped unit are counted here; [`Job::compute`] counts the others.
    fn gate_survives(&self, head: &[u8], wanted: &[Wanted], w: &mut Worker) -> Result<bool> {
        let mut sub = std::mem::take(&mut w.sub);
        let mut any = false;
        for t in 0..self.acts_g.len() {
            let mine = self.token_entries(t, wanted, &mut sub);
            if !mine.is_empty() && self.gate_survives_token(head, t, mine, w)? {
                any = true;
                break;
            }
        }
        w.sub = sub;
        Ok(any)
    }

    /// The entries of `wanted` token `t` wants: all of them for a step of one token, else those
    /// `wants` marks (in `sub`).
    fn token_entries<'s>(
        &self,
        t: usize,
        wanted: &'s [Wanted],
        sub: &'s mut Vec<Wanted>,
    ) -> &'s [Wanted] {
        if self.wants.is_empty() {
            return wanted;
        }
        let ff = self.wants.len() / self.acts_g.len();
        let mine = &self.wants[t * ff..(t + 1) * ff];
        sub.clear();
        sub.extend(wanted.iter().filter(|wn| mine[wn.2 as usize]));
        sub
    }

    /// [`Job::gate_survives`] for token `t`.
    fn gate_survives_token(
        &self,
        head: &[u8],
        t: usize,
        wanted: &[Wanted],
        w: &mut Worker,
    ) -> Result<bool> {
        let ix = self.off.store.index();
        let l = &ix.layout;
        let gate = QMatrix::new(
            ix.formats.gate,
            l.neurons,
            ix.d_model,
            head.get(l.gate_range()).unwrap_or(&[]),
        )
        .map_err(kernel("offloaded ffn gate (first page)"))?;
        let s = &mut w.scratch;
        s.slots.clear();
        s.slots.extend(wanted.iter().map(|w| w.1));
        s.g.resize(s.slots.len(), 0.0);
        kernels_neon::matvec_rows_prepared(&self.acts_g[t], &gate, &s.slots, &mut s.g)
            .map_err(kernel("offloaded ffn gate (first page)"))?;
        let any = wanted
            .iter()
            .zip(&s.g)
            .any(|(wn, &g)| self.rule.may_pass(g, wn.2 as usize));
        if !any {
            w.counts.0 += wanted.len();
        }
        Ok(any)
    }

    /// `Σ down_j · v_j` over the wanted `(unit, slot, neuron)` entries of one unit's bytes, summed
    /// in f32 and added to `w.acc` in fixed point ([`kernels_neon::axpy_rows_fixed`], the integers
    /// of [`kernels_neon::add_fixed`]: modulo 2^64, so in any order; an FFN output far below 2^31
    /// keeps the true sum inside i64). A unit none of whose neurons passes adds nothing.
    pub(super) fn compute(&self, bytes: &[u8], wanted: &[Wanted], w: &mut Worker) -> Result<()> {
        let mut sub = std::mem::take(&mut w.sub);
        let mut out = Ok(());
        for t in 0..self.acts_g.len() {
            let mine = self.token_entries(t, wanted, &mut sub);
            if !mine.is_empty() {
                out = self.compute_token(bytes, t, mine, w);
                if out.is_err() {
                    break;
                }
            }
        }
        w.sub = sub;
        out
    }

    /// [`Job::compute`] for token `t`, into its part of `w.acc`.
    fn compute_token(
        &self,
        bytes: &[u8],
        t: usize,
        wanted: &[Wanted],
        w: &mut Worker,
    ) -> Result<()> {
        let ix = self.off.store.index();
        let (l, f) = (&ix.layout, &ix.formats);
        let Scratch {
            slots,
            keep,
            coeffs,
            select,
            gate_up_rows,
            gate_up_out,
            ..
        } = &mut w.scratch;
        let mut src = UnitRows {
            bytes,
            layer: self.layer,
            d: ix.d_model,
            k: l.neurons,
            gate: (f.gate, l.gate_range()),
            up: (f.up, l.up_range()),
            acts_g: &self.acts_g[t],
            acts_u: &self.acts_u[t],
            rows: gate_up_rows,
            out: gate_up_out,
        };
        let down = src.matrix(f.down, l.neurons, l.down_range(), "down")?;
        slots.clear();
        slots.extend(wanted.iter().map(|w| w.1));
        keep.clear();
        coeffs.clear();
        let up_rows = self.rule.select(
            &mut src,
            slots,
            |i| wanted[i].2 as usize,
            select,
            keep,
            coeffs,
        )?;
        if !keep.is_empty() {
            let d = ix.d_model;
            let acc = &mut w.acc[t * d..(t + 1) * d];
            kernels_neon::axpy_rows_fixed(&down, keep, coeffs, &mut w.unit_out, acc)
                .map_err(kernel("offloaded ffn down"))?;
        }
        w.counts.0 += slots.len();
        w.counts.1 += up_rows;
        w.counts.2 += keep.len();
        Ok(())
    }
}

/// The gate and up rows of one unit's bytes (row indices are slots in the unit).
struct UnitRows<'a> {
    bytes: &'a [u8],
    layer: usize,
    d: usize,
    /// Neurons per unit.
    k: usize,
    gate: (WeightFormat, Range<usize>),
    up: (WeightFormat, Range<usize>),
    acts_g: &'a PreparedActs<'a>,
    acts_u: &'a PreparedActs<'a>,
    /// Scratch of the combined gate/up product.
    rows: &'a mut Vec<u32>,
    out: &'a mut Vec<f32>,
}

impl<'a> UnitRows<'a> {
    fn matrix(
        &self,
        fmt: WeightFormat,
        rows: usize,
        range: Range<usize>,
        what: &'static str,
    ) -> Result<QMatrix<'a>> {
        let layer = self.layer;
        QMatrix::new(fmt, rows, self.d, self.bytes.get(range).unwrap_or(&[])).map_err(|e| {
            OffloadError::Kernel {
                context: format!("offloaded ffn {what} (layer {layer})"),
                source: e.into(),
            }
        })
    }
}

impl GateUpRows for UnitRows<'_> {
    fn gate(&mut self, rows: &[u32], g: &mut [f32]) -> Result<()> {
        let m = self.matrix(self.gate.0, self.k, self.gate.1.clone(), "gate")?;
        kernels_neon::matvec_rows_prepared(self.acts_g, &m, rows, g)
            .map_err(kernel("offloaded ffn gate"))
    }

    fn up(&mut self, rows: &[u32], u: &mut [f32]) -> Result<()> {
        let m = self.matrix(self.up.0, self.k, self.up.1.clone(), "up")?;
        kernels_neon::matvec_rows_prepared(self.acts_u, &m, rows, u)
            .map_err(kernel("offloaded ffn up"))
    }

    fn gate_up(&mut self, rows: &[u32], g: &mut [f32], u: &mut [f32]) -> Result<()> {
        if self.gate.0 != self.up.0 {
            self.gate(rows, g)?;
            return self.up(rows, u);
        }
        // Gate and up rows sit back to back in a unit: with one format they are one 2k-row matrix,
        // and one call over gate and up rows shares the activations between them.
        let (k, n) = (self.k, rows.len());
        let gu = self.matrix(
            self.gate.0,
            2 * k,
            self.gate.1.start..self.up.1.end,
            "gate/up",
        )?;
        self.rows.clear();
        self.rows.extend(
            rows.iter()
                .copied()
                .chain(rows.iter().map(|&r| r + k as u32)),
        );
        self.out.resize(2 * n, 0.0);
        kernels_neon::matvec_rows_prepared(self.acts_g, &gu, self.rows, &mut self.out[..2 * n])
            .map_err(kernel("offloaded ffn gate/up"))?;
        g.copy_from_slice(&self.out[..n]);
        u.copy_from_slice(&self.out[n..2 * n]);
        Ok(())
    }
}
