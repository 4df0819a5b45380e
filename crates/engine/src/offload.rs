//! Flash offload (PowerInfer-2 §4): FFN weights in a neuron store on flash, read on demand through
//! `ufs-io` into a `neuron-cache` under a byte budget, computed unit by unit as they arrive.
//!
//! * [`convert`] writes a model plus its activation profile as a *resident file* (a GGUF without the
//!   FFN tensors, naming its store) and a *neuron store* (`neuron-store`: gate row, up row and down
//!   column of each neuron together, hot neurons first, packed into 4 KiB units by activation
//!   frequency).
//! * [`Offload`] is the run-time side, used by [`crate::SparseFfn::from_store`]: at start-up the hot
//!   prefix of every layer is read sequentially into the cache's hot region (whole clusters of units);
//!   the rest of the budget is the cold region (two-queue LRU of single units). A decode step groups the
//!   predicted neurons by unit, computes units found in the cache at once and queues the others on the
//!   I/O thread; completions are computed as they arrive, interleaved with cached units, so flash reads
//!   overlap with compute at unit granularity and there is no barrier between gate, up and down (a unit
//!   holds all three).
//! * Two-phase loading (PowerInfer-2 §4.4): where a unit spans pages (bundles over 4 KiB, e.g. d = 4096)
//!   a miss reads the unit's first page, which holds its gate rows; the rest is read only when a gate
//!   output can pass the threshold (for the output score: a non-zero activation, i.e. not a ReLU zero).
//!   Each part is checked against its own checksum (the store records the first page's CRC too).
//!   Opt-in ([`OffloadOptions::two_phase`]): the second read is in series with the first.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use kernels_neon::{Precision, QMatrix, WeightFormat};
use model_format::{GgufWriter, MetaValue};
use neuron_cache::{ClusterId, NeuronCache, NeuronId};
use neuron_store::{Formats, LayerInput, NeuronStore, StoreWriter};
use ufs_io::{EngineConfig, IoEngine, IoError, OpenOptions};

use crate::config::{FFN_STORE_FILE_KEY, FFN_STORE_FINGERPRINT_KEY};
use crate::error::{kernel, EngineError, Result};
use crate::model::{Model, ModelFile};
use crate::sparse::{Score, SparseFfn};

/// Settings of [`convert`].
#[derive(Debug, Clone)]
pub struct ConvertOptions {
    /// Format of the stored down rows (the down matrix transposed; default that of sparse decode).
    pub down_format: WeightFormat,
    /// At most this many neurons per 4 KiB unit (`usize::MAX`: as many as fit; 1: no packing).
    pub max_neurons_per_unit: usize,
    /// Neurons whose batch-1 activation frequency is at least this are marked hot in the store.
    pub hot_frequency: f32,
}

impl Default for ConvertOptions {
    fn default() -> Self {
        ConvertOptions {
            down_format: crate::sparse::DEFAULT_DOWN_FORMAT,
            max_neurons_per_unit: usize::MAX,
            hot_frequency: 0.5,
        }
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
    /// Hot neurons marked per layer.
    pub hot_neurons: Vec<usize>,
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
    let fingerprint = crate::profile::model_fingerprint(&model);
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
    let sparse = SparseFfn::new(&model, vec![0.0; cfg.n_layers], opts.down_format)?;
    let store_path = store_path_for(resident);
    let formats = Formats {
        gate: gate_f,
        up: up_f,
        down: opts.down_format,
    };
    let mut w = StoreWriter::create_with(
        &store_path,
        cfg.n_layers,
        cfg.d_model,
        cfg.d_ff,
        formats,
        opts.max_neurons_per_unit,
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
            down_t: sparse.down_t_data(li),
            order,
            hot_neurons: hot,
            down_norms: sparse.down_norms(li).to_vec(),
        })?;
        progress(li + 1, cfg.n_layers);
    }
    w.finish()?;

    // The resident file: all metadata and every tensor but the FFN matrices.
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
        hot_neurons,
    })
}

