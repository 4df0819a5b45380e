//! Dispatch of the KV-cache kernels of attention ([`crate::attend_cache`]): the scores of one query
//! head against the key rows of one cache chunk, and the weighted sum of the value rows of one chunk,
//! each row read in the cache's [`KvFormat`]. The scalar reference is in `crate::kv`.
//!
//! The rows of a chunk: position `p`'s head row is `rows[p * pos_bytes + off..]`, of
//! `format.row_bytes(q.len())` bytes; the caller ([`crate::attend_cache_with`]) has checked that
//! every row asked for is inside `rows`.

use crate::{kv, KernelPath, KvFormat};

/// `scores[p] = scale * (q · row p)` for `p < scores.len()`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn scores(
    path: KernelPath,
    format: KvFormat,
    q: &[f32],
    rows: &[u8],
    pos_bytes: usize,
    off: usize,
    scale: f32,
    scores: &mut [f32],
) {
    match path {
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx2Fma | KernelPath::Avx512 => {
            // SAFETY: the path was checked available (AVX2/FMA/F16C present); the kernel slices
            // every row it reads (bounds-checked).
            unsafe { super::x86_64::kv_scores(format, q, rows, pos_bytes, off, scale, scores) }
        }
        #[cfg(target_arch = "aarch64")]
        KernelPath::Neon | KernelPath::NeonDotprod | KernelPath::NeonI8mm => {
            // SAFETY: NEON is part of every aarch64 target this crate builds for (the path was
            // checked available); the kernel slices every row it reads (bounds-checked).
            unsafe { super::aarch64::kv_scores(format, q, rows, pos_bytes, off, scale, scores) }
        }
        _ => {
            let Some(hb) = format.row_bytes(q.len()) else {
                return;
            };
            for (p, s) in scores.iter_mut().enumerate() {
                *s = scale * kv::dot(format, q, &rows[p * pos_bytes + off..][..hb]);
            }
        }
    }
}

/// `out += Σ_p weights[p] · row p` for `p < weights.len()`, in position order.
pub(crate) fn accumulate(
    path: KernelPath,
    format: KvFormat,
    weights: &[f32],
    rows: &[u8],
    pos_bytes: usize,
    off: usize,
    out: &mut [f32],
) {
    match path {
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx2Fma | KernelPath::Avx512 => {
            // SAFETY: the path was checked available (AVX2/FMA/F16C present); the kernel slices
            // every row it reads (bounds-checked).
            unsafe { super::x86_64::kv_accumulate(format, weights, rows, pos_bytes, off, out) }
        }
        #[cfg(target_arch = "aarch64")]
        KernelPath::Neon | KernelPath::NeonDotprod | KernelPath::NeonI8mm => {
            // SAFETY: NEON is part of every aarch64 target this crate builds for (the path was
            // checked available); the kernel slices every row it reads (bounds-checked).
            unsafe { super::aarch64::kv_accumulate(format, weights, rows, pos_bytes, off, out) }
        }
        _ => {
            let Some(hb) = format.row_bytes(out.len()) else {
                return;
            };
            for (p, &w) in weights.iter().enumerate() {
                kv::axpy(format, w, &rows[p * pos_bytes + off..][..hb], out);
            }
        }
    }
}
