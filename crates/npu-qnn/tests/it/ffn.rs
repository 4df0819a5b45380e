//! FFN graphs through the QNN test double, loaded by path like libQnnHtp.so, against an f64
//! reference: SiLU and ReLU, f32 and INT8 per-row weights, batch sizes 1, 2, 4, 8.

use crate::common;

use common::{control, double, quantize_rows, reference_ffn, Rng};
use npu_qnn::{Backend, Context, Device, FfnActivation, FfnGraph, FfnWeights, Qnn};

const D_MODEL: usize = 24;
const D_FF: usize = 64;
/// f32 accumulation over at most 64 terms of values below 1 in magnitude: far inside this.
const TOL: f64 = 1e-4;

fn check(activation: FfnActivation, int8: bool, seed: u64) {
    let ctl = control();
    let mut rng = Rng::new(seed);
    let gate = rng.vec(D_FF * D_MODEL, 0.5);
    let up = rng.vec(D_FF * D_MODEL, 0.5);
    let down = rng.vec(D_MODEL * D_FF, 0.5);
    let qg = quantize_rows(&gate, D_FF, D_MODEL);
    let qu = quantize_rows(&up, D_FF, D_MODEL);
    let qd = quantize_rows(&down, D_MODEL, D_FF);
    let f64s = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<_>>();
    let (rg, ru, rd) = if int8 {
        (qg.2.clone(), qu.2.clone(), qd.2.clone())
    } else {
        (f64s(&gate), f64s(&up), f64s(&down))
    };
    let w = |f: &'static str| -> FfnWeights<'_> {
        let (fv, q) = match f {
            "gate" => (&gate, &qg),
            "up" => (&up, &qu),
            _ => (&down, &qd),
        };
        if int8 {
            FfnWeights::Int8 {
                values: &q.0,
                scales: &q.1,
            }
        } else {
            FfnWeights::F32(fv)
        }
    };
    {
        let qnn = Qnn::load(Some(&double())).expect("the double loads");
        assert_eq!(qnn.api_version().major, 2);
        let backend = Backend::new(&qnn).unwrap();
        let device = Device::new(&backend).unwrap();
        let ctx = Context::new(&backend, Some(&device)).unwrap();
        for batch in [1, 2, 4, 8] {
            let mut ffn = FfnGraph::build(
                &ctx,
                batch,
                D_MODEL,
                D_FF,
                w("gate"),
                w("up"),
                w("down"),
                activation,
            )
            .unwrap();
            assert_eq!(ffn.batch(), batch);
            let x = rng.vec(batch * D_MODEL, 1.0);
            let mut y = vec![f32::NAN; batch * D_MODEL];
            ffn.execute(&x, &mut y).unwrap();
            let want = reference_ffn(
                &x,
                batch,
                D_MODEL,
                D_FF,
                &rg,
                &ru,
                &rd,
                activation == FfnActivation::Silu,
            );
            let mut worst = 0.0f64;
            for (i, (&got, &r)) in y.iter().zip(&want).enumerate() {
                let err = (got as f64 - r).abs();
                assert!(
                    err <= TOL * (1.0 + r.abs()),
                    "{activation:?} int8={int8} batch {batch} element {i}: {got} vs reference {r}"
                );
                worst = worst.max(err);
            }
            // The output is not trivially zero (ReLU could zero everything on bad weights).
            assert!(want.iter().any(|v| v.abs() > 1e-3), "degenerate test data");
            eprintln!("{activation:?} int8={int8} batch {batch}: max error {worst:.2e}");
            // A second run with other inputs gives other outputs (no stale results).
            let x2 = rng.vec(batch * D_MODEL, 1.0);
            let mut y2 = vec![0.0f32; batch * D_MODEL];
            ffn.execute(&x2, &mut y2).unwrap();
            assert_ne!(y, y2);
        }
        // Dropped here in declaration-reverse order; the Arcs inside keep QNN's order regardless.
    }
    assert_eq!(ctl.live_objects(), 0, "every QNN object freed");
    assert_eq!(ctl.order_errors(), 0, "children freed before parents");
}

#[test]
fn silu_f32() {
    check(FfnActivation::Silu, false, 1);
}

#[test]
fn silu_int8() {
    check(FfnActivation::Silu, true, 2);
}

#[test]
fn relu_f32() {
    check(FfnActivation::Relu, false, 3);
}

#[test]
fn relu_int8() {
    check(FfnActivation::Relu, true, 4);
}

