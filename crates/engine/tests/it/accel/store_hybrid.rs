//! (A module of the `accel` test binary: one link for both.)
//!
//! Hybrid decode over a neuron store: the accelerator's blocks are each layer's leading units (read
//! from the store, `Offload::accel_blocks`), the neuron cache gives up their memory and its pinned
//! hot prefix, which starts after them from then on (`CacheControl::reserve`), and the CPU computes
//! the other neurons from the cache and flash. With zero thresholds and no predictor the store's sparse FFN is dense, so hybrid decode
//! and prompt steps must give its logits (QNN through the test double, and the CPU backend, whose
//! down columns are `Q8_0`), the CPU's decode steps must skip exactly the block's neurons, and the
//! cache's budget must shrink by the blocks' bytes.

use std::path::PathBuf;

use super::common::{logits, rel_drift};
use super::double;
use super::hybrid::engine;
use engine::accel::{open, AccelKind};
use engine::offload::{store_path_for, OffloadOptions};
use engine::{HotSplit, HybridFfn, ModelFile, SparseFfn};

const TOKENS: &[u32] = &[1, 70, 80, 90, 100, 33, 7, 250, 12, 64, 5, 99];

fn converted(name: &str) -> PathBuf {
    super::prefill::converted_in("accel-store-hybrid", name)
}

/// The sparse FFN over `path`'s store with a cache budget of `budget` times the store's size (all
/// of it a pinned hot prefix), zero thresholds.
fn store_sparse(cfg: &engine::ModelConfig, path: &std::path::Path, budget: f64) -> SparseFfn {
    store_sparse_with(cfg, path, budget, 0.0)
}

/// [`store_sparse`] with every layer's threshold `threshold`.
fn store_sparse_with(
    cfg: &engine::ModelConfig,
    path: &std::path::Path,
    budget: f64,
    threshold: f32,
) -> SparseFfn {
    let store = store_path_for(path);
    let ffn = std::fs::metadata(&store).unwrap().len() as f64 * budget;
    SparseFfn::from_store(
        cfg,
        &store,
        vec![threshold; cfg.n_layers],
        OffloadOptions {
            ffn_budget: ffn as usize,
            hot_share: 1.0,
            cluster_units: 2,
            outside_ffn_bytes: 1000,
            ..Default::default()
        },
    )
    .unwrap()
}

