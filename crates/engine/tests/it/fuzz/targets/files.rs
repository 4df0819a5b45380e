//! The files Sparrow writes and reads back: profiles, predictors, neuron stores, bundle manifests
//! and plans.

use super::*;

/// Saves `save` to a scratch file and returns its bytes.
fn saved(save: impl FnOnce(&Path)) -> Vec<u8> {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("sparrow-fuzz-seed-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("seed");
    save(&path);
    let bytes = std::fs::read(&path).unwrap();
    std::fs::remove_dir_all(&dir).ok();
    bytes
}

pub(super) fn profile() -> Target {
    let layer = |n: u32| LayerProfile {
        n_neurons: n,
        threshold: 0.01,
        freq: (0..2)
            .map(|b| (0..n).map(|j| (j + b) as f32 * 0.1).collect())
            .collect(),
        mean_abs: (0..n).map(|j| j as f32).collect(),
        max_abs: (0..n).map(|j| j as f32 * 2.0).collect(),
        coact_gate_up: (0..n).map(|j| 1.0 / (1.0 + j as f32)).collect(),
        coact_gate_down: (0..n).map(|j| 0.5 / (1.0 + j as f32)).collect(),
    };
    let p = Profile {
        model: "tiny.gguf".into(),
        model_fingerprint: 0xdead_beef,
        corpus: "corpus.txt".into(),
        tokens: 1234,
        activation: ActivationKind::Silu,
        score: ScoreKind::OutputNorm,
        batch_sizes: vec![1, 4],
        layers: vec![layer(5), layer(0), layer(3)],
    };
    Target {
        name: "profile",
        seeds: vec![one("p.prof", saved(|path| p.save(path).unwrap()))],
        dict: &[],
        fixup: Some(reseal_fnv),
        run: Box::new(|dir| Profile::load(dir.join("p.prof")).map(|_| ()).map_err(e)),
    }
}

pub(super) fn predictor() -> Target {
    let (d, h, o) = (9, 32, 7);
    let w = |n: usize, k: f32| {
        (0..n)
            .map(|i| ((i as f32) * k).sin() * 0.3)
            .collect::<Vec<f32>>()
    };
    let p = Predictor::from_f32(
        d,
        h,
        o,
        &w(h * d, 0.7),
        &w(h, 1.1),
        &w(o * h, 0.3),
        &w(o, 0.9),
        0.1,
    )
    .unwrap();
    let set = PredictorSet {
        model_fingerprint: 7,
        layers: vec![p.clone(), p],
    };
    Target {
        name: "predictor",
        seeds: vec![one("p.pred", saved(|path| set.save(path).unwrap()))],
        dict: &[],
        fixup: Some(reseal_fnv),
        run: Box::new(|dir| {
            let set = PredictorSet::load(dir.join("p.pred")).map_err(e)?;
            for p in &set.layers {
                let x = vec![0.5; p.d_in()];
                let mut out = vec![0.0; p.n_out()];
                p.scores(&x, &mut out).map_err(e)?;
                let mut ids = Vec::new();
                p.predict(&x, &mut ids).map_err(e)?;
            }
            Ok(())
        }),
    }
}

pub(super) fn store() -> Target {
    let (layers, d, ff) = (2, 64, 12);
    let q8 = Formats {
        gate: WeightFormat::Q8_0,
        up: WeightFormat::Q8_0,
        down: WeightFormat::Q8_0,
    };
    let mut seeds = Vec::new();
    for max_k in [usize::MAX, 1] {
        let l = BundleLayout::with_neurons(d, q8, max_k).unwrap();
        seeds.push(one(
            "m.neurons",
            saved(|path| {
                let mut w = StoreWriter::create_with(path, layers, d, ff, q8, max_k).unwrap();
                for li in 0..layers {
                    let order: Vec<u32> = (0..ff as u32)
                        .map(|i| (i * 5 + li as u32) % ff as u32)
                        .collect();
                    w.add_layer(LayerInput {
                        gate: &vec![1; ff * l.gate_row],
                        up: &vec![2; ff * l.up_row],
                        down_t: &vec![3; ff * l.down_row],
                        order,
                        hot_neurons: ff / 4,
                        down_norms: (0..ff).map(|i| i as f32).collect(),
                    })
                    .unwrap();
                }
                w.finish().unwrap();
            }),
        ));
    }
    // The engine keeps every file it opened: a fresh one now and then bounds the open descriptors.
    let io = std::cell::RefCell::new((IoEngine::new(IoConfig::default()).unwrap(), 0u32));
    Target {
        name: "store",
        seeds,
        dict: &[],
        fixup: Some(reseal_store),
        run: Box::new(move |dir| {
            let mut io = io.borrow_mut();
            io.1 += 1;
            if io.1 % 256 == 0 {
                // Dropping an engine joins its I/O thread, which took ~1.8 s here: not on the clock.
                let old =
                    std::mem::replace(&mut io.0, IoEngine::new(IoConfig::default()).map_err(e)?);
                std::thread::spawn(move || drop(old));
            }
            let store = NeuronStore::open(&io.0, dir.join("m.neurons"), OpenOptions::default())
                .map_err(e)?;
            store.verify_all(&io.0).map_err(e)
        }),
    }
}

/// Bundle manifests: re-seal the checksum line (the hash of everything before it).
fn reseal_manifest(_: &str, b: &mut [u8]) {
    let Ok(text) = std::str::from_utf8(b) else {
        return;
    };
    let Some(i) = text.rfind("checksum fnv1a64:") else {
        return;
    };
    let start = i + "checksum fnv1a64:".len();
    if b.len() >= start + 16 {
        let h = format!("{:016x}", fnv(&b[..i]));
        b[start..start + 16].copy_from_slice(h.as_bytes());
    }
}

pub(super) fn manifest() -> Target {
    use engine::manifest::{Manifest, Part, PartRole};
    let part = |role, file: &str, size| Part {
        role,
        file: file.into(),
        size,
        hash: size.wrapping_mul(0x9e37_79b9_7f4a_7c15),
    };
    let m = Manifest {
        source_fingerprint: 0xdead_beef,
        parts: vec![
            part(PartRole::Resident, "m.resident.gguf", 48_234_496),
            part(PartRole::Store, "m.resident.neurons", 106_954_752),
            part(PartRole::Profile, "m.resident.gguf.sparrow-profile", 41_216),
            part(
                PartRole::Predictor,
                "m.resident.gguf.sparrow-predictor",
                9_000,
            ),
        ],
    };
    Target {
        name: "manifest",
        seeds: vec![one("m.sparrow-manifest", m.to_text().into_bytes())],
        dict: &[
            b"part ",
            b"store ",
            b"checksum ",
            b"fnv1a64:",
            b"\n",
            b"../",
            b" ",
        ],
        fixup: Some(reseal_manifest),
        run: Box::new(|dir| {
            let p = dir.join("m.sparrow-manifest");
            let bytes = std::fs::read(&p).map_err(e)?;
            let m = Manifest::parse(&p, &bytes).map_err(e)?;
            let back = Manifest::parse(&p, m.to_text().as_bytes()).map_err(e)?;
            if back != m {
                panic!("the manifest does not round-trip: {m:?} -> {back:?}");
            }
            Ok(())
        }),
    }
}

/// Planner files (`kind vN len=L fnv1a64=H` then JSON): re-seal the length and hash of the payload.
fn reseal_planner(_: &str, b: &mut [u8]) {
    let Some(nl) = b.iter().take(256).position(|&c| c == b'\n') else {
        return;
    };
    let Ok(header) = std::str::from_utf8(&b[..nl]) else {
        return;
    };
    let mut words = header.split(' ');
    let (Some(kind), Some(version)) = (words.next(), words.next()) else {
        return;
    };
    let body = &b[nl + 1..];
    let payload = body.strip_suffix(b"\n").unwrap_or(body);
    // The length is zero-padded to the header's old width (the reader accepts leading zeros), so the
    // header keeps its size; a payload whose length needs more digits stays unsealed.
    let Some(width) =
        (nl + 1).checked_sub(format!("{kind} {version} len= fnv1a64={:016x}\n", 0).len())
    else {
        return;
    };
    let fixed = format!(
        "{kind} {version} len={:0width$} fnv1a64={:016x}\n",
        payload.len(),
        planner::fnv1a64(payload)
    );
    if fixed.len() == nl + 1 {
        b[..=nl].copy_from_slice(fixed.as_bytes());
    }
}

/// A small device profile and a plan made for it (the seeds of the `plan` target).
fn planner_seeds() -> (Vec<u8>, Vec<u8>) {
    use planner::{
        make_plan, Constraints, DeviceProfile, FfnLayer, IoRate, KernelRate, ModelSummary, Solver,
        TensorInfo,
    };
    let kernels = (1..=2)
        .map(|t| KernelRate {
            format: "q4_0".into(),
            threads: t,
            dense_bps: 4e9 * t as f64,
            sparse_bps: 2e9 * t as f64,
            axpy_bps: 0.0,
            batch_cost: 0.0,
            dram_dense_bps: 0.0,
            unit_rows_bps: 0.0,
            unit_axpy_bps: 0.0,
        })
        .collect();
    let device = DeviceProfile {
        name: "fuzz".into(),
        fingerprint: 7,
        cores: 2,
        dram_bps: 12e9,
        kernels,
        flash_random: vec![IoRate {
            read_bytes: 4096,
            queue_depth: 32,
            bps: 0.6e9,
        }],
        batch_cost: 0.3,
        flash_seq_bps: 2e9,
        flash_path: "/tmp".into(),
        ..Default::default()
    };
    let freq: Vec<f32> = (0..16).map(|i| 1.0 / (1.0 + i as f32)).collect();
    let freq2: Vec<f32> = freq.iter().map(|p| 1.0 - (1.0 - p) * (1.0 - p)).collect();
    let layer = FfnLayer::from_frequencies(1536, "q4_0", 4096, 2, &[freq, freq2], 4).unwrap();
    let model = ModelSummary {
        name: "fuzz-model".into(),
        fingerprint: 99,
        tensors: vec![TensorInfo {
            name: "attention".into(),
            format: "q4_0".into(),
            bytes: 1 << 20,
            touched_bytes: 1 << 20,
            offloadable: false,
            computed: true,
        }],
        layers: vec![layer.clone(), layer],
        kv_bytes_per_position: 1024,
        process_bytes: 1 << 20,
        batch_sizes: vec![1, 2],
        grid: 4,
        offloaded: true,
        ..Default::default()
    };
    let c = Constraints {
        memory_budget: Some(8 << 20),
        context: 64,
        attended: 64,
        min_tok_s: None,
        max_threads: None,
        accelerator: None,
        accel_neuron_bytes: None,
        spec_acceptance: Default::default(),
    };
    let plan = make_plan(&device, &model, &c, Solver::Search).unwrap();
    (
        saved(|path| device.save(path).unwrap()),
        saved(|path| plan.save(path).unwrap()),
    )
}

pub(super) fn plan() -> Target {
    use planner::{DeviceProfile, Plan};
    let (device, plan) = planner_seeds();
    Target {
        name: "plan",
        seeds: vec![one("d.sparrow-device", device), one("p.sparrow-plan", plan)],
        dict: JSON_DICT,
        fixup: Some(reseal_planner),
        run: Box::new(|dir| {
            // Whichever of the two files the case holds is read, used as the engine would use it,
            // and written back.
            let d = dir.join("d.sparrow-device");
            if d.exists() {
                let d = DeviceProfile::load(d).map_err(e)?;
                for t in d.thread_counts() {
                    let _ = d.kernel_rate("q4_0", t);
                }
                for q in d.queue_depths() {
                    let _ = d.io_rate(4096, q);
                }
                d.save(dir.join("back")).map_err(e)?;
            }
            let p = dir.join("p.sparrow-plan");
            if p.exists() {
                let plan = Plan::load(&p).map_err(e)?;
                let _ = plan.describe();
                let _ = plan.check_for(&p, 99, 2, Some(7));
                let _ = engine::PlanSettings::of(&plan);
                plan.save(dir.join("back")).map_err(e)?;
            }
            Ok(())
        }),
    }
}