#[test]
fn int8_reference_differs_from_f32_weights() {
    // The INT8 graph computes with the dequantized weights, not the f32 ones: its output differs
    // from the f32 reference by more than the tolerance somewhere (so the INT8 test can fail).
    let mut rng = Rng::new(9);
    let w = rng.vec(D_FF * D_MODEL, 0.5);
    let (q, s, _) = quantize_rows(&w, D_FF, D_MODEL);
    let qnn = Qnn::load(Some(&double())).unwrap();
    let backend = Backend::new(&qnn).unwrap();
    let ctx = Context::new(&backend, None).unwrap();
    let down = rng.vec(D_MODEL * D_FF, 0.5);
    let mut f = FfnGraph::build(
        &ctx,
        1,
        D_MODEL,
        D_FF,
        FfnWeights::F32(&w),
        FfnWeights::F32(&w),
        FfnWeights::F32(&down),
        FfnActivation::Relu,
    )
    .unwrap();
    let mut i = FfnGraph::build(
        &ctx,
        1,
        D_MODEL,
        D_FF,
        FfnWeights::Int8 {
            values: &q,
            scales: &s,
        },
        FfnWeights::Int8 {
            values: &q,
            scales: &s,
        },
        FfnWeights::F32(&down),
        FfnActivation::Relu,
    )
    .unwrap();
    let x = rng.vec(D_MODEL, 1.0);
    let (mut a, mut b) = (vec![0.0; D_MODEL], vec![0.0; D_MODEL]);
    f.execute(&x, &mut a).unwrap();
    i.execute(&x, &mut b).unwrap();
    let diff = a
        .iter()
        .zip(&b)
        .map(|(p, q)| (p - q).abs() as f64)
        .fold(0.0, f64::max);
    assert!(diff > TOL, "quantization changed nothing ({diff})");
}

/// Weights as graph inputs (`FfnWeights::Input`, what a prompt step streaming its weights from flash
/// uses): one graph serves every set of weights of its shape, each execution computing with the
/// weights it is given; a wrong count or size of weights is a length error before QNN is called.
#[test]
fn weights_given_to_each_execution() {
    let ctl = control();
    let mut rng = Rng::new(7);
    {
        let qnn = Qnn::load(Some(&double())).expect("the double loads");
        let backend = Backend::new(&qnn).unwrap();
        let ctx = Context::new(&backend, None).unwrap();
        let batch = 4;
        let mut ffn = FfnGraph::build(
            &ctx,
            batch,
            D_MODEL,
            D_FF,
            FfnWeights::Input,
            FfnWeights::Input,
            FfnWeights::Input,
            FfnActivation::Silu,
        )
        .unwrap();
        let x = rng.vec(batch * D_MODEL, 1.0);
        let mut outs = Vec::new();
        for _ in 0..2 {
            let gate = rng.vec(D_FF * D_MODEL, 0.5);
            let up = rng.vec(D_FF * D_MODEL, 0.5);
            let down = rng.vec(D_MODEL * D_FF, 0.5);
            let mut y = vec![f32::NAN; batch * D_MODEL];
            ffn.execute_with(&x, &[&gate, &up, &down], &mut y).unwrap();
            let f64s = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<_>>();
            let want = reference_ffn(
                &x,
                batch,
                D_MODEL,
                D_FF,
                &f64s(&gate),
                &f64s(&up),
                &f64s(&down),
                true,
            );
            for (&got, &r) in y.iter().zip(&want) {
                assert!(
                    (got as f64 - r).abs() <= TOL * (1.0 + r.abs()),
                    "{got} vs {r}"
                );
            }
            outs.push(y);
        }
        assert_ne!(
            outs[0], outs[1],
            "the second execution used its own weights"
        );
        let w = rng.vec(D_FF * D_MODEL, 0.5);
        let mut y = vec![0.0f32; batch * D_MODEL];
        let e = ffn.execute_with(&x, &[&w, &w], &mut y).unwrap_err();
        assert!(e.to_string().contains("weight inputs"), "{e}");
        let e = ffn
            .execute_with(&x, &[&w, &w, &w[1..]], &mut y)
            .unwrap_err();
        assert!(e.to_string().contains("FFN weights"), "{e}");
        // A graph with static weights takes none.
        let e = ffn.execute(&x, &mut y).unwrap_err();
        assert!(e.to_string().contains("weight inputs"), "{e}");
    }
    assert_eq!(ctl.live_objects(), 0, "every QNN object freed");
}
