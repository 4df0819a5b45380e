//! The cost model's tables, one effect at a time: each format's rate, caches, read-ahead, selection,
//! units over a store, tensors on flash, queue depth, batches and prompts.

use crate::common;

use crate::solve::budget;
use common::{device, model};
use planner::{
    make_plan, Constraints, DeviceProfile, FormatMacs, PromptRate, Solver, StepBytes, Tables,
};

/// One layer of 1000 neurons half of which fire, gate+up 720 bytes and down 612 bytes (Q8_0) per
/// neuron, gate and up in Q4_0; a model of that layer alone, and constraints at a context of 256.
fn one_layer() -> (planner::FfnLayer, planner::ModelSummary, Constraints) {
    let half = vec![0.5f32; 1000];
    let layer =
        planner::FfnLayer::from_frequencies(1332, "q4_0", 1332, 1, &[half.clone(), half], 4)
            .unwrap()
            .with_parts(720, 612, "q8_0");
    let mut m = model(1, 1000, 4, 0.0, false);
    m.layers = vec![layer.clone()];
    let c = Constraints {
        context: 256,
        ..Constraints::default()
    };
    (layer, m, c)
}

/// Dense decode reads a layer's gate and up rows at their format's rate and its down matrix at the
/// down format's (a Q4_K_M file: gate/up Q5_0 where rows are 896 wide, down Q4_K): costed at the
/// gate's rate alone, a fast down format made dense look slower than it is, and the plan picked
/// sparse where dense was faster (Qwen2.5-Coder-0.5B in memory).
#[test]
fn dense_cost_reads_the_down_matrix_at_its_own_formats_rate() {
    let (layer, mut m, c) = one_layer();
    let d = device(1, 1.0);
    let dense_ns = |m: &planner::ModelSummary| {
        let t = Tables::build(&d, m, &c, 0).unwrap();
        let i = t.threads.iter().position(|&x| x == 1).unwrap();
        t.dense_ffn_ns(i) as f64
    };
    let ns = |bytes: f64, bps: f64| bytes / bps * 1e9;
    let (q4, q8) = (d.kernel_rate("q4_0", 1).0, d.kernel_rate("q8_0", 1).0);
    // Without the down's format: the whole neuron at the gate's rate.
    let want = ns(1000.0 * 1332.0, q4);
    assert!(
        (dense_ns(&m) - want).abs() <= 2.0,
        "{} vs {want}",
        dense_ns(&m)
    );
    m.layers = vec![layer.with_dense_down("q8_0")];
    let want = ns(1000.0 * 720.0, q4) + ns(1000.0 * 612.0, q8);
    assert!(
        (dense_ns(&m) - want).abs() <= 2.0,
        "{} vs {want}",
        dense_ns(&m)
    );
    assert!(want < ns(1000.0 * 1332.0, q4));
}

