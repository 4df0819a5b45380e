//! GELU's tanh form in the gated product (`gelu_mul_inplace`, and `act_mul_inplace` for every
//! activation) against the formula computed in f64 on the f16-rounded input, the result rounded to
//! f16 as ggml's table does: within an f16 rounding over the range a model's gate values take, its
//! tails (0 at or below -10, the identity at or above 10), and NaN kept.

use half::f16;
use kernels_neon::Activation;
use kernels_neon::{
    act_mul_inplace, act_value, gelu_mul_inplace, gelu_value, relu_mul_inplace, silu_mul_inplace,
};

/// ggml's value: the formula in f64 on the input rounded to f16 (in (-10, 10)).
fn gelu_ref(g: f32, u: f32) -> f64 {
    if g <= -10.0 {
        return 0.0;
    }
    if g >= 10.0 {
        return g as f64 * u as f64;
    }
    let x = f16::from_f32(g).to_f64();
    let inner = (2.0 / std::f64::consts::PI).sqrt() * x * (1.0 + 0.044715 * x * x);
    0.5 * x * (1.0 + inner.tanh()) * u as f64
}

#[test]
fn gelu_mul_matches_the_formula_in_f64() {
    let g: Vec<f32> = (-3000..=3000).map(|i| i as f32 / 250.0).collect();
    let u: Vec<f32> = (0..g.len()).map(|i| 0.5 + (i % 7) as f32 / 4.0).collect();
    let mut got = g.clone();
    gelu_mul_inplace(&mut got, &u);
    for ((&x, &u), &y) in g.iter().zip(&u).zip(&got) {
        let want = gelu_ref(x, u);
        // The f16 rounding of the result: half an ulp of f16 (2^-11 relative), and the subnormals'
        // step (2^-24, times u up to 2).
        assert!(
            (y as f64 - want).abs() <= 6e-4 * want.abs() + 3e-7,
            "gelu({x}) * {u} = {y}, f64 {want}"
        );
        // And exactly what the one-value form gives.
        assert_eq!(y, gelu_value(x) * u, "gelu({x})");
        assert_eq!(act_value(Activation::GeluTanh, x), gelu_value(x));
    }
    // The tails and the specials.
    let mut t = [-30.0f32, 30.0, 0.0, f32::NAN, -10.0, 10.0, 9.99];
    gelu_mul_inplace(&mut t, &[2.0; 7]);
    assert_eq!(t[0], 0.0);
    assert_eq!(t[1], 60.0);
    assert_eq!(t[2], 0.0);
    assert!(t[3].is_nan());
    assert_eq!((t[4], t[5]), (0.0, 20.0));
    // Just under 10: the table's f16 value (9.99 rounds to 9.9921875 in f16).
    assert_eq!(t[6], 2.0 * 9.992_187_5);
}

#[test]
fn gelu_mul_stops_at_the_shorter_slice() {
    let mut g = [1.0f32, 2.0, 3.0];
    gelu_mul_inplace(&mut g, &[1.0, 1.0]);
    assert_eq!(g[2], 3.0);
    assert!((g[0] as f64 - gelu_ref(1.0, 1.0)).abs() < 1e-3);
}

#[test]
fn act_mul_dispatches_to_each_activations_kernel() {
    let g0: Vec<f32> = (-40..40).map(|i| i as f32 / 7.0).collect();
    let u: Vec<f32> = (0..80).map(|i| 1.0 - i as f32 / 100.0).collect();
    for act in [Activation::Silu, Activation::Relu, Activation::GeluTanh] {
        let (mut got, mut want) = (g0.clone(), g0.clone());
        act_mul_inplace(act, &mut got, &u);
        match act {
            Activation::Silu => silu_mul_inplace(&mut want, &u),
            Activation::Relu => relu_mul_inplace(&mut want, &u),
            Activation::GeluTanh => gelu_mul_inplace(&mut want, &u),
        }
        assert_eq!(got, want, "{act:?}");
    }
    // The three differ on negative inputs, so the dispatch is seen.
    let mut a = [-1.0f32];
    let mut b = [-1.0f32];
    act_mul_inplace(Activation::GeluTanh, &mut a, &[1.0]);
    act_mul_inplace(Activation::Relu, &mut b, &[1.0]);
    assert!(a[0] < -0.15 && b[0] == 0.0, "{a:?} {b:?}");
}
