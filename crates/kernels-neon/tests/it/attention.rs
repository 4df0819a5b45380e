//! `attend` (one query head over a KV cache) on every available path against an f64 reference written
//! from the definition, for random head sizes (ragged tails), strides, offsets and context lengths.

use kernels_neon::{attend, attend_with, available_paths, KernelError, KvLayout};
use proptest::prelude::*;

fn reference(q: &[f32], k: &[f32], v: &[f32], l: KvLayout, ctx: usize, scale: f32) -> Vec<f64> {
    let row = |c: &[f32], j: usize| {
        c[j * l.stride + l.offset..][..l.head_dim]
            .iter()
            .map(|&x| f64::from(x))
            .collect::<Vec<_>>()
    };
    let s: Vec<f64> = (0..ctx)
        .map(|j| {
            f64::from(scale)
                * row(k, j)
                    .iter()
                    .zip(q)
                    .map(|(a, &b)| a * f64::from(b))
                    .sum::<f64>()
        })
        .collect();
    let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
    let z: f64 = e.iter().sum();
    let mut out = vec![0.0f64; l.head_dim];
    for (j, w) in e.iter().enumerate() {
        for (o, x) in out.iter_mut().zip(row(v, j)) {
            *o += w / z * x;
        }
    }
    out
}

struct Rng(u64);
impl Rng {
    fn f(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

proptest! {
    #[test]
    fn attend_matches_f64_on_every_path(
        head_dim in 1usize..80,
        heads in 1usize..4,
        head in 0usize..4,
        ctx in 0usize..70,
        spare in 0usize..3,
        seed in any::<u64>(),
    ) {
        let head = head % heads;
        let layout = KvLayout { stride: heads * head_dim, offset: head * head_dim, head_dim };
        let mut rng = Rng(seed);
        let n = (ctx + spare) * layout.stride;
        let k: Vec<f32> = (0..n).map(|_| rng.f() * 2.0).collect();
        let v: Vec<f32> = (0..n).map(|_| rng.f()).collect();
        let q: Vec<f32> = (0..head_dim).map(|_| rng.f()).collect();
        let scale = 1.0 / (head_dim as f32).sqrt();
        let want = reference(&q, &k, &v, layout, ctx, scale);
        for path in available_paths() {
            let mut scores = Vec::new();
            let mut out = vec![f32::NAN; head_dim];
            attend_with(path, &q, &k, &v, layout, ctx, scale, &mut scores, &mut out).unwrap();
            prop_assert_eq!(scores.len(), ctx);
            for (i, (&o, &w)) in out.iter().zip(&want).enumerate() {
                // Values are in [-1, 1] and the weights sum to 1: absolute error.
                prop_assert!((f64::from(o) - w).abs() <= 2e-5, "{:?} ctx {} dim {}: out[{}] = {} vs {}", path, ctx, head_dim, i, o, w);
            }
            if ctx > 0 {
                let sum: f32 = scores.iter().sum();
                prop_assert!((sum - 1.0).abs() < 1e-4, "{:?}: weights sum to {}", path, sum);
            }
        }
    }
}

#[test]
fn bad_shapes_are_errors() {
    let l = KvLayout {
        stride: 8,
        offset: 4,
        head_dim: 4,
    };
    let (q, k, v) = (vec![0.5f32; 4], vec![0.1f32; 24], vec![0.2f32; 24]);
    let mut s = Vec::new();
    let mut out = vec![0.0f32; 4];
    attend(&q, &k, &v, l, 3, 1.0, &mut s, &mut out).unwrap();
    assert!(
        out.iter().all(|&o| (o - 0.2).abs() < 1e-6),
        "uniform values average to themselves: {out:?}"
    );
    let too_long = attend(&q, &k, &v, l, 4, 1.0, &mut s, &mut out).unwrap_err();
    assert!(
        matches!(
            too_long,
            KernelError::LengthMismatch {
                what: "attend k cache",
                expected: 32,
                actual: 24
            }
        ),
        "{too_long}"
    );
    assert!(attend(&q, &k, &v[..16], l, 3, 1.0, &mut s, &mut out).is_err());
    assert!(attend(&q[..3], &k, &v, l, 3, 1.0, &mut s, &mut out).is_err());
    assert!(attend(&q, &k, &v, l, 3, 1.0, &mut s, &mut out[..2]).is_err());
    let outside = KvLayout {
        stride: 8,
        offset: 5,
        head_dim: 4,
    };
    assert!(attend(&q, &k, &v, outside, 3, 1.0, &mut s, &mut out).is_err());
    // No positions: zero output, no weights.
    attend(&q, &k, &v, l, 0, 1.0, &mut s, &mut out).unwrap();
    assert!(out.iter().all(|&o| o == 0.0) && s.is_empty());
}
