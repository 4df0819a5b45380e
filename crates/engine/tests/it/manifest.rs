//! Bundle manifests (`engine::manifest`): `sparrow convert`'s bundle is sealed with the size and hash
//! of every part; loading checks the sizes and refuses a part that does not match, naming it; a
//! bundle without a manifest loads (the CLI warns); `verify` reads every part and names the one whose
//! contents changed; a damaged or hostile manifest is an error naming it, never a panic.

use crate::common;

use std::path::{Path, PathBuf};

use engine::bundle::{seal_manifest, BundleParts, ModelBundle, SparsePlan, SparseSidecars};
use engine::manifest::{manifest_path, Manifest, ManifestStatus, PartRole};
use engine::offload::{convert, store_path_for, ConvertOptions, OffloadOptions};
use engine::{Engine, EngineOptions, MemoryBudget, ModelFile};

fn tmp_dir(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("manifest-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn engine(file: &ModelFile) -> Engine<'_> {
    Engine::new(
        file,
        EngineOptions {
            threads: 1,
            context: 64,
            ..Default::default()
        },
    )
    .unwrap()
}

/// The manifest the bundle of `resident` has (the name the resident file records, or the older
/// layout's `<resident>.sparrow-manifest`).
fn mpath_of(resident: &Path) -> PathBuf {
    BundleParts::read(resident).unwrap().unwrap().manifest
}

/// A converted bundle in its own folder (resident file, store, profile), as convert writes it
/// (sealed). With `older`, rewritten into the layout of converts before bundles were transactions
/// (fixed sidecar names), then sealed unless `seal` is false. Returns the resident file's path.
fn bundle(tag: &str, seal: bool) -> PathBuf {
    bundle_in(tag, seal, false)
}

fn older_bundle(tag: &str, seal: bool) -> PathBuf {
    bundle_in(tag, seal, true)
}

fn bundle_in(tag: &str, seal: bool, older: bool) -> PathBuf {
    let dir = tmp_dir(tag);
    let file = ModelFile::open(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tiny-llama-silu-q4_0.gguf"),
    )
    .unwrap();
    let profile = common::synthetic_profile(engine(&file).model());
    let resident = ModelBundle::new(dir.join("m.gguf")).resident();
    let r = convert(
        &file,
        &profile,
        &resident,
        &ConvertOptions::default(),
        |_, _| {},
    )
    .unwrap();
    assert!(seal || older, "convert always seals");
    if older {
        common::to_older_layout(&resident);
        assert_eq!(mpath_of(&resident), manifest_path(&resident));
    }
    if seal && older {
        let m = seal_manifest(&resident, r.source_fingerprint).unwrap();
        assert_eq!(
            m.parts.iter().map(|p| p.role).collect::<Vec<_>>(),
            [PartRole::Resident, PartRole::Store, PartRole::Profile]
        );
    }
    resident
}

/// What loading the bundle for sparse decode says (its manifest status, or the error).
fn load(resident: &Path) -> Result<Option<ManifestStatus>, String> {
    let file = ModelFile::open(resident).map_err(|e| e.to_string())?;
    let eng = engine(&file);
    SparsePlan::new(
        &eng,
        &SparseSidecars::default(),
        MemoryBudget::All,
        OffloadOptions::default(),
    )
    .map(|p| p.manifest)
    .map_err(|e| e.to_string())
}

fn fnv(b: &[u8]) -> u64 {
    let mut h = predictor::Fnv1a64::default();
    h.update(b);
    h.finish()
}

/// `body` with a correct checksum line: a hostile manifest that passes the checksum.
fn sealed(body: &str) -> String {
    format!("{body}checksum fnv1a64:{:016x}\n", fnv(body.as_bytes()))
}

#[test]
fn a_sealed_bundle_loads_and_verifies() {
    for older in [false, true] {
        let resident = bundle_in(&format!("ok-{older}"), true, older);
        sealed_bundle_loads_and_verifies(&resident);
    }
}

fn sealed_bundle_loads_and_verifies(resident: &Path) {
    let resident = resident.to_path_buf();
    let m = Manifest::read(&resident).unwrap().unwrap();
    assert_eq!(
        m.parts.iter().map(|p| p.role).collect::<Vec<_>>(),
        [PartRole::Resident, PartRole::Store, PartRole::Profile]
    );
    assert_eq!(
        load(&resident).unwrap(),
        Some(ManifestStatus::SizesMatch(mpath_of(&resident)))
    );
    let m = Manifest::read(&resident).unwrap().unwrap();
    let mut seen = 0;
    let checks = m.verify(&resident, |n| seen += n).unwrap();
    assert_eq!(seen, m.total_bytes(), "progress covers every byte");
    assert_eq!(checks.len(), 3);
    assert!(checks.iter().all(|c| c.problem.is_none()), "{checks:?}");
    // The text round-trips.
    let text = std::fs::read(mpath_of(&resident)).unwrap();
    assert_eq!(Manifest::parse(Path::new("m"), &text).unwrap(), m);
}

#[test]
fn a_bundle_without_a_manifest_loads_unchecked() {
    let resident = older_bundle("old", false);
    assert_eq!(
        load(&resident).unwrap(),
        Some(ManifestStatus::Missing(manifest_path(&resident)))
    );
}

#[test]
fn a_part_of_another_size_is_refused_at_load_by_name() {
    let resident = bundle("size", true);
    let store = store_path_for(&resident);
    // One byte more on the store: the load names the store and the manifest.
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&store)
        .unwrap();
    std::io::Write::write_all(&mut f, b"x").unwrap();
    drop(f);
    let e = load(&resident).unwrap_err();
    assert!(
        e.contains(store.to_str().unwrap()) && e.contains("store part") && e.contains("manifest"),
        "{e}"
    );
    // A missing profile is named too.
    let resident = bundle("missing", true);
    let profile = BundleParts::read(&resident).unwrap().unwrap().profile;
    std::fs::remove_file(&profile).unwrap();
    let e = load(&resident).unwrap_err();
    assert!(e.contains("missing") && e.contains("profile part"), "{e}");
}

