//! An MoE model converted to a bundle of experts (`engine::offload::convert_moe`) and run from its
//! expert store under a budget that forces misses computes what the in-memory model computes: the
//! same logits for a prompt and for greedy decode steps, for qwen3moe (no shared expert) and
//! qwen2moe (a gated shared expert); the cache is hit and missed, and every expert a step needs is
//! read at most once per step.

use std::path::PathBuf;

use engine::offload::{
    belady_misses, convert_moe, fixed_set_misses, ConvertOptions, ConvertStep, Eviction,
    ExpertOffload, ExpertOffloadOptions,
};
use engine::{Engine, EngineBuilder, EngineOptions, Logits, MemoryBudget, ModelFile, Precision};

use super::moe_reference::ci_options;
use crate::src::synth_moe::{self, Arch};

struct TempDir(PathBuf);
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

/// Prompt logits (every position) and then `steps` greedy decode steps' logits.
fn run(eng: &Engine<'_>, prompt: &[u32], steps: usize) -> Vec<Vec<f32>> {
    let mut cache = eng.new_cache();
    let mut out = vec![eng.forward(&mut cache, prompt, Logits::All).unwrap()];
    let vocab = out[0].len() / prompt.len();
    let mut next = argmax(&out[0][out[0].len() - vocab..]);
    for _ in 0..steps {
        let l = eng.forward(&mut cache, &[next], Logits::Last).unwrap();
        next = argmax(&l);
        out.push(l);
    }
    out
}

fn check(arch: Arch) {
    check_options(ci_options(arch));
}

