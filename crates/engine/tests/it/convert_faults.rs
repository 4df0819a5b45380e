//! A convert over an existing bundle is one transaction: failing at any step (an injected error, as
//! a full disk gives; a file-size limit, so writes fail with EFBIG; the process killed) leaves the
//! earlier bundle byte-identical and runnable, or the new one complete, never a mix (issue 49).

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use atomic_out::testing::{child_writes, run_in_child};
use engine::bundle::{BundleParts, SparsePlan, SparseSidecars};
use engine::manifest::Manifest;
use engine::offload::{convert, ConvertOptions, ConvertStep, OffloadOptions, Packing};
use engine::{Engine, EngineOptions, MemoryBudget, ModelFile, Precision, PredictorSet};

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tiny-llama-silu-q4_0.gguf")
}

fn engine(file: &ModelFile) -> Engine<'_> {
    Engine::new(
        file,
        EngineOptions {
            threads: 1,
            precision: Precision::Exact,
            context: 64,
            ..Default::default()
        },
    )
    .unwrap()
}

fn tmp_dir(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("convert-faults-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Converts the fixture into `resident`; `second` gives another packing and profile (a different
/// store), and carries a predictor file.
fn convert_with(resident: &Path, second: bool, opts: ConvertOptions) -> Result<(), String> {
    let file = ModelFile::open(fixture()).map_err(|e| e.to_string())?;
    let mut profile = common::synthetic_profile(engine(&file).model());
    let mut opts = opts;
    if second {
        for l in &mut profile.layers {
            l.freq[0].reverse();
        }
        opts.packing = Some(Packing::None);
        let pred = resident.with_file_name("input.sparrow-predictor");
        PredictorSet {
            model_fingerprint: profile.model_fingerprint,
            layers: Vec::new(),
        }
        .save(&pred)
        .map_err(|e| e.to_string())?;
        opts.predictor = Some(pred.clone());
        opts.keep = vec![pred];
    }
    convert(&file, &profile, resident, &opts, |_, _| {})
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Every file in `dir` with its bytes.
fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect()
}

/// The bundle of `resident` loads (its manifest's sizes and ownership checked), every part hashes
/// as its manifest says, and a forward step over it runs. Returns the bundle's parts.
fn runs(resident: &Path) -> BundleParts {
    let parts = BundleParts::read(resident).unwrap().unwrap();
    let m = Manifest::read_at(&parts.manifest)
        .unwrap()
        .expect("a manifest");
    let checks = m.verify(resident, |_| {}).unwrap();
    assert!(checks.iter().all(|c| c.problem.is_none()), "{checks:?}");
    let file = ModelFile::open(resident).unwrap();
    let mut eng = engine(&file);
    let sidecars = SparseSidecars {
        no_predictor: true,
        ..Default::default()
    };
    let plan = SparsePlan::new(
        &eng,
        &sidecars,
        MemoryBudget::All,
        OffloadOptions::default(),
    )
    .unwrap();
    let sp = plan.build(&eng).unwrap();
    eng.set_sparse(Some(sp));
    let l = common::logits(&eng, &[1, 2, 3], false);
    assert!(l.iter().all(|x| x.is_finite()) && !l.is_empty());
    parts
}

static FAIL_AT: AtomicUsize = AtomicUsize::new(usize::MAX);
static SEEN: AtomicUsize = AtomicUsize::new(0);

fn fail_at_step(step: ConvertStep) -> std::io::Result<()> {
    SEEN.fetch_add(1, Ordering::SeqCst);
    if ConvertStep::ALL[FAIL_AT.load(Ordering::SeqCst)] == step {
        return Err(std::io::Error::from_raw_os_error(28)); // ENOSPC
    }
    Ok(())
}

#[test]
fn a_convert_failing_at_any_step_leaves_the_old_bundle_or_the_new_one() {
    let dir = tmp_dir("steps");
    let resident = dir.join("m.resident.gguf");
    convert_with(&resident, false, ConvertOptions::default()).unwrap();
    let old_parts = runs(&resident);
    let before = snapshot(&dir);
    for (k, step) in ConvertStep::ALL.into_iter().enumerate() {
        FAIL_AT.store(k, Ordering::SeqCst);
        let opts = ConvertOptions {
            fault: Some(fail_at_step),
            ..Default::default()
        };
        let e = convert_with(&resident, true, opts).expect_err("the injected fault fails it");
        assert!(e.contains(&format!("{step:?}")), "{step:?}: {e}");
        if step != ConvertStep::Switched {
            // The old bundle, byte for byte, and nothing else (the new parts are removed; the
            // predictor input is the test's own).
            let mut now = snapshot(&dir);
            now.remove("input.sparrow-predictor");
            assert_eq!(
                now.keys().collect::<Vec<_>>(),
                before.keys().collect::<Vec<_>>(),
                "{step:?}"
            );
            assert!(now == before, "{step:?}: a part changed");
            assert_eq!(runs(&resident), old_parts, "{step:?}");
        } else {
            // Switched: the new bundle runs; the old parts are still there (not yet removed).
            let parts = runs(&resident);
            assert_ne!(parts, old_parts);
            assert!(parts.predictor.is_some());
            for p in old_parts.all().iter().skip(1) {
                assert!(p.exists(), "{}", p.display());
            }
        }
    }
    // A convert that succeeds switches and removes what it replaced, the inputs excepted.
    let replaced = runs(&resident);
    convert_with(&resident, false, ConvertOptions::default()).unwrap();
    let parts = runs(&resident);
    for p in replaced.all().iter().skip(1) {
        assert!(!p.exists(), "{} was not removed", p.display());
    }
    assert!(
        dir.join("input.sparrow-predictor").exists(),
        "an input was removed"
    );
    assert!(parts.all().iter().all(|p| p.exists()));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_convert_killed_at_any_step_leaves_a_runnable_bundle() {
    // In the child: convert, and exit at the step the parent names (no destructor runs, as on a kill).
    if let Ok(k) = std::env::var("SPARROW_TEST_KILL_AT") {
        fn exit_at(step: ConvertStep) -> std::io::Result<()> {
            if ConvertStep::ALL[FAIL_AT.load(Ordering::SeqCst)] == step {
                std::process::exit(9);
            }
            Ok(())
        }
        FAIL_AT.store(k.parse().unwrap(), Ordering::SeqCst);
        let resident = PathBuf::from(std::env::var("SPARROW_TEST_KILL_RESIDENT").unwrap());
        let opts = ConvertOptions {
            fault: Some(exit_at),
            ..Default::default()
        };
        let r = convert_with(&resident, true, opts);
        panic!("the child was not killed: {r:?}");
    }
    let dir = tmp_dir("kill");
    let resident = dir.join("m.resident.gguf");
    convert_with(&resident, false, ConvertOptions::default()).unwrap();
    let old_parts = runs(&resident);
    let before = snapshot(&dir);
    for (k, step) in ConvertStep::ALL.into_iter().enumerate() {
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "convert_faults::a_convert_killed_at_any_step_leaves_a_runnable_bundle",
                "--exact",
                "--test-threads=1",
            ])
            .env("SPARROW_TEST_KILL_AT", k.to_string())
            .env("SPARROW_TEST_KILL_RESIDENT", &resident)
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap();
        assert_eq!(status.code(), Some(9), "{step:?}");
        let parts = runs(&resident);
        if step == ConvertStep::Switched {
            assert_ne!(parts, old_parts);
        } else {
            assert_eq!(parts, old_parts, "{step:?}");
            for p in old_parts.all() {
                let name = p.file_name().unwrap().to_string_lossy().into_owned();
                assert!(
                    std::fs::read(&p).unwrap() == before[&name],
                    "{step:?}: {name} changed"
                );
            }
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_convert_that_fills_the_disk_leaves_earlier_outputs_intact() {
    child_writes(|r| convert_with(r, true, ConvertOptions::default()));
    let dir = tmp_dir("efbig");
    let resident = dir.join("m.resident.gguf");
    convert_with(&resident, false, ConvertOptions::default()).unwrap();
    let old_parts = runs(&resident);
    let store = old_parts.store.clone();
    let before = snapshot(&dir);
    let limit = (std::fs::metadata(&resident).unwrap().len() / 2) as u64;
    assert!(limit > 0);
    let r = run_in_child(
        "convert_faults::a_convert_that_fills_the_disk_leaves_earlier_outputs_intact",
        &resident,
        limit,
    )
    .expect("a child test process starts on the host");
    let err = r.expect_err("convert must fail past the file-size limit");
    assert!(
        err.contains(dir.to_str().unwrap()),
        "the error names the file: {err}"
    );
    let mut now = snapshot(&dir);
    now.remove("input.sparrow-predictor");
    assert!(now == before, "the folder changed: {:?}", now.keys());
    assert_eq!(runs(&resident), old_parts);
    for p in [&resident, &store] {
        let t = atomic_out::temporaries(p).unwrap();
        assert!(t.is_empty(), "temporaries left: {t:?}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Converting over a bundle of an older layout switches it to this one and removes its parts; a
/// (hostile) resident file naming another file of the folder as its store never gets that file
/// removed.
#[test]
fn a_convert_over_an_older_bundle_replaces_it_and_removes_only_its_parts() {
    let dir = tmp_dir("older");
    let resident = dir.join("m.resident.gguf");
    convert_with(&resident, false, ConvertOptions::default()).unwrap();
    common::to_older_layout(&resident);
    let old = BundleParts::read(&resident).unwrap().unwrap();
    assert!(!old.recorded);
    convert_with(&resident, true, ConvertOptions::default()).unwrap();
    let new = runs(&resident);
    assert!(new.recorded);
    assert!(!old.store.exists() && !old.profile.exists());

    // A resident file whose store is `notes.txt`: converting over it keeps the notes.
    let notes = dir.join("notes.txt");
    common::to_older_layout_with_store(&resident, &notes);
    let hostile = BundleParts::read(&resident).unwrap().unwrap();
    assert_eq!(hostile.store, notes);
    convert_with(&resident, false, ConvertOptions::default()).unwrap();
    runs(&resident);
    assert!(
        notes.exists(),
        "a file the old resident file named was removed"
    );
    assert!(!hostile.profile.exists(), "its own profile is removed");
    std::fs::remove_dir_all(&dir).unwrap();
}