/// Settings of an [`Offload`].
#[derive(Debug, Clone)]
pub struct OffloadOptions {
    /// Bytes of FFN units kept in memory (hot and cold regions together).
    pub ffn_budget: usize,
    /// Share of `ffn_budget` preloaded as each layer's hot prefix (the rest is the cold LRU; default all,
    /// see `sparrow --help`).
    pub hot_share: f32,
    /// Units per hot cluster (read and cached as a whole).
    pub cluster_units: usize,
    /// Unit reads in flight on the I/O thread (default 256). With kernel AIO the device holds up to this
    /// many, coalesced where neighbouring; 32 left the synthetic model's reads latency-bound (0.63x vs
    /// 0.72x of in-memory sparse decode at 256, docs/BENCHMARKS.md).
    pub queue_depth: usize,
    /// Core the I/O thread is pinned to.
    pub pin_core: Option<usize>,
    /// Read with direct I/O (page cache out of play, see `ufs-io`) where the filesystem allows it.
    pub direct: bool,
    /// Keep units read from flash in the cold region (off: every miss is read again; for the ablation).
    pub cache_cold: bool,
    /// Interleave the compute of cached units with outstanding reads (off: wait for all reads of a
    /// layer first; for the ablation).
    pub pipeline: bool,
    /// Two-phase loading (PowerInfer-2 §4.4) of units that span pages: read the first page (the gate
    /// rows) alone, and the rest only if a neuron's gate output survives. Only stores whose gate rows
    /// fit in the first page. Off by default: it saves the bytes of units whose neurons turn out
    /// inactive but puts a second read in series for the others, and with predictors of precision
    /// 0.78 (the synthetic model, docs/BENCHMARKS.md) it measured slower (0.41x vs 0.58x at 50%).
    pub two_phase: bool,
    /// Hand reads to the kernel asynchronously (Linux AIO, `ufs_io::EngineConfig::async_io`), so the
    /// device holds up to `queue_depth` of them at once; off: one blocking read at a time.
    pub async_io: bool,
}

impl Default for OffloadOptions {
    fn default() -> Self {
        OffloadOptions {
            ffn_budget: usize::MAX,
            hot_share: 1.0,
            cluster_units: 16,
            queue_depth: 256,
            pin_core: None,
            direct: true,
            cache_cold: true,
            pipeline: true,
            two_phase: false,
            async_io: true,
        }
    }
}

/// Counters of an [`Offload`] since the last reset.
#[derive(Debug, Clone, Default)]
pub struct OffloadStats {
    /// Decode steps (tokens).
    pub tokens: u64,
    /// Units needed by predicted neurons.
    pub units: u64,
    /// Of those, found in the hot region.
    pub hot_hits: u64,
    /// Found in the cold region.
    pub cold_hits: u64,
    /// Read from flash.
    pub misses: u64,
    /// Bytes read from flash.
    pub bytes_read: u64,
    /// Misses read in two phases whose gate outputs all failed, so the rest of the unit was not read.
    pub rest_skipped: u64,
    /// Seconds the compute thread waited for reads.
    pub io_wait_s: f64,
    /// Seconds in the offloaded FFN (compute plus waits).
    pub ffn_s: f64,
    /// Per token: seconds in the offloaded FFN over all layers.
    pub token_ffn_s: Vec<f64>,
    /// Per token: seconds of that spent waiting for reads.
    pub token_wait_s: Vec<f64>,
    /// Bytes of FFN units resident in the cache now.
    pub resident_bytes: usize,
}

impl OffloadStats {
    /// Share of needed units that had to be read.
    pub fn miss_rate(&self) -> f64 {
        self.misses as f64 / self.units.max(1) as f64
    }
}

#[derive(Default)]
struct Counters {
    tokens: AtomicU64,
    units: AtomicU64,
    hot_hits: AtomicU64,
    cold_hits: AtomicU64,
    misses: AtomicU64,
    bytes_read: AtomicU64,
    rest_skipped: AtomicU64,
    wait_ns: AtomicU64,
    ffn_ns: AtomicU64,
    per_token: Mutex<Vec<(u64, u64)>>,
}

