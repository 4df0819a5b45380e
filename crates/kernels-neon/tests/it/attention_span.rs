//! Sliding-window attention: `attend_cache_span` (one query over positions `lo..ctx` of a chunked
//! cache) against `attend` over the same positions as a plain f32 cache in f64-checked scalar form,
//! and bit for bit what `attend_cache` gives over `0..ctx`; `attend_head_span` (a block of rows,
//! each with its own first and last key) against `attend_cache_span` row by row, on every path.

use crate::common;

use common::encode_kv as encode;
use common::Rng;
use kernels_neon::{
    attend_cache_span_with, attend_cache_with, attend_head_span_with, attend_with, available_paths,
    HeadCache, KernelPath, KvChunks, KvFormat, KvLayout,
};
use proptest::prelude::*;

proptest! {
    #[test]
    fn span_equals_attention_over_the_window_rows(
        head_dim in prop::sample::select(vec![16usize, 32, 8, 24]),
        positions in 1usize..80,
        lo_frac in 0.0f64..1.0,
        chunk in 1usize..30,
        seed in any::<u64>(),
    ) {
        let layout = KvLayout { stride: head_dim, offset: 0, head_dim };
        let mut rng = Rng(seed);
        let n = positions * head_dim;
        let kf: Vec<f32> = (0..n).map(|_| rng.f() * 3.0).collect();
        let vf: Vec<f32> = (0..n).map(|_| rng.f()).collect();
        let format = KvFormat::F32;
        let (kc, vc) = (encode(format, &kf, head_dim, chunk), encode(format, &vf, head_dim, chunk));
        let k = KvChunks { format, chunk, chunks: &kc };
        let v = KvChunks { format, chunk, chunks: &vc };
        let q: Vec<f32> = (0..head_dim).map(|_| rng.f()).collect();
        let lo = ((positions as f64 * lo_frac) as usize).min(positions - 1);
        let scale = 0.3;
        let mut scores = Vec::new();
        // The window's rows as a cache of their own.
        let mut want = vec![0f32; head_dim];
        let (kw, vw) = (&kf[lo * head_dim..], &vf[lo * head_dim..]);
        attend_with(KernelPath::Scalar, &q, kw, vw, layout, positions - lo, scale, &mut scores, &mut want).unwrap();
        for path in available_paths() {
            let mut got = vec![f32::NAN; head_dim];
            attend_cache_span_with(path, &q, k, v, layout, lo..positions, scale, &mut scores, &mut got).unwrap();
            prop_assert_eq!(scores.len(), positions - lo);
            for (g, w) in got.iter().zip(&want) {
                prop_assert!((g - w).abs() <= 2e-5, "{:?} lo {} of {}: {} vs {}", path, lo, positions, g, w);
            }
            // From 0 it is attend_cache, bit for bit.
            let mut full = vec![f32::NAN; head_dim];
            attend_cache_with(path, &q, k, v, layout, positions, scale, &mut scores, &mut full).unwrap();
            attend_cache_span_with(path, &q, k, v, layout, 0..positions, scale, &mut scores, &mut got).unwrap();
            prop_assert!(full.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits()));
        }
    }

    #[test]
    fn block_rows_with_starts_match_the_span_kernel(
        format in prop::sample::select(KvFormat::ALL.to_vec()),
        head_dim in prop::sample::select(vec![16usize, 32, 64, 8, 24]),
        rows in 1usize..11,
        positions in 1usize..90,
        chunk in 1usize..40,
        seed in any::<u64>(),
    ) {
        let head_dim = if format == KvFormat::Q8_0 { head_dim.next_multiple_of(32) } else { head_dim };
        let layout = KvLayout { stride: head_dim, offset: 0, head_dim };
        let mut rng = Rng(seed);
        let n = positions * head_dim;
        let kf: Vec<f32> = (0..n).map(|_| rng.f() * 3.0).collect();
        let vf: Vec<f32> = (0..n).map(|_| rng.f()).collect();
        let (kc, vc) = (encode(format, &kf, head_dim, chunk), encode(format, &vf, head_dim, chunk));
        let k = KvChunks { format, chunk, chunks: &kc };
        let v = KvChunks { format, chunk, chunks: &vc };
        let q: Vec<f32> = (0..rows * head_dim).map(|_| rng.f()).collect();
        let lens: Vec<usize> = (0..rows).map(|_| 1 + (rng.next_u64() as usize) % positions).collect();
        let starts: Vec<usize> = lens.iter().map(|&l| (rng.next_u64() as usize) % l).collect();
        let scale = 1.0 / (head_dim as f32).sqrt();
        let mut scores = Vec::new();
        let mut want = vec![0f32; rows * head_dim];
        for (i, (qi, wi)) in q.chunks(head_dim).zip(want.chunks_mut(head_dim)).enumerate() {
            attend_cache_span_with(KernelPath::Scalar, qi, k, v, layout, starts[i]..lens[i], scale, &mut scores, wi).unwrap();
        }
        let mut head = HeadCache::default();
        head.load(k, v, layout, positions).unwrap();
        for path in available_paths() {
            let mut out = vec![f32::NAN; rows * head_dim];
            attend_head_span_with(path, &q, &starts, &lens, &head, scale, &mut scores, &mut out).unwrap();
            for (i, (&o, &w)) in out.iter().zip(&want).enumerate() {
                let r = i / head_dim;
                prop_assert!((o - w).abs() <= 2e-5, "{:?} {:?} dim {} row {} ({}..{}): {} vs {}",
                    path, format, head_dim, r, starts[r], lens[r], o, w);
            }
        }
    }
}

#[test]
fn a_start_at_or_past_the_rows_length_is_an_error() {
    let layout = KvLayout {
        stride: 16,
        offset: 0,
        head_dim: 16,
    };
    let rows = vec![0.25f32; 4 * 16];
    let kc = encode(KvFormat::F32, &rows, 16, 4);
    let k = KvChunks {
        format: KvFormat::F32,
        chunk: 4,
        chunks: &kc,
    };
    let mut head = HeadCache::default();
    head.load(k, k, layout, 4).unwrap();
    let (q, mut out) = (vec![0.5f32; 32], vec![0f32; 32]);
    let path = kernels_neon::active_path();
    let mut s = Vec::new();
    assert!(
        attend_head_span_with(path, &q, &[1, 3], &[2, 3], &head, 1.0, &mut s, &mut out).is_err()
    );
    assert!(attend_head_span_with(path, &q, &[1], &[2, 3], &head, 1.0, &mut s, &mut out).is_err());
    attend_head_span_with(path, &q, &[1, 2], &[2, 3], &head, 1.0, &mut s, &mut out).unwrap();
    // Equal rows of keys and values: the output is the value row whatever the window.
    assert!(out.iter().all(|&x| (x - 0.25).abs() < 1e-6), "{out:?}");
}