/// A decode step that reads at least as many weights as the last-level cache holds is costed at
/// the kernels' DRAM rates, one that reads between half the cache and the whole at a blend; one
/// within half the cache, one within a budget that is, and a device whose cache is unknown are
/// costed at the measured rates. Calibrated on a matrix that sat in a 260 MiB cache,
/// Qwen2.5-Coder-0.5B in memory (about 390 MB a token) was predicted 25% fast.
#[test]
fn weights_past_the_last_level_cache_are_costed_towards_the_dram_rate() {
    let (_, m, mut c) = one_layer();
    let mut d = device(1, 1.0);
    let at = |d: &DeviceProfile, c: &Constraints| {
        let t = Tables::build(d, &m, c, 0).unwrap();
        let i = t.threads.iter().position(|&x| x == 1).unwrap();
        (
            t.dense_ffn_ns(i) as f64,
            t.sparse_ffn_ns(i) as f64,
            t.attn_ns[i] as f64,
        )
    };
    let measured = at(&d, &c);
    let w = m.decode_weight_bytes();
    assert_eq!(w, (8 << 20) + 1000 * 1332 + (1 << 20));
    for k in &mut d.kernels {
        k.dram_dense_bps = k.dense_bps / 2.0;
    }
    d.llc_bytes = 2 * w;
    assert_eq!(at(&d, &c), measured, "the weights fit in half the cache");
    for (llc, slower) in [(w, 2.0), (w / 4, 2.0), (w * 4 / 3, 1.5)] {
        d.llc_bytes = llc;
        let (dense, sparse, attn) = at(&d, &c);
        // At half the rate: twice the time; half from the cache, half from DRAM: 1.5 times
        // (attention's weights too; its KV cache was read at DRAM's rate already).
        for (got, was) in [(dense, measured.0), (sparse, measured.1)] {
            assert!((got / was - slower).abs() < 1e-3, "{got} vs {was} at {llc}");
        }
        assert!(attn > measured.2 * (1.0 + slower) / 2.0 && attn < measured.2 * slower);
    }
    d.llc_bytes = w;
    c.memory_budget = Some(w / 2);
    assert_eq!(at(&d, &c), measured, "no more than the budget is in memory");
    c.memory_budget = None;
    d.llc_bytes = 0;
    assert_eq!(at(&d, &c), measured, "the cache's size is unknown");
}

/// Without predictors the engine reads each next layer's uncached units ahead and, under a
/// budget, counts what that holds beside the cache; the planner counts it the same way, so that
/// the cache it plans is the cache the engine gets (it planned 8 MiB more for Qwen2.5-Coder-0.5B
/// at 211 MiB, and predicted its decode that much fast).
#[test]
fn read_ahead_is_counted_beside_the_cache() {
    let mut m = model(4, 64, 4, 0.8, true);
    m.predicted = false;
    let budget = (5 << 20) + (8 << 20) + (3 << 19);
    let c = Constraints {
        context: 256,
        memory_budget: Some(budget),
        ..Constraints::default()
    };
    let d = device(2, 1.0);
    let fixed = |m: &planner::ModelSummary| Tables::build(&d, m, &c, 0).unwrap().fixed_bytes;
    let without = fixed(&m);
    assert_eq!(without, 5 << 20, "process and KV cache");
    let plain = make_plan(&d, &m, &c, Solver::Search).unwrap();
    m.reads_ahead = true;
    let with = fixed(&m);
    // 1.5 MiB of room beside the attention's 8 MiB for a 3 MiB FFN in 4 layers: two layers'
    // uncached part, at most half the room.
    let ffn = 4 * 64 * 12288;
    assert_eq!(with - without, planner::read_ahead_bytes(ffn, 4, 3 << 19));
    assert_eq!(with - without, 3 << 18);
    let ahead = make_plan(&d, &m, &c, Solver::Search).unwrap();
    assert!(ahead.memory <= budget, "{} over {budget}", ahead.memory);
    assert!(ahead.ffn_cache_bytes < plain.ffn_cache_bytes);
    // No budget: nothing counted (the cache is the whole FFN).
    let c = Constraints {
        memory_budget: None,
        ..c
    };
    assert_eq!(Tables::build(&d, &m, &c, 0).unwrap().fixed_bytes, without);
}

