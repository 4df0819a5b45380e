//! `attend_head` over a `HeadCache` (`attend_cache_block_with`: a block of query rows of one KV head, each with its own causal length) on
//! every available path against `attend_cache` on the scalar path, row by row: every cache format,
//! head widths that take the block kernel (multiples of 16) and ones that fall back, chunk sizes
//! that split the keys anywhere, and the errors of bad shapes.

use crate::common;

use common::encode_kv as encode;

use common::Rng;
use kernels_neon::{
    active_path, attend_cache_block_with, attend_cache_with, attend_head, available_paths,
    HeadCache, KernelError, KernelPath, KvChunks, KvFormat, KvLayout,
};
use proptest::prelude::*;

fn format_strategy() -> impl Strategy<Value = KvFormat> {
    prop::sample::select(KvFormat::ALL.to_vec())
}

proptest! {
    #[test]
    fn block_matches_row_by_row_on_every_path(
        format in format_strategy(),
        head_dim in prop::sample::select(vec![16usize, 32, 64, 96, 128, 8, 24]),
        heads in 1usize..3,
        head in 0usize..3,
        rows in 1usize..11,
        positions in 1usize..90,
        chunk in 1usize..40,
        seed in any::<u64>(),
    ) {
        // q8_0 rows come in blocks of 32.
        let head_dim = if format == KvFormat::Q8_0 { head_dim.next_multiple_of(32) } else { head_dim };
        let head = head % heads;
        let layout = KvLayout { stride: heads * head_dim, offset: head * head_dim, head_dim };
        let mut rng = Rng(seed);
        let n = positions * layout.stride;
        let kf: Vec<f32> = (0..n).map(|_| rng.f() * 3.0).collect();
        let vf: Vec<f32> = (0..n).map(|_| rng.f()).collect();
        let (kc, vc) = (encode(format, &kf, layout.stride, chunk), encode(format, &vf, layout.stride, chunk));
        let k = KvChunks { format, chunk, chunks: &kc };
        let v = KvChunks { format, chunk, chunks: &vc };
        let q: Vec<f32> = (0..rows * head_dim).map(|_| rng.f()).collect();
        let lens: Vec<usize> = (0..rows).map(|_| 1 + (rng.next_u64() as usize) % positions).collect();
        let scale = 1.0 / (head_dim as f32).sqrt();
        let mut want = vec![0f32; rows * head_dim];
        let mut scores = Vec::new();
        for ((qi, wi), &l) in q.chunks(head_dim).zip(want.chunks_mut(head_dim)).zip(&lens) {
            attend_cache_with(KernelPath::Scalar, qi, k, v, layout, l, scale, &mut scores, wi).unwrap();
        }
        let mut head = HeadCache::default();
        for path in available_paths() {
            let mut out = vec![f32::NAN; rows * head_dim];
            attend_cache_block_with(path, &q, &lens, k, v, layout, scale, &mut head, &mut out).unwrap();
            for (i, (&o, &w)) in out.iter().zip(&want).enumerate() {
                // Values are in [-1, 1] and the weights sum to 1: absolute error.
                prop_assert!((o - w).abs() <= 2e-5, "{:?} {:?} dim {} row {} (len {}): {} vs {}",
                    path, format, head_dim, i / head_dim, lens[i / head_dim], o, w);
            }
        }
    }
}

#[test]
fn bad_blocks_are_errors() {
    let layout = KvLayout {
        stride: 16,
        offset: 0,
        head_dim: 16,
    };
    let rows = vec![0.25f32; 3 * 16];
    let kc = encode(KvFormat::F32, &rows, 16, 2);
    let k = KvChunks {
        format: KvFormat::F32,
        chunk: 2,
        chunks: &kc,
    };
    let (q, mut out) = (vec![0.5f32; 32], vec![0f32; 32]);
    let (mut head, mut s) = (HeadCache::default(), Vec::new());
    let block = |lens: &[usize], head: &mut HeadCache, out: &mut [f32]| {
        attend_cache_block_with(
            active_path(),
            &q[..out.len()],
            lens,
            k,
            k,
            layout,
            1.0,
            head,
            out,
        )
    };
    block(&[3, 1], &mut head, &mut out).unwrap();
    assert!(out.iter().all(|&o| (o - 0.25).abs() < 1e-6), "{out:?}");
    assert_eq!(head.len(), 3);
    // A row that sees no key, a row past the cache, mismatched query and output lengths.
    let none = block(&[3, 0], &mut head, &mut out).unwrap_err();
    assert!(
        matches!(none, KernelError::LengthMismatch { actual: 0, .. }),
        "{none}"
    );
    let past = block(&[4, 1], &mut head, &mut out).unwrap_err();
    assert!(
        matches!(
            past,
            KernelError::LengthMismatch {
                what: "attend k cache",
                ..
            }
        ),
        "{past}"
    );
    let past_head = attend_head(&q, &[4, 1], &head, 1.0, &mut s, &mut out).unwrap_err();
    assert!(
        matches!(
            past_head,
            KernelError::LengthMismatch {
                expected: 3,
                actual: 4,
                ..
            }
        ),
        "{past_head}"
    );
    assert!(attend_head(&q[..16], &[3, 1], &head, 1.0, &mut s, &mut out).is_err());
    assert!(attend_head(&q, &[3, 1], &head, 1.0, &mut s, &mut out[..16]).is_err());
}