#[test]
fn hybrid_decode_over_the_store_is_the_dense_ffn_with_nothing_skipped() {
    for name in [
        "tiny-llama-silu-q4_0.gguf",
        "tiny-llama-relu-q8_0.gguf",
        "tiny-qwen2-q4_1.gguf",
    ] {
        let path = converted(name);
        let resident = ModelFile::open(&path).unwrap();
        let mut eng = engine(&resident);
        let cfg = eng.model().config.clone();
        eng.set_sparse(Some(store_sparse(&cfg, &path, 0.5)));
        let want: Vec<Vec<f32>> = [false, true].map(|b| logits(&eng, TOKENS, b)).to_vec();
        eng.set_sparse(None);
        let kinds = [
            AccelKind::new("qnn", Some("f32"), Some(double())),
            AccelKind::cpu(),
        ];
        for kind in kinds {
            // f32 blocks take 3.5 times the store's bytes here: a budget past the FFN leaves
            // them room beside the cache.
            let budget = if kind == AccelKind::cpu() { 0.9 } else { 4.0 };
            let mut sp = store_sparse(&cfg, &path, budget);
            let off = sp.offload_mut().unwrap();
            let control = off.control();
            let before = control.report();
            assert!(
                before.cache_bytes > 0,
                "{name}: the hot prefix is preloaded"
            );
            let probe = open(&kind, std::iter::empty()).unwrap();
            let ix = off.store().index();
            let (d, format) = (ix.d_model, ix.formats.gate);
            let per_layer = before.cache_asked / cfg.n_layers as u64;
            let units = off.accel_units(&off.share_units(0.25), before.cache_asked, |k| {
                probe.block_bytes(k, d, format)
            });
            let order = off.leading_neurons(&units);
            let total = ix.units_per_layer();
            let want_units = ((total as f64 * 0.25).round() as usize).max(1);
            for (l, (&u, n)) in units.iter().zip(&order).enumerate() {
                assert!(u > 0, "{name} {kind:?}: layer {l} gets no unit");
                assert!(probe.block_bytes(n.len(), d, format) <= per_layer);
                // A quarter of the units, or as many as the cache's share of the layer holds.
                assert!(
                    u == want_units
                        || probe.block_bytes(n.len() + ix.neurons_of(l, u).len(), d, format)
                            > per_layer,
                    "{name} {kind:?}: layer {l} takes {u} units"
                );
            }
            let bytes: u64 = order
                .iter()
                .map(|n| probe.block_bytes(n.len(), d, format))
                .sum();
            control.reserve(bytes, &units).unwrap();
            let after = control.report();
            assert_eq!(after.cache_asked, before.cache_asked - bytes, "{name}");
            assert_eq!(
                after.cache_budget,
                after.cache_asked.min(after.ffn_bytes),
                "{name}"
            );
            assert_eq!(after.minimum, before.minimum + bytes, "{name}");
            if before.cache_asked <= before.ffn_bytes {
                // The process budget stays what it was: the blocks moved from cache to resident.
                assert_eq!(after.memory_budget, before.memory_budget, "{name}");
            }
            // Each layer's pinned prefix now starts after the accelerator's units: as many as the
            // rest of the budget holds, up to the layer's end.
            let ub = ix.layout.unit_bytes() as u64;
            let per_layer = after.cache_budget / cfg.n_layers as u64 / ub;
            let hot: u64 = units
                .iter()
                .map(|&u| per_layer.min((total - u) as u64))
                .sum();
            assert!(hot > 0, "{name} {kind:?}: no hot prefix left to test");
            assert_eq!(
                off.stats().resident_bytes as u64,
                hot * ub,
                "{name} {kind:?}"
            );
            let activation = cfg.activation;
            let accel = open(&kind, off.accel_blocks(&units, activation)).unwrap();
            for (l, n) in order.iter().enumerate() {
                assert_eq!(accel.block_neurons(l), n.len());
            }
            let split = HotSplit::fixed(order.clone());
            eng.set_hybrid(Some(
                HybridFfn::new(sp, accel, eng.model(), &split).unwrap(),
            ));
            let tol = if kind == AccelKind::cpu() { 2e-2 } else { 1e-4 };
            for (batched, want) in [false, true].into_iter().zip(&want) {
                let d = rel_drift(&logits(&eng, TOKENS, batched), want);
                assert!(d < tol, "{name} {kind:?}, batched={batched}: drift {d}");
            }
            let h = eng.hybrid().unwrap();
            assert_eq!(h.failure(), None);
            // Decode steps: the CPU computed every neuron but the block's (layer 0's share).
            let cold = (cfg.d_ff - order[0].len()) as f64 / cfg.d_ff as f64;
            let st = h.sparse().stats();
            assert!(
                (st.gate_frac() - cold).abs() < 1e-9,
                "{name} {kind:?}: gate share {} for a cold share {cold}",
                st.gate_frac()
            );
            let control = h.sparse().offload().unwrap().control();
            let cache = control.report();
            assert!(cache.cache_bytes <= cache.cache_budget, "{name}: {cache:?}");
            // A live budget (the server's) after the reservation: the blocks stay counted as
            // resident, the cache shrinks to what is left, its prefix still after the blocks'.
            let one_unit = ix_unit_bytes(&eng) as u64;
            let r = control.set_memory_budget(cache.minimum + one_unit).unwrap();
            assert_eq!(r.minimum, cache.minimum);
            assert!(r.cache_bytes <= 2 * one_unit, "{name}: {r:?}");
            let stats = || eng.hybrid().unwrap().sparse().offload().unwrap().stats();
            let ahead = stats().read_ahead;
            for (batched, want) in [false, true].into_iter().zip(&want) {
                let d = rel_drift(&logits(&eng, TOKENS, batched), want);
                assert!(d < tol, "{name} {kind:?} at the minimum budget: drift {d}");
            }
            // No predictor: every unit past the accelerator's is wanted, so the next layer's
            // misses are read ahead as in sparse decode.
            assert!(
                stats().read_ahead > ahead,
                "{name} {kind:?}: nothing read ahead ({} misses)",
                stats().misses
            );
            eng.set_hybrid(None);
        }
    }
}