#[test]
fn sparse_cost_counts_what_selection_computes_and_each_call() {
    let (_, mut m, c) = one_layer();
    let mut d = device(1, 1.0);
    let (dense, sparse) = d.kernel_rate("q4_0", 1);
    let axpy = d.axpy_rate("q8_0", 1);
    let at = |m: &planner::ModelSummary, d: &planner::DeviceProfile| {
        let t = Tables::build(d, m, &c, 0).unwrap();
        let i = t.threads.iter().position(|&x| x == 1).unwrap();
        t.sparse_ffn_ns(i) as f64
    };
    let ns = |bytes: f64, bps: f64| bytes / bps * 1e9;
    // With predictors: the firing neurons' gate/up rows (row-subset kernels) and down columns.
    m.predicted = true;
    let want = ns(500.0 * 720.0, sparse) + ns(500.0 * 612.0, axpy);
    assert!((at(&m, &d) - want).abs() <= 2.0, "{} vs {want}", at(&m, &d));
    // Without, under the output-norm score: every gate and up row (dense kernels), the firing downs.
    m.predicted = false;
    m.select_up = true;
    let want = ns(1000.0 * 720.0, dense) + ns(500.0 * 612.0, axpy);
    assert!((at(&m, &d) - want).abs() <= 2.0, "{} vs {want}", at(&m, &d));
    // Under a gate score: every gate row, the firing neurons' up rows.
    m.select_up = false;
    let want = ns(1000.0 * 360.0, dense) + ns(500.0 * 360.0, sparse) + ns(500.0 * 612.0, axpy);
    assert!((at(&m, &d) - want).abs() <= 3.0, "{} vs {want}", at(&m, &d));
    // A fixed cost per call adds two FFN calls for the layer.
    let before = at(&m, &d);
    d.call_overhead = vec![planner::CallOverhead {
        threads: 1,
        ns: 5000.0,
    }];
    assert!((at(&m, &d) - before - 10_000.0).abs() <= 1.0);
    // Selection's serial cost: per candidate, every neuron without a predictor (1000 × 3 ns), the
    // firing ones with one (500 × 3 ns).
    let before = at(&m, &d);
    d.select_ns = 3.0;
    assert!(
        (at(&m, &d) - before - 3000.0).abs() <= 1.0,
        "{} vs {before}",
        at(&m, &d)
    );
    m.predicted = true;
    let predicted = at(&m, &d);
    d.select_ns = 0.0;
    assert!((predicted - at(&m, &d) - 1500.0).abs() <= 1.0);
}

/// Over a store each unit is its own kernel call: where the device measured one-unit calls
/// slower than long row lists, every computed unit costs the difference for its neuron's rows
/// (gate/up for every unit without predictors, down for the units holding a firing neuron),
/// an in-memory FFN nothing more, and a profile without the one-unit rates nothing either. On the
/// 7B-shaped synthetic bundle the FFN was predicted at 52.8 ms a token and measured about 125.
#[test]
fn over_a_store_each_unit_costs_its_call() {
    let (layer, mut m, c) = one_layer();
    let mut d = device(1, 1.0);
    let at = |m: &planner::ModelSummary, d: &planner::DeviceProfile| {
        let t = Tables::build(d, m, &c, 0).unwrap();
        let i = t.threads.iter().position(|&x| x == 1).unwrap();
        t.sparse_ffn_ns(i) as f64
    };
    let ns = |bytes: f64, bps: f64| bytes / bps * 1e9;
    let (sparse, axpy) = (d.kernel_rate("q4_0", 1).1, d.axpy_rate("q8_0", 1));
    m.predicted = true;
    let in_memory = at(&m, &d);
    m.offloaded = true;
    let no_rates = at(&m, &d);
    assert!(
        (no_rates - in_memory).abs() <= 1.0,
        "{no_rates} vs {in_memory}"
    );
    for k in &mut d.kernels {
        k.unit_rows_bps = k.sparse_bps / 2.0;
        k.unit_axpy_bps = k.sparse_bps / 4.0;
    }
    let unit_axpy = d.unit_rates("q8_0", 1).1;
    // One neuron a unit, 500 of 1000 firing: 500 units each way.
    let want = 500.0 * (ns(720.0, sparse / 2.0) - ns(720.0, sparse))
        + 500.0 * (ns(612.0, unit_axpy) - ns(612.0, axpy));
    assert!(
        (at(&m, &d) - no_rates - want).abs() <= 2.0,
        "{} vs {want}",
        at(&m, &d) - no_rates
    );
    // Four neurons a unit: 1000/4 × (1 - 0.5^4) units hold a firing neuron.
    m.layers = vec![planner::FfnLayer {
        neurons_per_read: 4,
        ..layer.clone()
    }];
    let units = 250.0 * (1.0 - 0.5f64.powi(4));
    let base = {
        let mut d0 = d.clone();
        for k in &mut d0.kernels {
            (k.unit_rows_bps, k.unit_axpy_bps) = (0.0, 0.0);
        }
        at(&m, &d0)
    };
    let want = units * (ns(720.0, sparse / 2.0) - ns(720.0, sparse))
        + units * (ns(612.0, unit_axpy) - ns(612.0, axpy));
    assert!((at(&m, &d) - base - want).abs() <= 2.0);
    // Without predictors every unit computes its gate/up rows.
    m.predicted = false;
    let base = {
        let mut d0 = d.clone();
        for k in &mut d0.kernels {
            (k.unit_rows_bps, k.unit_axpy_bps) = (0.0, 0.0);
        }
        at(&m, &d0)
    };
    let want = 250.0 * (ns(720.0, sparse / 2.0) - ns(720.0, sparse))
        + units * (ns(612.0, unit_axpy) - ns(612.0, axpy));
    assert!((at(&m, &d) - base - want).abs() <= 2.0);
    // In memory, nothing.
    m.offloaded = false;
    assert!((at(&m, &d) - base).abs() <= 1.0);
}