#[test]
fn verify_names_a_part_whose_contents_changed() {
    let resident = bundle("flip", true);
    // A byte of the store's last unit (its own CRC is only checked when that unit is read).
    let store = store_path_for(&resident);
    let mut b = std::fs::read(&store).unwrap();
    let n = b.len();
    b[n - 4096 + 10] ^= 1;
    std::fs::write(&store, &b).unwrap();
    // Same size: the cheap check at load passes...
    assert!(load(&resident).is_ok());
    // ...and verify finds it, and only it.
    let m = Manifest::read(&resident).unwrap().unwrap();
    let checks = m.verify(&resident, |_| {}).unwrap();
    let bad: Vec<_> = checks.iter().filter(|c| c.problem.is_some()).collect();
    assert_eq!(bad.len(), 1, "{checks:?}");
    assert_eq!(bad[0].part.role, PartRole::Store);
    assert!(bad[0].problem.as_ref().unwrap().contains("contents differ"));
}

#[test]
fn damaged_or_hostile_manifests_are_errors_naming_it() {
    let resident = bundle("hostile", true);
    let mpath = mpath_of(&resident);
    let good = std::fs::read_to_string(&mpath).unwrap();
    let body = &good[..good.rfind("checksum ").unwrap()];
    let store_line = body.lines().find(|l| l.starts_with("part store")).unwrap();
    let fp_line = body.lines().nth(1).unwrap();
    let cases: Vec<(&str, String, &str)> = vec![
        ("flipped byte", good.replacen("part", "pArt", 1), "damaged"),
        ("no checksum", body.to_string(), "no checksum"),
        ("empty", String::new(), "no checksum"),
        (
            "version 2",
            sealed(&body.replacen("manifest 1", "manifest 2", 1)),
            "version `2`",
        ),
        (
            "not a manifest",
            sealed("hello\n"),
            "not a Sparrow manifest",
        ),
        (
            "path out",
            sealed(&body.replacen(
                store_line,
                "part store ../x.neurons 1 fnv1a64:0000000000000000",
                1,
            )),
            "not a plain file name",
        ),
        (
            "absolute",
            sealed(&body.replacen(
                store_line,
                "part store /dev/zero 1 fnv1a64:0000000000000000",
                1,
            )),
            "not a plain file name",
        ),
        (
            "no store",
            sealed(&body.replacen(&format!("{store_line}\n"), "", 1)),
            "lacks the store part",
        ),
        (
            "store twice",
            sealed(&body.replacen(store_line, &format!("{store_line}\n{store_line}"), 1)),
            "listed twice",
        ),
        (
            "huge size",
            sealed(&body.replacen(
                store_line,
                "part store m.neurons 99999999999999999999999 fnv1a64:0000000000000000",
                1,
            )),
            "bad part line",
        ),
        (
            "unknown role",
            sealed(&format!(
                "{body}part weights w 1 fnv1a64:0000000000000000\n"
            )),
            "bad part line",
        ),
        (
            "other model",
            sealed(&body.replacen(fp_line, "source-fingerprint 0123456789abcdef", 1)),
            "conversion of model 0123456789abcdef",
        ),
    ];
    for (what, text, expect) in cases {
        std::fs::write(&mpath, &text).unwrap();
        let e = load(&resident).expect_err(what);
        assert!(
            e.contains(mpath.to_str().unwrap()) && e.contains(expect),
            "{what}: {e}"
        );
    }
    std::fs::write(&mpath, [0xff, 0xfe, b'\n']).unwrap();
    let e = load(&resident).unwrap_err();
    assert!(e.contains("not UTF-8"), "{e}");
    // Larger than any manifest: refused before it is read.
    std::fs::write(&mpath, vec![b'#'; 1 << 20]).unwrap();
    let e = load(&resident).unwrap_err();
    assert!(e.contains("more than the"), "{e}");
    // Not a regular file.
    std::fs::remove_file(&mpath).unwrap();
    std::fs::create_dir(&mpath).unwrap();
    let e = load(&resident).unwrap_err();
    assert!(e.contains("not a regular file"), "{e}");
    std::fs::remove_dir(&mpath).unwrap();
    std::fs::write(&mpath, &good).unwrap();
    assert!(load(&resident).is_ok(), "the good manifest loads again");
}

