//! `convert` failing half-way (the disk fills up: a child process with a file-size limit, so writes fail
//! with EFBIG) is an error, and the resident file and store of an earlier convert stay byte-identical,
//! with no temporary left behind (issue "Reliability", item 5).

use crate::common;

use std::path::{Path, PathBuf};

use atomic_out::testing::{child_writes, run_in_child};
use engine::offload::{convert, store_path_for, ConvertOptions};
use engine::{Engine, EngineOptions, ModelFile, Precision};

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tiny-llama-silu-q4_0.gguf")
}

fn convert_to(resident: &Path) -> Result<(), String> {
    let file = ModelFile::open(fixture()).map_err(|e| e.to_string())?;
    let profile = {
        let eng = Engine::new(
            &file,
            EngineOptions {
                threads: 1,
                precision: Precision::Exact,
                context: 64,
                ..Default::default()
            },
        )
        .map_err(|e| e.to_string())?;
        common::synthetic_profile(eng.model())
    };
    convert(
        &file,
        &profile,
        resident,
        &ConvertOptions::default(),
        |_, _| {},
    )
    .map(|_| ())
    .map_err(|e| e.to_string())
}

#[test]
fn a_convert_that_fills_the_disk_leaves_earlier_outputs_intact() {
    child_writes(convert_to);
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("convert-faults-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let resident = dir.join("m.resident.gguf");
    let store = store_path_for(&resident);
    convert_to(&resident).unwrap();
    let before = (
        std::fs::read(&resident).unwrap(),
        std::fs::read(&store).unwrap(),
    );
    let limit = (before.0.len().min(before.1.len()) / 2) as u64;
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
    assert_eq!(
        std::fs::read(&resident).unwrap(),
        before.0,
        "resident file changed"
    );
    assert_eq!(std::fs::read(&store).unwrap(), before.1, "store changed");
    for p in [&resident, &store] {
        let t = atomic_out::temporaries(p).unwrap();
        assert!(t.is_empty(), "temporaries left: {t:?}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