#[test]
fn a_tensor_left_on_flash_costs_a_row_read_or_a_sequential_stream() {
    let mut m = model(1, 64, 4, 1.0, true);
    // An embedding (one row a step), a whole output matrix, and megabytes of a larger one.
    let tensor = |name: &str, bytes: u64, touched: u64| planner::TensorInfo {
        name: name.into(),
        format: "q4_0".into(),
        bytes,
        touched_bytes: touched,
        offloadable: true,
        computed: false,
    };
    m.tensors = vec![
        tensor("embedding", 16 << 20, 2304),
        tensor("output", 8 << 20, 8 << 20),
        tensor("output+embedding", 24 << 20, (8 << 20) + 2304),
    ];
    let d = device(1, 1.0);
    let t = Tables::build(&d, &m, &Constraints::default(), 0).unwrap();
    let ns = |bytes: f64, bps: f64| (bytes / bps * 1e9).round() as u64;
    assert_eq!(t.tensors[0].1, ns(2304.0, d.io_rate(2304, 1)));
    assert_eq!(t.tensors[1].1, ns((8 << 20) as f64, d.flash_seq_bps));
    assert_eq!(
        t.tensors[2].1,
        ns(((8 << 20) + 2304) as f64, d.flash_seq_bps)
    );
    assert!(
        t.tensors.iter().all(|x| x.2),
        "offloadable in an offloaded model"
    );
}

/// Decode's misses are read while the compute threads run beside the I/O thread: where the device
/// measured reads beside busy cores, they are costed at those rates (a tensor left on flash, read
/// at a step's start, at the idle ones); without them at the idle rates. On this VM the busy
/// rates at depths 1-32 were a tenth to a quarter of the idle ones, and an offloaded decode read
/// its misses at about half the idle rate.
#[test]
fn decode_misses_are_read_at_the_busy_rates() {
    let mut m = model(1, 64, 4, 1.0, true);
    m.tensors = vec![planner::TensorInfo {
        name: "embedding".into(),
        format: "q4_0".into(),
        bytes: 16 << 20,
        touched_bytes: 2304,
        offloadable: true,
        computed: false,
    }];
    let mut d = device(1, 1.0);
    let c = Constraints::default();
    let idle = Tables::build(&d, &m, &c, 0).unwrap();
    assert!(idle.io_ns[0][0][0] > 0);
    d.flash_random_busy = d
        .flash_random
        .iter()
        .map(|r| planner::IoRate {
            bps: r.bps / 2.0,
            ..r.clone()
        })
        .collect();
    let busy = Tables::build(&d, &m, &c, 0).unwrap();
    for (a, b) in idle
        .io_ns
        .iter()
        .flatten()
        .flatten()
        .zip(busy.io_ns.iter().flatten().flatten())
    {
        assert!(b.abs_diff(2 * a) <= 2, "{b} vs twice {a}");
    }
    assert_eq!(idle.tensors, busy.tensors);
    d.flash_random_busy[0].bps = f64::NAN;
    assert!(d.validate().is_err());
}

