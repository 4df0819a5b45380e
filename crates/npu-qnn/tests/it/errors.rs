//! Failures, each named: a library that does not load, one that is not QNN, a wrong API version,
//! and a failing QNN call at every step the wrapper makes (fault injection of the double).

use crate::common;

use std::path::Path;

use common::{control, double};
use npu_qnn::{
    Backend, Context, Device, FfnActivation, FfnGraph, FfnWeights, Graph, Qnn, QnnError,
};

#[test]
fn a_missing_library_is_a_load_error_naming_the_path() {
    let path = Path::new("/nonexistent/libQnnHtp.so");
    match Qnn::load(Some(path)) {
        Err(e @ QnnError::Load { .. }) => {
            let QnnError::Load { path: p, .. } = &e else {
                unreachable!()
            };
            assert_eq!(p, path);
            assert!(e.to_string().contains("/nonexistent/libQnnHtp.so"), "{e}");
        }
        Err(e) => panic!("expected Load, got {e:?}"),
        Ok(_) => panic!("a missing library loaded"),
    }
}

#[test]
fn a_library_without_the_symbol_is_missing_symbol() {
    match Qnn::load(Some(Path::new("libm.so.6"))) {
        Err(QnnError::MissingSymbol { symbol, path }) => {
            assert_eq!(symbol, "QnnInterface_getProviders");
            assert_eq!(path, Path::new("libm.so.6"));
        }
        Err(e) => panic!("expected MissingSymbol, got {e:?}"),
        Ok(_) => panic!("libm taken for a QNN library"),
    }
}

#[test]
fn a_wrong_api_major_is_a_version_error() {
    let ctl = control();
    for major in [1, 3] {
        ctl.set_api_major(Some(major));
        let r = Qnn::load(Some(&double()));
        ctl.set_api_major(None);
        match r {
            Err(QnnError::Version { found, want }) => {
                assert_eq!(found.major, major);
                assert_eq!((want.major, want.minor), (2, 10));
            }
            Err(e) => panic!("expected Version, got {e:?}"),
            Ok(_) => panic!("core API {major}.x accepted"),
        }
    }
    // And the override is gone again.
    assert_eq!(Qnn::load(Some(&double())).unwrap().api_version().major, 2);
}

/// Builds and runs a small FFN, stopping at the first error.
fn run_all(qnn: &Qnn) -> Result<(), QnnError> {
    let backend = Backend::new(qnn)?;
    let device = Device::new(&backend)?;
    let ctx = Context::new(&backend, Some(&device))?;
    let w = vec![0.25f32; 8 * 4];
    let mut ffn = FfnGraph::build(
        &ctx,
        2,
        4,
        8,
        FfnWeights::F32(&w),
        FfnWeights::F32(&w),
        FfnWeights::F32(&w),
        FfnActivation::Silu,
    )?;
    let mut y = vec![0.0; 8];
    ffn.execute(&[1.0; 8], &mut y)
}

#[test]
fn every_failing_step_is_named() {
    let ctl = control();
    let qnn = Qnn::load(Some(&double())).unwrap();
    run_all(&qnn).expect("no fault: everything runs");
    for step in [
        "backendCreate",
        "deviceCreate",
        "contextCreate",
        "graphCreate",
        "tensorCreateGraphTensor",
        "graphAddNode",
        "graphFinalize",
        "graphExecute",
    ] {
        ctl.set_fail(Some(step));
        let r = run_all(&qnn);
        ctl.set_fail(None);
        match r {
            Err(QnnError::Call { step: s, code }) => {
                assert_eq!(s, step);
                assert_eq!(code, npu_qnn_sys::QNN_COMMON_ERROR_GENERAL);
            }
            other => panic!("{step} failing gave {other:?}"),
        }
        assert_eq!(ctl.live_objects(), 0, "objects leaked after {step} failed");
    }
    assert_eq!(ctl.order_errors(), 0);
}

#[test]
fn parents_dropped_first_are_freed_last() {
    let ctl = control();
    let qnn = Qnn::load(Some(&double())).unwrap();
    let backend = Backend::new(&qnn).unwrap();
    let device = Device::new(&backend).unwrap();
    let ctx = Context::new(&backend, Some(&device)).unwrap();
    let mut g = Graph::new(&ctx, "g").unwrap();
    drop(qnn);
    drop(backend);
    drop(device);
    drop(ctx);
    // The graph still works: its context, device, backend and library are alive through it.
    let x = g.input("x", &[1, 2]).unwrap();
    let y = g.output("y", &[1, 2]).unwrap();
    g.relu("relu", x, y).unwrap();
    g.finalize().unwrap();
    let mut out = [0.0f32; 2];
    g.execute(&[&[-1.0, 3.0]], &mut [&mut out]).unwrap();
    assert_eq!(out, [0.0, 3.0]);
    drop(g);
    assert_eq!(ctl.live_objects(), 0);
    assert_eq!(ctl.order_errors(), 0);
}

