//! `attend_cache` (one query head over a chunked KV cache in f32, f16 or `q8_0`) on every available
//! path: against the scalar reference path and an f64 reference on the decoded cache rows, for random
//! head sizes, strides, offsets, chunk sizes and context lengths; an f32 cache gives exactly what
//! `attend` gives on f32 slices, and the chunking never changes a bit.

use crate::common;

use common::encode_kv as encode;

use kernels_neon::{
    attend_cache, attend_cache_with, attend_with, available_paths, kv_decode, KernelPath, KvChunks,
    KvFormat, KvLayout,
};
use proptest::prelude::*;

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

/// The rows as the cache holds them, back in f32.
fn decode(format: KvFormat, chunks: &[Vec<u8>], stride: usize) -> Vec<f32> {
    let rb = format.row_bytes(stride).unwrap();
    let mut out = Vec::new();
    for c in chunks {
        for r in c.chunks(rb) {
            let mut row = vec![0.0f32; stride];
            kv_decode(format, r, &mut row).unwrap();
            out.extend(row);
        }
    }
    out
}

fn reference(q: &[f32], k: &[f32], v: &[f32], l: KvLayout, ctx: usize, scale: f32) -> Vec<f64> {
    let row = |c: &[f32], j: usize| -> Vec<f64> {
        c[j * l.stride + l.offset..][..l.head_dim]
            .iter()
            .map(|&x| f64::from(x))
            .collect()
    };
    let s: Vec<f64> = (0..ctx)
        .map(|j| {
            let d: f64 = row(k, j)
                .iter()
                .zip(q)
                .map(|(a, &b)| a * f64::from(b))
                .sum();
            f64::from(scale) * d
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

fn run(
    path: KernelPath,
    q: &[f32],
    k: KvChunks<'_>,
    v: KvChunks<'_>,
    l: KvLayout,
    ctx: usize,
) -> (Vec<f32>, Vec<f32>) {
    let mut scores = Vec::new();
    let mut out = vec![f32::NAN; l.head_dim];
    let scale = 1.0 / (l.head_dim as f32).sqrt();
    attend_cache_with(path, q, k, v, l, ctx, scale, &mut scores, &mut out).unwrap();
    (out, scores)
}

fn format_strategy() -> impl Strategy<Value = KvFormat> {
    prop::sample::select(KvFormat::ALL.to_vec())
}

proptest! {
    #[test]
    fn attend_cache_matches_the_scalar_path_and_f64_on_every_path(
        format in format_strategy(),
        width in 1usize..80,
        heads in 1usize..4,
        head in 0usize..4,
        ctx in 0usize..90,
        spare in 0usize..3,
        chunk in 1usize..40,
        seed in any::<u64>(),
    ) {
        // q8_0 rows are whole blocks of 32.
        let head_dim = if format == KvFormat::Q8_0 { 32 * (1 + width % 3) } else { width };
        let head = head % heads;
        let l = KvLayout { stride: heads * head_dim, offset: head * head_dim, head_dim };
        let mut rng = Rng(seed);
        let n = (ctx + spare) * l.stride;
        let k: Vec<f32> = (0..n).map(|_| rng.f() * 2.0).collect();
        let v: Vec<f32> = (0..n).map(|_| rng.f()).collect();
        let q: Vec<f32> = (0..head_dim).map(|_| rng.f()).collect();
        let (kc, vc) = (encode(format, &k, l.stride, chunk), encode(format, &v, l.stride, chunk));
        let view = |chunks| KvChunks { format, chunk, chunks };
        let scale = 1.0 / (head_dim as f32).sqrt();
        // The f64 reference on what the cache holds: the format's rounding is not an error.
        let want = reference(&q, &decode(format, &kc, l.stride), &decode(format, &vc, l.stride), l, ctx, scale);
        let (scalar, _) = run(KernelPath::Scalar, &q, view(&kc[..]), view(&vc[..]), l, ctx);
        for path in available_paths() {
            let (out, scores) = run(path, &q, view(&kc[..]), view(&vc[..]), l, ctx);
            prop_assert_eq!(scores.len(), ctx);
            for i in 0..head_dim {
                let (o, s, w) = (f64::from(out[i]), f64::from(scalar[i]), want[i]);
                // Values are in [-1, 1] and the weights sum to 1: absolute error.
                prop_assert!((o - w).abs() <= 2e-5, "{:?} {} ctx {} dim {}: out[{}] = {} vs f64 {}", path, format, ctx, head_dim, i, o, w);
                prop_assert!((o - s).abs() <= 2e-5, "{:?} {} ctx {} dim {}: out[{}] = {} vs scalar {}", path, format, ctx, head_dim, i, o, s);
            }
            if ctx > 0 {
                let sum: f32 = scores.iter().sum();
                prop_assert!((sum - 1.0).abs() < 1e-4, "{:?}: weights sum to {}", path, sum);
            }
            // Chunking changes nothing: one chunk holding every position gives the same bits.
            let whole = ctx.max(1) + spare;
            let (k1, v1) = (encode(format, &k, l.stride, whole), encode(format, &v, l.stride, whole));
            let one = |chunks| KvChunks { format, chunk: whole, chunks };
            let (out1, _) = run(path, &q, one(&k1[..]), one(&v1[..]), l, ctx);
            prop_assert_eq!(out1.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), out.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
            // An f32 cache is the f32 attention of before, to the bit.
            if format == KvFormat::F32 {
                let mut s = Vec::new();
                let mut plain = vec![0.0f32; head_dim];
                attend_with(path, &q, &k, &v, l, ctx, scale, &mut s, &mut plain).unwrap();
                prop_assert_eq!(plain.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), out.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), "{:?}", path);
            }
        }
    }
}

#[test]
fn f16_and_q8_0_caches_stay_close_to_f32() {
    // The format's own rounding, end to end: f16 keeps ~3 decimal digits, q8_0 about 2.
    let (hd, ctx) = (64, 200);
    let l = KvLayout {
        stride: hd,
        offset: 0,
        head_dim: hd,
    };
    let mut rng = Rng(7);
    let k: Vec<f32> = (0..ctx * hd).map(|_| rng.f() * 3.0).collect();
    let v: Vec<f32> = (0..ctx * hd).map(|_| rng.f()).collect();
    let q: Vec<f32> = (0..hd).map(|_| rng.f()).collect();
    let exact = reference(&q, &k, &v, l, ctx, 0.125);
    for (format, tol) in [(KvFormat::F16, 1e-3), (KvFormat::Q8_0, 1e-2)] {
        let (kc, vc) = (encode(format, &k, hd, 256), encode(format, &v, hd, 256));
        let view = |chunks| KvChunks {
            format,
            chunk: 256,
            chunks,
        };
        let mut s = Vec::new();
        let mut out = vec![0.0f32; hd];
        attend_cache(
            &q,
            view(&kc[..]),
            view(&vc[..]),
            l,
            ctx,
            0.125,
            &mut s,
            &mut out,
        )
        .unwrap();
        let err = out
            .iter()
            .zip(&exact)
            .map(|(&o, &w)| (f64::from(o) - w).abs())
            .fold(0.0, f64::max);
        assert!(err < tol, "{format}: max error {err}");
        assert!(err > 0.0, "{format}: the format rounds");
    }
}

#[test]
fn bad_caches_are_errors() {
    let l = KvLayout {
        stride: 64,
        offset: 32,
        head_dim: 32,
    };
    let q = vec![0.5f32; 32];
    let rows = vec![0.25f32; 3 * 64];
    let mut s = Vec::new();
    let mut out = vec![0.0f32; 32];
    for format in KvFormat::ALL {
        let c = encode(format, &rows, 64, 2);
        let view = |chunk, chunks| KvChunks {
            format,
            chunk,
            chunks,
        };
        attend_cache(
            &q,
            view(2, &c[..]),
            view(2, &c[..]),
            l,
            3,
            1.0,
            &mut s,
            &mut out,
        )
        .unwrap();
        assert!(
            out.iter().all(|&o| (o - 0.25).abs() < 1e-4),
            "{format}: uniform values average to themselves (up to the f16 scale of q8_0): {out:?}"
        );
        // More positions than the chunks hold.
        let e = attend_cache(
            &q,
            view(2, &c[..]),
            view(2, &c[..]),
            l,
            5,
            1.0,
            &mut s,
            &mut out,
        )
        .unwrap_err();
        assert!(e.to_string().contains("attend k cache"), "{e}");
        // A chunk shorter than its positions.
        let short = [c[0].clone(), c[1][..c[1].len() / 2].to_vec()];
        assert!(attend_cache(
            &q,
            view(2, &c[..]),
            view(2, &short[..]),
            l,
            3,
            1.0,
            &mut s,
            &mut out
        )
        .is_err());
        // No chunk size, a query of the wrong size, keys and values that disagree.
        assert!(attend_cache(
            &q,
            view(0, &c[..]),
            view(0, &c[..]),
            l,
            3,
            1.0,
            &mut s,
            &mut out
        )
        .is_err());
        assert!(attend_cache(
            &q[..3],
            view(2, &c[..]),
            view(2, &c[..]),
            l,
            3,
            1.0,
            &mut s,
            &mut out
        )
        .is_err());
        assert!(attend_cache(
            &q,
            view(2, &c[..]),
            view(1, &c[..]),
            l,
            3,
            1.0,
            &mut s,
            &mut out
        )
        .is_err());
        // No positions: zero output, no weights.
        attend_cache(
            &q,
            view(2, &c[..]),
            view(2, &c[..]),
            l,
            0,
            1.0,
            &mut s,
            &mut out,
        )
        .unwrap();
        assert!(out.iter().all(|&o| o == 0.0) && s.is_empty());
    }
    // q8_0 blocks may not straddle heads.
    let odd = KvLayout {
        stride: 64,
        offset: 16,
        head_dim: 16,
    };
    let c = encode(KvFormat::Q8_0, &rows, 64, 4);
    let view = |chunks| KvChunks {
        format: KvFormat::Q8_0,
        chunk: 4,
        chunks,
    };
    let e = attend_cache(
        &q[..16],
        view(&c[..]),
        view(&c[..]),
        odd,
        3,
        1.0,
        &mut s,
        &mut out[..16],
    )
    .unwrap_err();
    assert!(e.to_string().contains("block"), "{e}");
}