fn check_options(o: synth_moe::Options) {
    let arch = o.arch;
    let dir = std::env::temp_dir().join(format!(
        "sparrow-moe-offload-{}{}-{}",
        arch.name(),
        if o.relu { "-relu" } else { "" },
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let _gone = TempDir(dir.clone());
    let path = dir.join("m.gguf");
    synth_moe::write_model(&o, &path, |_, _| {}).unwrap();
    let file = ModelFile::open(&path).unwrap();
    let opts = EngineOptions {
        threads: 2,
        precision: Precision::Exact,
        context: 256,
        ..Default::default()
    };
    let mem = Engine::new(&file, opts.clone()).unwrap();
    let tok = |s: &str| mem.tokenizer().encode(s, false).unwrap();
    let calib = tok("Calibration text, not the evaluation text: the routers are counted here. ");
    let routing = engine::measure_routing(&mem, &calib, 32).unwrap();
    assert_eq!(routing.tokens, calib.len() as u64);
    let k = o.used as u64;
    assert_eq!(
        routing.counts[0].iter().sum::<u64>(),
        k * calib.len() as u64
    );

    let resident = dir.join("m.resident.gguf");
    let r = convert_moe(
        &file,
        &routing,
        &resident,
        &ConvertOptions::default(),
        |_, _| {},
    )
    .unwrap();
    assert!(r.store_bytes >= r.source_expert_bytes && r.blob_bytes.iter().all(|b| b % 4096 == 0));
    // ReLU experts are written neuron-major (a neuron store), SiLU experts as blobs.
    assert_eq!(r.neuron_major, o.relu);
    assert!(r.resident_bytes < std::fs::metadata(&path).unwrap().len());

    // Three experts per layer fit the cache (one pinned hot): top-k of 8 misses often.
    let blob = r.blob_bytes[0] as u64;
    let loaded = EngineBuilder {
        threads: 2,
        precision: Precision::Exact,
        context: Some(256),
        budget: MemoryBudget::Bytes(3 * blob * r.experts.len() as u64),
        ..EngineBuilder::new(&resident)
    }
    .open()
    .unwrap();
    let off = loaded.engine().unwrap();
    let x = off
        .experts()
        .expect("the bundle runs from its expert store");
    x.set_trace(true);
    let prompt = tok("The evaluation prompt: a different sentence with other words in it.");
    let want = run(&mem, &prompt, 6);
    let got = run(&off, &prompt, 6);
    assert_eq!(want.len(), got.len());
    for (i, (a, b)) in want.iter().zip(&got).enumerate() {
        assert_eq!(a.len(), b.len());
        let diff = a
            .iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0f32, f32::max);
        assert!(diff <= 1e-4, "{arch:?}: step {i} differs by {diff}");
    }
    let c = x.counters();
    assert!(c.hits > 0 && c.reads > 0, "{arch:?}: {c:?}");
    assert!(
        c.peak_in_flight >= 1 && c.peak_in_flight <= 32,
        "{arch:?}: {c:?}"
    );
    assert!(c.lookups == c.hits + c.ahead + (c.reads - c.predicted_reads));
    // Each expert once per layer step: lookups are the distinct experts of each step.
    assert!(c.lookups <= c.steps * 8);
    let trace = x.take_trace();
    let cap = 3;
    let opt: u64 = trace.iter().map(|t| belady_misses(t, cap, &[])).sum();
    assert!(opt > 0 && opt <= c.lookups);
    let st = x.cache_stats();
    assert!(
        st.bytes as u64 <= 3 * blob * r.experts.len() as u64,
        "{st:?}"
    );
    drop(off);
    drop(loaded);
    one_read_at_a_time(
        &resident,
        &r.store,
        &r.experts,
        3 * blob,
        &opts,
        &prompt,
        &want,
    );
    converts_again_as_one_transaction(&file, &routing, &resident, &dir);
}

/// With one read in flight at most (the rest wait their turn, as the budget's reservation for
/// reads requires), with no prediction, one or every predicted expert per token queued ahead, and
/// with either eviction order, the same logits come out; prediction reads no more than it may.
fn one_read_at_a_time(
    resident: &std::path::Path,
    store: &std::path::Path,
    experts: &[usize],
    cache_bytes: u64,
    opts: &EngineOptions,
    prompt: &[u32],
    want: &[Vec<f32>],
) {
    let file = ModelFile::open(resident).unwrap();
    let moe_layers = experts.iter().filter(|&&n| n > 0).count() as u64;
    let most = experts.iter().copied().max().unwrap_or(0);
    let mut predicted = Vec::new();
    for (depth, ahead, eviction) in [
        (1, 2, Eviction::Recency),
        (32, 0, Eviction::Recency),
        (32, 1, Eviction::Frequency),
        (32, 8, Eviction::Recency),
        (32, 2, Eviction::Predicted),
        (2, 1, Eviction::Predicted),
    ] {
        let mut eng = Engine::new(&file, opts.clone()).unwrap();
        let x = ExpertOffload::open(
            store,
            experts,
            None,
            ExpertOffloadOptions {
                cache_bytes: cache_bytes as usize * experts.len(),
                queue_depth: depth,
                prefetch_per_token: ahead,
                eviction,
                ..ExpertOffloadOptions::default()
            },
        )
        .unwrap();
        eng.set_experts(Some(x));
        let got = run(&eng, prompt, 6);
        let case = format!("queue depth {depth}, {ahead} ahead, {eviction:?}");
        for (i, (a, b)) in want.iter().zip(&got).enumerate() {
            let diff = a
                .iter()
                .zip(b)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0f32, f32::max);
            assert!(diff <= 1e-4, "{case}: step {i} differs by {diff}");
        }
        let c = eng.experts().unwrap().counters();
        assert!(c.reads > c.predicted_reads, "{case}: {c:?}");
        assert!(c.peak_in_flight <= depth as u64, "{case}: {c:?}");
        // Each token predicts at most `ahead` experts of the next MoE layer: a prompt step at most
        // every expert, each of the 6 decode steps at most `ahead`.
        let per_layer = (ahead * prompt.len()).min(most) + ahead * 6;
        let bound = (moe_layers - 1) * per_layer as u64;
        assert!(
            c.predicted_reads <= bound,
            "{case}: {c:?} (at most {bound})"
        );
        predicted.push(c.predicted_reads);
    }
    assert_eq!(predicted[1], 0, "no prediction, no predicted read");
    assert!(
        predicted[3] > 0,
        "every predicted expert queued: {predicted:?}"
    );
}