/// The run-time side of flash offload: the store, its I/O thread and the neuron cache.
pub struct Offload {
    io: IoEngine,
    store: NeuronStore,
    cache: Mutex<NeuronCache>,
    /// Per layer: units `0..hot_units[l]` are in hot clusters.
    hot_units: Vec<usize>,
    /// Per layer, per cluster: the hot clusters' bytes (the same allocations the cache accounts for).
    hot: Vec<Vec<Arc<[u8]>>>,
    opts: OffloadOptions,
    counters: Counters,
}

/// Cached units a decode worker takes from the shared counter at a time.
const HIT_RUN: usize = 8;

/// Rows of one layer's FFN computed by [`Offload::decode`]: (gate, up, down).
pub(crate) type RowCounts = (usize, usize, usize);

impl Offload {
    /// Opens the store at `path` (validated), starts the I/O thread and preloads each layer's hot prefix
    /// into the hot region (`hot_share` of `ffn_budget`, split evenly over layers, whole clusters).
    pub fn open(path: &Path, opts: OffloadOptions) -> Result<Self> {
        let io = IoEngine::new(EngineConfig {
            queue_depth: opts.queue_depth.max(1),
            pin_core: opts.pin_core,
            async_io: opts.async_io,
            ..Default::default()
        })?;
        let store = NeuronStore::open(
            &io,
            path,
            OpenOptions {
                direct: opts.direct,
                drop_cache: true,
            },
        )?;
        let ix = store.index();
        let (ub, units) = (ix.layout.unit_bytes(), ix.units_per_layer());
        let budget = opts.ffn_budget.min(ix.ffn_bytes());
        let hot_budget = (budget as f64 * f64::from(opts.hot_share.clamp(0.0, 1.0))) as usize;
        let per_layer = (hot_budget / ix.layers.len() / ub).min(units);
        let mut cache = NeuronCache::new(budget);
        cache.set_hot_bytes(per_layer * ub * ix.layers.len())?;
        let cu = opts.cluster_units.max(1);
        let mut hot = Vec::with_capacity(ix.layers.len());
        for l in 0..ix.layers.len() {
            let mut clusters = Vec::new();
            for (c, start) in (0..per_layer).step_by(cu).enumerate() {
                let buf = store.read_units(&io, l, start..(start + cu).min(per_layer))?;
                let data: Arc<[u8]> = Arc::from(&buf[..]);
                cache.insert_cluster(
                    ClusterId {
                        layer: l as u32,
                        cluster: c as u32,
                    },
                    data.clone(),
                )?;
                clusters.push(data);
            }
            hot.push(clusters);
        }
        Ok(Offload {
            io,
            hot_units: vec![per_layer; ix.layers.len()],
            hot,
            store,
            cache: Mutex::new(cache),
            opts,
            counters: Counters::default(),
        })
    }

    /// The store.
    pub fn store(&self) -> &NeuronStore {
        &self.store
    }

    /// The options in use.
    pub fn options(&self) -> &OffloadOptions {
        &self.opts
    }

    /// The I/O engine (its statistics: latency histogram, requests, merges).
    pub fn io(&self) -> &IoEngine {
        &self.io
    }

    /// Counters since the last [`Offload::reset_stats`].
    pub fn stats(&self) -> OffloadStats {
        let c = &self.counters;
        let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let per = c.per_token.lock().map(|v| v.clone()).unwrap_or_default();
        OffloadStats {
            tokens: ld(&c.tokens),
            units: ld(&c.units),
            hot_hits: ld(&c.hot_hits),
            cold_hits: ld(&c.cold_hits),
            misses: ld(&c.misses),
            bytes_read: ld(&c.bytes_read),
            rest_skipped: ld(&c.rest_skipped),
            io_wait_s: ld(&c.wait_ns) as f64 * 1e-9,
            ffn_s: ld(&c.ffn_ns) as f64 * 1e-9,
            token_ffn_s: per.iter().map(|p| p.0 as f64 * 1e-9).collect(),
            token_wait_s: per.iter().map(|p| p.1 as f64 * 1e-9).collect(),
            resident_bytes: self
                .cache
                .lock()
                .map(|c| c.stats().resident_bytes())
                .unwrap_or(0),
        }
    }