#[test]
fn touching_misses_are_read_as_longer_requests() {
    // Every unit of the cold region needed: the reads coalesce into 512 KiB requests, which this
    // device serves faster than single units. Every neuron firing, or (whatever fires) no
    // predictor: the engine then computes every gate row, so it reads every unit it lacks.
    let mut m = model(1, 64, 4, 1.0, true);
    let few = m.layers[0].hit.clone();
    m.layers[0].hit = vec![vec![0.0, 16.0, 32.0, 48.0, 64.0]; 2];
    let mut d = device(1, 1.0);
    let q = d.queue_depths()[0];
    d.flash_random.push(planner::IoRate {
        read_bytes: 512 << 10,
        queue_depth: q,
        bps: 4.0 * d.io_rate(m.layers[0].read_bytes, q),
    });
    let t = Tables::build(&d, &m, &Constraints::default(), 0).unwrap();
    let l = &m.layers[0];
    let bytes = l.neurons as f64 / l.neurons_per_read as f64 * l.read_bytes as f64;
    let want = (bytes / d.io_rate(512 << 10, q) * 1e9).round() as u64;
    assert_eq!(
        t.io_ns[0][0][0], want,
        "nothing cached: every unit read, coalesced"
    );
    m.layers[0].hit = few;
    let with = Tables::build(&d, &m, &Constraints::default(), 0).unwrap();
    assert!(
        with.io_ns[0][0][0] < want,
        "predictors: the units of firing neurons"
    );
    m.predicted = false;
    let without = Tables::build(&d, &m, &Constraints::default(), 0).unwrap();
    assert_eq!(without.io_ns[0][0][0], want, "no predictor: every unit");
}

/// Flash points at 4 KiB and 256 KiB for each `(depth, bytes per second at 256 KiB)`.
fn flash(points: &[(u32, f64)]) -> Vec<planner::IoRate> {
    points
        .iter()
        .flat_map(|&(q, bps)| {
            [(4096, bps / 8.0), (256 << 10, bps)].map(|(size, bps)| planner::IoRate {
                read_bytes: size,
                queue_depth: q,
                bps,
            })
        })
        .collect()
}

#[test]
fn a_deeper_queue_is_never_predicted_slower() {
    // A calibration whose 256 KiB reads at depth 1 measured faster than at 8 and 128, and 8 faster
    // than 128 (noise: more reads in flight never read slower).
    let mut d = device(2, 1.0);
    d.flash_random = flash(&[(1, 30e6), (8, 20e6), (128, 10e6)]);
    for size in [2048, 4096, 16384, 256 << 10, 1 << 20] {
        let at = |q| d.io_rate(size, q);
        assert_eq!(at(8), at(1), "{size} bytes");
        assert_eq!(at(128), at(1), "{size} bytes");
        assert_eq!(
            at(64),
            at(1),
            "{size} bytes: an unmeasured depth takes those below"
        );
    }
    // A deeper queue measured faster keeps its own figure; a shallower one is not lifted by it.
    let mut up = device(2, 1.0);
    up.flash_random = flash(&[(1, 10e6), (8, 30e6), (128, 20e6)]);
    assert_eq!(up.io_rate(256 << 10, 1), 10e6);
    assert_eq!(up.io_rate(256 << 10, 8), 30e6);
    assert_eq!(up.io_rate(256 << 10, 128), 30e6);
    // Below every measured depth, the nearest point of any depth (as before).
    up.flash_random.retain(|r| r.queue_depth > 1);
    assert_eq!(up.io_rate(256 << 10, 1), 30e6);

    // The plan of an FFN read from flash: the depths predict the same reads, so it takes the
    // deepest (with each depth's own figure it took depth 1, reads at 128 looking 3x slower).
    let m = model(2, 1024, 4, 1.0, true);
    let c = Constraints {
        context: 256,
        ..Constraints::default()
    };
    let t = Tables::build(&d, &m, &c, 0).unwrap();
    assert_eq!(t.queue_depths, [1, 8, 128]);
    assert!(t.io_ns.iter().all(|q| q == &t.io_ns[0]), "{:?}", t.io_ns);
    let c = Constraints {
        memory_budget: Some(budget(&t, 0.2)),
        ..c
    };
    let p = make_plan(&d, &m, &c, Solver::Search).unwrap();
    assert!(p.sparse.iter().all(|&s| s), "{}", p.describe());
    assert_eq!(p.queue_depth, 128, "{}", p.describe());
}

