//! The committed fixtures in `fixtures/` are exactly what `cargo xtask fixtures` writes.

use crate::src::fixtures;

#[test]
fn committed_fixtures_are_up_to_date() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .join("fixtures");
    let tmp = std::env::temp_dir().join(format!("sparrow-fixtures-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    for fresh in fixtures::write_all(&tmp).unwrap() {
        let name = fresh.file_name().unwrap();
        let committed = std::fs::read(root.join(name)).unwrap_or_else(|e| {
            panic!(
                "fixtures/{} is missing ({e}): run `cargo xtask fixtures`",
                name.to_string_lossy()
            )
        });
        assert!(
            committed == std::fs::read(&fresh).unwrap(),
            "fixtures/{} is stale: run `cargo xtask fixtures`",
            name.to_string_lossy()
        );
    }
    std::fs::remove_dir_all(&tmp).unwrap();
}