/// A seeded byte mutator over a real manifest: every variant parses or is an error naming it; none
/// panics (the libFuzzer target `manifest` does the same at scale).
#[test]
fn mutated_manifests_never_panic() {
    let resident = bundle("mutate", true);
    let good = std::fs::read(mpath_of(&resident)).unwrap();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for _ in 0..2000 {
        let mut b = good.clone();
        for _ in 0..1 + next() % 4 {
            let i = (next() as usize) % b.len();
            match next() % 3 {
                0 => b[i] = next() as u8,
                1 => {
                    b.truncate(i);
                }
                _ => b.insert(i, next() as u8),
            }
            if b.is_empty() {
                break;
            }
        }
        let p = Path::new("fuzzed.sparrow-manifest");
        if let Err(e) = Manifest::parse(p, &b) {
            assert!(e.to_string().contains("fuzzed.sparrow-manifest"), "{e}");
        }
    }
}

/// A manifest must describe its own bundle: one naming another resident file (a pristine copy,
/// while the loaded one is damaged) or another store once passed `verify` while `run` read the
/// damaged file. Now the load is refused and `verify` marks the part, in both layouts.
#[test]
fn a_manifest_naming_another_bundles_parts_is_refused() {
    for older in [false, true] {
        let resident = bundle_in(&format!("owner-{older}"), true, older);
        let parts = BundleParts::read(&resident).unwrap().unwrap();
        let mpath = parts.manifest.clone();
        let good = std::fs::read_to_string(&mpath).unwrap();
        let body = &good[..good.rfind("checksum ").unwrap()];
        for (role, from) in [("resident", &parts.resident), ("store", &parts.store)] {
            let name = from.file_name().unwrap().to_str().unwrap();
            let copy = format!("copy-{name}");
            std::fs::copy(from, resident.with_file_name(&copy)).unwrap();
            let text = sealed(&body.replacen(
                &format!("part {role} {name} "),
                &format!("part {role} {copy} "),
                1,
            ));
            assert_ne!(text, good);
            std::fs::write(&mpath, &text).unwrap();
            let e = load(&resident).expect_err(role);
            assert!(
                e.contains(mpath.to_str().unwrap()) && e.contains("not this bundle's"),
                "{role}: {e}"
            );
            let m = Manifest::read(&resident).unwrap().unwrap();
            let checks = m.verify(&resident, |_| {}).unwrap();
            let bad: Vec<_> = checks.iter().filter(|c| c.problem.is_some()).collect();
            assert_eq!(bad.len(), 1, "{checks:?}");
            assert_eq!(bad[0].part.role.name(), role);
        }
        std::fs::write(&mpath, &good).unwrap();
        assert!(load(&resident).is_ok());
    }
}