#[test]
fn a_batch_costs_what_its_formats_batched_kernel_measured() {
    let mut d = device(2, 1.0);
    // Without a format's own figure, the profile's.
    assert!((d.batch_scale("q4_0", 4) - (1.0 + 0.3 * 3.0)).abs() < 1e-12);
    assert_eq!(d.batch_scale("q4_0", 1), 1.0);
    // q4_0 measured cheap at the most threads (the figure taken), q8_0 left to the profile's.
    for k in d.kernels.iter_mut().filter(|k| k.format == "q4_0") {
        k.batch_cost = if k.threads == 2 { 0.1 } else { 0.9 };
    }
    assert!((d.batch_scale("Q4_0", 4) - 1.3).abs() < 1e-12);
    assert!((d.batch_scale("q8_0", 4) - 1.9).abs() < 1e-12);
    // The FFN's batched compute follows: cheaper per token with the cheaper figure.
    let m = common::model(2, 64, 4, 1.0, false);
    let c = Constraints {
        context: 256,
        ..Constraints::default()
    };
    let cheap = Tables::build(&d, &m, &c, 1).unwrap();
    d.kernels.iter_mut().for_each(|k| k.batch_cost = 0.0);
    let dear = Tables::build(&d, &m, &c, 1).unwrap();
    assert!(cheap.dense_ffn_ns(0) < dear.dense_ffn_ns(0));
    assert!(cheap.attn_ns[0] < dear.attn_ns[0]);
}