/// A convert over the bundle that fails at any step (as a full disk would) leaves the bundle as it
/// was and no new file behind; one that succeeds replaces it and removes the old parts.
fn converts_again_as_one_transaction(
    file: &ModelFile,
    routing: &engine::moe::RoutingProfile,
    resident: &std::path::Path,
    dir: &std::path::Path,
) {
    thread_local! {
        static AT: std::cell::Cell<Option<ConvertStep>> = const { std::cell::Cell::new(None) };
    }
    fn full(step: ConvertStep) -> std::io::Result<()> {
        match AT.with(|a| a.get()) {
            Some(at) if at == step => Err(std::io::Error::other("disk full")),
            _ => Ok(()),
        }
    }
    let listing = || {
        let mut v: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        v.sort();
        v
    };
    let (before, bytes) = (listing(), std::fs::read(resident).unwrap());
    for step in ConvertStep::ALL {
        if matches!(step, ConvertStep::Predictor | ConvertStep::Switched) {
            continue;
        }
        AT.with(|a| a.set(Some(step)));
        let opts = ConvertOptions {
            fault: Some(full),
            ..Default::default()
        };
        assert!(convert_moe(file, routing, resident, &opts, |_, _| {}).is_err());
        assert_eq!(listing(), before, "after a fault at {step:?}");
        assert_eq!(std::fs::read(resident).unwrap(), bytes);
    }
    let r = convert_moe(
        file,
        routing,
        resident,
        &ConvertOptions::default(),
        |_, _| {},
    )
    .unwrap();
    assert_eq!(r.removed.len(), 3, "{:?}", r.removed);
    assert_eq!(listing().len(), before.len());
}

#[test]
fn qwen3moe_from_its_expert_store_equals_in_memory() {
    check(Arch::Qwen3Moe);
}

#[test]
fn qwen2moe_with_a_shared_expert_from_its_expert_store_equals_in_memory() {
    check(Arch::Qwen2Moe);
}

/// ReLU experts (`--activation relu`): the bundle keeps the activation and stores them neuron-major
/// (converted without a neuron profile: every neuron of an expert computed), so its experts from
/// flash compute what the in-memory ReLU experts compute. F16 weights, whose down matrices
/// transpose without rounding: only the order of the down sums differs.
#[test]
fn mixtral_with_relu_experts_from_its_expert_store_equals_in_memory() {
    check_options(synth_moe::Options {
        relu: true,
        format: model_format::DType::F16,
        ..ci_options(Arch::Mixtral)
    });
}

#[test]
fn belady_is_the_fewest_misses() {
    // Capacity 2 over a b c a b c: OPT misses a, b, c, then keeps two of the three.
    assert_eq!(belady_misses(&[0, 1, 2, 0, 1, 2], 2, &[]), 4);
    assert_eq!(belady_misses(&[0, 1, 2, 0, 1, 2], 3, &[]), 3);
    assert_eq!(belady_misses(&[0, 0, 0], 0, &[]), 3);
    // 7 is used once and not kept (a cache that must keep it misses 4).
    assert_eq!(belady_misses(&[5, 6, 5, 6, 7, 5, 6], 2, &[]), 3);
    // A warm start: what the cache holds is not read again (as far as it fits).
    assert_eq!(belady_misses(&[0, 1, 2, 0, 1, 2], 3, &[0, 1, 2]), 0);
    assert_eq!(belady_misses(&[0, 1, 0, 1], 1, &[0, 1]), 2);
}

/// The fewest misses of any policy on `trace` with `capacity` slots starting from `initial`: every
/// choice tried (after a miss, keep the expert in place of any resident one, or not at all).
fn fewest_misses(trace: &[u32], capacity: usize, initial: &[u32]) -> u64 {
    use std::collections::{BTreeSet, HashMap};
    fn go(
        i: usize,
        held: BTreeSet<u32>,
        trace: &[u32],
        cap: usize,
        memo: &mut HashMap<(usize, BTreeSet<u32>), u64>,
    ) -> u64 {
        if i == trace.len() {
            return 0;
        }
        if let Some(&m) = memo.get(&(i, held.clone())) {
            return m;
        }
        let e = trace[i];
        let best = if held.contains(&e) {
            go(i + 1, held.clone(), trace, cap, memo)
        } else {
            let mut best = go(i + 1, held.clone(), trace, cap, memo);
            if cap > 0 && held.len() < cap {
                let mut h = held.clone();
                h.insert(e);
                best = best.min(go(i + 1, h, trace, cap, memo));
            }
            for &v in held.iter().filter(|_| cap > 0 && held.len() >= cap) {
                let mut h = held.clone();
                h.remove(&v);
                h.insert(e);
                best = best.min(go(i + 1, h, trace, cap, memo));
            }
            1 + best
        };
        memo.insert((i, held), best);
        best
    }
    let held = initial.iter().take(capacity).copied().collect();
    go(0, held, trace, capacity, &mut HashMap::new())
}

