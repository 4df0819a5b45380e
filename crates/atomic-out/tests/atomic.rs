//! `AtomicFile`, stale temporaries and same-file detection on a real filesystem.

use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use atomic_out::{
    refuse_same_file, remove_stale_temporaries, same_file, temporaries, write_atomic, AtomicError,
    AtomicFile,
};

/// A fresh folder for one test, removed at the end.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let d = std::env::temp_dir().join(format!("atomic-out-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        TempDir(d)
    }
    fn join(&self, p: &str) -> PathBuf {
        self.0.join(p)
    }
    /// The names in the folder, sorted.
    fn names(&self) -> Vec<String> {
        let mut v: Vec<_> = std::fs::read_dir(&self.0)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A pid above any kernel's `pid_max` (2^22): never a live process.
const DEAD_PID: u32 = 2_000_000_000;

#[test]
fn commit_replaces_the_destination_atomically() {
    let dir = TempDir::new("commit");
    let dest = dir.join("m.bin");
    std::fs::write(&dest, b"old contents").unwrap();
    let mut f = AtomicFile::create(&dest).unwrap();
    assert_eq!(f.dest(), dest.as_path());
    let tmp = f.temp_path().to_path_buf();
    assert_eq!(
        tmp.parent(),
        Some(dir.0.as_path()),
        "the temporary is in the destination's folder"
    );
    let tmp_name = tmp.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        tmp_name.starts_with(&format!(".m.bin.sparrow-tmp-{}-", std::process::id())),
        "{tmp_name}"
    );
    f.write_all(b"new").unwrap();
    f.flush().unwrap();
    assert_eq!(
        std::fs::read(&dest).unwrap(),
        b"old contents",
        "untouched until commit"
    );
    assert_eq!(temporaries(&dest).unwrap(), vec![tmp.clone()]);
    f.commit().unwrap();
    assert_eq!(std::fs::read(&dest).unwrap(), b"new");
    assert_eq!(dir.names(), vec!["m.bin"], "no temporary left");
}

#[test]
fn a_dropped_file_leaves_the_old_file_intact_and_no_temporary() {
    let dir = TempDir::new("drop");
    let dest = dir.join("m.bin");
    std::fs::write(&dest, b"precious").unwrap();
    {
        let mut f = AtomicFile::create(&dest).unwrap();
        f.write_all(&[7; 10_000]).unwrap();
        assert!(f.temp_path().exists());
    }
    assert_eq!(std::fs::read(&dest).unwrap(), b"precious");
    assert_eq!(dir.names(), vec!["m.bin"]);

    // The same when nothing was there before: nothing appears.
    let fresh = dir.join("fresh.bin");
    drop(AtomicFile::create(&fresh).unwrap());
    assert!(!fresh.exists());
    assert_eq!(dir.names(), vec!["m.bin"]);
}

#[test]
fn a_panicking_writer_leaves_the_old_file_intact() {
    let dir = TempDir::new("panic");
    let dest = dir.join("m.bin");
    std::fs::write(&dest, b"precious").unwrap();
    let d = dest.clone();
    let r = std::panic::catch_unwind(move || {
        let mut f = AtomicFile::create(&d).unwrap();
        f.write_all(b"half").unwrap();
        panic!("interrupted");
    });
    assert!(r.is_err());
    assert_eq!(std::fs::read(&dest).unwrap(), b"precious");
    assert_eq!(dir.names(), vec!["m.bin"]);
}

#[test]
fn seek_and_positioned_writes_reach_the_file() {
    let dir = TempDir::new("seek");
    let dest = dir.join("s.bin");
    let mut f = AtomicFile::create(&dest).unwrap();
    f.write_all(&[0; 8]).unwrap();
    f.write_all(b"body").unwrap();
    f.seek(SeekFrom::Start(0)).unwrap();
    f.write_all(b"HEAD").unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileExt;
        f.file().write_at(b"ab", 4).unwrap();
    }
    assert_eq!(f.file().metadata().unwrap().len(), 12);
    f.commit().unwrap();
    assert_eq!(std::fs::read(&dest).unwrap(), b"HEADab\0\0body");
}

#[test]
fn write_atomic_writes_everything() {
    let dir = TempDir::new("whole");
    let dest = dir.join("w.bin");
    std::fs::write(&dest, b"old").unwrap();
    write_atomic(&dest, b"all of it").unwrap();
    assert_eq!(std::fs::read(&dest).unwrap(), b"all of it");
    assert_eq!(dir.names(), vec!["w.bin"]);
}

#[test]
fn two_writers_of_one_destination_do_not_collide() {
    let dir = TempDir::new("two");
    let dest = dir.join("m.bin");
    let mut a = AtomicFile::create(&dest).unwrap();
    let mut b = AtomicFile::create(&dest).unwrap();
    assert_ne!(a.temp_path(), b.temp_path());
    a.write_all(b"a").unwrap();
    b.write_all(b"b").unwrap();
    b.commit().unwrap();
    assert_eq!(std::fs::read(&dest).unwrap(), b"b");
    a.commit().unwrap();
    assert_eq!(std::fs::read(&dest).unwrap(), b"a");
    assert_eq!(dir.names(), vec!["m.bin"]);
}

