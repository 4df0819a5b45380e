//! Plan and device-profile files: round trips, damage, other kinds and versions, plans for another
//! model or device.

use crate::common;

use common::{device, model};
use planner::{make_plan, Constraints, DeviceProfile, Plan, PlannerError, Solver};
use proptest::prelude::*;

fn tmp(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("planner-files-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

fn plan() -> Plan {
    let m = model(2, 32, 4, 1.0, true);
    let c = Constraints {
        memory_budget: Some(64 << 20),
        context: 256,
        ..Constraints::default()
    };
    make_plan(&device(2, 1.0), &m, &c, Solver::Search).unwrap()
}

#[test]
fn plan_and_device_round_trip() {
    let p = plan();
    let path = tmp("rt.plan");
    p.save(&path).unwrap();
    assert_eq!(Plan::load(&path).unwrap(), p);
    let d = device(4, 1.5);
    let dp = tmp("rt.device");
    d.save(&dp).unwrap();
    assert_eq!(DeviceProfile::load(&dp).unwrap(), d);
    // The header names the kind; a device profile is not a plan.
    let err = Plan::load(&dp).unwrap_err().to_string();
    assert!(
        err.contains("rt.device") && err.contains("not a sparrow-plan file"),
        "{err}"
    );
}

#[test]
fn a_plan_for_another_model_or_device_is_refused_by_name() {
    let p = plan();
    let path = std::path::Path::new("x.plan");
    p.check_for(path, 99, 2, Some(7)).unwrap();
    let e = p.check_for(path, 98, 2, Some(7)).unwrap_err();
    assert!(matches!(e, PlannerError::Mismatch { .. }));
    assert!(e.to_string().contains("x.plan") && e.to_string().contains("another model"));
    let e = p.check_for(path, 99, 3, None).unwrap_err();
    assert!(e.to_string().contains("another model"));
    let e = p.check_for(path, 99, 2, Some(8)).unwrap_err();
    assert!(e.to_string().contains("another device"), "{e}");
}

#[test]
fn other_versions_and_garbage_are_named() {
    let p = plan();
    let path = tmp("v.plan");
    p.save(&path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let text = String::from_utf8(bytes.clone()).unwrap();
    std::fs::write(
        &path,
        text.replacen("sparrow-plan v1", "sparrow-plan v9", 1),
    )
    .unwrap();
    let e = Plan::load(&path).unwrap_err().to_string();
    assert!(e.contains("version 9"), "{e}");
    std::fs::write(&path, b"").unwrap();
    assert!(Plan::load(&path)
        .unwrap_err()
        .to_string()
        .contains("v.plan"));
    let e = Plan::load(tmp("missing.plan")).unwrap_err().to_string();
    assert!(e.contains("missing.plan"), "{e}");
    let e = Plan::load(std::env::temp_dir()).unwrap_err().to_string();
    assert!(e.contains("not a regular file"), "{e}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Any byte flipped or any truncation is an error naming the file, never a panic or a different
    /// plan.
    #[test]
    fn damage_is_detected(pos in any::<prop::sample::Index>(), bit in 0u8..8, cut in any::<bool>()) {
        let p = plan();
        let path = tmp(&format!("d-{}.plan", std::thread::current().name().unwrap_or("t").len()));
        p.save(&path).unwrap();
        let mut bytes = std::fs::read(&path).unwrap();
        let i = pos.index(bytes.len() - 1); // the last byte is a newline outside the payload
        if cut {
            bytes.truncate(i);
        } else {
            bytes[i] ^= 1 << bit;
        }
        std::fs::write(&path, &bytes).unwrap();
        match Plan::load(&path) {
            Err(e) => prop_assert!(e.to_string().contains(".plan"), "{}", e),
            // A flip inside the header's checksum digits can only be accepted if it is a no-op
            // (upper/lower case of a hex digit); the plan must then be the same.
            Ok(q) => prop_assert_eq!(q, p),
        }
    }
}