/// A xorshift generator from `seed`: each call a number below its argument.
fn xorshift(mut x: u64) -> impl FnMut(u64) -> u32 {
    move |m: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % m) as u32
    }
}

/// Belady's count is the true minimum (exhaustive search over every policy, keeping or not keeping
/// each expert read) on pseudo-random traces, warm and cold, over one layer's or one pool's keys.
#[test]
fn belady_equals_an_exhaustive_search() {
    let mut next = xorshift(0x2545_f491_4f6c_dd1d);
    for case in 0..300 {
        let len = 4 + next(9) as usize;
        let alphabet = 2 + u64::from(next(4));
        let trace: Vec<u32> = (0..len).map(|_| next(alphabet)).collect();
        let cap = next(4) as usize;
        let initial: Vec<u32> = (0..next(3)).map(|_| next(alphabet)).collect();
        let mut initial_set = initial.clone();
        initial_set.dedup();
        let want = fewest_misses(&trace, cap, &initial_set);
        assert_eq!(
            belady_misses(&trace, cap, &initial_set),
            want,
            "case {case}: {trace:?}, capacity {cap}, holding {initial_set:?}"
        );
    }
}

/// The best fixed set's reads: the set's loads and every request outside it, never fewer than
/// Belady's; on traces whose order matters it reads more.
#[test]
fn fixed_set_reads_at_least_belady() {
    // Capacity 1 over 0 1 0 1 2 0: the set {0} (asked for three times): its load, then 1, 1, 2.
    assert_eq!(fixed_set_misses(&[0, 1, 0, 1, 2, 0], 1, &[]), 4);
    // Order matters: 0 0 0 then 1 1 1; a fixed set keeps one of them, Belady's cache both in turn.
    assert_eq!(fixed_set_misses(&[0, 0, 0, 1, 1, 1], 1, &[]), 4);
    assert_eq!(belady_misses(&[0, 0, 0, 1, 1, 1], 1, &[]), 2);
    // What the cache holds counts: 1 is held, so keeping it saves its two reads where 0's load
    // would save one of three; 0 is then read each time (capacity 1).
    assert_eq!(fixed_set_misses(&[0, 1, 0, 1, 0], 1, &[1]), 3);
    // Nothing kept with no room.
    assert_eq!(fixed_set_misses(&[0, 0, 1], 0, &[0]), 3);
    // Warm and whole: nothing read.
    assert_eq!(fixed_set_misses(&[0, 1, 2, 0, 1, 2], 3, &[0, 1, 2]), 0);
    let mut next = xorshift(0x9e37_79b9_7f4a_7c15);
    for case in 0..500 {
        let len = 1 + next(40) as usize;
        let alphabet = 1 + u64::from(next(12));
        let trace: Vec<u32> = (0..len).map(|_| next(alphabet)).collect();
        let cap = next(6) as usize;
        let mut initial: Vec<u32> = (0..next(5)).map(|_| next(alphabet)).collect();
        initial.sort_unstable();
        initial.dedup();
        let fixed = fixed_set_misses(&trace, cap, &initial);
        let opt = belady_misses(&trace, cap, &initial);
        assert!(
            opt <= fixed && fixed <= len as u64,
            "case {case}: {trace:?}, capacity {cap}, holding {initial:?}: fixed {fixed}, opt {opt}"
        );
        // From a cold cache, no fixed set of `cap` experts reads less (every set tried).
        let cold = fixed_set_misses(&trace, cap, &[]);
        let best = (0u32..1 << alphabet)
            .filter(|set| set.count_ones() as usize <= cap)
            .map(|set| {
                let asked = |e: u32| trace.contains(&e);
                let loads = (0..alphabet as u32)
                    .filter(|&e| set >> e & 1 == 1 && asked(e))
                    .count();
                let outside = trace.iter().filter(|&&e| set >> e & 1 == 0).count();
                (loads + outside) as u64
            })
            .min()
            .unwrap();
        assert_eq!(cold, best, "case {case}: {trace:?}, capacity {cap}");
        if cap >= alphabet as usize {
            // Room for every expert: each is read at most once, as Belady's.
            assert_eq!(fixed, opt, "case {case}: {trace:?}, capacity {cap}");
        }
    }
}