#[test]
fn shapes_and_lengths_are_checked_before_qnn() {
    let qnn = Qnn::load(Some(&double())).unwrap();
    let backend = Backend::new(&qnn).unwrap();
    let ctx = Context::new(&backend, None).unwrap();
    let mut g = Graph::new(&ctx, "shapes").unwrap();
    let x = g.input("x", &[2, 3]).unwrap();
    let w = g.static_f32("w", &[4, 5], &[0.0; 20]).unwrap();
    let y = g.output("y", &[2, 4]).unwrap();
    assert!(matches!(
        g.fully_connected("fc", x, w, None, y),
        Err(QnnError::Shape { .. })
    ));
    assert!(matches!(
        g.static_i8_per_row("q", [2, 2], &[1, 2, 3, 4], &[1.0]),
        Err(QnnError::Length {
            expected: 2,
            got: 1,
            ..
        })
    ));
    assert!(matches!(g.execute(&[], &mut []), Err(QnnError::State(_))));
    let w2 = g.static_f32("w2", &[4, 3], &[0.5; 12]).unwrap();
    g.fully_connected("fc", x, w2, None, y).unwrap();
    g.finalize().unwrap();
    let mut out = [0.0f32; 8];
    assert!(matches!(
        g.execute(&[&[1.0; 5]], &mut [&mut out]),
        Err(QnnError::Length {
            expected: 6,
            got: 5,
            ..
        })
    ));
    g.execute(&[&[1.0; 6]], &mut [&mut out]).unwrap();
    assert_eq!(out, [1.5; 8]);
    // Duplicate graph names are QNN's to refuse.
    assert!(matches!(
        Graph::new(&ctx, "shapes"),
        Err(QnnError::Call {
            step: "graphCreate",
            code: 6003
        })
    ));
}

/// Child half of `environment_variables_reach_the_double`.
const CHILD: &str = "NPU_QNN_TEST_ENV_CHILD";

#[test]
fn environment_variables_reach_the_double() {
    if std::env::var_os(CHILD).is_some() {
        // In the child: report what happens under the environment the parent set.
        let r = Qnn::load(Some(&double())).and_then(|q| run_all(&q));
        println!("CHILD-RESULT {:?}", r.err());
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let runner = std::env::var("SPARROW_TEST_RUNNER").unwrap_or_default();
    for (var, value, want) in [
        (
            "QNN_DOUBLE_FAIL",
            "graphFinalize",
            "Call { step: \"graphFinalize\", code: 1100 }",
        ),
        (
            "QNN_DOUBLE_API_MAJOR",
            "7",
            "Version { found: ApiVersion { major: 7",
        ),
    ] {
        let mut words = runner.split_whitespace();
        let mut cmd = match words.next() {
            Some(p) => {
                let mut c = std::process::Command::new(p);
                c.args(words).arg(&exe);
                c
            }
            None => std::process::Command::new(&exe),
        };
        let out = match cmd
            .args([
                "errors::environment_variables_reach_the_double",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD, "1")
            .env(var, value)
            .output()
        {
            Ok(o) => o,
            // Not a skip: a check that did not run must not pass. Under an emulator, say how to
            // start the child (cargo xtask ci sets it for the aarch64 run).
            Err(e) => panic!(
                "cannot start the child test binary {exe:?} ({e}): set SPARROW_TEST_RUNNER to the \
                 emulator command (e.g. \"qemu-aarch64 -L /usr/aarch64-linux-gnu\")"
            ),
        };
        let stdout = String::from_utf8_lossy(&out.stdout);
        // The binary did not start (an emulated target: a binfmt handler without the target's
        // sysroot; set SPARROW_TEST_RUNNER as `cargo xtask ci` does): a failure, not a skip.
        assert!(
            stdout.contains("running 1 test"),
            "the child test binary did not start ({}): {}; set SPARROW_TEST_RUNNER to the emulator",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            stdout.contains(&format!("CHILD-RESULT Some({want}")),
            "{var}={value}: child said\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