#[test]
fn errors_name_the_file() {
    let dir = TempDir::new("errors");
    let e = AtomicFile::create(dir.join("missing/m.bin")).unwrap_err();
    assert!(matches!(e, AtomicError::Io { .. }), "{e}");
    assert!(e.to_string().contains("missing"), "{e}");
    let io: std::io::Error = e.into();
    assert_eq!(io.kind(), std::io::ErrorKind::NotFound);
    for p in ["/", ".."] {
        let e = AtomicFile::create(p).unwrap_err();
        assert!(matches!(e, AtomicError::NotAFileName { .. }), "{e}");
    }
    // A destination that is a folder: the rename fails and the folder survives.
    std::fs::create_dir(dir.join("sub")).unwrap();
    std::fs::write(dir.join("sub/keep"), b"k").unwrap();
    let mut f = AtomicFile::create(dir.join("sub")).unwrap();
    f.write_all(b"x").unwrap();
    let e = f.commit().unwrap_err();
    assert!(e.to_string().contains("sub"), "{e}");
    assert_eq!(std::fs::read(dir.join("sub/keep")).unwrap(), b"k");
    assert_eq!(
        dir.names(),
        vec!["sub"],
        "the failed commit removed its temporary"
    );
}

#[test]
fn stale_temporaries_of_dead_pids_are_removed_and_live_ones_kept() {
    let dir = TempDir::new("stale");
    let dest = dir.join("m.gguf");
    std::fs::write(&dest, b"model").unwrap();
    let me = std::process::id();
    let dead = [
        format!(".m.gguf.sparrow-tmp-{DEAD_PID}-0"),
        format!(".m.gguf.sparrow-tmp-{DEAD_PID}"),
    ];
    let kept = [
        format!(".m.gguf.sparrow-tmp-{me}-999999"), // live: this process
        format!(".other.sparrow-tmp-{DEAD_PID}-0"), // another destination's
        ".m.gguf.sparrow-tmp-junk".to_string(),     // not one of our names
        "m.gguf.tmp-1".to_string(),
    ];
    for n in dead.iter().chain(&kept) {
        std::fs::write(dir.join(n), b"partial").unwrap();
    }
    assert_eq!(temporaries(&dest).unwrap().len(), 3);
    let mut removed = remove_stale_temporaries(&dest).unwrap();
    removed.sort();
    let mut expected: Vec<_> = dead.iter().map(|n| dir.join(n)).collect();
    expected.sort();
    assert_eq!(removed, expected);
    let mut names: Vec<_> = kept.to_vec();
    names.push("m.gguf".into());
    names.sort();
    assert_eq!(dir.names(), names);
    assert_eq!(std::fs::read(&dest).unwrap(), b"model");

    // Creating a writer for the destination cleans up too.
    std::fs::write(dir.join(&dead[0]), b"partial").unwrap();
    let f = AtomicFile::create(&dest).unwrap();
    assert!(!dir.join(&dead[0]).exists());
    drop(f);
    assert_eq!(dir.names(), names);
    assert!(remove_stale_temporaries(dir.join("no-such-folder/x"))
        .unwrap()
        .is_empty());
}

#[test]
fn same_file_through_links_and_spellings() {
    let dir = TempDir::new("same");
    let (x, y) = (dir.join("x"), dir.join("y"));
    std::fs::write(&x, b"same bytes").unwrap();
    std::fs::write(&y, b"same bytes").unwrap();
    assert!(same_file(&x, &x));
    assert!(!same_file(&x, &y), "equal contents are not the same file");

    std::fs::hard_link(&x, dir.join("hard")).unwrap();
    assert!(same_file(&x, dir.join("hard")));
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink(&x, dir.join("sym")).unwrap();
        assert!(same_file(dir.join("sym"), &x));
        std::os::unix::fs::symlink(&dir.0, dir.join("dirlink")).unwrap();
        assert!(same_file(dir.join("dirlink/x"), &x));
        assert!(same_file(dir.join("dirlink/new"), dir.join("new")));
    }
    std::fs::create_dir(dir.join("sub")).unwrap();
    assert!(same_file(dir.0.join("./x"), &x));
    assert!(same_file(dir.0.join("sub/../x"), &x));

    // Relative spellings (cargo runs tests in the package's folder).
    assert!(same_file("./Cargo.toml", "Cargo.toml"));
    assert!(same_file(
        "Cargo.toml",
        Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml")
    ));
    assert!(!same_file("Cargo.toml", "src"));

    // Outputs that do not exist yet compare by folder and name.
    assert!(same_file(dir.0.join("./new"), dir.join("new")));
    assert!(same_file(dir.join("a/b/c"), dir.0.join("a/./b/c")));
    assert!(!same_file(dir.join("new"), dir.join("other")));
    assert!(!same_file(dir.join("new"), &x));
}

#[test]
fn refuse_same_file_names_both_paths() {
    let dir = TempDir::new("refuse");
    let model = dir.join("m.gguf");
    std::fs::write(&model, b"model").unwrap();
    let spelled = dir.0.join(".").join("m.gguf");
    let e = refuse_same_file(&[dir.join("m.profile"), spelled.clone()], &[&model]).unwrap_err();
    match &e {
        AtomicError::SameFile { output, input } => {
            assert_eq!((output, input), (&spelled, &model));
        }
        other => panic!("{other}"),
    }
    assert!(e.to_string().contains("same file"), "{e}");
    assert_eq!(e.path(), spelled.as_path());

    let (a, b) = (dir.join("out"), dir.0.join("./out"));
    let e = refuse_same_file(&[&a, &b], &[&model]).unwrap_err();
    assert!(matches!(e, AtomicError::SameOutput { .. }), "{e}");

    refuse_same_file(&[dir.join("m.profile"), dir.join("m.store")], &[&model]).unwrap();
    refuse_same_file::<PathBuf, PathBuf>(&[], &[]).unwrap();
    assert_eq!(std::fs::read(&model).unwrap(), b"model");
}