    /// Zeroes the counters (the cache keeps its contents).
    pub fn reset_stats(&self) {
        let c = &self.counters;
        for a in [
            &c.tokens,
            &c.units,
            &c.hot_hits,
            &c.cold_hits,
            &c.misses,
            &c.bytes_read,
            &c.rest_skipped,
            &c.wait_ns,
            &c.ffn_ns,
        ] {
            a.store(0, Ordering::Relaxed);
        }
        if let Ok(mut v) = c.per_token.lock() {
            v.clear();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, NeuronCache> {
        // The cache holds no invariant a panic elsewhere could break half-way: recover from poisoning.
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One token's FFN of `layer` over the `rows` (neuron ids) chosen by the caller's predictor (all
    /// rows without one), with `sp`'s score and threshold: `out = Σ down_j · v_j` over the neurons that
    /// pass. Returns the rows computed of gate, up and down.
    ///
    /// The calling thread looks the units up and queues the misses on the I/O thread; then every thread
    /// of the current rayon pool computes cached units (taking them from a shared counter) and, when
    /// none are left, completed reads (each worker first claims one of the outstanding completions, so
    /// nobody waits for a read that another worker will take). Each worker accumulates its own output;
    /// the outputs are summed at the end. An error stops the computing but not the draining of claimed
    /// reads, so no stale completion is left for the next step.
    pub(crate) fn decode(
        &self,
        sp: &SparseFfn,
        layer: usize,
        rows: &[u32],
        x: &[f32],
        out: &mut [f32],
        precision: Precision,
    ) -> Result<RowCounts> {
        let t0 = Instant::now();
        let ix = self.store.index();
        if layer >= ix.layers.len() || x.len() != ix.d_model || out.len() != ix.d_model {
            return Err(EngineError::Request(format!(
                "offloaded FFN: layer {layer} / width {} does not match the store ({} layers of width {})",
                x.len(),
                ix.layers.len(),
                ix.d_model
            )));
        }
        if let Some(&bad) = rows.iter().find(|&&n| n as usize >= ix.d_ff) {
            return Err(EngineError::Request(format!(
                "offloaded FFN: the predictor chose neuron {bad} of layer {layer}, which has {} neurons",
                ix.d_ff
            )));
        }
        // Group the neurons by unit: (unit, slot, neuron), sorted by unit.
        let mut wanted: Vec<(u32, u32, u32)> = rows
            .iter()
            .map(|&n| {
                let (u, s) = ix.unit_of(layer, n);
                (u as u32, s as u32, n)
            })
            .collect();
        wanted.sort_unstable();
        let mut groups: Vec<(usize, std::ops::Range<usize>)> = Vec::new();
        for (i, w) in wanted.iter().enumerate() {
            match groups.last_mut() {
                Some((u, r)) if *u == w.0 as usize => r.end = i + 1,
                _ => groups.push((w.0 as usize, i..i + 1)),
            }
        }
        let c = &self.counters;
        c.units.fetch_add(groups.len() as u64, Ordering::Relaxed);
        let ub = ix.layout.unit_bytes();
        let cu = self.opts.cluster_units.max(1);
        let mut hits: Vec<(Arc<[u8]>, usize, std::ops::Range<usize>)> =
            Vec::with_capacity(groups.len());
        let mut misses = Vec::new();
        {
            let mut cache = self.lock();
            for (u, r) in groups {
                if u < self.hot_units[layer] {
                    // The hot region is preloaded and never evicted: no LRU bookkeeping needed.
                    c.hot_hits.fetch_add(1, Ordering::Relaxed);
                    hits.push((self.hot[layer][u / cu].clone(), (u % cu) * ub, r));
                } else if let Some(b) = cache.get_neuron(NeuronId {
                    layer: layer as u32,
                    neuron: u as u32,
                }) {
                    c.cold_hits.fetch_add(1, Ordering::Relaxed);
                    hits.push((b, 0, r));
                } else {
                    misses.push((u, r));
                }
            }
        }
        c.misses.fetch_add(misses.len() as u64, Ordering::Relaxed);

        let acts_g = kernels_neon::prepare_acts(ix.formats.gate, x, precision);
        let acts_u = kernels_neon::prepare_acts(ix.formats.up, x, precision);
        // Two-phase loading: a miss of a multi-page unit reads its first page (the gate rows) first.
        let two_phase =
            self.opts.two_phase && ix.layout.pages > 1 && ix.layout.gate_in_first_page();
        let pending: Mutex<HashMap<usize, Pending>> =
            Mutex::new(HashMap::with_capacity(misses.len()));
        // Reads submitted whose completions nobody has taken yet.
        let outstanding = AtomicUsize::new(0);
        let job = Job {
            off: self,
            sp,
            layer,
            acts_g: &acts_g,
            acts_u: &acts_u,
            wanted: &wanted,
            pending: &pending,
            outstanding: &outstanding,
        };
        let mut first_err: Option<EngineError> = None;
        let mut main = Worker::new(ix.d_model);
        // Queue every miss; when the queue is full, take one completion on this thread first (or, when
        // every read queued so far has been taken, wait for the I/O thread to free its slot).
        for (u, r) in misses {
            lock_pending(&pending).insert(
                u,
                Pending {
                    range: r,
                    head: None,
                },
            );
            let req = if two_phase {
                self.store
                    .head_request(layer, u, tag_of(layer, u) | TAG_HEAD)
            } else {
                self.store.unit_request(layer, u, tag_of(layer, u))
            };
            loop {
                let submitted = if outstanding.load(Ordering::Acquire) > 0 {
                    self.io.try_submit(req)
                } else {
                    self.io.submit(req)
                };
                match submitted {
                    Ok(()) => {
                        outstanding.fetch_add(1, Ordering::AcqRel);
                        break;
                    }
                    Err(IoError::QueueFull { .. }) => {
                        outstanding.fetch_sub(1, Ordering::AcqRel);
                        let w0 = Instant::now();
                        let done = self.io.completions().recv();
                        main.wait_ns += w0.elapsed().as_nanos() as u64;
                        match done {
                            Ok(d) => job.completed(d, &mut main),
                            Err(_) => {
                                first_err.get_or_insert(EngineError::Flash(IoError::Stopped));
                                break;
                            }
                        }
                    }
                    Err(e) => {
                        lock_pending(&pending).remove(&u);
                        first_err.get_or_insert(e.into());
                        break;
                    }
                }
            }
        }
        let next_hit = std::sync::atomic::AtomicUsize::new(0);
        if first_err.is_some() {
            main.err = first_err.take();
        }
        // Without the pipeline (ablation): every read queued so far completes before any compute.
        let mut done_first = Vec::new();
        if !self.opts.pipeline {
            while outstanding.load(Ordering::Acquire) > 0 {
                outstanding.fetch_sub(1, Ordering::AcqRel);
                let w0 = Instant::now();
                let d = self.io.completions().recv();
                main.wait_ns += w0.elapsed().as_nanos() as u64;
                match d {
                    Ok(d) => done_first.push(d),
                    Err(_) => {
                        main.err.get_or_insert(EngineError::Flash(IoError::Stopped));
                        outstanding.store(0, Ordering::Release);
                    }
                }
            }
            for d in done_first {
                job.completed(d, &mut main);
            }
        }
        // While reads are outstanding a pread I/O thread needs a core of its own (PowerInfer-2 pins it
        // to one): one compute worker fewer then. An AIO thread only submits and reaps, so every
        // worker computes.
        let threads = rayon::current_num_threads().clamp(1, 8);
        let step_aside =
            outstanding.load(Ordering::Relaxed) > 0 && self.opts.pipeline && !self.io.is_async();
        let workers = if step_aside {
            (threads - 1).max(1)
        } else {
            threads
        };
        let run = |w: &mut Worker| {
            loop {
                // Cached units in runs of HIT_RUN (fewer trips to the shared counter).
                let h = next_hit.fetch_add(HIT_RUN, Ordering::Relaxed);
                if h < hits.len() {
                    for (bytes, at, r) in &hits[h..(h + HIT_RUN).min(hits.len())] {
                        if w.err.is_none() {
                            let res = job.compute(
                                bytes.get(*at..at + ub).unwrap_or(&[]),
                                &wanted[r.clone()],
                                w,
                            );
                            if let Err(e) = res {
                                w.err = Some(e);
                            }
                        }
                    }
                    continue;
                }
                // Claim one outstanding completion, or stop when none is left.
                if outstanding
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
                    .is_err()
                {
                    break;
                }
                let w0 = Instant::now();
                let d = self.io.completions().recv();
                w.wait_ns += w0.elapsed().as_nanos() as u64;
                match d {
                    Ok(d) => job.completed(d, w),
                    Err(_) => {
                        w.err.get_or_insert(EngineError::Flash(IoError::Stopped));
                        outstanding.store(0, Ordering::Release);
                    }
                }
            }
        };
        let mut others: Vec<Worker> = (1..workers).map(|_| Worker::new(ix.d_model)).collect();
        if others.is_empty() {
            run(&mut main);
        } else {
            rayon::scope(|s| {
                for w in others.iter_mut() {
                    s.spawn(|_| run(w));
                }
                run(&mut main);
            });
        }
        out.copy_from_slice(&main.out);
        let mut counts = main.counts;
        let mut wait_ns = main.wait_ns;
        let mut err = main.err;
        for w in others {
            out.iter_mut().zip(&w.out).for_each(|(o, v)| *o += v);
            counts = (
                counts.0 + w.counts.0,
                counts.1 + w.counts.1,
                counts.2 + w.counts.2,
            );
            wait_ns = wait_ns.max(w.wait_ns);
            err = err.or(w.err);
        }
        if let Some(e) = err {
            return Err(e);
        }
        let ns = t0.elapsed().as_nanos() as u64;
        c.ffn_ns.fetch_add(ns, Ordering::Relaxed);
        c.wait_ns.fetch_add(wait_ns, Ordering::Relaxed);
        if let Ok(mut v) = c.per_token.lock() {
            if layer == 0 {
                c.tokens.fetch_add(1, Ordering::Relaxed);
                v.push((0, 0));
            }
            if let Some(last) = v.last_mut() {
                last.0 += ns;
                last.1 += wait_ns;
            }
        }
        Ok(counts)
    }
}

/// One compute thread's state in [`Offload::decode`].
struct Worker {
    out: Vec<f32>,
    counts: RowCounts,
    wait_ns: u64,
    err: Option<EngineError>,
    scratch: Scratch,
}

impl Worker {
    fn new(d: usize) -> Self {
        Worker {
            out: vec![0.0; d],
            counts: (0, 0, 0),
            wait_ns: 0,
            err: None,
            scratch: Scratch::default(),
        }
    }
}

/// Tag bit of a first-page read (two-phase loading).
const TAG_HEAD: u64 = 1 << 63;
/// Tag bit of the read of the rest of a unit after its first page.
const TAG_REST: u64 = 1 << 62;

/// The tag of a read of `unit` of `layer` (phase bits clear).
fn tag_of(layer: usize, unit: usize) -> u64 {
    ((layer as u64) << 32) | unit as u64
}

/// A unit being read: its wanted entries and, between the phases of a two-phase read, its first page.
struct Pending {
    range: std::ops::Range<usize>,
    head: Option<ufs_io::AlignedBuf>,
}

fn lock_pending<'a>(
    p: &'a Mutex<HashMap<usize, Pending>>,
) -> std::sync::MutexGuard<'a, HashMap<usize, Pending>> {
    p.lock().unwrap_or_else(|e| e.into_inner())
}

/// What every worker of one [`Offload::decode`] shares.
struct Job<'a> {
    off: &'a Offload,
    sp: &'a SparseFfn,
    layer: usize,
    acts_g: &'a kernels_neon::PreparedActs<'a>,
    acts_u: &'a kernels_neon::PreparedActs<'a>,
    wanted: &'a [(u32, u32, u32)],
    pending: &'a Mutex<HashMap<usize, Pending>>,
    outstanding: &'a AtomicUsize,
}

impl Job<'_> {
    /// Handles a completed read: checks it; for a whole unit (or the rest of a two-phase one) computes
    /// its neurons and keeps it in the cold region; for a first page, reads the rest only if a gate
    /// output survives.
    fn completed(&self, done: ufs_io::Completion, w: &mut Worker) {
        let (off, layer) = (self.off, self.layer);
        let phase = done.tag & (TAG_HEAD | TAG_REST);
        let tag = done.tag & !(TAG_HEAD | TAG_REST);
        let u = (tag & 0xffff_ffff) as usize;
        let entry = ((tag >> 32) as usize == layer)
            .then(|| lock_pending(self.pending).remove(&u))
            .flatten();
        let Some(mut entry) = entry.filter(|e| (phase == TAG_REST) == e.head.is_some()) else {
            w.err.get_or_insert(EngineError::Request(format!(
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
                    .map_err(EngineError::from)
                    .and_then(|()| self.gate_survives(&bytes, wanted, w));
                match survives {
                    Err(e) => {
                        w.err.get_or_insert(e);
                    }
                    Ok(false) => {
                        off.counters.rest_skipped.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(true) if w.err.is_none() => {
                        let Some(req) =
                            off.store
                                .rest_request(layer, u, tag_of(layer, u) | TAG_REST)
                        else {
                            w.err.get_or_insert(EngineError::Request(format!(
                                "offload: unit {u} of layer {layer} has no second part"
                            )));
                            return;
                        };
                        entry.head = Some(bytes);
                        lock_pending(self.pending).insert(u, entry);
                        // Counted once queued (so nobody waits for a read that failed to queue); this
                        // worker goes on claiming until nothing is outstanding, so the read is taken.
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
        if off.opts.cache_cold {
            let data: Arc<[u8]> = Arc::from(full);
            // A full cold region (everything pinned) is not an error: the unit is just not kept.
            let _ = off.lock().insert_neuron(
                NeuronId {
                    layer: layer as u32,
                    neuron: u as u32,
                },
                data,
            );
        }
    }

    /// Phase one of two-phase loading: the gate rows of the wanted neurons from a unit's first page.
    /// True when any of them can pass the threshold, by the same test [`Job::compute`] applies (so a
    /// unit skipped here would have contributed nothing): for the gate scores the score itself, for
    /// the output score a non-zero activation (ReLU zeros, the case this is for). Gate rows computed
    /// for a skipped unit are counted here; [`Job::compute`] counts the others.
    fn gate_survives(
        &self,
        head: &[u8],
        wanted: &[(u32, u32, u32)],
        w: &mut Worker,
    ) -> Result<bool> {
        let ix = self.off.store.index();
        let (l, layer) = (&ix.layout, self.layer);
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
        kernels_neon::matvec_rows_prepared(self.acts_g, &gate, &s.slots, &mut s.g)
            .map_err(kernel("offloaded ffn gate (first page)"))?;
        let (sp, t, norms) = (
            self.sp,
            self.sp.thresholds()[layer],
            self.sp.down_norms(layer),
        );
        let any = wanted.iter().zip(&s.g).any(|(wn, &g)| {
            let a = sp.act(g);
            match sp.score {
                Score::OutputNorm => a != 0.0 || 0.0 > t,
                score => score.of(a, 0.0, norms[wn.2 as usize]) > t,
            }
        });
        if !any {
            w.counts.0 += wanted.len();
        }
        Ok(any)
    }

    /// `w.out += Σ down_j · v_j` over the wanted `(unit, slot, neuron)` entries of one unit's bytes.
    fn compute(&self, bytes: &[u8], wanted: &[(u32, u32, u32)], w: &mut Worker) -> Result<()> {
        let ix = self.off.store.index();
        let (l, f, d) = (&ix.layout, &ix.formats, ix.d_model);
        let k = l.neurons;
        let layer = self.layer;
        let m = |fmt, rows: usize, range: std::ops::Range<usize>, what: &'static str| {
            QMatrix::new(fmt, rows, d, bytes.get(range).unwrap_or(&[])).map_err(|e| {
                EngineError::Kernel {
                    context: format!("offloaded ffn {what} (layer {layer})"),
                    source: e.into(),
                }
            })
        };
        let (gate, up, down) = (
            m(f.gate, k, l.gate_range(), "gate")?,
            m(f.up, k, l.up_range(), "up")?,
            m(f.down, k, l.down_range(), "down")?,
        );
        let s = &mut w.scratch;
        s.slots.clear();
        s.slots.extend(wanted.iter().map(|w| w.1));
        let n = s.slots.len();
        let (t, norms, sp) = (
            self.sp.thresholds()[self.layer],
            self.sp.down_norms(self.layer),
            self.sp,
        );
        s.keep.clear();
        s.coeffs.clear();
        s.survivors.clear();
        s.acts.clear();
        let up_rows;
        match sp.score {
            Score::OutputNorm => {
                // Gate and up rows sit back to back in a unit: with one format they are one 2k-row
                // matrix, and one call over gate and up rows shares the activations between them.
                if f.gate == f.up {
                    let gu = m(
                        f.gate,
                        2 * k,
                        l.gate_range().start..l.up_range().end,
                        "gate/up",
                    )?;
                    s.survivors.extend(
                        s.slots
                            .iter()
                            .copied()
                            .chain(s.slots.iter().map(|&r| r + k as u32)),
                    );
                    s.g.resize(2 * n, 0.0);
                    kernels_neon::matvec_rows_prepared(self.acts_g, &gu, &s.survivors, &mut s.g)
                        .map_err(kernel("offloaded ffn gate/up"))?;
                    s.u.clear();
                    s.u.extend_from_slice(&s.g[n..]);
                    s.survivors.clear();
                } else {
                    s.g.resize(n, 0.0);
                    kernels_neon::matvec_rows_prepared(self.acts_g, &gate, &s.slots, &mut s.g)
                        .map_err(kernel("offloaded ffn gate"))?;
                    s.u.resize(n, 0.0);
                    kernels_neon::matvec_rows_prepared(self.acts_u, &up, &s.slots, &mut s.u)
                        .map_err(kernel("offloaded ffn up"))?;
                }
                up_rows = n;
                for (i, wn) in wanted.iter().enumerate() {
                    let v = sp.act(s.g[i]) * s.u[i];
                    if v.abs() * norms[wn.2 as usize] > t {
                        s.keep.push(wn.1);
                        s.coeffs.push(v);
                    }
                }
            }
            Score::Gate | Score::GateNorm => {
                // Two phases: gate rows, then up rows of the survivors.
                s.g.resize(n, 0.0);
                kernels_neon::matvec_rows_prepared(self.acts_g, &gate, &s.slots, &mut s.g)
                    .map_err(kernel("offloaded ffn gate"))?;
                for (i, wn) in wanted.iter().enumerate() {
                    let a = sp.act(s.g[i]);
                    if sp.score.of(a, 0.0, norms[wn.2 as usize]) > t {
                        s.survivors.push(wn.1);
                        s.acts.push(a);
                    }
                }
                s.u.resize(s.survivors.len(), 0.0);
                kernels_neon::matvec_rows_prepared(self.acts_u, &up, &s.survivors, &mut s.u)
                    .map_err(kernel("offloaded ffn up"))?;
                up_rows = s.survivors.len();
                for ((&slot, &a), &uv) in s.survivors.iter().zip(&s.acts).zip(&s.u) {
                    let v = a * uv;
                    if v != 0.0 {
                        s.keep.push(slot);
                        s.coeffs.push(v);
                    }
                }
            }
        }
        kernels_neon::axpy_rows(&down, &s.keep, &s.coeffs, &mut w.out)
            .map_err(kernel("offloaded ffn down"))?;
        w.counts.0 += s.slots.len();
        w.counts.1 += up_rows;
        w.counts.2 += s.keep.len();
        Ok(())
    }
}

#[derive(Default)]
struct Scratch {
    slots: Vec<u32>,
    g: Vec<f32>,
    u: Vec<f32>,
    keep: Vec<u32>,
    coeffs: Vec<f32>,
    survivors: Vec<u32>,
    acts: Vec<f32>,
}

/// Opens the store next to `resident` and reads and checks every unit (`sparrow convert --verify`).
pub fn verify(resident: &Path) -> Result<()> {
    let io = IoEngine::new(EngineConfig::default())?;
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
