//! MoE layers in the planner: units that are experts, their caches sized per layer by the solver.

use crate::common::{device, model as neuron_model};
use planner::{
    make_plan, Constraints, ExpertParts, FfnLayer, ModelSummary, Solver, TensorInfo, UnitKind,
};

const MIB: u64 = 1 << 20;
const EXPERTS: usize = 32;
const TOKENS: u64 = 10_000;
const TOP_K: u64 = 4;

fn parts() -> ExpertParts {
    ExpertParts {
        blob_bytes: MIB,
        gate_up_bytes: 2 * MIB / 3,
        down_bytes: MIB / 3,
        format: "q4_0".into(),
        down_format: "q8_0".into(),
    }
}

/// Counts of a layer whose experts are selected by a power law of exponent `alpha` (0: uniform),
/// `TOP_K` a token, in a shuffled order (the layer sorts them).
fn counts(alpha: f64) -> Vec<u64> {
    let w: Vec<f64> = (0..EXPERTS)
        .map(|i| (i as f64 + 1.0).powf(-alpha))
        .collect();
    let sum: f64 = w.iter().sum();
    let mut c: Vec<u64> = w
        .iter()
        .map(|x| ((x / sum * (TOP_K * TOKENS) as f64) as u64).min(TOKENS))
        .collect();
    c.reverse();
    c.rotate_left(5);
    c
}

fn moe_model(alphas: &[f64]) -> ModelSummary {
    let layers = alphas
        .iter()
        .map(|&a| FfnLayer::from_expert_counts(&parts(), &counts(a), TOKENS, &[1, 2], 64).unwrap())
        .collect();
    ModelSummary {
        name: "moe".into(),
        fingerprint: 5,
        tensors: vec![TensorInfo {
            name: "attention".into(),
            format: "q4_0".into(),
            bytes: 4 * MIB,
            touched_bytes: 4 * MIB,
            offloadable: false,
            computed: true,
        }],
        layers,
        kv_bytes_per_position: 1024,
        process_bytes: 8 * MIB,
        batch_sizes: vec![1, 2],
        grid: 64,
        offloaded: true,
        ..Default::default()
    }
}

/// The fixed memory of `moe_model` at context 256: process, attention, KV cache.
const FIXED: u64 = 8 * MIB + 4 * MIB + 256 * 1024;

fn plan(m: &ModelSummary, cache: u64) -> planner::Plan {
    let c = Constraints {
        memory_budget: Some(FIXED + cache),
        context: 256,
        attended: 256,
        ..Constraints::default()
    };
    make_plan(&device(2, 1.0), m, &c, Solver::Search).unwrap()
}

#[test]
fn an_expert_layer_is_its_experts_with_top_k_selected_per_token() {
    let m = moe_model(&[1.0]);
    let l = &m.layers[0];
    assert_eq!(l.unit, UnitKind::Expert);
    assert_eq!((l.neurons, l.neuron_bytes, l.read_bytes), (32, MIB, MIB));
    let total: u64 = counts(1.0).iter().sum();
    let top_k = total as f64 / TOKENS as f64;
    assert!((l.hit[0][64] - top_k).abs() < 1e-3, "{}", l.hit[0][64]);
    // The hottest half holds more than half of the selections; a pair of tokens selects more
    // experts than one, fewer than twice as many.
    assert!(l.hit[0][32] > top_k / 2.0);
    assert!(l.hit[1][64] > top_k && l.hit[1][64] < 2.0 * top_k);
}

#[test]
fn a_hotter_layer_gets_a_larger_share_within_the_budget() {
    let m = moe_model(&[1.2, 0.0]);
    let p = plan(&m, 20 * MIB);
    let x = p
        .experts
        .as_ref()
        .expect("an MoE plan says its expert caches");
    assert!(p.memory <= FIXED + 20 * MIB, "{}", p.memory);
    assert!(
        x.cache_bytes[0] > x.cache_bytes[1],
        "the skewed layer {:?}",
        x.cache_bytes
    );
    assert_eq!(x.cache_bytes.iter().sum::<u64>(), p.ffn_cache_bytes);
    assert_eq!(x.cached, p.hot_neurons);
    // The prediction is the routing's own: what the uncached experts are selected per token.
    let want: f64 = [1.2, 0.0]
        .iter()
        .zip(&x.cached)
        .map(|(&a, &n)| {
            let mut c = counts(a);
            c.sort_unstable_by(|a, b| b.cmp(a));
            c[n as usize..].iter().sum::<u64>() as f64 / TOKENS as f64 * MIB as f64
        })
        .sum();
    assert!(
        (x.read_bytes_per_token - want).abs() < 1e-6 * want.max(1.0),
        "{} vs {want}",
        x.read_bytes_per_token
    );
    assert!(x.hit_rate > 0.0 && x.hit_rate < 1.0, "{}", x.hit_rate);
    let text = p.describe();
    assert!(
        text.contains("routed experts in 2 layers") && text.contains("predicted hit rate"),
        "{text}"
    );
    assert!(!text.contains("neuron cache"), "{text}");
}

#[test]
fn more_budget_reads_fewer_bytes_and_every_budget_is_kept() {
    let m = moe_model(&[1.0, 0.6, 0.3]);
    let mut last = f64::MAX;
    let mut fewer = 0;
    for cache in [0, 4, 12, 24, 48, 96] {
        let p = plan(&m, cache * MIB);
        assert!(
            p.memory <= FIXED + cache * MIB,
            "{} at {cache} MiB",
            p.memory
        );
        let x = p.experts.unwrap();
        assert!(x.read_bytes_per_token <= last, "{cache} MiB");
        fewer += usize::from(x.read_bytes_per_token < last);
        last = x.read_bytes_per_token;
        // Neither the compute nor the reads choose dense or sparse for experts.
        assert!(p.sparse.iter().all(|&s| !s));
    }
    assert!(fewer >= 5, "each larger budget reads less");
    // The whole FFN cached: every selection a hit, nothing read.
    assert_eq!(last, 0.0);
}

#[test]
fn a_neuron_model_plans_neurons_and_old_layers_read_as_neurons() {
    let m = neuron_model(2, 32, 4, 1.0, true);
    assert!(m.layers.iter().all(|l| l.unit == UnitKind::Neuron));
    let c = Constraints {
        memory_budget: Some(64 << 20),
        context: 256,
        ..Constraints::default()
    };
    let p = make_plan(&device(2, 1.0), &m, &c, Solver::Search).unwrap();
    assert!(p.experts.is_none());
    assert!(p.describe().contains("neuron cache"));
    // A layer written before units had a kind is a layer of neurons.
    let mut v = serde_json::to_value(&m.layers[0]).unwrap();
    v.as_object_mut().unwrap().remove("unit");
    let old: FfnLayer = serde_json::from_value(v).unwrap();
    assert_eq!(old, m.layers[0]);
}