#[test]
fn a_reservation_refused_or_failing_changes_nothing() {
    let path = converted("tiny-llama-silu-q4_0.gguf");
    let resident = ModelFile::open(&path).unwrap();
    let eng = engine(&resident);
    let sp = store_sparse(&eng.model().config, &path, 0.5);
    let control = sp.offload().unwrap().control();
    let before = control.report();
    let e = control
        .reserve(
            before.cache_asked + 1,
            &vec![1; eng.model().config.n_layers],
        )
        .unwrap_err();
    assert!(e.to_string().contains("more than the neuron cache"), "{e}");
    assert_eq!(control.report(), before);
    let resident = sp.offload().unwrap().stats().resident_bytes;
    assert!(resident > 0);
    // Blocks that fail to build: the cache held none of the units meanwhile, and is as it was after.
    let layers = eng.model().config.n_layers;
    let e = control
        .reserve_with(
            1,
            &vec![1; layers],
            || -> Result<(), engine::OffloadError> {
                assert_eq!(sp.offload().unwrap().stats().resident_bytes, 0);
                Err(engine::OffloadError::Request("no blocks".into()))
            },
        )
        .unwrap_err();
    assert!(e.to_string().contains("no blocks"), "{e}");
    assert_eq!(control.report(), before);
    assert_eq!(sp.offload().unwrap().stats().resident_bytes, resident);
}

/// The hybrid FFN over `path`'s store on `kind`, a quarter of each layer's units on the
/// accelerator, thresholds `threshold`, prompt chunks on `prompt` when given.
fn store_hybrid(
    eng: &engine::Engine<'_>,
    path: &std::path::Path,
    kind: &AccelKind,
    threshold: f32,
    prompt: Option<&AccelKind>,
) -> HybridFfn {
    let cfg = &eng.model().config;
    let mut sp = store_sparse_with(cfg, path, 4.0, threshold);
    let off = sp.offload_mut().unwrap();
    let probe = open(kind, std::iter::empty()).unwrap();
    let ix = off.store().index();
    let (d, format) = (ix.d_model, ix.formats.gate);
    let control = off.control();
    let units = off.accel_units(&off.share_units(0.25), control.report().cache_asked, |k| {
        probe.block_bytes(k, d, format)
    });
    let order = off.leading_neurons(&units);
    let bytes = order
        .iter()
        .map(|n| probe.block_bytes(n.len(), d, format))
        .sum();
    control.reserve(bytes, &units).unwrap();
    if let Some(p) = prompt {
        off.set_prompt_accel(Some(open(p, std::iter::empty()).unwrap()));
    }
    let accel = open(kind, off.accel_blocks(&units, cfg.activation)).unwrap();
    HybridFfn::new(sp, accel, eng.model(), &HotSplit::fixed(order)).unwrap()
}

/// With a prompt accelerator, a hybrid prompt step over the store is dense whatever the thresholds:
/// the block on one accelerator, every other chunk of the layer (none holds a block neuron) on the
/// other. Without it the CPU's chunks apply the thresholds (here: nothing passes), so the logits
/// differ.
#[test]
fn hybrid_prompt_steps_over_the_store_run_every_chunk_on_the_accelerator() {
    let path = converted("tiny-llama-silu-q4_0.gguf");
    let resident = ModelFile::open(&path).unwrap();
    let mut eng = engine(&resident);
    let cfg = eng.model().config.clone();
    eng.set_sparse(Some(store_sparse(&cfg, &path, 0.5)));
    let dense = logits(&eng, TOKENS, true);
    eng.set_sparse(None);
    let qnn = AccelKind::new("qnn", Some("f32"), Some(double()));
    eng.set_hybrid(Some(store_hybrid(&eng, &path, &qnn, 1e9, Some(&qnn))));
    let d = rel_drift(&logits(&eng, TOKENS, true), &dense);
    assert!(d < 1e-4, "drift {d}");
    let off = eng.hybrid().unwrap().sparse().offload().unwrap();
    assert_eq!(off.prompt_accel_failure(), None);
    eng.set_hybrid(Some(store_hybrid(&eng, &path, &qnn, 1e9, None)));
    let d = rel_drift(&logits(&eng, TOKENS, true), &dense);
    assert!(d > 1e-2, "the CPU's chunks skip every neuron: drift {d}");
}

/// Bytes of one unit of the store behind `eng`'s hybrid FFN.
fn ix_unit_bytes(eng: &engine::Engine<'_>) -> usize {
    let off = eng.hybrid().unwrap().sparse().offload().unwrap();
    off.store().index().layout.unit_bytes()
}
