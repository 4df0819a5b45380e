//! SiLU and softmax on every available path against f64's `exp`: the SIMD paths' `exp` within a
//! few ulp (libm's bit for bit on x86_64 with glibc), its limits (0 below `ln 2^-150`, ∞ past f32's
//! range, NaN kept), and the same value for an element whatever slice it is computed in (a tail
//! shorter than a SIMD step included).

use kernels_neon::{available_paths, silu_mul_inplace_with, softmax_inplace_with};
use proptest::prelude::*;

/// Relative error allowed against f64 (about 4 ulp of f32), besides an absolute one far below
/// anything a model's activations or probabilities hold (where `exp` nears f32's smallest normal).
const REL: f64 = 5e-7;
const ABS: f64 = 1e-30;

fn close(got: f32, want: f64) -> bool {
    if want.is_nan() {
        return got.is_nan();
    }
    if want.is_infinite() || got.is_infinite() {
        return got as f64 == want;
    }
    (got as f64 - want).abs() <= REL * want.abs() + ABS
}

fn silu_ref(g: f32, u: f32) -> f64 {
    let g = g as f64;
    g / (1.0 + (-g).exp()) * u as f64
}

/// Softmax in f64 of the f32 differences `x - max` (as every path rounds them).
fn softmax_ref(x: &[f32]) -> Vec<f64> {
    let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let e: Vec<f64> = x.iter().map(|&v| ((v - max) as f64).exp()).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|v| v / s).collect()
}

#[test]
fn silu_limits_and_specials() {
    let g = [
        0.0f32,
        -0.0,
        1.0,
        -1.0,
        86.5,
        -86.5,
        87.5,
        -87.5,
        88.5,
        -88.5,
        100.0,
        -100.0,
        1e-30,
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        20.0,
    ];
    let u = [1.0f32; 17];
    for path in available_paths() {
        let mut got = g;
        silu_mul_inplace_with(path, &mut got, &u).unwrap();
        for (i, (&x, &y)) in g.iter().zip(&got).enumerate() {
            let want = silu_ref(x, 1.0);
            // -∞·0 is NaN in f64 as in f32; silu(-∞) = -∞/∞ is NaN in both too.
            assert!(
                close(y, want),
                "{path:?}: silu({x}) = {y}, want {want} (element {i})"
            );
        }
    }
}

#[test]
fn softmax_masks_and_uniform() {
    for path in available_paths() {
        // Masked scores (-∞) get exactly 0; nine elements leave a tail on every path.
        let mut x = [
            0.0f32,
            2f32.ln(),
            f32::NEG_INFINITY,
            -1e30,
            -90.0,
            0.0,
            1.0,
            3.0,
            -3.0,
        ];
        let want = softmax_ref(&x);
        softmax_inplace_with(path, &mut x).unwrap();
        assert_eq!(x[2], 0.0, "{path:?}");
        for (i, (&g, &w)) in x.iter().zip(&want).enumerate() {
            assert!(close(g, w), "{path:?}: element {i} = {g}, want {w}");
        }
        let mut all_masked = [f32::NEG_INFINITY; 5];
        softmax_inplace_with(path, &mut all_masked).unwrap();
        assert_eq!(all_masked, [0.2; 5], "{path:?}");
    }
}

/// glibc's `expf` on x86_64 machines with FMA (which every SIMD path there needs) is
/// `__expf_fma`, the function the SIMD `exp` reproduces: equal bits over a sweep of the range where
/// it is neither 0 nor ∞ (every 251st f32 from -104 to 89), its limits and tails.
#[cfg(all(target_arch = "x86_64", target_env = "gnu"))]
#[test]
fn exp_is_glibc_s_bit_for_bit() {
    use kernels_neon::exp_inplace_with;
    let mut x: Vec<f32> = (0..=u32::MAX / 251)
        .map(|i| f32::from_bits(i * 251))
        .flat_map(|v| [v, -v])
        .filter(|v| (-104.0..89.0).contains(v))
        .collect();
    x.extend([
        -103.97,
        -103.98,
        88.72,
        88.73,
        f32::INFINITY,
        f32::NEG_INFINITY,
        -0.0,
    ]);
    let want: Vec<u32> = x.iter().map(|v| v.exp().to_bits()).collect();
    for path in available_paths() {
        let mut got = x.clone();
        exp_inplace_with(path, &mut got).unwrap();
        let bad = got
            .iter()
            .zip(&want)
            .zip(&x)
            .find(|((g, &w), _)| g.to_bits() != w);
        assert!(
            bad.is_none(),
            "{path:?}: exp({:?}) = {:?}, libm {:?}",
            bad.unwrap().1,
            bad.unwrap().0 .0,
            f32::from_bits(*bad.unwrap().0 .1)
        );
    }
}

proptest! {
    #[test]
    fn silu_within_ulps_of_f64_anywhere_in_a_slice(
        g in prop::collection::vec(-95.0f32..95.0, 1..70),
        u in prop::collection::vec(-4.0f32..4.0, 70),
        start in 0usize..9,
    ) {
        for path in available_paths() {
            let mut whole = g.clone();
            silu_mul_inplace_with(path, &mut whole, &u).unwrap();
            for (i, (&x, &y)) in g.iter().zip(&whole).enumerate() {
                let want = silu_ref(x, u[i]);
                prop_assert!(close(y, want), "{:?}: silu({})·{} = {}, want {}", path, x, u[i], y, want);
            }
            // The same elements computed from another start (and so another tail) agree exactly.
            let s = start.min(g.len());
            let mut part = g[s..].to_vec();
            silu_mul_inplace_with(path, &mut part, &u[s..]).unwrap();
            prop_assert_eq!(&part[..], &whole[s..], "{:?}", path);
        }
    }

    #[test]
    fn softmax_within_ulps_of_f64(x in prop::collection::vec(-60.0f32..60.0, 1..300)) {
        let want = softmax_ref(&x);
        for path in available_paths() {
            let mut got = x.clone();
            softmax_inplace_with(path, &mut got).unwrap();
            for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                // The f32 sum's rounding adds a few ulp.
                prop_assert!((g as f64 - w).abs() <= 4.0 * REL * w + ABS,
                    "{:?}: element {} = {}, want {}", path, i, g, w);
            }
        }
    }
}