#[test]
fn a_plan_predicts_its_prompt_from_the_tile_rate_and_the_bytes_left_on_flash() {
    let c = Constraints {
        context: 256,
        ..Constraints::default()
    };
    let mut m = model(2, 1024, 4, 1.0, true);
    let d = device(2, 1.0);
    // An older device profile (no prompt rate) or model summary (no counts): no prediction.
    assert_eq!(make_plan(&d, &m, &c, Solver::Search).unwrap().prompt, None);
    m.prompt_macs_per_token = 1e9;
    m.down_macs_per_token = 4e8;
    m.attn_macs_per_pair = 1e3;
    m.output_macs = 1e8;
    m.prompt_step_tokens = 128;
    let d = DeviceProfile {
        prompt_flops: 2e11,
        prompt_t_flops: 1e11,
        ..d
    };
    let all = make_plan(&d, &m, &c, Solver::Search).unwrap();
    let p = all.prompt.expect("a prediction");
    // An offloaded FFN: 6e8 multiply-adds a token at 1e11 a second, the 4e8 of its down rows
    // (transposed) at 5e10; the whole FFN cached: nothing to read.
    assert!((p.token_s - 1.4e-2).abs() < 1e-12, "{p:?}");
    assert_eq!(p.step_io_s, 0.0, "{}", all.describe());
    assert!(all.describe().contains("predicted prompt: 512 tokens"));
    // Under a budget that leaves part of the FFN on flash, each step reads it at the sequential rate.
    let t = Tables::build(&d, &m, &c, 0).unwrap();
    let tight = Constraints {
        memory_budget: Some(budget(&t, 0.0)),
        ..c.clone()
    };
    let part = make_plan(&d, &m, &tight, Solver::Search).unwrap();
    let q = part.prompt.expect("a prediction");
    let ffn: u64 = m
        .layers
        .iter()
        .map(|l| l.neurons as u64 * l.neuron_bytes)
        .sum();
    let cold = (ffn - part.ffn_cache_bytes) as f64;
    assert!(part.ffn_cache_bytes < ffn, "{}", part.describe());
    assert!(
        (q.step_io_s - cold / d.flash_seq_bps).abs() < 1e-12,
        "{q:?}"
    );
    assert!(q.seconds(512) >= p.seconds(512));
    // Per weight format: each at its own tile's rate (a format not measured at `prompt_flops`),
    // down projections transposed; short steps at the short rate.
    m.prompt_macs = vec![
        FormatMacs {
            format: "q8_0".into(),
            macs: 4e8,
            down: false,
        },
        FormatMacs {
            format: "Q4_1".into(),
            macs: 2e8,
            down: false,
        },
        FormatMacs {
            format: "q4_k".into(),
            macs: 4e8,
            down: true,
        },
    ];
    let d = DeviceProfile {
        prompt_rates: vec![PromptRate {
            format: "Q8_0".into(),
            flops: 8e11,
        }],
        prompt_short_flops: 5e10,
        prompt_tile_min_tokens: 32,
        ..d
    };
    let r = make_plan(&d, &m, &c, Solver::Search)
        .unwrap()
        .prompt
        .expect("a prediction");
    // 4e8 at 4e11 a second, 2e8 at 1e11, the down rows at 5e10 (offloaded: transposed).
    assert!((r.token_s - (1e-3 + 2e-3 + 8e-3)).abs() < 1e-12, "{r:?}");
    assert!((r.short_token_s - 4e-2).abs() < 1e-12, "{r:?}");
    let fewer = r.seconds(16) - r.once_s - r.pair_s * (16.0 * 17.0 / 2.0);
    assert!((fewer - 16.0 * 4e-2).abs() < 1e-9, "{r:?}");
    // Where the cache cannot hold the FFN, the engine's step: the longest whose memory is at most
    // half the cache (else the shortest), that memory lent by the cache and so streamed too.
    let half = Constraints {
        memory_budget: Some(budget(&t, 0.5)),
        ..c.clone()
    };
    let cache = make_plan(&d, &m, &half, Solver::Search)
        .unwrap()
        .ffn_cache_bytes;
    assert!(cache > 4 && cache < ffn, "{cache} of {ffn}");
    m.prompt_step_bytes = vec![
        StepBytes {
            tokens: 512,
            bytes: cache,
        },
        StepBytes {
            tokens: 256,
            bytes: cache / 2,
        },
        StepBytes {
            tokens: 128,
            bytes: 10,
        },
    ];
    let pl = make_plan(&d, &m, &half, Solver::Search).unwrap();
    assert_eq!(pl.ffn_cache_bytes, cache);
    let s = pl.prompt.expect("a prediction");
    assert_eq!(s.step_tokens, 256, "{s:?}");
    let cold = (ffn - (cache - cache / 2)) as f64;
    assert!(
        (s.step_io_s - cold / d.flash_seq_bps).abs() < 1e-12,
        "{s:?}"
    );
    assert_eq!(
        m.prompt_step(ffn, ffn),
        (128, 0),
        "the whole FFN cached: no step shortened"
    );
    assert_eq!(m.prompt_step(0, ffn), (128, 10), "else the shortest");
}

#[test]
fn random_reads_are_never_predicted_faster_than_sequential_ones() {
    // A calibration whose large random reads measured faster than its sequential read (noise: a
    // decode step's coalesced misses then looked 25% faster than they were read, issue "planner").
    let mut d = device(2, 1.0);
    d.flash_random = flash(&[(1, 10e6), (128, 40e6)]);
    d.flash_seq_bps = 30e6;
    assert_eq!(d.io_rate(256 << 10, 128), 30e6);
    assert_eq!(
        d.io_rate(256 << 10, 1),
        10e6,
        "slower ones stay as measured"
    );
    // Small reads are scaled down from the nearest point, then capped the same way.
    assert!(d.io_rate(4096, 128) <= 30e6);
}
